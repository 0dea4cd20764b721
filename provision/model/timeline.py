"""Where a bring-up's time went: one Timeline per `up` / `run` / `launch` / recovery, kept in
the inventory (`Inventory.timelines`, newest last) and shown by `status NAME --timeline`.

    tl = Timeline.begin("up")            before the plan (the inventory does not exist yet)
    tl.add("plan", since=tl.started_at)  a phase that ended now
    with timed(inv, "create call"): ...  a phase around a block (recorded failed or not)
    reached(inv, "nodes running", part_of="create call")
                                         a part of an open phase: from the parent's start
                                         until now (every node got there)
    finish(inv)                          nothing more is recorded into this timeline

Phases (the order a bring-up meets them): plan, create call (part: nodes running),
bootstrap (parts: ssh answers, image present), gate, first output line; a recovery:
replacement, bootstrap, restore, gate, first output line. Every helper is a no-op when the
inventory has no open timeline (e.g. `check --bandwidth` on a cluster made long ago), so a
caller never checks. Times are wall-clock seconds (they survive the inventory's reload).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

KEPT = 10  # timelines kept per inventory (the oldest are dropped)
Command = Literal["up", "run", "launch", "recovery"]


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str
    start_s: float = Field(description="seconds after the timeline's start")
    seconds: float | None = Field(None, description="None: still open (or never closed)")
    detail: str = ""
    part_of: str = Field("", description="the phase this one lies inside (\"\": top level)")


class Timeline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Command
    started_at: float = Field(description="unix time of the start")
    phases: list[Phase] = Field(default_factory=list)
    ended: bool = False

    @classmethod
    def begin(cls, command: Command) -> Timeline:
        return cls(command=command, started_at=time.time())

    def now_s(self) -> float:
        return round(time.time() - self.started_at, 3)

    def add(self, phase: str, *, since: float, detail: str = "", part_of: str = "",
            at: float | None = None) -> Phase:
        """A phase from unix time `since` to `at` (default: now)."""
        end = time.time() if at is None else at
        p = Phase(phase=phase, start_s=round(since - self.started_at, 3),
                  seconds=round(max(0.0, end - since), 3), detail=detail, part_of=part_of)
        self.phases.append(p)
        return p

    def open_phase(self, name: str) -> Phase | None:
        return next((p for p in reversed(self.phases)
                     if p.phase == name and p.seconds is None), None)

    def slowest(self) -> tuple[Phase, Phase | None] | None:
        """The longest top-level phase and its longest part (None: nothing recorded)."""
        top = [p for p in self.phases if not p.part_of and p.seconds is not None]
        if not top:
            return None
        worst = max(top, key=lambda p: p.seconds or 0.0)
        parts = [p for p in self.phases if p.part_of == worst.phase and p.seconds is not None]
        return worst, max(parts, key=lambda p: p.seconds or 0.0) if parts else None

    def summary(self) -> str:
        """One line: how long it took to the last phase, and the slowest phase."""
        ends = [p.start_s + (p.seconds or 0.0) for p in self.phases]
        if not ends:
            return f"{self.command}: no phase recorded"
        head = f"{self.command} timeline: {max(ends):.1f} s to {self.phases[-1].phase}"
        slow = self.slowest()
        if slow is None:
            return head
        worst, part = slow
        of = f" ({part.phase} {part.seconds:.1f} s of it)" if part is not None else ""
        return f"{head}; slowest phase: {worst.phase} {worst.seconds:.1f} s{of}"


class Timed(Protocol):
    """What keeps timelines: the Inventory (named so, not imported: it imports this)."""

    timelines: list[Timeline]


def process_started_at() -> float:
    """When this process started (Linux: its age, /proc/uptime less its start in
    /proc/self/stat, both since boot, to the hundredth); now where that cannot be read. A CLI
    command's clock starts with the user's (the interpreter's start and the tool's imports
    are waited for too)."""
    import os
    from pathlib import Path

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - age


def begin(inv: Timed, command: Command, timeline: Timeline | None = None) -> Timeline:
    """Start (or adopt) the inventory's current timeline; the caller saves the inventory."""
    tl = timeline or Timeline.begin(command)
    inv.timelines = [*inv.timelines, tl][-KEPT:]
    return tl


def current(inv: Timed) -> Timeline | None:
    """The open timeline, if any."""
    if inv.timelines and not inv.timelines[-1].ended:
        return inv.timelines[-1]
    return None


@contextlib.contextmanager
def timed(inv: Timed, phase: str, *, part_of: str = "") -> Iterator[None]:
    """Record `phase` around the block: open while it runs (a part can find its start),
    closed when it ends, "failed" in its detail when it raised."""
    tl = current(inv)
    if tl is None:
        yield
        return
    p = Phase(phase=phase, start_s=tl.now_s(), part_of=part_of)
    tl.phases.append(p)
    try:
        yield
    except BaseException:
        p.detail = "failed"
        raise
    finally:
        p.seconds = round(tl.now_s() - p.start_s, 3)


def reached(inv: Timed, phase: str, *, part_of: str, detail: str = "",
            at: float | None = None) -> None:
    """`phase` ended at unix time `at` (default now), as a part of the open phase `part_of`,
    from that phase's start (e.g. nodes running: from the create call's start)."""
    tl = current(inv)
    parent = tl.open_phase(part_of) if tl is not None else None
    if tl is None or parent is None:
        return
    tl.add(phase, since=tl.started_at + parent.start_s, detail=detail, part_of=part_of, at=at)


def mark(inv: Timed, phase: str, *, since: float, detail: str = "") -> None:
    """A top-level phase from unix time `since` until now, into the open timeline."""
    tl = current(inv)
    if tl is not None:
        tl.add(phase, since=since, detail=detail)


def finish(inv: Timed) -> Timeline | None:
    """Close the open timeline (returns it; None when none was open)."""
    tl = current(inv)
    if tl is not None:
        tl.ended = True
    return tl
