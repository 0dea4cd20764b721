"""Warm spares' launchers, the controller's side (issue 44; the node's side: remote/warm.py).

While a job with resident ranks runs, every ready spare (Inventory.spares, a spare made during
the run too) runs a launcher that imported torch and waits, as its part of the job under the
same job id: a session like a node's, attached (it ends with this controller). When a lost
node's rank goes to that spare (job/resident.py), `take` sends the word (`remote.pyz warm
promote`: the newcomer's torchrun words and variables) and the session that already runs
becomes the newcomer's: its output goes to that node's writer from then on, its end is the
node's end. Where no launcher waits (none started: the job cannot, launch.can_warm; ended;
not ready) `take` says None and the newcomer starts cold, as without.

    warm.keep()         every poll of run_job's follow: a launcher on each ready spare
    warm.take(node, ..) the promoted spare's session (its future), or None: start it cold
    warm.close()        the launchers of spares not promoted stopped, their sessions closed
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from provision.job.following import SESSION_LOST, stop_job
from provision.job.output import PrefixWriter
from provision.model import nodetext
from provision.model.errors import LaunchError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.nodes import Connector, NodeGroup, background

HELD_BYTES = 64 * 1024  # a launcher's output before it takes a rank: kept for that node


class Relay:
    """A warm session's output: held (the last HELD_BYTES) until the spare takes a rank, then
    written to that node's writer."""

    def __init__(self) -> None:
        self.target: PrefixWriter | None = None
        self.held = ""
        self.lock = threading.Lock()

    def write(self, data: str) -> int:
        with self.lock:
            if self.target is None:
                self.held = (self.held + data)[-HELD_BYTES:]
                return len(data)
            target = self.target
        return target.write(data)

    def flush(self) -> None:
        """Fabric calls it between chunks."""

    def bind(self, target: PrefixWriter) -> None:
        with self.lock:
            self.target, held, self.held = target, self.held, ""
        if held:
            target.write(held)

    def finish(self) -> None:
        if self.target is not None:
            self.target.finish()


@dataclass
class _Session:
    spare: NodeRecord
    relay: Relay
    future: Future[int] | None = None
    node: NodeRecord | None = None  # the rank it took


def _key(node: NodeRecord) -> tuple[str, int]:
    """A machine, whatever name it has (a promoted spare takes the lost node's)."""
    return node.address, node.port


@dataclass
class WarmSpares:
    inv: Inventory
    command: Callable[[NodeRecord], str]  # a spare's launcher (launch.node_command, warm)
    connector: Connector
    writer: dict[str, PrefixWriter]  # run_job's, by node name
    finished: Callable[[NodeRecord, int], None] | None = None  # JobMonitor.finished
    log: Log = print
    sessions: dict[tuple[str, int], _Session] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: bool = False

    def __post_init__(self) -> None:
        self.group = NodeGroup(self.inv, [], connector=self.connector)

    def keep(self) -> None:
        """A launcher on every ready spare that has none (each is started once)."""
        with self.lock:
            if self.closing:
                return
            new = [s for s in self.inv.spares if _key(s) not in self.sessions]
            for spare in new:
                self.sessions[_key(spare)] = _Session(spare, Relay())
        for spare in new:
            self._start(self.sessions[_key(spare)], self.command(spare))

    def _start(self, session: _Session, command: str) -> None:
        session.future = background(lambda: self._run(session, command))

    def _run(self, session: _Session, command: str) -> int:
        try:
            code = self.group.connection(session.spare).run(command, out=session.relay).exit_code
        except Exception as exc:
            with self.lock:
                node, closing = session.node, self.closing
            if node is None and not closing:
                self.log(f"the warm launcher on spare {session.spare.name} could not run "
                         f"({nodetext.shown(str(exc))[:300]}): it takes a rank cold")
            if node is None or closing:
                return SESSION_LOST
            raise LaunchError(f"{node.name}: could not run the job: {exc}") from exc
        finally:
            session.relay.finish()
        with self.lock:
            node, closing = session.node, self.closing
        if node is not None and self.finished is not None:
            self.finished(node, code)
        elif node is None and not closing:
            said = [t for t in nodetext.lines(session.relay.held) if t.strip()
                    and not t.startswith("MGPU-")]  # its end line says only "exited"
            last = said[-1:] or [""]
            self.log(f"the warm launcher on spare {session.spare.name} ended (exit {code}): "
                     f"it takes a rank cold; its last line: {nodetext.shown(last[0])[:300]}")
        return code

    def take(self, node: NodeRecord, command: str) -> Future[int] | None:
        """`node` (a spare just promoted to a lost rank) joins through its waiting launcher,
        told by `command` (launch.promote_command): its session's future, or None (no
        launcher waits there: start it cold)."""
        with self.lock:
            session = self.sessions.get(_key(node))
            if session is None or session.future is None:
                return None  # no launcher was started there: nothing to set aside either
            session.node = node
        with NodeGroup(self.inv, [node], connector=self.connector) as told:
            result = told.run(command, timeout=30)[node.name]
            if result.ok:
                self.log(f"{node.name}: the launcher waiting warm on {session.spare.name} "
                         "takes its rank (torch imported already)")
                session.relay.bind(self.writer[node.name])
                return session.future
            with self.lock:
                session.node = None
            self.log(f"{node.name}: its warm launcher did not take the rank "
                     f"({result.why}); starting it cold")
            stop_job(told, [node], grace=5.0)
        return None

    def close(self) -> None:
        """Stop the launchers that took no rank (their job is over: no rank will come) and
        close every session's connection."""
        with self.lock:
            self.closing = True
            idle = [s.spare for s in self.sessions.values()
                    if s.node is None and s.future is not None and not s.future.done()]
        if idle:
            with NodeGroup(self.inv, idle, connector=self.connector) as group:
                stop_job(group, idle, grace=5.0)
        self.group.close()
