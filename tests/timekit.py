"""Where a test run's time went, by folder (issue 45): conftest.py prints it after every run,
benchmarks/test_time.py compares two runs.

A test's time is its setup + call + teardown durations (what `--durations` counts); a folder's
time is the sum over its tests. With xdist workers the folders' sum exceeds the wall time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Folder:
    seconds: float = 0.0
    tests: int = 0


def folder_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def by_folder(reports: Iterable[Iterable[Any]]) -> dict[str, Folder]:
    """Per folder, from pytest's reports (terminalreporter.stats' values)."""
    folders: dict[str, Folder] = {}
    for group in reports:
        for report in group:
            duration = getattr(report, "duration", None)
            nodeid = getattr(report, "nodeid", None)
            if duration is None or not nodeid or not hasattr(report, "when"):
                continue
            f = folders.setdefault(folder_of(nodeid), Folder())
            f.seconds += float(duration)
            f.tests += report.when == "call"
    return folders


def table(folders: dict[str, Folder], wall_s: float) -> list[str]:
    """Lines, slowest folder first, then the totals."""
    width = max(len("all tests"), *(len(k) for k in folders))
    lines = [f"{name:<{width}}  {f.seconds:8.1f} s  {f.tests:5d} tests"
             for name, f in sorted(folders.items(), key=lambda kv: -kv[1].seconds)]
    total = sum(f.seconds for f in folders.values())
    count = sum(f.tests for f in folders.values())
    lines.append(f"{'all tests':<{width}}  {total:8.1f} s  {count:5d} tests "
                 f"in {wall_s:.1f} s of wall time ({wall_s / 60:.1f} min)")
    return lines
