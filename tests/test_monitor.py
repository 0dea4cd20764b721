"""monitor on the controller: one channel per node for the live view, one sample each for
--once, and the table rows (GPU rows; CPU/memory/load for nodes without GPUs)."""

from __future__ import annotations

import json

from fake_nodes import FakeConnector
from kit import until

from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import NodeGroup
from provision.operations.monitor import LiveMonitor, snapshot, table_rows

SAMPLE = {"host": "node-0", "cpu_pct": 12.5, "cpus": 8, "mem_used_mib": 2048,
          "mem_total_mib": 8192, "load": [0.5, 0.25, 0.0], "gpus": [], "gpu_source": None,
          "gpu_error": "nvidia-smi not found"}
GPU = {"index": 0, "name": "NVIDIA H200", "util_pct": 87.0, "mem_used_mib": 102400,
       "mem_total_mib": 143771, "power_w": 512.3, "temp_c": 61.0, "sm_active": 0.55}


def _inv() -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}") for r in range(2)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def test_snapshot_lists_every_node_even_an_unreachable_one() -> None:
    inv = _inv()
    fake = FakeConnector()
    fake.on(r"monitor --count 1", stdout=json.dumps(SAMPLE) + "\n")
    fake.unreachable("node-1")
    samples = snapshot(NodeGroup(inv, connector=fake))
    assert [s["node"] for s in samples] == ["node-0", "node-1"]
    assert samples[0]["cpu_pct"] == 12.5 and "error" in samples[1]


def test_rows_for_cpu_and_gpu_nodes() -> None:
    rows = table_rows([
        {"node": "node-0", **SAMPLE},
        {"node": "node-1", **SAMPLE, "gpus": [GPU]},
        {"node": "node-2", "error": "No route to host"},
    ])
    assert rows[0] == ("node-0", "cpu x8", "12", "2.0/8.0 GiB", "-", "-", "0.50 0.25 0.00")
    assert rows[2] == ("node-1", "gpu0 NVIDIA H200", "87 (sm 55)", "100.0/140.4 GiB", "512 W",
                       "61 C", "")
    assert rows[3][0] == "node-2" and rows[3][-1] == "No route to host"


def test_live_monitor_keeps_one_channel_per_node() -> None:
    inv = _inv()
    fake = FakeConnector()
    lines = json.dumps(SAMPLE) + "\n" + json.dumps({**SAMPLE, "cpu_pct": 99.0}) + "\n"
    fake.on(r"monitor --interval", stream=lines)
    live = LiveMonitor(inv, 0.1, group=NodeGroup(inv, connector=fake))
    live.start()
    # each node's second sample (its channel is kept: one command per node, read on)
    until(lambda: [s.get("cpu_pct") for s in live.latest()] == [99.0, 99.0], 90,
          what="both nodes' second sample")
    latest = live.latest()
    live.close()
    assert [s["cpu_pct"] for s in latest] == [99.0, 99.0]
    assert sorted(fake.connected) == ["node-0", "node-1"]
    assert all(len(fake.commands(n)) == 1 for n in ("node-0", "node-1"))
