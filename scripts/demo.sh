#!/usr/bin/env bash
# `make demo`: autoplan's main job on built-in examples.
#  1. Plan Llama-2-7B on a cluster of three GPU types (H100 + A100 + L4) and compare the plan with
#     a Megatron-style grid search that treats every GPU as the slowest type.
#  2. Draw the plan's timeline.
#  3. The whole path on this machine: profile a tiny model (measured on this CPU), solve it for a
#     2 fast + 2 slow "GPU" cluster, show the plan, and run it with torchrun (4 processes, gloo),
#     printing measured beside predicted.
set -euo pipefail
out=${1:-demo-out}
autoplan=.venv/bin/autoplan
export COLUMNS=${COLUMNS:-120}  # rich wraps tables at 80 columns when output is not a terminal
mkdir -p "$out"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. Profile Llama-2-7B at 4096 tokens under fake tensors (nothing is allocated)"
$autoplan profile llama2-7b --seq 4096 -o "$out/llama2-7b.profile.json" | tail -n 1

step "Solve for 16 H100 + 16 A100 + 16 L4 (profiles/clusters/h100-a100-l4.yaml), global batch 256"
$autoplan solve "$out/llama2-7b.profile.json" --cluster h100-a100-l4 --global-batch 256 \
  -o "$out/llama2-7b.plan.json"

step "The same with a Megatron-style grid search that ignores heterogeneity"
$autoplan solve "$out/llama2-7b.profile.json" --cluster h100-a100-l4 --global-batch 256 \
  --strategy megatron -o "$out/llama2-7b.megatron.json" > /dev/null
$autoplan compare "$out/llama2-7b.megatron.json" "$out/llama2-7b.plan.json"

step "2. Simulate the plan's schedule: Chrome trace (open in ui.perfetto.dev) and a PNG timeline"
$autoplan simulate "$out/llama2-7b.plan.json" --trace "$out/llama2-7b.trace.json" \
  --png "$out/llama2-7b.timeline.png"

step "3. Profile gpt-tiny and time its layers on this CPU"
$autoplan profile gpt-tiny --seq 64 --micro-batch 4 --dtype fp32 --measure \
  -o "$out/gpt-tiny.profile.json" | tail -n 1

step "Solve for 2 fast + 2 slow CPU 'GPUs' (profiles/clusters/cpu-hetero.yaml)"
$autoplan solve "$out/gpt-tiny.profile.json" --cluster cpu-hetero --global-batch 32 \
  -o "$out/gpt-tiny.plan.json" > /dev/null
$autoplan show "$out/gpt-tiny.plan.json"
$autoplan validate "$out/gpt-tiny.plan.json" --profile "$out/gpt-tiny.profile.json"

step "Run it: torchrun, one process per planned GPU, gloo on CPU, 5 steps"
$autoplan run "$out/gpt-tiny.plan.json" --local --steps 5 --report "$out/gpt-tiny.run.json"

step "Done: everything above is in $out/"
ls "$out"
