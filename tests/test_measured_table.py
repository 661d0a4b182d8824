"""Measured tables in and out: ``autoplan profile import`` and ``profile --measure --table``
(autoplan.profile.measured_table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.profile.measured_table import TableRow, attach, read_table, table_rows, write_table
from autoplan.profile.schema import Profile
from tests.synthetic_profiles import transformer_profile

CALIBRATION = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "layer_times.csv"


def _rows() -> list[TableRow]:
    rows = []
    for gpu, tp in (("A100-80GB", 1), ("A100-80GB", 2), ("NVIDIA H200", 1)):
        for mbs in (1, 4):
            for index in range(4):
                rows.append(
                    TableRow(gpu, tp, mbs, str(index), 1.5 * mbs / tp + index, 3.25 * mbs + 0.1)
                )
    return rows


def test_import_round_trips(tmp_path: Path) -> None:
    profile = transformer_profile(blocks=2, hidden=256, seq_len=64)
    rows = _rows()
    path = tmp_path / "table.csv"
    write_table(path, rows)
    read_back = read_table(path)
    assert read_back == rows
    measured = attach(profile, read_back, source=str(path))
    assert sorted(table_rows(measured), key=repr) == sorted(rows, key=repr)
    # Writing the measured profile's table again gives the same bytes; attaching twice
    # changes nothing (same keys are replaced).
    again = tmp_path / "again.csv"
    write_table(again, table_rows(measured))
    assert sorted(again.read_text().splitlines()) == sorted(path.read_text().splitlines())
    assert attach(measured, read_back, source=str(path)) == measured
    # And through the profile file.
    write_json_model(tmp_path / "p.json", measured)
    assert read_json_model(tmp_path / "p.json", Profile) == measured


def test_json_tables_aliases_and_filters(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(
        json.dumps(
            {
                "rows": [
                    {"model": "a", "device": "X", "tensor_parallel_degree": 2, "mbs": 4,
                     "layer_index": 1, "forward_ms": 2.0, "backward_ms": 4.0,
                     "memory_bytes": 1024},
                    {"model": "b", "gpu": "Y", "tp": 1, "micro_batch": 1, "layer": "0",
                     "fwd_ms": 1.0, "bwd_ms": 2.0},
                ]
            }
        )
    )  # fmt: skip
    rows = read_table(path, model="a", gpu_names={"X": "A100-80GB"})
    assert rows == [TableRow("A100-80GB", 2, 4, "1", 2.0, 4.0, 1024)]
    with pytest.raises(InputError, match="no rows of model 'c'"):
        read_table(path, model="c")


def test_bad_tables_fail_in_one_line(tmp_path: Path) -> None:
    profile = transformer_profile(blocks=2, hidden=256, seq_len=64)
    with pytest.raises(InputError, match="has 4 layers"):
        attach(profile, [TableRow("G", 1, 1, "7", 1.0, 1.0)], source="t")
    with pytest.raises(InputError, match="twice"):
        attach(profile, [TableRow("G", 1, 1, "0", 1.0, 1.0)] * 2, source="t")
    with pytest.raises(InputError, match="does not have"):
        attach(profile, [TableRow("G", 1, 1, "nope", 1.0, 1.0)], source="t")
    path = tmp_path / "t.csv"
    path.write_text("gpu,tp,layer\nA,1,0\n")
    with pytest.raises(InputError, match="no micro_batch, fwd_ms, bwd_ms"):
        read_table(path)


@pytest.mark.parametrize(
    ("cell", "message"),
    [("nan", "finite"), ("inf", "finite"), ("-2", "finite and >= 0"), ("1e999", "finite")],
)
def test_a_time_that_is_not_a_finite_duration_is_refused_at_import(
    tmp_path: Path, cell: str, message: str
) -> None:
    # Found by fuzzing: a NaN time passed the reader and reached the profile writer, whose
    # refusal escaped `profile import` as a traceback (exit 1).
    profile = transformer_profile(blocks=2, hidden=256, seq_len=64)
    write_json_model(tmp_path / "p.json", profile)
    table = tmp_path / "t.csv"
    table.write_text(f"gpu,tp,micro_batch,layer,fwd_ms,bwd_ms\nA100-80GB,1,1,0,{cell},1.0\n")
    with pytest.raises(InputError, match=message):
        read_table(table)
    result = CliRunner().invoke(
        app,
        ["profile", "import", str(table), "--profile", str(tmp_path / "p.json"),
         "-o", str(tmp_path / "out.json")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output
    assert not (tmp_path / "out.json").exists()


def test_a_memory_column_that_is_not_a_byte_count_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    for cell, message in (("inf", "infinity to integer"), ("-5", "memory_bytes must be >= 0")):
        table.write_text(
            f"gpu,tp,micro_batch,layer,fwd_ms,bwd_ms,memory_bytes\nA,1,1,0,1.0,1.0,{cell}\n"
        )
        with pytest.raises(InputError, match=message):
            read_table(table)


@pytest.mark.skipif(not CALIBRATION.is_file(), reason="../shared/calibration is not present")
def test_the_shared_calibration_table_imports_onto_a_profile_of_26_layers(tmp_path: Path) -> None:
    # OPT-350's 26 rows per configuration (embedding, 24 blocks, head) map onto layer indices.
    profile = transformer_profile(blocks=24, hidden=1024, seq_len=2048, heads=16)
    write_json_model(tmp_path / "p.json", profile)
    result = CliRunner().invoke(
        app,
        [
            "profile", "import", str(CALIBRATION), "--profile", str(tmp_path / "p.json"),
            "-o", str(tmp_path / "out.json"), "--model", "OPT-350",
            "--gpu-name", "A100-80=A100-80GB", "--gpu-name", "GH-96=GH200",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = read_json_model(tmp_path / "out.json", Profile)
    configs = {
        (e.device_name, e.tensor_parallel_degree, e.micro_batch_size)
        for e in out.layers[5].measured
    }
    assert ("A100-80GB", 4, 64) in configs and ("GH200", 1, 1) in configs
    assert all(len(layer.measured) == len(configs) for layer in out.layers)
    # A table whose layers the profile lacks: exit 2, one line.
    bad = CliRunner().invoke(
        app,
        ["profile", "import", str(CALIBRATION), "--profile", str(tmp_path / "p.json"),
         "-o", str(tmp_path / "x.json"), "--model", "OPT-30"],
    )  # fmt: skip
    assert bad.exit_code == 2
    assert "the table has layer 26" in bad.output


def test_measure_writes_the_import_format(tmp_path: Path) -> None:
    table = tmp_path / "measured.csv"
    result = CliRunner().invoke(
        app,
        ["profile", "gpt-tiny", "--seq", "16", "--dtype", "fp32", "--measure",
         "--table", str(table), "-o", str(tmp_path / "p.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    profile = read_json_model(tmp_path / "p.json", Profile)
    rows = read_table(table)
    assert {row.layer for row in rows} == {str(i) for i in range(len(profile.layers))}
    assert all(row.tp == 1 and row.micro_batch == 1 for row in rows)
    assert attach(profile, rows, source="t").layers[0].measured[0].forward_ms == rows[0].forward_ms
