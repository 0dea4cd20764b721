"""How often a job that finished its work fails at interpreter exit, with and without the
node sitecustomize's atexit hook (destroy a still-initialised default process group).

    python benchmarks/exit_abort_rate.py [--runs 20]

One 2-node docker cluster, 2 processes per node (world 4), `--launcher accelerate`. The job
is tests/data/scripts/repeat_script.py, which runs the held-out script
tests/data/scripts/accelerate_no_teardown.py (module-level code, no destroy_process_group)
RUNS times on every rank, each in a fresh interpreter. A run failed when any of its 4 ranks
exited non-zero (SIGABRT at exit shows as -6). Both settings in the same cluster, the baseline
(MGPU_EXIT_DESTROY_PG=0: the group is left to the interpreter's shutdown, as before) first.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "data" / "scripts"
CLI = [sys.executable, "-m", "provision.cli"]
NAME = "bench-exit"


def failed_runs(output: str, runs: int) -> list[int]:
    """Per run, how many ranks exited non-zero (from `rank R exit codes [...]` lines)."""
    per_rank = [[int(c) for c in m.group(1).split(",")]
                for m in re.finditer(r"rank \d+ exit codes \[([-\d, ]+)\]", output)]
    if len(per_rank) != 4 or any(len(codes) != runs for codes in per_rank):
        raise SystemExit(f"could not read every rank's exit codes:\n{output[-3000:]}")
    return [sum(1 for codes in per_rank if codes[i] != 0) for i in range(runs)]


def measure(home: str, runs: int, hook: bool) -> list[int]:
    env = {**os.environ, "MGPU_CLOUD_HOME": home}
    res = subprocess.run([*CLI, "launch", NAME, "--launcher", "accelerate", "--master-port",
                          "29700", "--env", f"MGPU_EXIT_DESTROY_PG={int(hook)}", "--",
                          "repeat_script.py", "accelerate_no_teardown.py", str(runs)],
                         cwd=SCRIPTS, env=env, capture_output=True, text=True)
    return failed_runs(res.stdout + res.stderr, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "MGPU_CLOUD_HOME": home}
        subprocess.run([*CLI, "up", "--nodes", "2", "--name", NAME], env=env, check=True,
                       capture_output=True)
        try:
            before = measure(home, args.runs, hook=False)
            after = measure(home, args.runs, hook=True)
        finally:
            subprocess.run([*CLI, "down", NAME], env=env, capture_output=True)
    for label, fails in (("baseline: group left to interpreter exit", before),
                         ("sitecustomize destroys it at exit", after)):
        bad = sum(1 for f in fails if f)
        print(f"{label:<42} {bad:>3}/{args.runs} runs failed at exit "
              f"({100 * bad / args.runs:.0f}%); ranks aborted per run: {fails}")


if __name__ == "__main__":
    main()
