"""provision/job/gate/ (judge.py, separate.py): the judging of the nodes' output, and the gate before a job through a
fake transport that streams real captured NCCL logs. (The pairwise schedule itself is tested in
tests/remote/test_allreduce.py.)

The JSON result lines (`{"busbw_gbps": ...}`, `{"pair": ...}`) in these tests are SYNTHETIC:
they are remote.pyz allreduce's own format, written here with chosen figures. The NCCL lines
are real (tests/data/logs/SOURCES.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_nodes import FakeConnector

from provision.cluster.providers.aws.catalog import fabric_expectation as aws_fabric
from provision.cluster.providers.gcp.catalog import fabric_expectation as gcp_fabric
from provision.job.gate.fabric import FIXES
from provision.job.gate.judge import (
    BUSBW_FAIL_FRACTION,
    PAIR_SLOW_FRACTION,
    FabricGateError,
    evaluate,
    render_table,
    should_run,
)
from provision.job.gate.separate import gate_before_job, gate_job, node_program, run_gate
from provision.job.gate.words import SLOW_FABRIC_FIX, SLOW_LINK_FIX, SLOW_NODE_FIX
from provision.model.inventory import FabricExpectation, Inventory, InventoryStore, NodeRecord
from provision.model.keys import ensure_cluster_key
from provision.model.spec import build_job_spec
from provision.nodes import NodeGroup
from remote.allreduce import slow_pairs
from remote.gatejudge import pair_fraction

LOGS = Path(__file__).resolve().parent / "data" / "logs"
EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


# ----------------------------------------------------------------------------- judging
def inventory(n: int, fabric: FabricExpectation | None = None, slots: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=slots, host_key="ssh-ed25519 AAAA")
             for r in range(n)]
    return Inventory(name="gate", provider="docker", nodes=nodes, status="ready", fabric=fabric)


def raw(*items: dict[str, Any] | str) -> str:
    """What a node prints (JSON records as remote.pyz prints them)."""
    return "".join(f"{json.dumps(i) if isinstance(i, dict) else i}\n" for i in items)


def lines(node: str, *items: dict[str, Any] | str) -> str:
    """The same as launch streams it: every line `[node] `-prefixed."""
    return "".join(f"[{node}] {line}\n" for line in raw(*items).splitlines())


def summary(busbw: float, world: int, backend: str = "gloo", pairwise: bool = True) -> dict[str, Any]:
    # SYNTHETIC record in remote.pyz allreduce's format
    return {"summary": True, "backend": backend, "world_size": world, "max_busbw_gbps": busbw,
            "avg_busbw_gbps": busbw, "hosts": [], "sizes": 1, "pairwise": pairwise}


def pair(a: int, b: int, bw: float, rnd: int, confirm: bool = False) -> dict[str, Any]:
    return {"pair": [a, b], "round": rnd, "busbw_gbps": bw, "confirm": confirm}  # SYNTHETIC


def test_a_throttled_node_of_three_is_named() -> None:
    out = (lines("node-0", summary(0.0024, 3), pair(0, 2, 0.0024, 1), pair(0, 1, 0.8, 2),
                 pair(0, 2, 0.0023, 0, confirm=True))
           + lines("node-1", pair(1, 2, 0.0024, 0), pair(1, 2, 0.0025, 1, confirm=True)))
    record = evaluate(inventory(3), out, 0, mode="on")
    assert record.verdict == "fail"
    verdicts = {n.node: n.verdict for n in record.nodes}
    assert verdicts == {"node-0": "ok", "node-1": "ok", "node-2": "slow"}
    assert any("node-2" in p and "slow node" in p for p in record.problems)
    assert record.fixes[0] == SLOW_NODE_FIX
    assert record.rounds == 3 and record.pair_reference_gbps == pytest.approx(0.8)
    by_nodes = {p.nodes: p for p in record.pairs}
    assert by_nodes[("node-1", "node-2")].measurements == 2
    assert by_nodes[("node-1", "node-2")].busbw_gbps == pytest.approx(0.0025)  # the better one
    assert all(n.transport == "socket" for n in record.nodes)  # gloo
    table = render_table(record)
    assert "node-2" in table and "slow" in table and "likely fix" in table


def test_healthy_nodes_pass() -> None:
    out = (lines("node-0", summary(0.5, 3), pair(0, 2, 0.7, 1), pair(0, 1, 0.8, 2))
           + lines("node-1", pair(1, 2, 0.75, 0)))
    record = evaluate(inventory(3), out, 0, mode="on", seconds=4.2)
    assert record.verdict == "pass" and not record.problems
    assert [n.busbw_gbps for n in record.nodes] == [0.8, 0.8, 0.75]  # each node's best pair
    assert record.summary().startswith("pass")


def test_a_slow_link_names_the_pair_not_the_nodes() -> None:
    pairs = {(0, 1): 0.1, (0, 2): 1.0, (0, 3): 1.0, (1, 2): 1.0, (1, 3): 1.0, (2, 3): 1.0}
    out = lines("node-0", summary(0.9, 4), *(pair(a, b, bw, 0) for (a, b), bw in pairs.items()),
                pair(0, 1, 0.12, 0, confirm=True))
    record = evaluate(inventory(4), out, 0, mode="on")
    assert record.verdict == "fail"
    assert {n.node: n.verdict for n in record.nodes} == {
        "node-0": "slow link", "node-1": "slow link", "node-2": "ok", "node-3": "ok"}
    assert any("node-0 <-> node-1" in p for p in record.problems)
    assert SLOW_LINK_FIX in record.fixes


def test_on_gloo_a_busy_cpu_halving_a_pair_twice_is_not_a_slow_link() -> None:
    # the figures of a CI run (2026-12-02) on a healthy 3-node docker cluster: (0, 1) at half
    # the median pair, in both measurements
    figures = [pair(0, 2, 0.632, 0), pair(1, 2, 0.835, 1), pair(0, 1, 0.417, 2),
               pair(0, 1, 0.417, 3, confirm=True)]
    on_gloo = evaluate(inventory(3), lines("node-0", summary(0.3, 3), *figures), 0, mode="on")
    assert on_gloo.verdict == "pass", on_gloo.problems
    assert "(25% of median pair)" in render_table(on_gloo)
    # the same figures from NCCL (GPU nodes): half the median pair is a slow link
    on_nccl = evaluate(inventory(3), lines("node-0", summary(0.3, 3, "nccl"), *figures), 0,
                       mode="on")
    assert on_nccl.verdict == "fail"
    assert any("slow link: node-0 <-> node-1" in p for p in on_nccl.problems)
    assert "(50% of median pair)" in render_table(on_nccl)


def test_the_pair_line_is_the_judges_on_either_backend() -> None:
    assert pair_fraction(PAIR_SLOW_FRACTION, "nccl") == PAIR_SLOW_FRACTION
    assert pair_fraction(PAIR_SLOW_FRACTION, None) == PAIR_SLOW_FRACTION
    assert pair_fraction(PAIR_SLOW_FRACTION, "gloo") == PAIR_SLOW_FRACTION / 2
    # the nodes choose which pairs to measure again with the same line
    first = {(0, 1): 0.3, (0, 2): 1.0, (1, 2): 1.0}  # 30 %: below 1/2, above 1/4
    assert slow_pairs(first, pair_fraction(PAIR_SLOW_FRACTION, "nccl")) == [(0, 1)]
    assert slow_pairs(first, pair_fraction(PAIR_SLOW_FRACTION, "gloo")) == []


def test_a_pair_is_slow_only_when_both_measurements_are() -> None:
    # (0, 2) was below the line, then fine when measured again: that raises the reference
    # above (0, 3) and (1, 2), which were measured once (above the line at the time)
    out = lines("node-0", summary(0.3, 4), pair(0, 3, 0.379, 0), pair(1, 2, 0.39, 0),
                pair(0, 2, 0.368, 1), pair(1, 3, 0.615, 1), pair(0, 1, 0.858, 2),
                pair(2, 3, 0.644, 2), pair(0, 2, 0.887, 0, confirm=True))
    record = evaluate(inventory(4), out, 0, mode="on")
    assert record.verdict == "pass", record.problems
    assert record.pair_reference_gbps == pytest.approx((0.887 + 0.858) / 2)


def test_two_nodes_cannot_blame_one() -> None:
    out = lines("node-0", summary(0.001, 2), pair(0, 1, 0.001, 0))
    record = evaluate(inventory(2), out, 0, mode="on")
    assert record.verdict == "pass"  # relative judgement needs a third node
    assert any("2 nodes" in n for n in record.notes)


def test_a_run_that_did_not_finish_fails_with_the_diagnosis() -> None:
    out = lines("node-1", "[rank2]: RuntimeError: Gloo connectFullMesh failed with "
                          "pair.cc:152 timed out connecting: SO_ERROR: Connection refused")
    record = evaluate(inventory(3), out, 1, mode="on")
    assert record.verdict == "fail"
    assert "did not finish" in record.problems[0]
    assert all(n.verdict == "not measured" for n in record.nodes)
    assert any("GLOO_SOCKET_IFNAME" in f for f in record.fixes)  # diagnose.py's gloo-reset


def test_below_the_published_figure_without_a_culprit() -> None:
    fabric = aws_fabric("p4d.24xlarge")
    # SYNTHETIC figures: every pair equally slow (SkyPilot's non-EFA 2 x p4d figure)
    out = (lines("node-0", summary(4.13, 24, "nccl"), pair(0, 1, 4.1, 0), pair(0, 2, 4.2, 1))
           + lines("node-1", pair(1, 2, 4.0, 2)))
    record = evaluate(inventory(3, fabric, 8), out, 0, mode="auto")
    assert record.verdict == "fail"
    assert record.threshold_gbps == pytest.approx(BUSBW_FAIL_FRACTION * 77.35)
    assert any("5.3% of the 77.35 GB/s" in p for p in record.problems)
    assert SLOW_FABRIC_FIX in record.fixes


# ----------------------------------------------------------------------------- deciding
def test_modes() -> None:
    p5 = aws_fabric("p5.48xlarge")
    assert should_run(inventory(2, p5), "auto")[0]
    assert not should_run(inventory(2), "auto")[0]  # docker/ssh: no catalog figure
    assert should_run(inventory(2), "on")[0]
    assert not should_run(inventory(2, p5), "off")[0]
    run, why = should_run(inventory(1, p5), "on")
    assert not run and "single node" in why


def test_node_program_and_gate_job() -> None:
    assert "--pairwise-below inf" in " ".join(node_program(inventory(3)))
    p4d = node_program(inventory(3, aws_fabric("p4d.24xlarge")))
    assert p4d[p4d.index("--pairwise-below") + 1] == "38.675"
    job = build_job_spec({}, {"script": EXAMPLE, "env": {"NCCL_DEBUG_FILE": "/tmp/x",  # noqa: S108
                                                          "FI_PROVIDER": "efa"},
                              "nproc_per_node": 4, "master_port": 29555, "image": "img:1"})
    gate = gate_job(job)
    assert gate.env["NCCL_DEBUG"] == "INFO" and gate.env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert "NCCL_DEBUG_FILE" not in gate.env and gate.env["FI_PROVIDER"] == "efa"
    assert (gate.nproc_per_node, gate.master_port, gate.image) == (4, 29555, "img:1")
    assert gate.launcher == "torchrun" and not gate.rdzv
    assert gate_job(job, gpus=False).nproc_per_node == 1


# --------------------------------------------- the same code path, on captured NCCL logs
def captured(log: str) -> str:
    return (LOGS / log).read_text()


def fake_nodes(inv: Inventory, outputs: dict[str, str], gpus: int = 8) -> FakeConnector:
    fake = FakeConnector()
    fake.on(r"nvidia-smi", stdout=f"{gpus}\n")
    for node, text in outputs.items():
        fake.on(r"torchrun", node=node, stream=text)
    return fake


@pytest.fixture
def store(mgpu_home: Path) -> InventoryStore:
    return InventoryStore()


def saved(inv: Inventory, store: InventoryStore) -> Inventory:
    inv.key_path = str(ensure_cluster_key(store.keys_dir(inv.name))[0])
    store.create(inv)
    return inv


def test_efa_type_on_sockets_fails_before_the_job_with_the_fix(store: InventoryStore) -> None:
    inv = saved(inventory(2, aws_fabric("p4d.24xlarge"), slots=8), store)
    # the real p4d log where aws-ofi-nccl failed and NCCL fell back to sockets, on both nodes
    node0 = raw(*captured("nccl-efa-fallback-socket-p4d.log").splitlines(),
                  summary(4.13, 16, "nccl", pairwise=True), pair(0, 1, 4.13, 0))
    node1 = raw(*captured("nccl-efa-fallback-socket-p4d.log").splitlines())
    fake = fake_nodes(inv, {"node-0": node0, "node-1": node1})
    job = build_job_spec({}, {"script": EXAMPLE, "env": {"NCCL_DEBUG": "WARN"}})
    logged: list[str] = []
    with pytest.raises(FabricGateError) as err:
        gate_before_job(inv, job, store=store, log=logged.append,
                        group=NodeGroup(inv, connector=fake))
    assert "socket instead of efa on node-0, node-1" in err.value.message
    assert "fi_info -p efa" in (err.value.hint or "")
    assert err.value.exit_code == 8  # a LaunchError: the job was not started
    table = "\n".join(logged)
    assert "wrong transport" in table and "NET/Socket" not in err.value.message
    assert FIXES["efa"] in table
    # the diagnosis signatures saw the plugin's NCCL WARN lines too
    assert "memlock" in table
    # what ran: torchrun with NCCL's INFO lines on (the job's NCCL_DEBUG=WARN overridden)
    command = fake.assert_ran("node-0", r"torchrun")
    assert "NCCL_DEBUG=INFO" in command and "--nproc_per_node 8" in command
    assert "--gate" in command and "--pairwise-below 38.675" in command
    kept = store.load("gate").fabric_gate
    assert kept is not None and kept.verdict == "fail" and not kept.overridden


def test_tcpx_type_on_sockets_fails_with_the_tcpx_fix() -> None:
    inv = inventory(2, gcp_fabric("a3-highgpu-8g"), slots=8)
    socket = captured("nccl-socket-gcp.log").splitlines()
    # SYNTHETIC figure: SkyPilot's a3-highgpu-8g run without TCPX measured 19.39 GB/s at 2 GB
    outputs = {"node-0": raw(*socket, summary(19.39, 16, "nccl")),
               "node-1": raw(*socket)}
    fake = fake_nodes(inv, outputs)
    record = run_gate(inv, None, mode="auto", log=lambda m: None,
                      group=NodeGroup(inv, connector=fake))
    assert record.verdict == "fail"
    assert [n.transport for n in record.nodes] == ["socket", "socket"]
    assert FIXES["tcpx"] in record.fixes
    assert any("below" not in p and "socket instead of tcpx" in p for p in record.problems)
    assert any("22% of the 88.18 GB/s" in p for p in record.problems)


def test_efa_in_use_at_the_expected_speed_passes(store: InventoryStore) -> None:
    inv = saved(inventory(2, aws_fabric("p5.48xlarge"), slots=8), store)
    efa = captured("nccl-efa-p5en.log").splitlines()
    outputs = {"node-0": raw(*efa, summary(401.0, 16, "nccl", pairwise=False)),
               "node-1": raw(*efa)}
    job = build_job_spec({}, {"script": EXAMPLE})
    logged: list[str] = []
    record = gate_before_job(inv, job, store=store, log=logged.append,
                             group=NodeGroup(inv, connector=fake_nodes(inv, outputs)))
    assert record is not None and record.verdict == "pass"
    assert [n.transport for n in record.nodes] == ["efa", "efa"]
    assert any("fabric gate: pass" in m and "efa" in m for m in logged)


def test_allow_slow_network_goes_on_with_a_warning(store: InventoryStore) -> None:
    inv = saved(inventory(2, aws_fabric("p4d.24xlarge"), slots=8), store)
    socket = captured("nccl-efa-fallback-socket-p4d.log").splitlines()
    outputs = {"node-0": raw(*socket, summary(4.13, 16, "nccl")),
               "node-1": raw(*socket)}
    job = build_job_spec({}, {"script": EXAMPLE, "allow_slow_network": True})
    logged: list[str] = []
    record = gate_before_job(inv, job, store=store, log=logged.append,
                             group=NodeGroup(inv, connector=fake_nodes(inv, outputs)))
    assert record is not None and record.verdict == "fail" and record.overridden
    assert any(m.startswith("warning: the fabric gate failed") for m in logged)
    assert "(ran anyway)" in store.load("gate").fabric_gate.summary()  # type: ignore[union-attr]


def test_cpu_nodes_run_one_process_each_and_auto_skips_docker(store: InventoryStore) -> None:
    inv = saved(inventory(3), store)
    fake = fake_nodes(inv, {"node-0": raw(summary(0.5, 3, pairwise=False))}, gpus=0)
    job = build_job_spec({}, {"script": EXAMPLE})
    assert gate_before_job(inv, job, store=store, log=print,
                           group=NodeGroup(inv, connector=fake)) is None  # auto, no fabric
    assert fake.commands("node-0") == []
    job = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on"})
    gate_before_job(inv, job, store=store, log=print, group=NodeGroup(inv, connector=fake))
    assert "--nproc_per_node 1 " in fake.assert_ran("node-0", r"torchrun")
