"""What the node's warm launcher (remote/warmhost.py) saves a torchrun job's launch, against
the same launch started afresh (`--env MGPU_WARM_LAUNCHER=0`), interleaved on one cluster.

    afresh = `mgpu-cloud launch` of a 2-rank-per-node job that prints one line, the warm
             launcher switched off: every node's agent is a new interpreter importing torch
    first  = the same launch where no warm launcher runs yet: it starts one per node (the
             imports move there) and the agent is forked from it
    warm   = the same launch again: the agents forked from the launchers that wait

Figures: the command's wall time and the machine's busy CPU-seconds over it (/proc/stat: the
CLI, SSH, the nodes' processes, the engine), medians of --repeat. Needs the Docker engine.
Usage: python benchmarks/warm_launcher.py [--nodes 2] [--repeat 5]
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

CLI = [sys.executable, "-m", "provision.cli"]
ROOT = Path(__file__).resolve().parent.parent


def busy_s() -> float:
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def launch(name: str, work: Path, env: dict[str, str], *extra: str) -> tuple[float, float]:
    cpu, wall = busy_s(), time.perf_counter()
    res = subprocess.run([*CLI, "launch", name, "--nproc-per-node", "2", *extra, "--", "hi.py"],
                         cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    wall, cpu = time.perf_counter() - wall, busy_s() - cpu
    if res.returncode != 0:
        raise SystemExit(f"launch failed:\n{res.stdout}{res.stderr}")
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    work = home / "work"
    work.mkdir()
    (work / "hi.py").write_text("import os\nprint('rank', os.environ['RANK'])\n")
    env = {**os.environ, "MGPU_CLOUD_HOME": str(home / "state"),
           "PYTHONPATH": str(ROOT)}
    name = f"bench-warm-{os.getpid()}"
    up = subprocess.run([*CLI, "up", "--provider", "docker", "--nodes", str(args.nodes),
                         "--name", name], env=env,
                        capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(up.stdout + up.stderr)
    rows: dict[str, list[tuple[float, float]]] = {"afresh": [], "first": [], "warm": []}
    try:
        rows["afresh"].append(launch(name, work, env, "--env", "MGPU_WARM_LAUNCHER=0"))
        rows["first"].append(launch(name, work, env))
        for _ in range(args.repeat):
            rows["afresh"].append(launch(name, work, env, "--env", "MGPU_WARM_LAUNCHER=0"))
            rows["warm"].append(launch(name, work, env))
    finally:
        subprocess.run([*CLI, "down", name], env=env, capture_output=True)
    print(f"{args.nodes} nodes x 2 ranks, medians (first: one launch)")
    print(f"{'':8}{'wall s':>9}{'busy CPU-s':>12}")
    for label, got in rows.items():
        print(f"{label:8}{statistics.median(w for w, _ in got):9.2f}"
              f"{statistics.median(c for _, c in got):12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
