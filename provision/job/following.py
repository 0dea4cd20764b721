"""Following a running job on its nodes: each node's launcher waited for, the first failure
(or a monitor's reason) stopping the others, and (issue 44) a lost node replaced while the
others' resident ranks keep running (a `Rejoin`, provision/job/resident.py).

`provision/job/launch.py` starts the nodes' commands and calls `follow`; the protocols here
are what it is given: a JobMonitor (job/watcher.Watcher), a JobGate (the in-job fabric gate),
a Rejoin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Protocol

from provision.model.inventory import NodeRecord
from provision.model.logsink import Log
from provision.nodes import NodeGroup

SESSION_LOST = -1  # a node's exit code when its session ended without one (node gone?)
STOPPED = 143  # run_job's code when a monitor stopped the job
POLL_S = 0.5  # how often run_job asks its monitor whether to stop the job
# After one node's launcher failed, how long the others get to end by themselves before they
# are stopped. A crashed rank takes its peers down within a second or two (their collectives
# fail), and each node's launcher then reports its own ranks' exit codes. Stopped at once, a
# node whose crashed rank was still exiting reported the SIGTERM it got from the stop (-15)
# instead of the crash's exit 1. A node that does not end (a hang) is stopped after this.
# (A -15 that still comes is torchrun's own: it ends every local rank once it sees one end,
# so a crashed rank still ending when a peer it broke ended first reads SIGTERM; job/cause.py
# says so in the output. 10 s of settle did not change it.)
PEERS_SETTLE_S = 3.0
# A node still running this long after its stop is stopped again: a stop that came while its
# job was still starting (no pidfile yet: a cancel just after launch, seen under load) found
# nothing there, and the job would have run on with nobody stopping it.
RESTOP_S = 5.0
# how follow starts a newcomer: (node, its command line) -> the future of its exit code
Starter = Callable[[NodeRecord, str], "Future[int]"]


class JobMonitor(Protocol):
    """Watches a running job for run_job (provision/job/watcher.py implements it)."""

    def line(self, node: NodeRecord, text: str) -> None:
        """Every output line of every node, as it arrives (any thread)."""
        ...

    def poll(self) -> str | None:
        """Called every half second: a reason to stop the job on every node now, or None."""
        ...

    def finished(self, node: NodeRecord, code: int) -> None:
        """A node's launcher ended with `code` (-1: its session dropped)."""
        ...


class JobGate(Protocol):
    """The fabric gate inside the job's launch (provision/job/gate/injob.py InJobGate)."""

    entry: list[str]  # words before the job's script in its launcher ("@root/" paths)

    def attach(self, nodes: list[str], print_line: Callable[[str, str], None]) -> None:
        """The nodes run_job starts, and how it prints a line of a node."""
        ...

    def take(self, node: str, line: str) -> bool:
        """Whether the line is the gate's (kept, not printed)."""
        ...

    def stopped(self, node: str) -> bool:
        """Whether the node's processes ended because the gate failed."""
        ...


class Rejoin(Protocol):
    """Resident restarts (provision/job/resident.py): a node lost mid-job is replaced while
    the other nodes' ranks keep their processes and re-form the group with the newcomer."""

    def lost(self, nodes: list[NodeRecord],
             start: Starter) -> dict[Future[int], NodeRecord] | None:
        """Replace `nodes` (their session dropped, or the provider says they are gone), the
        others' ranks kept: each newcomer started with `start` as soon as it can be, its
        future. None: not possible (it says why; a newcomer started already is stopped); the
        job is stopped on every node and relaunched, as without."""
        ...

    def gone(self, running: list[NodeRecord]) -> list[NodeRecord]:
        """Nodes among `running` the provider says are gone (a session may hang instead of
        dropping)."""
        ...

    def stalled(self) -> str | None:
        """A reason to stop the job now: resident ranks stopped on an error with no node
        lost (a rank crash)."""
        ...

    def warm(self, spares: Any) -> bool:
        """Offered the ready spares' waiting launchers (job/warmspares.WarmSpares): a
        newcomer that is one of them is promoted there instead of started cold. False: not
        for this job (they are not started)."""
        ...


