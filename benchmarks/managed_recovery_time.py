"""Time from a node's death to training again: unattended (the controller) beside attached.

    python benchmarks/managed_recovery_time.py [--nodes 2] [--repeat 1]

Both on N docker nodes, same script (examples/train_ddp.py, a checkpoint every 5 steps),
node-1's container killed once a checkpoint is kept:

    attached     `mgpu-cloud run --max-restarts 1` (benchmarks/recovery_time.py's measurement:
                 kill -> rank 0's "resumed from step" in the streamed output)
    unattended   `mgpu-cloud run --detach --store file://DIR --max-restarts 1`: the command has
                 returned; kill -> "resumed from step" read from the store's log objects
                 (polled every 0.2 s; the controller flushes its log every 2 s, so the figure
                 is late by up to that much: a ceiling, not a floor)
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
from recovery_time import CLI, EXAMPLE  # noqa: E402
from recovery_time import one as attached  # noqa: E402


def unattended(n: int, home: str, cwd: str) -> float:
    name = f"bench-mrc-{n}"
    # a fresh store per run: job 1 in it is this run's (a reused one would hold an earlier
    # repeat's job 1, its checkpoints and its "resumed from step" line)
    folder = Path(tempfile.mkdtemp(dir=cwd, prefix=f"store-{n}-"))
    env = {**os.environ, "MGPU_CLOUD_HOME": home}
    res = subprocess.run([*CLI, "run", "--detach", "--nodes", str(n), "--name", name,
                          "--max-restarts", "1", "--store", f"file://{folder}", EXAMPLE,
                          "--steps", "100000", "--save-every", "5", "--sleep", "0.1",
                          "--log-every", "1000"], cwd=cwd, env=env, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(f"run --detach failed:\n{res.stderr}")
    ckpts = folder / name / "jobs" / "1" / "checkpoints"  # per run
    logs = folder / name / "jobs" / "1" / "log"
    try:
        while not (ckpts.is_dir() and any(ckpts.glob("step_*.pt"))):
            time.sleep(0.2)
        subprocess.run(["docker", "kill", f"{name}-node-1"], check=True, capture_output=True)
        killed = time.monotonic()
        deadline = killed + 300
        while time.monotonic() < deadline:
            if any("resumed from step" in p.read_text(errors="replace")
                   for p in logs.glob("*.log")):
                return time.monotonic() - killed
            time.sleep(0.2)
        raise SystemExit("the unattended run did not resume within 300 s")
    finally:
        subprocess.run([*CLI, "cancel", name], env=env, capture_output=True)
        end = time.monotonic() + 180
        while time.monotonic() < end and subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=mgpu-cloud-cluster={name}"],
                capture_output=True, text=True).stdout.strip():
            time.sleep(1)
        subprocess.run([*CLI, "down", name], env=env, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[2])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(f"medians of {args.repeat} run(s); {os.cpu_count()} CPUs; seconds from kill to "
          "training again")
    print(f"{'N':>3} {'attached':>10} {'unattended':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.nodes:
            att = statistics.median(attached(n, f"{tmp}/home", tmp)["total"]
                                    for _ in range(args.repeat))
            una = statistics.median(unattended(n, f"{tmp}/home", tmp)
                                    for _ in range(args.repeat))
            print(f"{n:>3} {att:>10.2f} {una:>11.2f}")


if __name__ == "__main__":
    main()
