"""`launch --fabric-check on` against `--fabric-check off` of the same one-line script on N
docker nodes, with the gate in the job's own processes (now) and as a run of its own before
the job (the baseline: what every launch did before, and what DeepSpeed's pdsh mode still
does), measured in the same run, alternating, on the same cluster.

    off        launch --fabric-check off
    in-job     launch --fabric-check on   (remote.pyz injob: the gate, then the script, in
                                           the processes torchrun starts for the job)
    separate   launch --fabric-check on   with the gate forced onto its separate path
                                           (provision.job.gate.step.separate_reason patched in
                                           the CLI's process: the old flow, unchanged)

Each is the real CLI in its own process (`python -m provision.cli launch ...`), one process
per node (--nproc-per-node 1, as the gate uses CPU nodes). Two scripts: the one-line script
of tests/integration/test_fabric_gate.py (it never imports torch: the gate's `import torch`
is all extra), and a one-line torch script (what a training job pays anyway). Every launch
says --allow-slow-network: on a loaded 2-core machine a pair can measure slow, and a failed
gate would end the measurement (its time is what is measured here, not its verdict).
The floor: a script that imports torch pays nothing extra for the gate's `import torch` and
its exit with torch loaded; the print script does (each of the N workers, on shared cores). So
the print script's floor is `off` of the torch script, and its in-job time is shown against
it as well (x floor) as against its own `off` (x off).

`--against REV` (benchmarks/revisions.py): the same launches with REV's CLI and REV's node
side (each tree re-bootstraps the cluster with its own remote.pyz and sitecustomize.py before
each of its launches), interleaved with this tree's, on the same cluster; `--modes` picks the
rows (default: off in-job separate; with --against: off in-job).
Usage: python benchmarks/gate_in_job.py [--nodes 4] [--repeat 5] [--scripts print torch]
           [--against REV] [--modes off in-job separate]
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
from revisions import Tree, trees  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "print": 'import os; print(f"job ran: rank {os.environ[\'RANK\']}", flush=True)\n',
    "torch": 'import os, torch; print(f"job ran: rank {os.environ[\'RANK\']}", flush=True)\n',
}
FORCE_SEPARATE = ("import provision.job.gate.step as g; "
                  "g.separate_reason = lambda inv, job: 'benchmark: the separate gate'; "
                  "from provision.cli import main; main()")
# a tree's node side onto the cluster: its remote.pyz and sitecustomize.py (bootstrap again)
PLACE = ("import sys; from provision.model.inventory import InventoryStore; "
         "from provision.nodes.bootstrap import bootstrap_cluster; s = InventoryStore(); "
         "bootstrap_cluster(s.load(sys.argv[1]), s, log=lambda m: None)")


def script_file(label: str) -> str:
    """The script's file name: never `torch.py`, which the script's own `import torch` would
    import (its folder is first on sys.path) instead of torch."""
    return f"one_line_{label}.py"


MODES = {"off": ("off", False), "in-job": ("on", False), "separate": ("on", True)}


def cli(*args: str, env: dict[str, str], cwd: Path, separate: bool = False,
        tails: list[float] | None = None) -> float:
    """The CLI's wall time. `tails` gets the exit's share of a launch: from the job's last
    output line to the CLI's "job finished" line (the ranks' exit, the launchers' ending)."""
    head = ["-c", FORCE_SEPARATE] if separate else ["-m", "provision.cli"]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *head, *args], cwd=cwd, text=True,
                            env={**env, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines, last_job, finished = [], 0.0, 0.0
    for line in proc.stdout:
        lines.append(line)
        if "job ran" in line:
            last_job = time.perf_counter()
        elif line.startswith("job finished on all"):
            finished = time.perf_counter()
    code = proc.wait(timeout=900)
    took = time.perf_counter() - t0
    text = "".join(lines)
    if code != 0:
        raise SystemExit(f"{' '.join(args)} failed ({code}):\n{text[-3000:]}")
    if args[0] == "launch" and not last_job:
        raise SystemExit(f"the job did not run:\n{text[-3000:]}")
    if tails is not None and finished:
        tails.append(finished - last_job)
    return took


def gate_split(home: Path, name: str) -> dict[str, float]:
    """Where the last in-job gate's time went on rank 0 (remote/injob.py's verdict record:
    torch's import, the process group's set-up, the measuring and judging), from node-0's
    log of the newest job."""
    import json

    newest = max((home / "jobs" / name).iterdir(), key=lambda d: int(d.name))
    for line in (newest / "node-0.log").read_text().splitlines():
        if '"import_s"' in line:
            rec = json.loads(line[line.index("{"):])
            return {k: float(rec[k]) for k in ("import_s", "group_s", "measure_s", "seconds")}
    return {}


def place(tree: Tree, name: str, env: dict[str, str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-c", PLACE, name], cwd=cwd, check=True,
                   env={**env, "PYTHONPATH": tree.env()["PYTHONPATH"]})


def measure(args: argparse.Namespace, found: list[Tree], name: str, home: Path,
            env: dict[str, str], work: Path) -> tuple[dict[tuple[str, str, str], list[float]],
                                                       dict[str, list[float]]]:
    """{(tree, script, mode): seconds per launch}, and this tree's in-job gate split."""
    times: dict[tuple[str, str, str], list[float]] = {}
    split: dict[str, list[float]] = {}
    tails = args.tails
    for _ in range(args.repeat):
        for tree in found:
            if len(found) > 1:
                place(tree, name, env, work)
            tree_env = {**env, "PYTHONPATH": tree.env()["PYTHONPATH"]}
            for label in args.scripts:
                for mode in args.modes:
                    check, separate = MODES[mode]
                    took = cli("launch", name, "--nproc-per-node", "1", "--fabric-check",
                               check, "--allow-slow-network", "--", script_file(label),
                               env=tree_env, cwd=work, separate=separate,
                               tails=tails.setdefault((tree.label, label, mode), []))
                    times.setdefault((tree.label, label, mode), []).append(took)
                    if mode == "in-job" and tree is found[0]:
                        for k, v in gate_split(home, name).items():
                            split.setdefault(k, []).append(v)
    return times, split


def report(args: argparse.Namespace, found: list[Tree],
           times: dict[tuple[str, str, str], list[float]]) -> None:
    print(f"launch on {args.nodes} docker nodes (1 process each), medians of {args.repeat}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    med = {k: statistics.median(v) for k, v in times.items()}
    for tree in found:
        floor = med.get((tree.label, "torch", "off"))
        print(f"  [{tree.label}]  (floor: `off` of the torch script"
              + (f", {floor:.2f} s)" if floor else ": not measured)"))
        for label in args.scripts:
            off = med.get((tree.label, label, "off"))
            for mode in args.modes:
                value = med[(tree.label, label, mode)]
                runs = " ".join(f"{x:.1f}" for x in times[(tree.label, label, mode)])
                tail = args.tails.get((tree.label, label, mode))
                rel = f"exit {statistics.median(tail):.2f} s  " if tail else ""
                rel += f"x off {value / off:.2f}" if off and mode != "off" else ""
                if floor and mode != "off":
                    rel += f"  x floor {value / floor:.2f}"
                print(f"    {label:<6} {mode:<9} {value:>6.2f} s  {rel:<40} runs: {runs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=list(SCRIPTS))
    parser.add_argument("--against", default=None, help="an older revision, measured beside")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None)
    args = parser.parse_args()
    args.tails = {}  # (tree, script, mode) -> [the exit's seconds per launch] (see cli)
    args.modes = args.modes or (["off", "in-job"] if args.against else list(MODES))
    name = "bench-gate-in-job"
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        for label, text in SCRIPTS.items():
            (work / script_file(label)).write_text(text)
        env = {**os.environ, "MGPU_CLOUD_HOME": str(home),
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cli("up", "--nodes", str(args.nodes), "--name", name, env=env, cwd=work)
        try:
            times, split = measure(args, found, name, home, env, work)
        finally:
            cli("down", name, env=env, cwd=work)
    report(args, found, times)
    if split:
        print("  the in-job gate on rank 0 (this tree, medians, s): " + ", ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in split.items()))


if __name__ == "__main__":
    main()
