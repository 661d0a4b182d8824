"""autoplan.files: atomic writes (an interrupted write leaves the old file whole), output paths
checked before any work, and defensive reading of files from elsewhere."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from autoplan import limits
from autoplan.cluster.catalog import load_cluster
from autoplan.errors import InputError
from autoplan.files import (
    atomic_output,
    check_output_path,
    check_outputs,
    read_json_model,
    read_yaml_model,
    write_json_model,
    write_text_atomic,
)
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from tests.plan_factory import make_plan

CLUSTER = """\
schema_version: 1
name: small
node_groups:
  - name: a100
    gpu: A100-80GB
    gpus_per_node: 8
    count: {count}
    intra_node_bandwidth_gb_per_s: {bandwidth}
inter_node_bandwidth_gb_per_s: 25
"""


def _leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


def test_an_interrupted_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old contents\n")
    with pytest.raises(RuntimeError, match="crash"), atomic_output(target) as temporary:
        handle = open(temporary, "w")  # noqa: SIM115
        handle.write("new, half writ")
        handle.flush()
        raise RuntimeError("crash in the middle of the write")
    assert target.read_text() == "old contents\n"
    assert _leftovers(tmp_path) == []


def test_a_failed_model_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    write_json_model(target, make_plan([2, 2]))
    before = target.read_bytes()
    broken = make_plan([2, 2])
    prediction = broken.prediction.model_copy(update={"iteration_time_ms": float("inf")})
    with pytest.raises(InputError, match="iteration_time_ms is not a finite number"):
        write_json_model(target, broken.model_copy(update={"prediction": prediction}))
    assert target.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_atomic_writes_replace_whole_files_and_keep_or_set_modes(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "script.sh"
    write_text_atomic(target, "#!/bin/bash\necho 1\n", mode=0o755)
    assert target.read_text() == "#!/bin/bash\necho 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    target.chmod(0o700)
    write_text_atomic(target, "#!/bin/bash\necho 2\n")
    assert target.read_text().endswith("echo 2\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o700  # an existing file keeps its mode
    # Through a symbolic link: the link stays, its target gets the data.
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    write_text_atomic(link, "three\n")
    assert link.is_symlink() and target.read_text() == "three\n"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp, "is a folder"),
        (lambda tmp: Path("/dev/full"), "not a regular file"),
        (lambda tmp: Path("/dev/null"), "not a regular file"),
        (lambda tmp: tmp / "input.json" / "out.json", "is a file, not a folder"),
        (lambda tmp: tmp / "input.json" / "a" / "b.json", "is a file, not a folder"),
        (lambda tmp: Path("/proc/self/nope/out.json"), "cannot write in"),
        (lambda tmp: tmp / "input.json", "is this command's input"),
        (lambda tmp: tmp / "hard-link.json", "is this command's input"),
        (lambda tmp: tmp / "soft-link.json", "is this command's input"),
    ],
)
def test_bad_output_paths_are_refused_before_any_work(tmp_path: Path, make, message: str) -> None:
    source = tmp_path / "input.json"
    source.write_text("{}")
    os.link(source, tmp_path / "hard-link.json")
    (tmp_path / "soft-link.json").symlink_to(source)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError, match=message) as refused:
        check_output_path(make(tmp_path), [source], "--output")
    assert "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert source.read_text() == "{}"


def test_a_write_that_fails_late_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot write /proc/.*out\.json"):
        write_text_atomic("/proc/autoplan-out.json", "x")
    with pytest.raises(InputError, match="are the same file"):
        check_outputs({"--trace": tmp_path / "x.json", "--out": tmp_path / "x.json"})


def _cluster_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (CLUSTER.format(count="true", bandwidth=300), "count: Input should be a valid integer"),
        (CLUSTER.format(count="'2'", bandwidth=300), "count: Input should be a valid integer"),
        (CLUSTER.format(count=10**12, bandwidth=300), "count: Input should be less than"),
        (CLUSTER.format(count=1, bandwidth=".inf"), "inf is not a finite number"),
        (CLUSTER.format(count=1, bandwidth=".nan"), "nan is not a finite number"),
        (CLUSTER.format(count=1, bandwidth="1e-300"), "greater than or equal to 0.001"),
        (CLUSTER.format(count=1, bandwidth=300) + "name: twice\n", "appears twice"),
        (CLUSTER.format(count=1, bandwidth="2020-01-01"), "date value is not allowed"),
        (
            CLUSTER.replace("name: a100", "name: 'a;touch x'").format(count=1, bandwidth=1),
            "node_groups.0.name: Value error, name must be",
        ),
        (CLUSTER.replace("name: a100", "name: a/b").format(count=1, bandwidth=1), "name must be"),
        (
            CLUSTER.replace("name: small", 'name: "x\\nrm -rf ~"').format(count=1, bandwidth=1),
            "name: Value error",
        ),
        (
            CLUSTER.replace("name: small", 'name: "\\e[31m"').format(count=1, bandwidth=1),
            "control character",
        ),
        ("a: &a [1, 2]\n" + "".join(f"b{i}: &b{i} [*a, *a]\n" for i in range(600)), "alias"),
        ("[" * 5000 + "]" * 5000, "nested deeper"),
        ("- " * 100 + "x", "nested deeper"),
    ],
)
def test_bad_cluster_files_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=None) as refused:
        load_cluster(_cluster_file(tmp_path, text))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_clusters_too_big_in_total_are_refused(tmp_path: Path) -> None:
    groups = "".join(
        f"  - {{name: g{i}, gpu: H100, gpus_per_node: 8, count: 60000, "
        "intra_node_bandwidth_gb_per_s: 450}\n"
        for i in range(3)
    )
    text = f"name: big\nnode_groups:\n{groups}inter_node_bandwidth_gb_per_s: 50\n"
    with pytest.raises(InputError, match=f"at most {limits.MAX_CLUSTER_NODES}"):
        load_cluster(_cluster_file(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ('{"a": NaN}', "NaN is not a number"),
        ('{"a": Infinity}', "Infinity is not a number"),
        ('{"a": 1e999}', "inf is not a finite number"),
        ('{"a": 1, "a": 2}', "appears twice"),
        ('{"a": ' + "9" * 5000 + "}", "not JSON autoplan reads"),
        ('{"a": ' + "9" * 30 + "}", "number too large"),
        ('{"a": "\\u001b[2J"}', "control character"),
        ("\ufeff{}", "not JSON"),
    ],
)
def test_bad_json_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(InputError) as refused:
        read_json_model(path, Plan)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_special_and_huge_files_are_refused_without_reading_them(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(InputError, match="not a regular file"):
        read_json_model(fifo, Profile)
    with pytest.raises(InputError, match="not a regular file"):
        read_yaml_model("/dev/zero", Plan)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(limits.MAX_INPUT_FILE_BYTES + 1)  # sparse: no real disk used
    with pytest.raises(InputError, match="reads files of at most"):
        read_json_model(huge, Profile)
    with pytest.raises(InputError, match="is a folder"):
        read_json_model(tmp_path, Profile)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError, match="not UTF-8"):
        read_json_model(binary, Profile)
