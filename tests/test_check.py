"""provision/nodes/checks.py: findings over preflight reports and judging an all-reduce sweep."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from provision.nodes.checks import (
    REFERENCE_BUSBW_GBPS,
    Finding,
    bandwidth_rows,
    compare_preflights,
    guess_interconnect,
    preflight_rows,
    render_findings_table,
    summarize_bandwidth,
)
from remote.preflight import parse_query_gpu, parse_topo_matrix

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"
GiB = 2**30


def a100_node(port_status: str = "refused") -> dict[str, Any]:
    """A preflight report built from the real A100 captures."""
    return {
        "schema": 1,
        "host": "ip-10-0-0-1",
        "gpus": parse_query_gpu((DATA / "query-a100-sxm4-8gpu-noheader-nounits.csv").read_text()),
        "gpu_error": None,
        "topology": parse_topo_matrix((DATA / "topo-a100-sxm4-80gb-8gpu.txt").read_text()),
        "torch": {"torch": "2.4.1+cu121", "cuda": "12.1", "nccl": "2.20.5", "cuda_available": True},
        "torch_error": None,
        "disk": {"path": "/work", "free_bytes": 500 * GiB, "total_bytes": 1000 * GiB},
        "master_port": {"addr": "10.0.0.1", "port": 29500, "status": port_status,
                        "reachable": port_status in ("open", "refused")},
    }  # fmt: skip


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def test_identical_nodes_have_no_findings() -> None:
    assert compare_preflights({"node-0": a100_node(), "node-1": a100_node()}, 8) == []
    assert render_findings_table([])[1] == ("ok", "all", "all", "no mismatch found")


def test_version_mismatches_are_errors_naming_nodes() -> None:
    odd = a100_node()
    odd["torch"] = {"torch": "2.3.0+cu121", "cuda": "12.1", "nccl": "2.19.3"}
    odd["gpus"] = [dict(g, driver_version="535.161.08") for g in odd["gpus"]]
    found = by_check(compare_preflights({"node-0": a100_node(), "node-1": odd}, 8))
    assert set(found) == {"torch-version", "nccl-version", "driver-version"}
    assert found["torch-version"].severity == "error"
    assert "node-0=2.4.1+cu121" in found["torch-version"].message
    assert "node-1=2.3.0+cu121" in found["torch-version"].message
    assert found["driver-version"].nodes == ("node-0", "node-1")


def test_mixed_gpu_models_and_fewer_gpus() -> None:
    rtx = a100_node()
    rtx["gpus"] = [
        {"index": i, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576,
         "memory_used_mib": 0, "driver_version": "550.163.01"} for i in range(4)
    ]  # fmt: skip
    rtx["topology"] = parse_topo_matrix((DATA / "topo-pcie-5gpu-rtx.txt").read_text())
    found = by_check(compare_preflights({"node-0": a100_node(), "node-1": rtx}, 8))
    assert (
        "A100-SXM4-80GB" in found["gpu-model"].message and "RTX 3090" in found["gpu-model"].message
    )
    assert found["gpu-count"].nodes == ("node-1",) and "node-1=4" in found["gpu-count"].message
    assert found["topology"].severity == "warning"


def test_cpu_node_is_info_not_failure() -> None:
    cpu = a100_node()
    cpu.update(gpus=[], gpu_error="nvidia-smi not found", topology=None)
    cpu["torch"] = {"torch": "2.4.1+cu121", "cuda": "12.1", "nccl": None}
    found = compare_preflights({"node-0": cpu, "node-1": copy.deepcopy(cpu)}, None)
    assert [(f.severity, f.check) for f in found] == [("info", "no-gpu")]


def test_unreachable_port_taken_port_low_disk_missing_torch_failed_preflight() -> None:
    blocked = a100_node("timeout")
    master = a100_node("open")
    master["master_port"]["bindable"] = False
    master["disk"]["free_bytes"] = 1 * GiB
    notorch = a100_node()
    notorch.update(torch=None, torch_error="ModuleNotFoundError: No module named 'torch'")
    notorch["disk"]["free_bytes"] = 5 * GiB
    reports = {
        "node-0": master,
        "node-1": blocked,
        "node-2": notorch,
        "node-3": {"error": "ssh: timed out"},
    }
    found = compare_preflights(reports, 8)
    checks = [(f.severity, f.check, f.nodes) for f in found]
    assert ("error", "preflight", ("node-3",)) in checks
    assert ("error", "torch", ("node-2",)) in checks
    assert ("error", "master-port", ("node-0",)) in checks  # taken on the master
    assert ("error", "master-port", ("node-1",)) in checks  # dropped by a firewall
    assert ("error", "disk", ("node-0",)) in checks
    assert ("warning", "disk", ("node-2",)) in checks
    assert [f.severity for f in found] == sorted(
        (f.severity for f in found), key=["error", "warning", "info"].index
    )
    rows = render_findings_table(found)
    assert rows[0] == ("severity", "check", "nodes", "finding") and len(rows) == len(found) + 1
    table = preflight_rows(reports)
    assert table[1][:2] == ("node-0", "8 x NVIDIA A100-SXM4-80GB")
    assert table[4][1].startswith("error: ssh")


def sweep(times_us: list[list[float]], busbw: float, hosts: list[str]) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for i, times in enumerate(times_us):
        size = 2**20 * 2**i
        lines.append({"size_bytes": size, "count": size // 4, "time_us": max(times),
                      "algbw_gbps": busbw / 1.75, "busbw_gbps": busbw, "rank_time_us": times})  # fmt: skip
    lines.append({"summary": True, "hosts": hosts, "world_size": len(hosts)})
    return lines


def test_bandwidth_ok_on_nvlink3() -> None:
    result = summarize_bandwidth(
        sweep([[100.0, 101.0, 99.0, 100.0]] * 3, 228.0, ["a", "a", "b", "b"]), "nvlink3"
    )
    assert result.verdict == "ok" and result.slow_ranks == () and result.findings == ()
    assert result.expected_busbw_gbps == REFERENCE_BUSBW_GBPS["nvlink3"]


def test_slow_link_and_slow_rank_are_named() -> None:
    times = [
        [100.0, 100.0, 310.0, 100.0],
        [200.0, 205.0, 650.0, 199.0],
        [400.0, 400.0, 410.0, 400.0],
    ]
    result = summarize_bandwidth(sweep(times, 4.1, ["n0", "n0", "n1", "n1"]), "ib-hdr")
    assert result.verdict == "slow" and result.fraction_of_expected is not None
    (slow,) = result.slow_ranks
    assert (slow.rank, slow.host, slow.sizes_slow) == (2, "n1", 2)
    assert slow.ratio > 3
    messages = " | ".join(f.message for f in result.findings)
    assert "rank 2 on n1" in messages and "ib-hdr" in messages


def test_unknown_interconnect_and_failed_run() -> None:
    result = summarize_bandwidth([{"error": "RuntimeError: NCCL error", "rank": "0"}], "cpu-gloo")
    assert result.verdict == "unknown" and result.peak_busbw_gbps == 0.0
    assert result.findings[0].check == "bandwidth"


def test_rows_and_interconnect_guess() -> None:
    rows = bandwidth_rows(sweep([[100.0, 100.0]], 20.0, ["a", "b"]))
    assert rows[0][0] == "size (B)" and rows[1][0] == str(2**20)
    assert guess_interconnect(a100_node(), 1) == "nvlink3"
    h100 = a100_node()
    h100["topology"] = parse_topo_matrix((DATA / "topo-h100-80gb-hbm3-8gpu.txt").read_text())
    assert guess_interconnect(h100, 1) == "nvlink4"
    assert guess_interconnect(h100, 2) is None
