"""A node slower than the others, named while the job runs (issue 36, straggler watch).

Ranks of a data-parallel job advance in lockstep (each all-reduce waits for the slowest), so
the time between step lines is the same on every node: a slow node shows only in the time
its ranks spend computing. The job's step markers carry it: any output line with
`compute=SECONDS` (or `compute_ms=MS`), e.g. `step 120 compute=0.031` printed by every rank
every few steps (examples/train_ddp.py does, with --compute-every). Once every node has
reported WARM values, the median of a node's last WINDOW values is compared with the median
of the other nodes' medians; a node above (1 + fraction) x that for `patience` reports in a
row is named, once, and `on_slow` hears it (with --replace-slow the supervisor saves,
replaces that node and resumes). Medians over a window, a warm-up and the patience keep a
busy machine's noise (measured on 2 shared cores: one rank's forward pass varies 10x from
step to step) from naming a healthy node.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# bounded digits: a node's marker of 5000 digits is no marker (int() refuses > 4300)
COMPUTE = re.compile(r"\bcompute(_ms)?[=: ]+(\d{1,12}(?:\.\d{1,12})?)(?![\d.])")
WINDOW = 12  # values per node: a few markers of each of its ranks
WARM = 6  # values every node needs before any is judged (the first steps are noisy)


def compute_s(line: str) -> float | None:
    if "compute" not in line:  # every line of every node passes here: the cheap test first
        return None
    found = COMPUTE.search(line)
    if not found:
        return None
    value = float(found.group(2))
    return value / 1000.0 if found.group(1) else value


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass
class Slow:
    node: str
    seconds: float  # its median compute time per report
    others: float  # the other nodes' median
    reports: int  # reports in a row it was slow

    def __str__(self) -> str:
        return (f"{self.node} is slow: compute {self.seconds:.3f} s vs {self.others:.3f} s "
                f"on the other nodes ({self.seconds / self.others:.1f}x) over "
                f"{self.reports} report(s)")


class StragglerWatch:
    def __init__(self, nodes: list[str], *, fraction: float = 0.5, patience: int = 5,
                 on_slow: Callable[[Slow], None] | None = None) -> None:
        self.fraction, self.patience, self.on_slow = fraction, patience, on_slow
        self.recent: dict[str, deque[float]] = {n: deque(maxlen=WINDOW) for n in nodes}
        self.streak: dict[str, int] = dict.fromkeys(nodes, 0)
        self.named: list[Slow] = []

    def feed(self, node: str, line: str) -> Slow | None:
        value = compute_s(line)
        if value is None or node not in self.recent:
            return None
        self.recent[node].append(value)
        return self._judge(node)

    def _judge(self, node: str) -> Slow | None:
        if any(len(v) < WARM for v in self.recent.values()):
            return None
        others = [_median(list(v)) for n, v in self.recent.items() if n != node]
        if not others:
            return None
        mine, theirs = _median(list(self.recent[node])), _median(others)
        if theirs <= 0 or mine <= theirs * (1.0 + self.fraction):
            self.streak[node] = 0
            return None
        self.streak[node] += 1
        if self.streak[node] < self.patience or any(s.node == node for s in self.named):
            return None
        slow = Slow(node, mine, theirs, self.streak[node])
        self.named.append(slow)
        if self.on_slow is not None:
            self.on_slow(slow)
        return slow

    def forget(self, node: str) -> None:
        """`node` was replaced: its history is the old machine's."""
        if node in self.recent:
            self.recent[node].clear()
            self.streak[node] = 0
        self.named = [s for s in self.named if s.node != node]
