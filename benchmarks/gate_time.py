"""Time the fabric gate on N = 2, 4, 8 docker nodes beside its floor, in one run, and count the
pairwise rounds as a function of N.

    floor(N) = the cheapest torch job of the same shape on the same nodes, through the same
               launch path (torchrun on every node, one process per CPU node, as the gate):
               `remote.pyz allreduce` of one 4-byte all-reduce. Starting torchrun, importing
               torch and meeting in a process group: what ANY job pays, gate or not.
    gate(N)  = provision.job.gate.separate.run_gate (`--fabric-check on`): the GPU probe, the bounded
               all-reduce over every rank, the pairwise rounds (always on docker: no catalog
               figure), and the judging.
    gate - floor = what the gate's measuring adds on top of starting a torch job.

floor and gate alternate on the same cluster (same connections), `--repeat` times; medians.
The rounds table is pure (remote.allreduce.round_robin): n - 1 rounds for even n, n for odd n,
capped at provision.job.gate.judge.MAX_PAIR_ROUNDS.
Usage: python benchmarks/gate_time.py [--repeat 3] [--nodes 2 4 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FLOOR = ["@root/remote.pyz", "allreduce", "--min-bytes", "4", "--max-bytes", "4",
         "--iters", "1", "--warmup", "0"]


def rounds_table(sizes: list[int]) -> None:
    from provision.job.gate.judge import MAX_PAIR_ROUNDS
    from remote.allreduce import round_robin

    print("pairwise rounds by node count (every pair once, capped at "
          f"{MAX_PAIR_ROUNDS} rounds):")
    print(f"  {'N':>4} {'rounds':>7} {'pairs/round':>12} {'pairs':>6} {'all pairs':>10}")
    for n in sizes:
        schedule = round_robin(n, MAX_PAIR_ROUNDS)
        pairs = sum(len(r) for r in schedule)
        print(f"  {n:>4} {len(schedule):>7} {n // 2:>12} {pairs:>6} {n * (n - 1) // 2:>10}")


def bench(n: int, repeat: int, log: dict[int, str]) -> tuple[list[float], list[float], int, int]:
    from provision.cluster import pipeline
    from provision.job.gate.separate import gate_job, run_gate
    from provision.job.programs import run_remote_program
    from provision.model.inventory import InventoryStore
    from provision.model.spec import build_cluster_spec
    from provision.nodes import NodeGroup

    store = InventoryStore()
    spec = build_cluster_spec({}, {"provider": "docker", "nodes": n, "name": f"bench-gate-{n}"})
    inv = pipeline.up(spec, confirm=lambda plan: True, store=store, log=lambda m: None)
    assert inv is not None
    floors: list[float] = []
    gates: list[float] = []
    rounds = pairs = 0
    try:
        with NodeGroup(inv) as group:
            group.run("true").raise_for("ssh")
            for _ in range(repeat):
                t0 = time.perf_counter()
                code, out = run_remote_program(inv, gate_job(None, gpus=False), FLOOR,
                                               log=lambda m: None, group=group)
                assert code == 0, out[-2000:]
                floors.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                record = run_gate(inv, None, mode="on", log=lambda m: None, group=group)
                gates.append(time.perf_counter() - t0)
                assert record.verdict == "pass", record.problems
                rounds, pairs = record.rounds, len(record.pairs)
                log[n] = (f"N={n}: last gate: busbw {record.busbw_gbps:.3g} GB/s, pair "
                          f"reference {record.pair_reference_gbps:.3g} GB/s, "
                          f"{sum(p.measurements > 1 for p in record.pairs)} pair(s) measured "
                          "twice")
    finally:
        pipeline.down(inv.name, store=store, log=lambda m: None)
    return floors, gates, rounds, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    rounds_table([2, 3, 4, 8, 16, 17, 32, 64])
    print()
    with tempfile.TemporaryDirectory() as home:
        os.environ["MGPU_CLOUD_HOME"] = home
        rows = []
        notes: dict[int, str] = {}
        for n in args.nodes:
            floors, gates, rounds, pairs = bench(n, args.repeat, notes)
            rows.append((n, statistics.median(floors), statistics.median(gates), rounds, pairs,
                         floors, gates))
    print(f"fabric gate on docker nodes (CPU, gloo, 1 process per node), medians of "
          f"{args.repeat}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  {'N':>3} {'floor s':>8} {'gate s':>7} {'gate-floor':>10} {'rounds':>7} "
          f"{'pairs':>6}   runs (floor | gate)")
    for n, floor_s, gate_s, rounds, pairs, floors, gates in rows:
        runs = (" ".join(f"{x:.1f}" for x in floors) + " | "
                + " ".join(f"{x:.1f}" for x in gates))
        print(f"  {n:>3} {floor_s:>8.2f} {gate_s:>7.2f} {gate_s - floor_s:>10.2f} {rounds:>7} "
              f"{pairs:>6}   {runs}")
    for note in notes.values():
        print(f"  {note}")


if __name__ == "__main__":
    main()
