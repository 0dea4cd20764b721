"""Synthetic state for dashboard tests: what the CLI would have written, without clouds.

`make_big_cluster` writes a cluster of N nodes whose addresses answer nothing (127.0.0.1 port
1: refused at once), its fabric gate's pairwise result, recovery replacements, and jobs: one
that succeeded with its logs saved, one failed, one still "running" on the silent nodes.
A removed cluster with a job of its own is in the history too.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from provision.cluster import cost
from provision.model.gate_record import GateNode, GatePair, GateRecord
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, Replacement
from provision.model.jobstore import JobStore, NodeJob
from provision.model.spec import build_cluster_spec

# Two hours ago, so that costs and hours left read like a cluster in use.
T0 = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).replace(second=0, microsecond=0)


def iso(minutes: float) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).isoformat(timespec="seconds")


def train_log(steps: int = 200, every: int = 10) -> list[str]:
    lines = ["rank 0/8 on node-0: local_rank=0 backend=nccl device=cuda:0"]
    for s in range(0, steps, every):
        lines.append(f"step {s} loss {2.0 * 0.97 ** s + 0.01:.4f}")
    lines.append("done: world_size=8 final_loss=0.0712 checkpoint=outputs/checkpoint.pt")
    lines.append("throughput: samples/s=18234.5 (global batch 512, 199 timed steps)")
    return lines


def gate_record(names: list[str], slow: tuple[str, str] | None = None) -> GateRecord:
    """Pairwise rounds over a ring (each node with its +1 and +2 neighbours)."""
    pairs = []
    n = len(names)
    for rnd, hop in enumerate((1, 2), start=1):
        for i in range(n if n > 2 else 1):
            a, b = names[i], names[(i + hop) % n]
            if a == b or any({a, b} == set(p.nodes) for p in pairs):
                continue
            bw = 11.2 + (i % 5) * 0.3
            verdict = "ok"
            if slow and {a, b} == set(slow):
                bw, verdict = 3.1, "slow"
            pairs.append(GatePair(nodes=(a, b), round=rnd, busbw_gbps=bw, verdict=verdict))
    nodes = [GateNode(node=x, transport="ib", busbw_gbps=11.5,
                      verdict="slow link" if slow and x == slow[1] else "ok") for x in names]
    return GateRecord(verdict="fail" if slow else "pass", checked_at=iso(4), mode="auto",
                      seconds=21.0, backend="nccl", world_size=8 * n, busbw_gbps=11.4,
                      expected_transport="ib", threshold_gbps=8.0, pair_reference_gbps=11.6,
                      rounds=2, nodes=nodes, pairs=pairs, overridden=bool(slow),
                      problems=[f"{slow[0]} <-> {slow[1]}: 3.1 GB/s, a quarter of the others"]
                      if slow else [])


def make_big_cluster(home: Path, name: str = "big", nodes: int = 64,
                     provider: str = "aws") -> Inventory:
    """`nodes` p5.48xlarge on AWS at their catalog price (or docker nodes, free)."""
    key = home / "dummy_key"
    home.mkdir(parents=True, exist_ok=True)
    key.write_text("not a key\n")
    fields: dict[str, object] = {"name": name, "nodes": nodes, "max_hours": 12,
                                 "provider": provider}
    if provider == "aws":
        fields["aws"] = {"instance_type": "p5.48xlarge", "region": "us-east-1"}
    spec = build_cluster_spec({}, fields)
    names = [f"node-{i}" for i in range(nodes)]
    inv = Inventory(
        name=name, provider=provider, status="ready", spec=spec, created_at=iso(0),
        nodes=[NodeRecord(name=n, rank=i, address="127.0.0.1", port=1,
                          private_address=f"10.0.{i // 250}.{i % 250 + 2}", slots=8)
               for i, n in enumerate(names)],
        key_path=str(key), hourly_cost_usd=98.32 * nodes if provider == "aws" else 0.0,
        bootstrapped=True,
        replacements=[Replacement(rank=3, old="node-3", new="node-3b", reason="node lost",
                                  at=iso(95))],
        spares=[NodeRecord(name=f"node-{nodes}", rank=nodes, address="127.0.0.1", port=1,
                           private_address="10.9.0.2", slots=8)],  # a warm spare (issue 44)
        fabric_gate=gate_record(names, slow=(names[1], names[2]) if nodes > 2 else None),
    )
    InventoryStore(home).create(inv)
    cost.record_up(inv, home)
    jobs = JobStore(home)
    everyone = {n: NodeJob(rank=i) for i, n in enumerate(names)}
    ok = jobs.new({"cluster": name, "cluster_created_at": inv.created_at,
                   "command": "train.py --steps 200", "launcher": "torchrun",
                   "nodes": {k: v.model_copy() for k, v in everyone.items()},
                   "started_at": iso(5)})
    for nj in ok.nodes.values():
        nj.set("exited", 0)
    ok.state, ok.ended_at, ok.logs_saved = "succeeded", iso(90), True
    hour = 3600.0 * nodes  # its ledger (job/ledger.py): 85 min of the ranks, 1 spare idle
    ok.ledger = {"node_seconds": {"provisioning": 0.05 * hour, "setup": 0.05 * hour,
                                  "training": 1.2 * hour, "recovery": 0.1 * hour,
                                  "spare": 5100.0},
                 "wall_s": 5100.0, "failures": 1, "spares": 1, "save_cost_s": 2.0,
                 "recovery_s": 30.0, "goodput": 0.84, "advice_s": 120.0}
    jobs.save(ok)
    jobs.log_path(ok, names[0]).write_text("\n".join(train_log()) + "\n")
    for n in names[1:]:
        jobs.log_path(ok, n).write_text(f"rank {names.index(n)} on {n}: ok\n")
    bad = jobs.new({"cluster": name, "cluster_created_at": inv.created_at,
                    "command": "train.py --steps 5000", "launcher": "torchrun",
                    "nodes": {k: v.model_copy() for k, v in everyone.items()},
                    "started_at": iso(91)})
    for i, nj in enumerate(bad.nodes.values()):
        nj.set("exited", 1 if i == 3 else 0)
    bad.state, bad.ended_at, bad.logs_saved = "failed", iso(96), True
    jobs.save(bad)
    jobs.new({"cluster": name, "cluster_created_at": inv.created_at,
              "command": "train.py --steps 100000", "launcher": "torchrun",
              "nodes": {k: v.model_copy() for k, v in everyone.items()},
              "started_at": iso(100), "detached": True})
    return inv


def make_removed_cluster(home: Path, name: str = "old-run") -> None:
    spec = build_cluster_spec({}, {"name": name, "nodes": 2, "provider": "aws", "aws": {
        "instance_type": "p4d.24xlarge", "region": "us-east-1"}})
    inv = Inventory(name=name, provider="aws", spec=spec, created_at=iso(-600),
                    hourly_cost_usd=65.54)
    cost.record_up(inv, home)
    cost._append({"event": "down", "cluster": name, "created_at": inv.created_at,  # noqa: SLF001
                  "removed_at": iso(-420)}, home)
    rec = JobStore(home).new({"cluster": name, "cluster_created_at": inv.created_at,
                              "command": "train.py", "launcher": "torchrun",
                              "nodes": {"node-0": NodeJob(rank=0), "node-1": NodeJob(rank=1)},
                              "started_at": iso(-590)})
    rec.state, rec.ended_at = "removed", iso(-421)
    JobStore(home).save(rec)
