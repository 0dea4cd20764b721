"""Node loss -> training again: unattended (the controller) beside attached (your terminal).

    python benchmarks/managed_recovery_time.py [--nodes 2 4] [--repeat 1]
                                               [--how relaunch resident] [--against REV]

For each N and each way (`--how`: examples/train_ddp.py relaunched, or examples/
train_resident.py whose other nodes keep their processes, issue 44), the same job (a
checkpoint every 5 steps) twice, node-1's container killed once a checkpoint is kept;
"total" is the kill to rank 0's "resumed from step" line:
    attached     `mgpu-cloud run --nodes N --max-restarts 1` (benchmarks/recovery_time.py's
                 measurement: the run's own output, timestamped here as it arrives)
    unattended   `mgpu-cloud run --detach --store file://... --max-restarts 1`: the job's
                 output as the controller writes it to the store (polled every 0.1 s)
The unattended figure includes up to one flush of the controller's log (records.FLUSH_S, 2 s)
before the line is in the store: "seen" says when it was read, "logged" when the controller
wrote the object holding it (its file's mtime), which is the fair figure. Goal (issue 36):
unattended no slower than attached. With `--against REV` (benchmarks/revisions.py), REV's CLI
recovers both ways too, its runs interleaved with this tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_time import SCRIPTS, one  # noqa: E402
from revisions import Tree, trees  # noqa: E402

JOB = ["--steps", "100000", "--save-every", "5", "--sleep", "0.1", "--log-every", "1000"]


def _log_files(folder: Path, name: str) -> list[Path]:
    return sorted((folder / name / "jobs" / "1" / "log").glob("*.log"))


def unattended(n: int, home: str, tree: Tree, script: str,
               more: tuple[str, ...] = ()) -> tuple[float, float]:
    """(seen, logged): kill -> the resumed line read here / written by the controller."""
    name = f"bench-ru-{n}-{os.getpid()}"
    store = Path(home) / "store"  # a fresh store per run: job 1 in it is this run's
    store.mkdir(parents=True, exist_ok=True)
    env = tree.env(MGPU_CLOUD_HOME=home)
    subprocess.run([*tree.cli(), "run", "--detach", "--nodes", str(n), "--name", name,
                    "--store", f"file://{store}", "--max-restarts", "1", *more, script, *JOB],
                   env=env,
                   cwd=home, check=True, capture_output=True)
    ckpts = store / name / "data" / "jobs" / "1" / "checkpoints"  # what the nodes write
    killed = None
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if killed is None and list(ckpts.glob("step_*.pt")):
                subprocess.run(["docker", "kill", f"{name}-node-1"], check=True,
                               capture_output=True)
                killed = time.time()
            if killed is not None:
                for path in _log_files(store, name):
                    if path.stat().st_mtime >= killed - 1 and "resumed from step" in \
                            path.read_text(errors="replace"):
                        return time.time() - killed, path.stat().st_mtime - killed
            time.sleep(0.1)
        raise SystemExit(f"unattended N={n}: the run did not recover")
    finally:
        subprocess.run([*tree.cli(), "down", name], env=env, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--how", nargs="+", choices=sorted(SCRIPTS), default=["relaunch"])
    ap.add_argument("--spares", type=int, default=0, help="warm spares (issue 44): --spares K")
    ap.add_argument("--against", metavar="REV", help="also time the recovery of git revision REV")
    args = ap.parse_args()
    more = ("--spares", str(args.spares)) if args.spares else ()
    print(f"medians of {args.repeat} run(s); {os.cpu_count()} CPUs; load "
          f"{os.getloadavg()[0]:.1f}; spares {args.spares}; seconds from the kill to rank 0's "
          "'resumed from step'")
    print(f"{'N':>3} {'tree':>10} {'how':>9} {'attached':>9} {'unattended (logged)':>20} "
          f"{'(seen)':>8}")
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found:
        for n in args.nodes:
            ways = [(t, how) for t in found for how in args.how]
            att: dict[str, list[float]] = {f"{t.label} {h}": [] for t, h in ways}
            logged: dict[str, list[float]] = {key: [] for key in att}
            seen: dict[str, list[float]] = {key: [] for key in att}
            for i in range(args.repeat):  # interleaved: the machine's load hits all alike
                for k, (tree, how) in enumerate(ways):
                    key = f"{tree.label} {how}"
                    att[key].append(one(n, f"{tmp}/a{n}-{i}-{k}", tmp, tree, SCRIPTS[how],
                                        more)["total"])
                    s, lg = unattended(n, f"{tmp}/u{n}-{i}-{k}", tree, SCRIPTS[how], more)
                    seen[key].append(s)
                    logged[key].append(lg)
            for tree, how in ways:
                key = f"{tree.label} {how}"
                print(f"{n:>3} {tree.label:>10} {how:>9} {statistics.median(att[key]):>9.2f} "
                      f"{statistics.median(logged[key]):>20.2f} "
                      f"{statistics.median(seen[key]):>8.2f}", flush=True)


if __name__ == "__main__":
    main()
