"""Where every node-second of a run went (issue 36, the goodput ledger).

A run is always in exactly one phase, on some number of nodes: the ledger integrates nodes
over time, phase by phase, so its buckets sum to the run's node-seconds by construction.

    provisioning  plan, create (until every node answers)
      queued        ... of it, and of a recovery: waiting for a queue to admit the run (Kueue
                    held it, or took it back: the timelines' "queued" phases)
    setup         bootstrap, workdir sync, restore of a checkpoint
    gate          the fabric gate
    training      the job's processes running, less what is moved out below:
      checkpoint    training seconds the job spent saving (`checkpoint saved ... (X s)` lines)
      redone        training seconds a failure threw away: from the restored step's save to
                    the failure (they are done again after the restart)
    recovery      a failure seen -> the job running again (replace, bootstrap, restore)
    idle          everything else: waiting, collecting outputs, teardown
    spare         warm spares (issue 44), idle by design: every spare the run holds, in
                  every phase (a spare being made in the background counts from its order);
                  the other buckets count the ranks' nodes, so the sum is wall x (nodes +
                  spares) and goodput is training over what was paid for

`advice` is the checkpoint interval that maximises availability given what the run measured
(`availability_interval`): Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2) (Saxena, Hukerikar, Blaz,
Raj, "Optimal Checkpoint Interval with Availability as an Objective Function", arXiv
2410.18124), where Young/Daly's first order sqrt(2 C MTBF) leaves the recovery time out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provision.model.timeline import Timeline

BUCKETS = ("provisioning", "setup", "gate", "training", "checkpoint", "redone", "recovery",
           "queued", "idle", "spare")
LABELS = {"spare": "spare, idle"}  # how a bucket is named for people (render, dashboard)
SAVE_COST = re.compile(r"checkpoint saved.*?\((\d{1,12}(?:\.\d{1,12})?) ?s\)")
# a bring-up's timeline phases (model/timeline.py) -> the ledger's buckets
PHASE_BUCKET = {"plan": "provisioning", "create call": "provisioning",
                "bootstrap": "setup", "sync": "setup", "restore": "setup", "gate": "gate",
                "replacement": "recovery", "nodes back": "recovery"}


@dataclass
class Ledger:
    """`at` values are seconds on one clock (time.monotonic() or epoch seconds)."""

    started: float
    nodes: int
    phase: str = "provisioning"
    spares: int = 0  # warm spares held (issue 44): the "spare" bucket, whatever the phase
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    saves: list[float] = field(default_factory=list)  # each save's cost, seconds
    recoveries: list[float] = field(default_factory=list)  # failure -> training again, s
    failures: int = 0
    _since: float = 0.0
    _end: float | None = None
    _failed_at: float | None = None

    def __post_init__(self) -> None:
        self._since = self.started

    def _accrue(self, at: float) -> None:
        at = max(at, self._since)
        self.seconds[self.phase] += (at - self._since) * self.nodes
        self.seconds["spare"] += (at - self._since) * self.spares
        self._since = at

    def switch(self, phase: str, at: float) -> None:
        """The run is in `phase` from `at` on (training again after a failure: the failure's
        recovery time is measured, for the advice)."""
        if phase not in BUCKETS or phase == "spare":
            raise ValueError(f"no ledger phase {phase!r}")
        self._accrue(at)
        if phase == "training" and self._failed_at is not None:
            self.recoveries.append(max(0.0, at - self._failed_at))
            self._failed_at = None
        self.phase = phase

    def resize(self, nodes: int, at: float, spares: int | None = None) -> None:
        """The run holds `nodes` nodes (and `spares` spares) from `at` on (a node lost,
        replaced, grown back; a spare taken or made)."""
        self._accrue(at)
        self.nodes = nodes
        self.spares = self.spares if spares is None else spares

    def saved(self, cost_s: float, at: float) -> None:
        """A checkpoint save that ended at `at` took `cost_s` of the job's time on every
        node."""
        self.saves.append(cost_s)
        self._accrue(at)
        self._move("checkpoint", cost_s * self.nodes)

    def save_line(self, line: str, at: float) -> None:
        found = SAVE_COST.search(line)
        if found:
            self.saved(float(found.group(1)), at)

    def failed(self, lost_training_s: float, at: float) -> None:
        """A failure at `at` threw away `lost_training_s` seconds of training on every node
        (since the save it restarts from); recovery begins."""
        self.failures += 1
        self._accrue(at)
        self._move("redone", lost_training_s * self.nodes)
        self.phase = "recovery"
        self._failed_at = at

    def queued(self, node_seconds: float) -> None:
        """Of the recovery accrued so far, `node_seconds` waited for a queue's admission."""
        self._move("queued", node_seconds, source="recovery")

    def _move(self, bucket: str, node_seconds: float, source: str = "training") -> None:
        moved = min(node_seconds, self.seconds[source])
        self.seconds[source] -= moved
        self.seconds[bucket] += moved

    def close(self, at: float) -> dict[str, float]:
        self._accrue(at)
        self._end = at
        return dict(self.seconds)

    def total(self) -> float:
        return sum(self.seconds.values())

    def to_json(self) -> dict[str, Any]:
        wall = (self._end if self._end is not None else self._since) - self.started
        return {"node_seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "wall_s": round(wall, 3), "failures": self.failures, "spares": self.spares,
                "save_cost_s": round(median(self.saves), 4) if self.saves else None,
                "recovery_s": round(self.recovery_s(), 3) if self.recoveries else None,
                "goodput": round(self.seconds["training"] / self.total(), 4)
                if self.total() else None,
                "advice_s": self.advice()}

    def recovery_s(self) -> float:
        """Tr: the mean time from a failure seen to training again (0 before any)."""
        return sum(self.recoveries) / len(self.recoveries) if self.recoveries else 0.0

    def advice(self) -> float | None:
        """The availability-best seconds between checkpoints, once a save and a failure
        were seen, from this run's own measures: Ts the median save, Tf its wall time per
        failure, Tr its mean recovery (availability_interval)."""
        if not self.saves or not self.failures:
            return None
        wall = (self._end if self._end is not None else self._since) - self.started
        return round(availability_interval(median(self.saves), wall / self.failures,
                                           self.recovery_s()), 1)


