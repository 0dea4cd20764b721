"""Where the test suite's time goes, by folder, so that growth is seen when it happens.

Runs the suite as `make test` does (workers, groups; PYTEST ARGS replace the defaults) with a
JUnit report, then prints per folder the sum of its tests' times (setup + call + teardown),
its test count and the whole run's wall time. With `--against REV` the suite of git revision
REV (a temporary worktree, benchmarks/revisions.py) runs too, AFTER this tree's (two suites
at once would measure each other), and the figures stand side by side.
`--report A.xml [B.xml]` prints the same table from JUnit reports already made; with
`--durations-out tests/durations.json` it also writes the mean time of every test of those
reports that took DURATION_MIN_S or more: the order the workers take the tests in reads it
(tests/conftest.py, the longest first), so write it again when tests are added or change.

Usage: python benchmarks/test_time.py [--workers 4] [--against REV] [-- PYTEST ARGS]
       python benchmarks/test_time.py --report run.xml [older.xml] [--durations-out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import Tree, checkout, current  # noqa: E402


@dataclass
class Times:
    label: str
    wall_s: float = 0.0
    folders: dict[str, float] = field(default_factory=dict)
    tests: dict[str, int] = field(default_factory=dict)


def folder_of(classname: str, root: Path) -> str:
    """tests.integration.test_x(.Class) -> tests/integration: the longest prefix that is a
    test file of `root`."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        if (root / Path(*parts[:cut])).with_suffix(".py").is_file():
            return "/".join(parts[:cut - 1]) or "."
    return "/".join(parts[:-1]) or "."


def read_report(label: str, report: Path, root: Path, wall_s: float = 0.0) -> Times:
    times = Times(label, wall_s)
    for case in ET.parse(report).getroot().iter("testcase"):
        folder = folder_of(case.get("classname", ""), root)
        times.folders[folder] = times.folders.get(folder, 0.0) + float(case.get("time", 0))
        times.tests[folder] = times.tests.get(folder, 0) + 1
    if not wall_s:
        suite = next(ET.parse(report).getroot().iter("testsuite"))
        times.wall_s = float(suite.get("time", 0))
    return times


DURATION_MIN_S = 3.0


def node_id(classname: str, name: str, root: Path) -> str:
    """A JUnit case's pytest node id (tests.x.test_y.Class + name -> tests/x/test_y.py::Class::
    name), its xdist group's `@GROUP` suffix dropped."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name.split("@")[0]])
    return "::".join([*parts, name.split("@")[0]])


def durations(reports: list[Path], root: Path) -> dict[str, float]:
    """{node id: mean seconds} of the tests that took DURATION_MIN_S or more (mean over the
    reports that ran them)."""
    seen: dict[str, list[float]] = {}
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            nid = node_id(case.get("classname", ""), case.get("name", ""), root)
            seen.setdefault(nid, []).append(float(case.get("time", 0)))
    means = {nid: sum(t) / len(t) for nid, t in seen.items()}
    return {nid: round(t, 1) for nid, t in sorted(means.items()) if t >= DURATION_MIN_S}


def default_args(tree: Tree, workers: int) -> list[str]:
    """`make test`'s workers for a tree whose suite keeps its workers apart (tests/engine.py);
    one process for an older tree, whose tests share fixed names."""
    if (tree.path / "tests" / "engine.py").is_file():
        return ["-n", str(workers), "--dist", "loadgroup"]
    return ["-n", "0"]


def run_suite(tree: Tree, workers: int, args: list[str]) -> Times:
    report = Path(tempfile.mkdtemp(prefix="mgpu-test-time-")) / "junit.xml"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "provision", "remote"],
                   cwd=tree.path, check=True)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    *(args or default_args(tree, workers)),
                    f"--junitxml={report}"], cwd=tree.path, env=tree.env())
    return read_report(tree.label, report, tree.path, time.monotonic() - start)


def table(runs: list[Times]) -> str:
    folders = sorted({f for r in runs for f in r.folders}, key=lambda f: -runs[0].folders.get(f, 0))
    width = max(len("wall time"), *(len(f) for f in folders))
    head = f"{'folder':<{width}}" + "".join(f"  {r.label[:20]:>22}" for r in runs)
    lines = [head]
    for f in folders:
        cells = "".join(f"  {r.folders.get(f, 0):9.1f} s {r.tests.get(f, 0):5d} t"
                        for r in runs)
        lines.append(f"{f:<{width}}{cells}")
    lines.append(f"{'all tests':<{width}}" + "".join(
        f"  {sum(r.folders.values()):9.1f} s {sum(r.tests.values()):5d} t" for r in runs))
    lines.append(f"{'wall time':<{width}}" + "".join(
        f"  {r.wall_s:9.1f} s {r.wall_s / 60:5.1f} m" for r in runs))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--report", nargs="+", type=Path, metavar="JUNIT")
    ap.add_argument("--durations-out", type=Path, metavar="FILE")
    ap.add_argument("pytest_args", nargs="*")
    opts = ap.parse_args()
    if opts.durations_out and not opts.report:
        ap.error("--durations-out reads the reports given with --report")
    root = current().path
    if opts.report:
        runs = [read_report(p.name, p, root) for p in opts.report]
        if opts.durations_out:
            found = durations(opts.report, root)
            opts.durations_out.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
            print(f"{opts.durations_out}: {len(found)} test(s) of {DURATION_MIN_S:.0f} s or more")
    else:
        runs = [run_suite(current(), opts.workers, opts.pytest_args)]
        if opts.against:
            with checkout(opts.against) as old:
                runs.append(run_suite(old, opts.workers, opts.pytest_args))
    print(table(runs))


if __name__ == "__main__":
    main()