def stop_job(group: NodeGroup, nodes: list[NodeRecord] | None = None,
             grace: float = 10.0) -> None:
    """Stop the job's process group on `nodes` (default: the group's). Idempotent and best
    effort: a node that is gone already is not an error."""
    layout = group.layout
    group.run(layout.remote_command("stop", "--pidfile", layout.pidfile, "--grace", str(grace)),
              nodes=nodes, timeout=grace + 5)


class _Stops:
    """The stops sent, and sent again to nodes still running RESTOP_S later (stop_job is
    idempotent: a node whose job ended meanwhile is not an error)."""

    def __init__(self, group: NodeGroup) -> None:
        self.group, self.at, self.sent = group, 0.0, set[str]()

    def send(self, nodes: list[NodeRecord]) -> None:
        if nodes:
            stop_job(self.group, nodes)
            self.at = time.monotonic()
            self.sent |= {n.name for n in nodes}

    def again(self, running: list[NodeRecord]) -> None:
        due = [n for n in running if n.name in self.sent]
        if due and time.monotonic() - self.at >= RESTOP_S:
            self.send(due)


def follow(futures: dict[Future[int], NodeRecord], stopper: NodeGroup, log: Log,
           monitor: JobMonitor | None, gate: JobGate | None, cancelled: threading.Event,
           rejoin: Rejoin | None = None, start: Starter | None = None,
           tend: Callable[[], None] | None = None) -> int:
    """Wait for every node's launcher; the first failure (or the monitor's reason) stops the
    others (a node the failed gate ended is not stopped: every node ends by itself). With
    `rejoin`, a lost node is first offered to it: its newcomer is started (`start`) and
    followed like the others, which go on. `tend`: called every poll (warm spares kept)."""
    code = 0
    pending = set(futures)
    stops = _Stops(stopper)
    while pending:
        if tend is not None and code == 0:
            tend()
        done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
        for fut in done:
            node_code = fut.result()
            if node_code == SESSION_LOST and code == 0 and _rejoined(
                    rejoin, start, [futures[fut]], futures, pending):
                continue
            if node_code != 0 and code == 0:
                code = node_code
                if gate is not None and gate.stopped(futures[fut].name):
                    continue
                why = (": its SSH session dropped (is the node gone?)"
                       if node_code == SESSION_LOST else f" exited with {node_code}")
                log(f"{futures[fut].name}{why}; stopping the other nodes")
                if node_code != SESSION_LOST:  # a lost node's peers do not end by themselves
                    wait(pending, timeout=PEERS_SETTLE_S)  # (their results: the next rounds)
                stops.send([futures[f] for f in pending if not f.done()])
        if code != 0:
            stops.again([futures[f] for f in pending if not f.done()])
        if rejoin is not None and pending and code == 0:
            hung = rejoin.gone([futures[f] for f in pending])
            left = {f for f in pending if futures[f] in hung}
            if hung and _rejoined(rejoin, start, hung, futures, pending):
                pending -= left  # their sessions hang: nothing more is waited for from them
        reason = monitor.poll() if monitor is not None and pending and code == 0 else None
        if reason is None and rejoin is not None and pending and code == 0:
            reason = rejoin.stalled()
        if reason is not None:
            code = STOPPED
            log(f"{reason}; stopping the job on every node")
            cancelled.set()
            stops.send([futures[f] for f in pending])
    return code


def _rejoined(rejoin: Rejoin | None, start: Starter | None, nodes: list[NodeRecord],
              futures: dict[Future[int], NodeRecord], pending: set[Future[int]]) -> bool:
    """Offer lost `nodes` to `rejoin`; True when their newcomers were started (and are now
    among the followed futures)."""
    started = rejoin.lost(nodes, start) if rejoin is not None and start is not None else None
    if started is None:
        return False
    futures.update(started)
    pending.update(started)
    return True

