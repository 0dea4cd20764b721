"""`launch --fabric-check on` against `--fabric-check off` of the same one-line script on N
docker nodes, with the gate in the job's own processes (now) and as a run of its own before
the job (the baseline: what every launch did before, and what DeepSpeed's pdsh mode still
does), measured in the same run, alternating, on the same cluster.

    off        launch --fabric-check off
    in-job     launch --fabric-check on   (remote.pyz injob: the gate, then the script, in
                                           the processes torchrun starts for the job)
    separate   launch --fabric-check on   with the gate forced onto its separate path
                                           (provision.job.gate_injob.separate_reason patched in
                                           the CLI's process: the old flow, unchanged)

Each is the real CLI in its own process (`python -m provision.cli launch ...`), one process
per node (--nproc-per-node 1, as the gate uses CPU nodes). Two scripts: the one-line script
of tests/integration/test_fabric_gate.py (it never imports torch: the gate's `import torch`
is all extra), and a one-line torch script (what a training job pays anyway). Every launch
says --allow-slow-network: on a loaded 2-core machine a pair can measure slow, and a failed
gate would end the measurement (its time is what is measured here, not its verdict).
Usage: python benchmarks/gate_in_job.py [--nodes 4] [--repeat 5] [--scripts print torch]
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

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "print": 'import os; print(f"job ran: rank {os.environ[\'RANK\']}", flush=True)\n',
    "torch": 'import os, torch; print(f"job ran: rank {os.environ[\'RANK\']}", flush=True)\n',
}
FORCE_SEPARATE = ("import provision.job.gate_injob as g; "
                  "g.separate_reason = lambda inv, job: 'benchmark: the separate gate'; "
                  "from provision.cli import main; main()")


def cli(*args: str, env: dict[str, str], cwd: Path, separate: bool = False) -> float:
    head = ["-c", FORCE_SEPARATE] if separate else ["-m", "provision.cli"]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *head, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    if args[0] == "launch" and done.stdout.count("job ran") < 1:
        raise SystemExit(f"the job did not run:\n{done.stdout}\n{done.stderr[-2000:]}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=list(SCRIPTS))
    args = parser.parse_args()
    name = "bench-gate-in-job"
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        for label, text in SCRIPTS.items():
            (work / f"{label}.py").write_text(text)
        env = {**os.environ, "MGPU_CLOUD_HOME": str(home),
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cli("up", "--nodes", str(args.nodes), "--name", name, env=env, cwd=work)
        times: dict[tuple[str, str], list[float]] = {}
        split: dict[str, list[float]] = {}
        try:
            for _ in range(args.repeat):
                for label in args.scripts:
                    for mode, check, separate in (("off", "off", False), ("in-job", "on", False),
                                                  ("separate", "on", True)):
                        took = cli("launch", name, "--nproc-per-node", "1", "--fabric-check",
                                   check, "--allow-slow-network", "--", f"{label}.py", env=env,
                                   cwd=work, separate=separate)
                        times.setdefault((label, mode), []).append(took)
                        if mode == "in-job":
                            for k, v in gate_split(home, name).items():
                                split.setdefault(k, []).append(v)
        finally:
            cli("down", name, env=env, cwd=work)
    print(f"launch on {args.nodes} docker nodes (1 process each), medians of {args.repeat}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  {'script':<7} {'off s':>6} {'in-job s':>9} {'x off':>6} {'separate s':>11} "
          f"{'x off':>6}   runs (off | in-job | separate)")
    for label in args.scripts:
        off, injob, sep = (statistics.median(times[(label, m)])
                           for m in ("off", "in-job", "separate"))
        runs = " | ".join(" ".join(f"{x:.1f}" for x in times[(label, m)])
                          for m in ("off", "in-job", "separate"))
        print(f"  {label:<7} {off:>6.2f} {injob:>9.2f} {injob / off:>6.2f} {sep:>11.2f} "
              f"{sep / off:>6.2f}   {runs}")
    if split:
        print("  the in-job gate on rank 0 (medians, s): " + ", ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in split.items()))


if __name__ == "__main__":
    main()
