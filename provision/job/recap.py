"""The few lines that end a run that had to recover: what failed each time, what it cost.

`Recap` is told when each attempt starts and ends and how long each recovery took; `lines()`
says, for a run with at least one restart: the whole run's time (every attempt and recovery,
not only the last attempt's), one line per attempt (its job id, how it ended, the last step
it reported), the steps redone after each restart when the job prints its steps
(`step N` / `resumed from step N`), the time lost (work after the last kept checkpoint, plus
the recovery), and what that time cost at the cluster's catalog price. When attempts ran on
different numbers of nodes (--min-nodes went on without a node, or grew back), each attempt
line says on how many. Pure bookkeeping:
times are passed in (monotonic seconds), nothing is read or printed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_STEP = re.compile(r"\bstep[\s=:#]*(\d{1,15})\b", re.IGNORECASE)  # bounded: a marker
_RESUMED = re.compile(r"\bresum\w*\s+(?:from\s+)?step[\s=:#]*(\d{1,15})\b", re.IGNORECASE)


@dataclass
class Attempt:
    job_id: str
    started: float
    ended: float | None = None
    outcome: str = "running"  # "succeeded", or the failure ("node lost (node-1)")
    first_step: int | None = None  # the first step number it printed
    resumed_from: int | None = None  # `resumed from step N`, when the job says so
    last_step: int | None = None
    kept_at: float | None = None  # when the last checkpoint kept during it was copied
    recovery_s: float = 0.0  # bringing the cluster back after it
    nodes: int = 0  # how many nodes it ran on (0: not told)


def steps_of(lines: Iterable[str]) -> tuple[int | None, int | None, int | None]:
    """(first step, resumed-from step, last step) an attempt's output mentions."""
    first = resumed = last = None
    for line in lines:
        if resumed is None and (m := _RESUMED.search(line)):
            resumed = int(m.group(1))
        for m in _STEP.finditer(line):
            n = int(m.group(1))
            first = n if first is None else first
            last = n if last is None else max(last, n)
    return first, resumed, last


@dataclass
class Recap:
    hourly_usd: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)

    def begin(self, job_id: str, now: float, nodes: int = 0) -> None:
        self.attempts.append(Attempt(job_id, now, nodes=nodes))

    def end(self, outcome: str, now: float, output: Iterable[str],
            kept_at: float | None) -> None:
        a = self.attempts[-1]
        a.ended, a.outcome = now, outcome
        a.first_step, a.resumed_from, a.last_step = steps_of(output)
        a.kept_at = kept_at if kept_at is not None and kept_at >= a.started else None

    def recovered(self, seconds: float) -> None:
        self.attempts[-1].recovery_s = seconds

    def _redone(self, before: Attempt, after: Attempt) -> int | None:
        if before.last_step is None:
            return None
        if after.resumed_from is not None:
            return max(0, before.last_step - after.resumed_from)
        if after.first_step is not None:
            return max(0, before.last_step - after.first_step + 1)
        return None

    def lines(self, now: float) -> list[str]:
        """The recap; nothing for a run that never restarted."""
        if len(self.attempts) < 2:
            return []
        total = now - self.attempts[0].started
        out = [f"recap: {len(self.attempts) - 1} restart(s), {total:.1f} s in all (every "
               f"attempt and recovery); {self.attempts[-1].outcome}"]
        lost = 0.0
        resized = len({a.nodes for a in self.attempts if a.nodes}) > 1  # --min-nodes shrank it
        for i, a in enumerate(self.attempts):
            step = f", at step {a.last_step}" if a.last_step is not None else ""
            size = f" on {a.nodes} node(s)" if resized and a.nodes else ""
            out.append(f"  attempt {i + 1} (job {a.job_id}){size}: {a.outcome} after "
                       f"{(a.ended or now) - a.started:.1f} s{step}")
            if i + 1 == len(self.attempts):
                break
            wasted = (a.ended or now) - (a.kept_at or a.started)
            lost += wasted + a.recovery_s
            redone = self._redone(a, self.attempts[i + 1])
            since = "since the last kept checkpoint" if a.kept_at else "(no checkpoint kept)"
            out.append(f"    lost: {wasted:.1f} s {since} + {a.recovery_s:.1f} s recovery"
                       + (f"; {redone} step(s) redone" if redone is not None else ""))
        cost = (f" = ${lost / 3600 * self.hourly_usd:.2f} at ${self.hourly_usd:.2f}/h"
                if self.hourly_usd else " (no catalog price)")
        out.append(f"  time lost to failures: {lost:.1f} s{cost}")
        return out
