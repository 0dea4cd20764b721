"""What a warm spare saves when a node takes minutes to boot (issue 44): node loss -> training
again with a spare beside without one, in one run, every node booting --boot seconds.

    python benchmarks/spare_recovery.py [--boot 120] [--nodes 2] [--repeat 1]
                                        [--how relaunch resident]

For each way (`--how`, as benchmarks/recovery_time.py: a relaunched script or a resident
one) and each repeat, interleaved so that the machine's load hits both alike:
    spare      `run --simulate-boot B --spares 1`: node-1's rank moves to the spare, booted
               with the cluster; a new spare boots in the background
    no spare   `run --simulate-boot B`: node-1's replacement boots B seconds on the critical
               path (docker --simulate-boot: its SSH answers only then, as a cloud VM's)
Each is recovery_time.one: the kill once a checkpoint is kept, then the run's own output
timestamped as it arrives (detection, replacement / bootstrap / restore from its "ready to
restart" line, relaunch, total = kill -> rank 0's "resumed from step").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_time import SCRIPTS, one  # noqa: E402
from revisions import current  # noqa: E402

COLS = ["detection", "replacement", "bootstrap", "restore", "relaunch", "total"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boot", type=float, default=120.0, help="seconds each node boots")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--how", nargs="+", choices=sorted(SCRIPTS), default=["relaunch"])
    args = ap.parse_args()
    boot = ("--simulate-boot", f"{args.boot:g}")
    ways = {"spare": (*boot, "--spares", "1"), "no spare": boot}
    # bootstrap waits for a node's SSH at most MGPU_CLOUD_SSH_DEADLINE (180 s by default)
    os.environ.setdefault("MGPU_CLOUD_SSH_DEADLINE", f"{max(180.0, args.boot + 120):g}")
    print(f"medians of {args.repeat} run(s); {os.cpu_count()} CPUs; load "
          f"{os.getloadavg()[0]:.1f} at the start; every node boots {args.boot:g} s; "
          f"{args.nodes} nodes; seconds", flush=True)
    print(f"{'how':>9} {'way':>9} " + " ".join(f"{c:>11}" for c in COLS), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[tuple[str, str], list[dict[str, float]]] = {
            (how, way): [] for how in args.how for way in ways}
        for i in range(args.repeat):
            for how in args.how:
                for way, more in ways.items():
                    runs[how, way].append(one(args.nodes, f"{tmp}/home-{i}", tmp, current(),
                                              SCRIPTS[how], more))
                    got = runs[how, way][-1]
                    print(f"  run {i + 1}: {how} {way}: " + ", ".join(
                        f"{c} {got[c]:.2f}" for c in COLS), flush=True)
        for (how, way), mine in runs.items():
            med = {c: statistics.median(r[c] for r in mine) for c in COLS}
            print(f"{how:>9} {way:>9} " + " ".join(f"{med[c]:>11.2f}" for c in COLS),
                  flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
