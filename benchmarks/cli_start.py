"""Start-up time of `mgpu-cloud --help` (target < 0.25 s) beside `python -c pass`, same run.

Runs `python -m provision.cli` of this tree (first on PYTHONPATH, so not whatever the venv's
editable install points at); with `--against REV` also of git revision REV, interleaved, in
the same run (benchmarks/revisions.py). Also checks that --help imports no cloud SDK, fabric,
paramiko or pydantic. Usage: python benchmarks/cli_start.py [--repeat 15] [--against REV]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import Tree, interleaved, timed_command, trees  # noqa: E402

HEAVY = ("boto3", "botocore", "google.cloud", "fabric", "paramiko", "docker", "pydantic", "rich",
         "starlette", "uvicorn")


def timed(argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def heavy_modules(tree: Tree) -> str:
    loaded = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.argv=['mgpu-cloud','--help']\n"
         "import provision.cli as c\n"
         "try: c.app()\nexcept SystemExit: pass\n"
         f"print('HEAVY:', ' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True, env=tree.env(), cwd=tree.path,
    ).stdout.splitlines()
    return next(line for line in loaded if line.startswith("HEAVY:"))[6:].strip() or "none"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--against", metavar="REV", help="also time git revision REV (a temporary "
                    "worktree), interleaved with this tree")
    args = ap.parse_args()
    with trees(args.against) as found:
        base = timed([sys.executable, "-c", "pass"], args.repeat)
        rows = [("python -c pass", base)]
        for words in (["--help"], ["run", "--help"]):
            medians = interleaved(found, args.repeat, lambda t, w=words: timed_command(
                [*t.cli(), *w], env=t.env(), cwd=t.path))
            rows += [(f"mgpu-cloud {' '.join(words)} [{t.label}]", medians[t.label])
                     for t in found]
        heavy = {t.label: heavy_modules(t) for t in found}
    print(f"medians of {args.repeat} runs, trees interleaved; `python -m provision.cli`")
    print(f"{'command':<40} {'median s':>9}")
    for label, value in rows:
        print(f"{label:<40} {value:>9.3f}")
    for label, mods in heavy.items():
        print(f"heavy modules imported by --help [{label}]: {mods}")
    print("target: mgpu-cloud --help < 0.25 s")


if __name__ == "__main__":
    main()
