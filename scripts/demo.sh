#!/usr/bin/env bash
# The main job on a built-in example (grows with the product).
set -euo pipefail
out=${1:-demo-out}
mkdir -p "$out"
.venv/bin/autoplan --help
