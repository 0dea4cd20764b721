"""remote/preflight.py: parsers on real captured nvidia-smi outputs (tests/data/nvidia-smi/,
sources in SOURCES.md), and collect() with a scripted command runner (no GPU needed)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from remote import preflight
from remote.preflight import collect, parse_query_gpu, parse_topo_matrix, probe_port

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
ROOT = Path(__file__).resolve().parents[2]


def sample(name: str) -> str:
    return (DATA / name).read_text()


# ----------------------------------------------------------------------------- query-gpu


def test_query_noheader_nounits_8x_a100() -> None:
    gpus = parse_query_gpu(sample("query-a100-sxm4-8gpu-noheader-nounits.csv"))
    assert len(gpus) == 8
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total_mib": 81920,
        "memory_used_mib": 1,
        "driver_version": "550.163.01",
    }
    assert [g["index"] for g in gpus] == list(range(8))


def test_query_with_header_and_units() -> None:
    gpus = parse_query_gpu(sample("query-h200-nvl-header-units.csv"))
    assert [(g["name"], g["memory_total_mib"], g["memory_used_mib"]) for g in gpus] == [
        ("NVIDIA H200 NVL", 143771, 88759),
        ("NVIDIA H200 NVL", 143771, 61807),
    ]
    assert {g["driver_version"] for g in gpus} == {"580.173.02"}


def test_query_header_missing_a_column_gives_none() -> None:
    gpus = parse_query_gpu(sample("query-a100-sxm4-header-no-used.csv"))
    assert [g["memory_used_mib"] for g in gpus] == [None, None]
    assert gpus[1]["driver_version"] == "580.126.16"


def test_query_header_other_order_and_extra_columns() -> None:
    (gpu,) = parse_query_gpu(sample("query-rtx3090-extra-columns.csv"))
    assert gpu == {
        "index": 0,  # no index column: position
        "name": "NVIDIA GeForce RTX 3090",
        "memory_total_mib": 24576,
        "memory_used_mib": 3887,
        "driver_version": "610.57.04",
    }


def test_query_na_values_and_empty_output() -> None:
    assert parse_query_gpu("") == []
    (gpu,) = parse_query_gpu("0, NVIDIA GH200 480GB, [N/A], [N/A], 550.54.15\n")
    assert gpu["memory_total_mib"] is None and gpu["memory_used_mib"] is None


# ----------------------------------------------------------------------------- topo -m


def test_topo_a100_nvswitch_nv12_with_nics() -> None:
    topo = parse_topo_matrix(sample("topo-a100-sxm4-80gb-8gpu.txt"))
    assert topo["gpus"] == [f"GPU{i}" for i in range(8)]
    assert topo["nics"] == ["NIC0", "NIC1", "NIC2"]
    assert topo["summary"] == "nvlink"
    assert topo["nvlink_min"] == 12
    assert topo["nvlink_pairs"] == 28 and topo["pcie_pairs"] == 0
    assert topo["links"]["GPU0"]["GPU7"] == "NV12"
    assert topo["links"]["GPU0"]["NIC0"] == "PXB"
    assert topo["links"]["GPU4"]["NIC2"] == "NODE"
    assert topo["links"]["NIC2"]["NIC1"] == "NODE"  # the last row ends with 'X ' and no cells after
    assert "NIC2" not in topo["links"]["NIC2"]  # the diagonal is dropped
    assert topo["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_3", "NIC2": "mlx5_bond_0"}


def test_topo_h100_nv18_eight_nics() -> None:
    topo = parse_topo_matrix(sample("topo-h100-80gb-hbm3-8gpu.txt"))
    assert topo["summary"] == "nvlink" and topo["nvlink_min"] == 18
    assert len(topo["nics"]) == 8
    assert [topo["links"][f"GPU{i}"][f"NIC{i}"] for i in range(8)] == ["PIX"] * 8
    assert topo["links"]["GPU0"]["NIC4"] == "SYS"
    assert topo["nic_names"]["NIC7"] == "mlx5_7"


def test_topo_pcie_box() -> None:
    topo = parse_topo_matrix(sample("topo-pcie-5gpu-rtx.txt"))
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4"]
    assert topo["nics"] == []
    assert topo["summary"] == "pcie" and topo["nvlink_min"] is None
    assert topo["links"]["GPU1"]["GPU2"] == "PHB"
    assert topo["links"]["GPU0"]["GPU4"] == "SYS"
    assert topo["links"]["GPU3"]["GPU1"] == "NODE"


def test_topo_tab_separated_with_short_nic_rows() -> None:
    topo = parse_topo_matrix(sample("topo-pcie-8x4090-tabs.txt"))
    assert len(topo["gpus"]) == 8 and topo["nics"] == ["NIC0", "NIC1"]
    assert topo["summary"] == "pcie" and topo["pcie_pairs"] == 28
    assert topo["links"]["GPU6"]["NIC0"] == "PHB"
    assert topo["links"]["NIC0"]["NIC1"] == "PIX"


def test_topo_pair_bridged_pcie_box_is_pcie_and_tolerates_missing_rows() -> None:
    topo = parse_topo_matrix(sample("topo-a100-pcie-nvlink-pairs-truncated.txt"))
    assert topo["summary"] == "pcie"
    assert topo["nvlink_pairs"] == 4 and topo["pcie_pairs"] == 24
    assert topo["links"]["GPU6"]["GPU7"] == "NV12"
    assert topo["links"]["GPU6"]["NIC0"] == "PHB"  # the empty CPU Affinity cell shifts nothing
    assert "NIC0" not in topo["links"]  # the NIC0 row was cut off in the source


def test_topo_nothing_to_parse() -> None:
    assert parse_topo_matrix("")["summary"] == "none"
    single = "        GPU0    CPU Affinity    NUMA Affinity\nGPU0     X      0-15    0\n"
    assert parse_topo_matrix(single)["summary"] == "none"


# ----------------------------------------------------------------------------- collect()


class ScriptedRunner:
    """Answers commands from a script (first argv word after the program) and records calls."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        for key, answer in self.answers.items():
            if key in " ".join(argv):
                return answer
        raise AssertionError(f"unexpected command {argv}")

    def assert_ran(self, fragment: str) -> None:
        assert any(fragment in " ".join(c) for c in self.calls), self.calls


