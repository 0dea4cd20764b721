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

`advice` is the checkpoint interval that maximises goodput given the measured save cost C and
the mean time between failures M (Young/Daly, first order): sqrt(2 x C x M).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provision.model.timeline import Timeline

BUCKETS = ("provisioning", "setup", "gate", "training", "checkpoint", "redone", "recovery",
           "queued", "idle")
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
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    saves: list[float] = field(default_factory=list)  # each save's cost, seconds
    failures: int = 0
    _since: float = 0.0
    _end: float | None = None

    def __post_init__(self) -> None:
        self._since = self.started

    def _accrue(self, at: float) -> None:
        at = max(at, self._since)
        self.seconds[self.phase] += (at - self._since) * self.nodes
        self._since = at

    def switch(self, phase: str, at: float) -> None:
        """The run is in `phase` from `at` on."""
        if phase not in BUCKETS:
            raise ValueError(f"no ledger phase {phase!r}")
        self._accrue(at)
        self.phase = phase

    def resize(self, nodes: int, at: float) -> None:
        """The run holds `nodes` nodes from `at` on (a node lost, replaced, grown back)."""
        self._accrue(at)
        self.nodes = nodes

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
                "wall_s": round(wall, 3), "failures": self.failures,
                "save_cost_s": round(median(self.saves), 4) if self.saves else None,
                "goodput": round(self.seconds["training"] / self.total(), 4)
                if self.total() else None,
                "advice_s": self.advice()}

    def advice(self) -> float | None:
        """The goodput-best seconds between checkpoints, once a save and a failure were
        seen (mean time between failures: the run's wall time per failure)."""
        if not self.saves or not self.failures:
            return None
        wall = (self._end if self._end is not None else self._since) - self.started
        return round(young_daly(median(self.saves), wall / self.failures), 1)


def from_timeline(tl: Timeline | None, nodes: int, now: float) -> Ledger:
    """A ledger for a run whose bring-up `tl` recorded (unix times), its phases that ended
    before `now` in their buckets and the gaps between them idle; it is in "setup" from the
    last one on."""
    if tl is None:
        return Ledger(started=now, nodes=nodes, phase="setup")
    led = Ledger(started=tl.started_at, nodes=nodes)
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


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def render(data: dict[str, Any]) -> str:
    """The ledger as a few lines for the recap and `jobs`."""
    secs = data["node_seconds"]
    total = sum(secs.values()) or 1.0
    parts = ", ".join(f"{k} {v / 3600:.2f} ({100 * v / total:.0f}%)" for k, v in secs.items()
                      if v > 0)
    lines = [f"node-hours: {parts}"]
    if data.get("advice_s") is not None:
        lines.append(f"checkpoint every ~{data['advice_s']:.3g} s for the best goodput "
                     f"(save {data['save_cost_s']} s, {data['failures']} failure(s) in "
                     f"{data['wall_s']:.0f} s: Young/Daly sqrt(2 x C x MTBF))")
    return "\n".join(lines)
