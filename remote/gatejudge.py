"""The fabric gate's verdict from its measurements (pure, stdlib only).

One function decides, wherever the gate runs: rank 0 of the job's own processes judges with it
before the job's script starts (remote/injob.py), and the controller judges the same output
with it afterwards (provision/job/gate/judge.py `evaluate`, which adds the table, texts and fixes). So
the nodes and the record can never disagree on pass or fail.

Rules (the thresholds are the controller's constants, passed in; docs/fabric-gate.md):
  - wrong transport: a node whose NCCL used another network than the expected one;
  - bandwidth: the whole cluster's peak busbw below `threshold` (a published figure x 1/2);
  - pairs: reference = the median over nodes of each node's best pair; a pair is slow when it
    is below `fraction` of the reference (half of it on gloo: `pair_fraction`) in BOTH of its
    measurements (pairs that were below the line the first time are measured again, so a
    pair measured once was above it);
  - slow node: every pair it is in is slow (even its best one);
  - slow link: a slow pair whose two nodes are fine with other partners.
Nodes are node ranks (0..n-1); pairs are (lower, higher) node ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from remote.transport import UNKNOWN, matches

Pair = tuple[int, int]

# On gloo (CPU tensors: docker nodes, CPU-only machines) a pair's figure is the two CPUs'
# memory copies as much as their network, and a busy CPU halves it: on a loaded 2-core CI
# machine a healthy pair of three docker nodes measured 0.417 GB/s twice in a row against a
# 0.835 GB/s median pair (2026-12-02). A throttled or broken link is at 0.3-30 % of its peers
# (20 Mbit/s tc tbf: 0.3 %; a socket fallback: 5-30 %), so a quarter still finds it.
GLOO_FRACTION_SCALE = 0.5


def pair_fraction(fraction: float, backend: str | None) -> float:
    """The share of the reference pair below which a pair is slow, on `backend`: `fraction`
    (the controller's PAIR_SLOW_FRACTION) on NCCL, GLOO_FRACTION_SCALE of it on gloo."""
    return fraction * GLOO_FRACTION_SCALE if backend == "gloo" else fraction


@dataclass
class PairFigure:
    """A pair's better figure (GB/s) and how often it was measured (1, or 2 when confirmed)."""

    busbw_gbps: float
    measurements: int = 1


def pair_reference(pairs: dict[Pair, float]) -> float:
    """The typical healthy pair: the median over nodes of each node's best pair. (The median
    of the pairs themselves would not do: with 3 nodes and one slow, 2 of the 3 pairs are
    slow.) 0.0 without pairs."""
    best: dict[int, float] = {}
    for (a, b), bw in pairs.items():
        for n in (a, b):
            best[n] = max(best.get(n, 0.0), bw)
    return statistics.median(best.values()) if best else 0.0


def merge_pairs(measured: list[tuple[Pair, float]]) -> dict[Pair, PairFigure]:
    """Every (pair, busbw) measurement, first ones and confirmations -> one figure per pair
    (the better one: a busy moment only ever slows a call down)."""
    merged: dict[Pair, PairFigure] = {}
    for pair, bw in measured:
        seen = merged.get(pair)
        if seen is None:
            merged[pair] = PairFigure(bw)
        else:
            seen.measurements += 1
            seen.busbw_gbps = max(seen.busbw_gbps, bw)
    return merged


@dataclass
class Judgement:
    finished: bool = True  # the measuring ran to its end on every rank
    wrong_transport: list[int] = field(default_factory=list)
    unknown_transport: list[int] = field(default_factory=list)
    below_threshold: bool = False
    reference: float | None = None  # pair_reference over the merged pairs
    floor: float | None = None  # fraction x reference
    best: dict[int, float] = field(default_factory=dict)  # each node's best pair
    slow_pairs: list[Pair] = field(default_factory=list)
    slow_nodes: list[int] = field(default_factory=list)
    slow_links: list[Pair] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.finished and not (self.wrong_transport or self.below_threshold
                                      or self.slow_nodes or self.slow_links)


def judge_pairs(pairs: dict[Pair, PairFigure], fraction: float, verdict: Judgement) -> None:
    """Fill the pair part of `verdict` (see the module doc)."""
    if not pairs:
        return
    reference = pair_reference({p: f.busbw_gbps for p, f in pairs.items()})
    floor = fraction * reference
    verdict.reference, verdict.floor = reference, floor
    nodes = sorted({n for p in pairs for n in p})
    verdict.best = {n: max(f.busbw_gbps for p, f in pairs.items() if n in p) for n in nodes}
    verdict.slow_pairs = sorted(p for p, f in pairs.items()
                                if f.busbw_gbps < floor and f.measurements > 1)
    slow = set(verdict.slow_pairs)
    verdict.slow_nodes = [n for n in nodes if all(p in slow for p in pairs if n in p)]
    verdict.slow_links = [p for p in verdict.slow_pairs
                          if not set(p) & set(verdict.slow_nodes)]


def judge(*, finished: bool, peak_gbps: float | None, threshold_gbps: float | None,
          expected_transport: str | None, transports: dict[int, str],
          pairs: dict[Pair, PairFigure], fraction: float, backend: str | None) -> Judgement:
    """The verdict (see the module doc). `transports`: node -> what its NCCL used ('socket'
    for gloo; leave it empty when the all-reduce did not run); `expected_transport` None: any
    transport will do. `finished` False (the measuring stopped on some rank) always fails.
    `backend`: the measuring's ('nccl', 'gloo'; None when unknown), for `pair_fraction`."""
    verdict = Judgement(finished=finished)
    if expected_transport is not None:
        for node, found in sorted(transports.items()):
            if found == UNKNOWN:
                if expected_transport != "socket":
                    verdict.unknown_transport.append(node)  # a note, not a failure
            elif not matches(expected_transport, found):
                verdict.wrong_transport.append(node)
    verdict.below_threshold = (threshold_gbps is not None and peak_gbps is not None
                               and peak_gbps < threshold_gbps)
    judge_pairs(pairs, pair_fraction(fraction, backend), verdict)
    return verdict