TORCH_JSON = json.dumps(
    {
        "torch": "2.4.1+cu121",
        "cuda": "12.1",
        "cuda_available": True,
        "device_count": 8,
        "nccl": "2.20.5",
        "gloo": True,
    }  # fmt: skip
)


def test_collect_gpu_node(tmp_path: Path) -> None:
    run = ScriptedRunner(
        {
            "--query-gpu": (0, sample("query-a100-sxm4-8gpu-noheader-nounits.csv"), ""),
            "topo -m": (0, sample("topo-a100-sxm4-80gb-8gpu.txt"), ""),
            "-c": (0, TORCH_JSON + "\n", ""),
        }
    )
    report = collect(str(tmp_path), run=run, which=lambda name: f"/usr/bin/{name}")
    run.assert_ran("--format=csv,noheader,nounits")
    assert len(report["gpus"]) == 8 and report["gpu_error"] is None
    assert report["topology"]["summary"] == "nvlink"
    assert report["torch"]["nccl"] == "2.20.5"
    assert report["disk"]["free_bytes"] > 0
    assert report["master_port"] is None
    json.dumps(report)  # one JSON-able object


def test_collect_node_without_nvidia_smi_does_not_fail(tmp_path: Path) -> None:
    run = ScriptedRunner(
        {"-c": (0, json.dumps({"torch": None, "error": "ModuleNotFoundError"}), "")}
    )
    report = collect(str(tmp_path / "not" / "yet"), run=run, which=lambda name: None)
    assert report["gpus"] == [] and report["gpu_error"] == "nvidia-smi not found"
    assert report["topology"] is None
    assert report["torch"] is None and "ModuleNotFoundError" in report["torch_error"]
    assert report["disk"]["measured_at"] == str(tmp_path)  # nearest existing parent


def test_a_torch_import_that_runs_past_the_probes_time_is_told_apart(tmp_path: Path) -> None:
    """run_command's timeout (124, its own words) is flagged; a probe that exits otherwise
    without its line is not, whatever it printed."""
    slow = collect(str(tmp_path), run=ScriptedRunner({"-c": (124, "", "timed out after 30s")}),
                   which=lambda name: None)
    assert slow["torch"] is None and slow["torch_timed_out"] is True
    assert slow["torch_error"].endswith(": timed out after 30s")
    crashed = collect(str(tmp_path), run=ScriptedRunner(
        {"-c": (139, "", "timed out after 30s")}), which=lambda name: None)
    assert crashed["torch_timed_out"] is False
    real = preflight.run_command(["sleep", "5"], timeout=0.2)
    assert real == (124, "", "timed out after 0.2s")


def test_collect_driver_broken() -> None:
    broken = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    run = ScriptedRunner({"--query-gpu": (9, broken, ""), "-c": (0, TORCH_JSON, "")})
    report = collect(".", run=run, which=lambda name: "/usr/bin/nvidia-smi")
    assert report["gpus"] == [] and broken in report["gpu_error"]


def test_torch_probe_with_the_real_python() -> None:
    """The probe script runs in this python; it reports torch when installed, null otherwise."""
    report = collect(".", which=lambda name: None)
    try:
        import torch
    except ImportError:
        assert report["torch"] is None
    else:
        assert report["torch"]["torch"] == torch.__version__
        assert report["torch"]["gloo"] is True


# ----------------------------------------------------------------------------- master port


def test_probe_port_open_refused_and_taken() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        opened = probe_port("127.0.0.1", port, 2.0)
        assert opened["status"] == "open" and opened["reachable"]
        assert opened["bindable"] is False  # on the master: torchrun would hit EADDRINUSE
    refused = probe_port("127.0.0.1", port, 2.0)
    assert refused["status"] == "refused" and refused["reachable"] is True
    assert probe_port("no-such-host.invalid", 29500, 2.0)["status"] == "unresolvable"


def test_main_json_is_one_object_on_a_cpu_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        preflight.main("preflight", ["--json", "--master-addr", "127.0.0.1", "--master-port", "1"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["master_port"]["port"] == 1
    assert "gpus" in report and "disk" in report


def test_cli_entry_point_runs_with_stdlib_only() -> None:
    """`python -m remote preflight` works and does not import provision or torch in-process."""
    code = (
        "import sys, runpy; sys.argv=['remote','preflight','--json'];"
        "import remote.cli as c; rc=c.main(sys.argv[1:]);"
        "assert 'provision' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules);"
        "raise SystemExit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == 1
