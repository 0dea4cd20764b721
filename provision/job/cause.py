"""Which rank failed first, and why: the story a failed job's output ends with.

A job's output is every rank's lines interleaved (`[node-i] ` prefixed, and `[rankN]: `
prefixed by torch.distributed for an uncaught exception). When one rank raises, the others
fail AFTER it: a Gloo peer's connection closes, a collective times out, torchrun SIGTERMs
the local peers and prints its own ChildFailedError. Those are consequences; the user needs
the one exception that started it.

`rank_failures(lines)` finds every Python traceback, per (node, rank), in order of
appearance, with its exception, the innermost frame of the user's code and the exit code
torchrun's Root Cause / Failures block gave that rank. `first_failure` picks the first one
that is not a consequence (else the first one). `explain` renders it, followed only by the
signature hints (provision/job/diagnose.py) that apply: the ones seen in that rank's own
traceback, or in any output before it. Pure: no I/O.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from provision.job.diagnose import Diagnosis, diagnose, match_line, split_node
from provision.model.nodetext import shown

_RANK_PREFIX = re.compile(r"^\[(?:default)?rank(?P<rank>\d+)\]: ?")
_EXCEPTION = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s?(?P<msg>.*))?$")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>.+))?')
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3[\d.]*/|^<frozen ")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_ELASTIC_FIELD = re.compile(r"^\s+(?P<key>rank|exitcode)\s*:\s*(?P<value>-?\d+)")
# What a rank dies of when ANOTHER rank failed first (its peer vanished, torchrun stopped it).
_CONSEQUENCE = re.compile(
    r"Connection (reset|closed) by peer|remote worker crashing|Broken pipe|SignalException|"
    r"KeyboardInterrupt|Signal \d+ \(SIG\w+\) received|ProcessGroupGloo.*(timed out|Timed out)|"
    r"DistNetworkError|DistBackendError|Socket Timeout|NCCL communicator was aborted"
)
_WRAPPERS = ("ChildFailedError",)  # torchrun's own report of a failed worker


@dataclass
class RankFailure:
    """One Python traceback a rank printed."""

    node: str | None
    rank: int | None  # None: printed without torch's [rankN] prefix (before init, or a launcher)
    exc_type: str
    message: str
    position: int  # index in the output of its "Traceback" line
    frames: list[tuple[str, int, str, str]] = field(default_factory=list)  # path, line, in, code
    exit_code: int | None = None  # what torchrun reported for the rank, when it did
    node_first: int | None = None  # the rank its node's torchrun saw end first (Root Cause)

    @property
    def consequence(self) -> bool:
        """Whether this failure follows another rank's (a peer gone, a stop from torchrun)."""
        text = f"{self.exc_type}: {self.message}"
        signature = match_line(text)
        return bool(_CONSEQUENCE.search(text)) or (
            signature is not None and signature.id in ("gloo-reset", "nccl-timeout"))

    @property
    def where(self) -> tuple[str, int, str, str] | None:
        """The innermost frame of the user's own code (else the innermost frame)."""
        own = [f for f in self.frames if not _LIBRARY.search(f[0])]
        frames = own or self.frames
        return frames[-1] if frames else None

    def who(self) -> str:
        if self.rank is None:
            return f"a process on {self.node}" if self.node else "a process"
        return f"rank {self.rank} ({self.node})" if self.node else f"rank {self.rank}"

    def summary(self, *, with_node: bool = True) -> str:
        """'rank 2 (node-1), exit 1: ValueError: bad batch at step 3 (fail3.py:8)'"""
        code = f", exit {self.exit_code}" if self.exit_code is not None else ""
        if self.signal_name:
            code += f" ({self.signal_name})"
        who = self.who() if with_node else f"rank {self.rank}" if self.rank is not None else ""
        text = f"{self.exc_type}: {self.message}" if self.message else self.exc_type
        where = self.where
        at = f" ({where[0].rsplit('/', 1)[-1]}:{where[1]})" if where else ""
        return f"{who}{code}: {text}{at}" if who else f"{text}{at}"

    @property
    def signal_name(self) -> str | None:
        """'SIGTERM' for exit code -15 (a process ended by a signal), else None."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return None

    def stopped_while_ending(self) -> str | None:
        """Why a rank that raised its own exception has a signal's exit code: torchrun ends
        every local rank once it sees one end, and captures their codes after it signalled
        them (torch/distributed/elastic/multiprocessing/api.py, SubprocessContext._poll: "log
        sigterms and sigkill exit codes in the self._failures"). So a rank still tearing
        down after its traceback (a loaded node) reads -15 when a local peer it broke ended
        first."""
        if self.signal_name is None or self.consequence:
            return None
        first = (f": rank {self.node_first} ended first" if self.node_first is not None
                 and self.node_first != self.rank else "")
        where = f" on {self.node}" if self.node else ""
        return (f"  it was ending with this exception when torchrun{where} stopped it "
                f"({self.signal_name}){first}")

    def last_lines(self) -> list[str]:
        """The traceback's last frames as Python printed them: the user's frame, and the
        innermost one when the error was raised inside a library."""
        picked = [self.where] if self.where else []
        if self.frames and self.frames[-1] not in picked:
            picked.append(self.frames[-1])
        out = []
        for path, line, fn, code in picked:
            out.append(f'  File "{path}", line {line}' + (f", in {fn}" if fn else ""))
            if code:
                out.append(f"    {code}")
        return out


def rank_failures(lines: Iterable[str]) -> list[RankFailure]:
    """Every traceback in `lines` (as launch streams them), in order of appearance. A chained
    traceback counts once (its last exception); torchrun's own ChildFailedError is left out."""
    done: list[RankFailure] = []
    open_: dict[tuple[str | None, int | None], RankFailure] = {}
    last: dict[tuple[str | None, int | None], RankFailure] = {}  # a key's latest, for chains
    chained: set[tuple[str | None, int | None]] = set()
    elastic: dict[str | None, list[tuple[int, int]]] = {}  # node -> (rank, exitcode) reported
    pending_rank: dict[str | None, int] = {}
    for i, raw in enumerate(lines):
        node, text = split_node(raw)
        rank_match = _RANK_PREFIX.match(text)
        rank = int(rank_match.group("rank")) if rank_match else None
        if rank_match:
            text = text[rank_match.end():]
        key = (node, rank)
        fieldm = _ELASTIC_FIELD.match(text) if rank is None else None
        if fieldm is not None:
            value = int(fieldm.group("value"))
            if fieldm.group("key") == "rank":
                pending_rank[node] = value
            elif node in pending_rank:
                elastic.setdefault(node, []).append((pending_rank.pop(node), value))
            continue
        if text.startswith("Traceback (most recent call last)"):
            failure = RankFailure(node, rank, "", "", i)
            if key in chained:  # "During handling ...": the outer exception counts, from the start
                chained.discard(key)
                done.remove(last[key])
                failure.position = last[key].position
            open_[key] = failure
            continue
        if any(text.startswith(c) for c in _CHAIN) and key in last and last[key] in done:
            chained.add(key)
            continue
        current = open_.get(key)
        if current is None:
            continue
        frame = _FRAME.match(text)
        if frame is not None:
            current.frames.append((frame.group("path"), int(frame.group("line")),
                                   frame.group("fn") or "", ""))
        elif text[:1].isspace():
            stripped = text.strip()
            frames = current.frames
            if frames and not frames[-1][3] and stripped and set(stripped) - set("^~ "):
                frames[-1] = (*frames[-1][:3], stripped)
        elif (exc := _EXCEPTION.match(text)) is not None:
            failure = current
            failure.exc_type, failure.message = exc.group("type"), (exc.group("msg") or "").strip()
            del open_[key]
            if not failure.exc_type.endswith(_WRAPPERS):
                done.append(failure)
                last[key] = failure
    for failure in done:
        reported = elastic.get(failure.node, [])
        if reported:  # the node's Root Cause block comes last
            failure.node_first = reported[-1][0]
            if failure.rank is None:
                failure.rank = failure.node_first
        for rank, code in reported:
            if rank == failure.rank:
                failure.exit_code = code
    return done


def first_failure(failures: Sequence[RankFailure]) -> RankFailure | None:
    """The first failure that is not a consequence of another (else the first of all)."""
    causes = [f for f in failures if not f.consequence] or list(failures)
    return causes[0] if causes else None


def _hints(lines: list[str], cause: RankFailure | None,
           failures: Sequence[RankFailure] = ()) -> list[Diagnosis]:
    """The signatures that apply: with a cause found, those in its own lines or before it
    (but not the lines of nodes whose ranks only failed because of it: a peer's dropped
    connection can print before the cause's traceback is through); the generic wrappers only
    when nothing else explains the failure."""
    if cause is None or cause.consequence:
        found = diagnose(lines)
    else:
        after = {f.node for f in failures if f.consequence} - {cause.node}
        before = [ln for ln in lines[:cause.position] if split_node(ln)[0] not in after]
        own = [ln for ln in lines[cause.position:] if split_node(ln)[0] == cause.node
               and _rank_of(ln) in (cause.rank, None)]
        found = diagnose(before + own[:60])
    specific = [d for d in found if d.signature not in ("child-failed", "nccl-system-error")]
    return specific if specific or cause is not None else found


def _ranks(failures: list[RankFailure]) -> str:
    """'ranks 0, 1, 3' (or the nodes, for tracebacks without a rank)."""
    ranks = sorted({f.rank for f in failures if f.rank is not None})
    others = sorted({f.who() for f in failures if f.rank is None})
    named = ([f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"] if ranks
             else [])
    return ", ".join(named + others)


def _rank_of(line: str) -> int | None:
    match = _RANK_PREFIX.match(split_node(line)[1])
    return int(match.group("rank")) if match else None


def explain(lines: Iterable[str], node_codes: dict[str, int] | None = None) -> list[str]:
    """What to print after a failed job, the cause first: the first failure (rank, node, exit
    code, exception, where) and its last frames; which ranks failed only because of it; then
    the hints that apply. `node_codes`: each node's launcher exit code (when torchrun did not
    report the rank's own)."""
    lines = list(lines)
    failures = rank_failures(lines)
    cause = first_failure(failures)
    out: list[str] = []
    if cause is not None:
        if cause.exit_code is None and node_codes and cause.node in node_codes:
            cause.exit_code = node_codes[cause.node]
        out.append(f"first failure: {cause.summary()}")
        out += cause.last_lines()
        if (stopped := cause.stopped_while_ending()) is not None:
            out.append(stopped)
        after = [f for f in failures if f is not cause and f.consequence]
        if after and not cause.consequence:
            out.append(f"  then {_ranks(after)} failed because of it: consequences, not causes")
    for d in _hints(lines, cause, failures):
        out.append(f"likely cause ({d.node or 'a node'}): {d.cause}\n  fix: {d.fix}")
    # what the nodes printed is shown escaped (a node line holds no "\n": split on it)
    return ["\n".join(shown(part) for part in line.split("\n")) for line in out]
