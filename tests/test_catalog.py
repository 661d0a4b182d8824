"""The GPU catalog and the example clusters: they load, they are complete, bad names fail well."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import (
    REQUIRED_DTYPES,
    efficiency_for,
    example_cluster_path,
    gpu_specs,
    load_catalog,
    load_cluster,
    peak_tflops,
    profiles_dir,
)
from autoplan.errors import InputError

EXAMPLE_CLUSTERS = sorted((profiles_dir() / "clusters").glob("*.yaml"))

# Types the brief and the calibration data need.
EXPECTED_TYPES = {
    "H100", "H200", "GH200", "A100-80GB", "A100-40GB", "V100-32GB", "V100-16GB",
    "L4", "A10", "T4", "RTX-3090", "RTX-4090", "RTX-2080", "Titan-RTX",
}  # fmt: skip


def test_catalog_has_every_expected_type_with_required_figures() -> None:
    catalog = load_catalog()
    assert set(catalog) >= EXPECTED_TYPES
    for name, gpu in catalog.items():
        assert gpu.name == name
        for dtype in REQUIRED_DTYPES:
            assert gpu.peak_tflops[dtype] > 0, (name, dtype)
        assert set(gpu.peak_tflops) <= {"fp32", "tf32", "fp16", "bf16", "fp64", "fp8"}
        assert gpu.datasheet_url.startswith("https://"), name
        assert 0 < gpu.efficiency <= 1


def test_tensor_core_peaks_exceed_fp32_where_listed() -> None:
    for gpu in load_catalog().values():
        for dtype in ("fp16", "bf16", "tf32"):
            if dtype in gpu.peak_tflops:
                assert gpu.peak_tflops[dtype] >= gpu.peak_tflops["fp32"], (gpu.name, dtype)


# name: (memory GiB, memory GB/s, dense bf16, dense fp8 or None), from each datasheet.
NEWER_TYPES = {
    "B200": (179, 8000, 2250.0, 4500.0),
    "GB200": (185, 8000, 2500.0, 5000.0),
    "H20": (96, 4000, 148.0, 296.0),
    "L40S": (48, 864, 362.05, 733.0),
    "MI300X": (192, 5300, 1307.4, 2614.9),
    "MI250X": (64, 1638.4, 191.5, None),  # one GCD: half the package's figures
}


@pytest.mark.parametrize("name", sorted(NEWER_TYPES))
def test_newer_types_load_with_their_dense_datasheet_figures(name: str) -> None:
    gpu = load_catalog()[name]
    memory, bandwidth, bf16, fp8 = NEWER_TYPES[name]
    assert (gpu.memory_gib, gpu.memory_bandwidth_gb_per_s) == (memory, bandwidth)
    assert peak_tflops(gpu, "bf16") == bf16
    assert gpu.peak_tflops.get("fp8") == fp8
    # Dense, not the 2:4-sparse figure: fp8 is twice 16-bit where listed (never four times).
    if fp8 is not None:
        assert fp8 == pytest.approx(2 * bf16, rel=0.025)
    assert gpu.datasheet_url.startswith("https://")
    assert 0 < gpu.memory_reserve_gib < 0.05 * gpu.memory_gib


def test_pre_ampere_gpus_have_no_bf16_and_fall_back_to_fp32() -> None:
    catalog = load_catalog()
    for name in ("V100-16GB", "V100-32GB", "T4", "RTX-2080", "Titan-RTX"):
        gpu = catalog[name]
        assert "bf16" not in gpu.peak_tflops
        assert peak_tflops(gpu, "bf16") == gpu.peak_tflops["fp32"]
    a100 = catalog["A100-80GB"]
    assert peak_tflops(a100, "bf16") == 312.0


def test_peak_for_unknown_dtype_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="no peak_tflops for dtype 'int4'"):
        peak_tflops(load_catalog()["H100"], "int4")


@pytest.mark.parametrize("path", EXAMPLE_CLUSTERS, ids=lambda p: p.stem)
def test_example_clusters_load_and_expand(path: Path) -> None:
    cluster = load_cluster(path)
    nodes = cluster.nodes()
    assert sum(node.gpus for node in nodes) == cluster.total_gpus()
    assert len({node.name for node in nodes}) == len(nodes)
    specs = gpu_specs(cluster)
    assert all(node.gpu in specs for node in nodes)


def test_named_example_clusters_have_the_promised_size() -> None:
    assert load_cluster(example_cluster_path("a100x8")).total_gpus() == 8
    assert load_cluster(example_cluster_path("mixed-1024")).total_gpus() == 1024
    megatron = load_cluster(example_cluster_path("megatron-a100"))
    assert megatron.total_gpus() >= 3072
    assert {node.gpu for node in megatron.nodes()} == {"A100-80GB"}
    assert len({n.gpu for n in load_cluster(example_cluster_path("mixed-1024")).nodes()}) == 3
    assert load_cluster(example_cluster_path("cpu-local")).total_gpus() <= 4
    hetero = load_cluster(example_cluster_path("cpu-hetero"))
    assert hetero.total_gpus() <= 4
    assert len({node.gpu for node in hetero.nodes()}) == 2


def test_cluster_gpu_types_extend_and_override_the_catalog() -> None:
    cluster = load_cluster(example_cluster_path("cpu-local"))
    specs = gpu_specs(cluster)
    assert specs["cpu"].peak_tflops["fp32"] < 1
    assert "H100" in specs
    overridden = cluster.model_copy(
        update={"gpu_types": [load_catalog()["H100"].model_copy(update={"efficiency": 0.9})]}
    )
    assert gpu_specs(overridden)["H100"].efficiency == 0.9
    assert load_catalog()["H100"].efficiency != 0.9  # the catalog itself is untouched


def test_unknown_gpu_type_is_one_line_with_suggestions(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\n"
        "node_groups:\n"
        "  - {name: n, gpu: A100-80G, gpus_per_node: 8, intra_node_bandwidth_gb_per_s: 300}\n"
        "inter_node_bandwidth_gb_per_s: 25\n"
    )
    with pytest.raises(InputError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "'A100-80G'" in message and "A100-80GB" in message


def test_missing_cluster_file_and_unknown_example_name() -> None:
    with pytest.raises(InputError, match="no such file"):
        load_cluster("/nonexistent/cluster.yaml")
    with pytest.raises(InputError, match="a100x8"):
        example_cluster_path("a100x9")


def test_efficiency_for_prefers_a_measured_dtype_figure() -> None:
    v100 = load_catalog()["V100-16GB"].model_copy(
        update={"efficiency": 0.4, "efficiency_by_dtype": {"fp32": 0.7}}
    )
    assert efficiency_for(v100, "fp32") == 0.7
    assert efficiency_for(v100, "bf16") == 0.7  # no bf16 tensor cores: runs as fp32
    assert efficiency_for(v100, "fp16") == 0.4  # tensor cores: the 16-bit figure
    a100 = load_catalog()["A100-80GB"].model_copy(update={"efficiency_by_dtype": {}})
    assert efficiency_for(a100, "bf16") == a100.efficiency


def test_cli_lists_the_catalog_and_the_example_clusters() -> None:
    from typer.testing import CliRunner

    from autoplan.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["gpus", "--urls"])
    assert listed.exit_code == 0, listed.output
    for name in load_catalog():
        assert name in listed.output
    listed = runner.invoke(app, ["clusters"])
    assert listed.exit_code == 0, listed.output
    for path in EXAMPLE_CLUSTERS:
        assert path.name in listed.output


def test_work_dependent_figures_resolve_per_dtype() -> None:
    from autoplan.cluster.catalog import half_intensity_for, spec_for_dtype

    a100 = load_catalog()["A100-80GB"]
    assert half_intensity_for(a100, "tf32") == a100.matmul_half_intensity_by_dtype["tf32"]
    assert half_intensity_for(a100, "bf16") == a100.matmul_half_intensity_ridges
    resolved = spec_for_dtype(a100, "tf32")
    assert resolved.efficiency == a100.efficiency_by_dtype["tf32"]
    assert resolved.matmul_half_intensity_ridges == a100.matmul_half_intensity_by_dtype["tf32"]
    assert spec_for_dtype(a100, "bf16", 0.5).efficiency == 0.5
    # No tf32 tensor cores: tf32 runs as fp32, with fp32's figures.
    v100 = load_catalog()["V100-16GB"]
    assert half_intensity_for(v100, "tf32") == v100.matmul_half_intensity_by_dtype["fp32"]
    for gpu in load_catalog().values():
        assert 0 <= gpu.matmul_half_intensity_ridges <= 4, gpu.name
        assert 0.5 <= gpu.backward_matmul_efficiency <= 1, gpu.name
        assert 0 <= gpu.kernel_launch_us <= 200, gpu.name
        assert all(0 < e <= 1 for e in gpu.efficiency_by_dtype.values()), gpu.name


def test_an_overlay_replaces_catalog_and_cluster_types(tmp_path: Path) -> None:
    from autoplan.cluster.catalog import CatalogOverlay, load_overlay, with_overlay

    h100 = load_catalog()["H100"].model_copy(update={"efficiency": 0.3})
    path = tmp_path / "overlay.yaml"
    import yaml

    path.write_text(yaml.safe_dump(CatalogOverlay(gpu_types=[h100]).model_dump(mode="json")))
    overlay = load_overlay(path)
    cluster = load_cluster(example_cluster_path("h100-a100-l4"))
    assert gpu_specs(with_overlay(cluster, overlay))["H100"].efficiency == 0.3
    assert gpu_specs(cluster)["H100"].efficiency != 0.3
    local = load_cluster(example_cluster_path("cpu-local"))
    cpu = gpu_specs(local)["cpu"].model_copy(update={"efficiency": 0.01})
    assert gpu_specs(with_overlay(local, [cpu]))["cpu"].efficiency == 0.01


def test_the_shipped_files_read_alike_with_libyaml() -> None:
    """``read_yaml_model(..., shipped=True)`` (libyaml's parser, for autoplan's own files)
    gives the model the guarded pure-Python reader gives, for the catalog and every shipped
    cluster."""
    from autoplan.cluster.catalog import GpuCatalog
    from autoplan.cluster.schema import Cluster
    from autoplan.files import read_yaml_model

    files = [(profiles_dir() / "gpus.yaml", GpuCatalog)]
    files += [(p, Cluster) for p in sorted((profiles_dir() / "clusters").glob("*.yaml"))]
    assert len(files) > 3
    for path, model in files:
        assert read_yaml_model(path, model, shipped=True) == read_yaml_model(path, model), path
