"""Start-up time of `mgpu-cloud dashboard` (target < 1 s) beside `mgpu-cloud --help` and
`python -c pass`, all measured in the same run.

Measured: from spawning `mgpu-cloud dashboard --port 0` until its first page (`/`, which
reads every inventory, job record and the cost history) answers 200 to the address it printed
(`?token=...`, whose redirect sets the cookie that opens the page), on a state dir holding
a 64-node cluster and its jobs (tests/dashboard/dash_synthetic.py), then the server is
stopped. Usage: python benchmarks/dashboard_start.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def first_page(cli: list[str], home: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen([*cli, "dashboard", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "MGPU_CLOUD_HOME": str(home)})
    try:
        assert proc.stdout is not None
        m = re.match(r"dashboard: (\S+)", proc.stdout.readline())
        assert m, "the dashboard did not start"
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(m.group(1), timeout=30) as resp:
            assert resp.status == 200
            resp.read()
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    script = Path(sys.executable).parent / "mgpu-cloud"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "provision.cli"]
    sys.path.insert(0, str(ROOT / "tests" / "dashboard"))
    from dash_synthetic import make_big_cluster, make_removed_cluster

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        make_big_cluster(home, nodes=64)
        make_removed_cluster(home)
        base = timed([sys.executable, "-c", "pass"], args.repeat)
        help_ = timed([*cli, "--help"], args.repeat)
        page = statistics.median(first_page(cli, home) for _ in range(args.repeat))
    print(f"{'command':<44} {'median s':>9}")
    print(f"{'python -c pass':<44} {base:>9.3f}")
    print(f"{'mgpu-cloud --help':<44} {help_:>9.3f}")
    print(f"{'mgpu-cloud dashboard: spawn -> first page':<44} {page:>9.3f}")
    print("target: the dashboard serves its first page < 1 s after it is started")


if __name__ == "__main__":
    main()
