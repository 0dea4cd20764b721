"""Time from a node's death to training again, on 2 and 4 docker nodes, split into parts.

    python benchmarks/recovery_time.py [--nodes 2 4] [--repeat 1] [--how relaunch resident]
                                       [--against REV]

For each N and each way (`--how`, interleaved in one run: the machine's load hits both alike):
`mgpu-cloud run --nodes N --max-restarts 1` of examples/train_ddp.py (relaunch: every rank
started again) or examples/train_resident.py (resident: the other nodes' ranks keep their
processes and re-form with the newcomer, issue 44), saving a checkpoint every 5 steps; once
a checkpoint is kept, node-1's container is killed. From the run's own output (timestamped
here as it arrives):

    detection    kill -> "failure: node lost (node-1)" / "node-1 lost: the ranks of ..."
    replacement / bootstrap / restore    the run's "ready to restart in ..." line
    relaunch     "ready to restart" -> rank 0's "resumed from step" (relaunch: torch start +
                 rendezvous of every rank; resident: the word to re-form, the newcomer's
                 start, the group formed again)
    total        kill -> "resumed from step"
    cpu, in nodes  CPU-seconds the whole machine was busy over "total" (/proc/stat), and how
                 much of it the node containers used (docker's cpuacct cgroup, their sum).
                 On one machine every node's work shares its cores: "total" cannot go below
                 cpu / cores, so a recovery whose CPU grows with N grows with N here, however
                 parallel its steps (a real node has its own cores)

Baseline beside it, same run: `mgpu-cloud up` of N fresh nodes (what replacing the whole
cluster would cost before the job could even start again; the relaunch comes on top).
With `--against REV` (benchmarks/revisions.py), REV's CLI recovers the same way too, its runs
interleaved with this tree's (the same example script for both).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import Tree, current, trees  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
SCRIPTS = {"relaunch": EXAMPLE, "resident": str(ROOT / "examples" / "train_resident.py")}
DETECTED = re.compile(r"failure: node lost|node-1 lost: the ranks of")
NODES_CPU = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")  # cgroup v1, cgroupfs driver


def cpu_now() -> tuple[float, float]:
    """(machine busy, node containers) CPU-seconds so far; containers NaN if not readable."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # not idle, iowait
    try:
        nodes = int(NODES_CPU.read_text()) / 1e9
    except (OSError, ValueError):
        nodes = float("nan")
    return busy, nodes


def one(n: int, home: str, cwd: str, tree: Tree, script: str = EXAMPLE,
        more: tuple[str, ...] = ()) -> dict[str, float]:
    """The parts of one recovery; `more`: more `run` options (e.g. --spares 1)."""
    name = f"bench-rc-{n}-{os.getpid()}"
    env = tree.env(MGPU_CLOUD_HOME=home, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([*tree.cli(), "run", "--nodes", str(n), "--name", name, "--max-restarts",
                             "1", *more, script, "--steps", "100000", "--save-every", "5", "--sleep",
                             "0.1", "--log-every", "1000"], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    marks: dict[str, float] = {}
    split: dict[str, float] = {}
    try:
        for line in proc.stdout:
            now = time.monotonic()
            if "kept checkpoint" in line and "kill" not in marks:
                subprocess.run(["docker", "kill", f"{name}-node-1"], check=True,
                               capture_output=True)
                marks["kill"] = time.monotonic()
                cpu0 = cpu_now()
            elif DETECTED.search(line) and "detected" not in marks:
                marks["detected"] = now
            elif m := re.search(r"ready to restart in [\d.]+ s: replacement ([\d.]+) s, "
                                r"bootstrap ([\d.]+) s, restore ([\d.]+) s", line):
                marks["ready"] = now
                split = dict(zip(("replacement", "bootstrap", "restore"),
                                 map(float, m.groups()), strict=True))
            elif "resumed from step" in line:
                marks["resumed"] = now
                cpu1 = cpu_now()
                break
    finally:
        proc.terminate()  # SIGTERM: the run tears the cluster down (after a spare being made)
        rest = proc.stdout
        threading.Thread(target=rest.read, daemon=True).start()  # never blocked on the pipe
        proc.wait(timeout=900)
    if not {"kill", "detected", "ready", "resumed"} <= set(marks):
        raise SystemExit(f"N={n}: the run did not recover: {sorted(marks)}")
    return {"detection": marks["detected"] - marks["kill"], **split,
            "relaunch": marks["resumed"] - marks["ready"],
            "total": marks["resumed"] - marks["kill"],
            "cpu": cpu1[0] - cpu0[0], "in nodes": cpu1[1] - cpu0[1]}


def baseline_up(n: int, home: str) -> float:
    tree = current()
    env = tree.env(MGPU_CLOUD_HOME=home)
    t0 = time.monotonic()
    name = f"bench-up-{n}-{os.getpid()}"
    subprocess.run([*tree.cli(), "up", "--nodes", str(n), "--name", name], env=env,
                   check=True, capture_output=True)
    elapsed = time.monotonic() - t0
    subprocess.run([*tree.cli(), "down", name], env=env, check=True, capture_output=True)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--how", nargs="+", choices=sorted(SCRIPTS), default=["relaunch"],
                    help="relaunch: a script without resident restarts; resident: one with")
    ap.add_argument("--spares", type=int, default=0, help="warm spares (issue 44): --spares K")
    ap.add_argument("--against", metavar="REV", help="also time the recovery of git revision REV")
    args = ap.parse_args()
    more = ("--spares", str(args.spares)) if args.spares else ()
    cols = ["detection", "replacement", "bootstrap", "restore", "relaunch", "total", "cpu",
            "in nodes"]
    print(f"medians of {args.repeat} run(s); {os.cpu_count()} CPUs; load "
          f"{os.getloadavg()[0]:.1f}; spares {args.spares}; seconds")
    print(f"{'N':>3} {'tree':>10} {'how':>9} " + " ".join(f"{c:>11}" for c in cols)
          + f" {'baseline up(N)':>15}")
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found:
        for n in args.nodes:
            runs: dict[tuple[str, str], list[dict[str, float]]] = {
                (t.label, how): [] for t in found for how in args.how}
            for _ in range(args.repeat):
                for i, tree in enumerate(found):
                    for how in args.how:
                        runs[tree.label, how].append(one(n, f"{tmp}/home-{i}", tmp, tree,
                                                         SCRIPTS[how], more))
            base = statistics.median(baseline_up(n, f"{tmp}/home") for _ in range(args.repeat))
            for (label, how), mine in runs.items():
                med = {c: statistics.median(r[c] for r in mine) for c in cols}
                print(f"{n:>3} {label:>10} {how:>9} " + " ".join(f"{med[c]:>11.2f}" for c in cols)
                      + f" {base:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
