"""Start-up time of `mgpu-cloud --help` (target < 0.25 s) beside `python -c pass`, same run.

Uses the console script next to this interpreter (e.g. .venv/bin/mgpu-cloud), so no shell
shim is measured. Also checks that --help imports no cloud SDK, fabric, paramiko or pydantic.
Usage: python benchmarks/cli_start.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("boto3", "botocore", "google.cloud", "fabric", "paramiko", "docker", "pydantic", "rich",
         "starlette", "uvicorn")


def timed(argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    script = Path(sys.executable).parent / "mgpu-cloud"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "provision.cli"]
    base = timed([sys.executable, "-c", "pass"], args.repeat)
    help_ = timed([*cli, "--help"], args.repeat)
    sub = timed([*cli, "run", "--help"], args.repeat)
    loaded = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.argv=['mgpu-cloud','--help']\n"
         "import provision.cli as c\n"
         "try: c.app()\nexcept SystemExit: pass\n"
         f"print('HEAVY:', ' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    heavy = next(line for line in loaded if line.startswith("HEAVY:"))[6:].strip()
    print(f"{'command':<28} {'median s':>9}")
    print(f"{'python -c pass':<28} {base:>9.3f}")
    print(f"{'mgpu-cloud --help':<28} {help_:>9.3f}")
    print(f"{'mgpu-cloud run --help':<28} {sub:>9.3f}")
    print(f"heavy modules imported by --help: {heavy or 'none'}")
    print("target: mgpu-cloud --help < 0.25 s")


if __name__ == "__main__":
    main()