def from_timeline(tl: Timeline | None, nodes: int, now: float, spares: int = 0) -> Ledger:
    """A ledger for a run whose bring-up `tl` recorded (unix times), its phases that ended
    before `now` in their buckets and the gaps between them idle; it is in "setup" from the
    last one on. `spares`: held from the start (made with the cluster)."""
    if tl is None:
        return Ledger(started=now, nodes=nodes, phase="setup", spares=spares)
    led = Ledger(started=tl.started_at, nodes=nodes, spares=spares)
    for ph in sorted((p for p in tl.phases if not p.part_of and p.seconds is not None),
                     key=lambda p: p.start_s):
        end = tl.started_at + ph.start_s + (ph.seconds or 0.0)
        if end > now:
            break
        led.switch(PHASE_BUCKET.get(ph.phase, "setup"), tl.started_at + ph.start_s)
        led.switch("idle", end)
    led.switch("setup", now)
    for ph in tl.phases:  # a wait in a queue, inside the phase that waited
        end = tl.started_at + ph.start_s + (ph.seconds or 0.0)
        if ph.phase == "queued" and ph.part_of and end <= now:
            led._move("queued", (ph.seconds or 0.0) * nodes,
                      source=PHASE_BUCKET.get(ph.part_of, "setup"))
    return led


def queued_in(tl: Timeline | None) -> float:
    """Seconds a timeline's "queued" phases took (a recovery waiting for Kueue)."""
    return sum(p.seconds or 0.0 for p in tl.phases if p.phase == "queued") if tl else 0.0


def young_daly(cost_s: float, mtbf_s: float) -> float:
    """sqrt(2 x C x M): Young (1974), Daly (2006) to first order."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def availability_interval(save_s: float, failure_s: float, recovery_s: float) -> float:
    """Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2), the checkpoint interval that maximises
    availability (arXiv 2410.18124; its abstract: lost time is a function of the interval,
    the checkpoint save time and the average failure time, and the availability-optimal
    interval also depends on the recovery time; the formula as issue 44 quotes the paper:
    its full text was not reachable from here). The symbols and where this run takes them:
        Ts  save_s      checkpoint save time: the median of the job's `checkpoint saved
                        ... (X s)` lines (Ledger.saves)
        Tf  failure_s   average time to a failure: the run's wall time per failure
        Tr  recovery_s  recovery time: failure seen -> training again, the mean of this
                        run's recoveries (Ledger.recoveries; 0 before any)
    Tc counts the save itself (the `Ts +`): the period from one save's start to the next.
    With Tr = 0 and Ts small against Tf it is Young/Daly's sqrt(2 Ts Tf)."""
    return save_s + math.sqrt(2.0 * (failure_s + recovery_s) * save_s + save_s ** 2)


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def buckets(data: dict[str, Any]) -> list[tuple[str, float, float]]:
    """A ledger's buckets that hold anything, for people: (label, node-hours, share)."""
    secs = data["node_seconds"]
    total = sum(secs.values()) or 1.0
    return [(LABELS.get(k, k), v / 3600, v / total) for k, v in secs.items() if v > 0]


def render(data: dict[str, Any]) -> str:
    """The ledger as a few lines for the recap and `jobs`."""
    parts = ", ".join(f"{label} {hours:.2f} ({100 * share:.0f}%)"
                      for label, hours, share in buckets(data))
    lines = [f"node-hours: {parts}"]
    if data.get("advice_s") is not None:
        lines.append(f"checkpoint every ~{data['advice_s']:.3g} s for the best goodput "
                     f"(save Ts {data['save_cost_s']} s, {data['failures']} failure(s) in "
                     f"{data['wall_s']:.0f} s, recovery Tr {data.get('recovery_s') or 0:g} s: "
                     "Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2), arXiv 2410.18124)")
    return "\n".join(lines)
