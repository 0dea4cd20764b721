"""Resident restarts, the controller's side (issue 44; the node's side: remote/resident.py):
a node lost mid-job is replaced while the other nodes' ranks keep their processes (torch
imported, model and data built) and re-form the process group with the newcomer.

    ResidentRanks  what the ranks' `MGPU-EVENT {"event": "resident", ...}` lines said: the
                   world, which ranks each node runs, which have stopped and wait
    Rejoin         run_job's hook for one attempt (job/following.Rejoin): a lost node ->
                   every rank left stopped and waiting -> one last copy of the checkpoint ->
                   replaced, bootstrapped, the checkpoint back on every node
                   (Recovery.bring_back) -> `remote.pyz resident reform` on every other node
                   at once -> the newcomer's launcher started (launch.Join), its ranks
                   joining generation G+1 with the same ranks; one login per node for all
                   of it (the cut's connections, NodeGroup.subset)
It says which path a loss took: "resident restart ..." (the run's output, the `resumed`
record, JobRecord.resident_restarts) or "full relaunch: WHY", after which the job is stopped
on every node and relaunched as for any script (job/attached.supervise): a script that does
not call remote.resident.run, a launcher without resident restarts (deepspeed, accelerate,
torchrun --rdzv), --on-node-loss other than replace, --min-nodes, no restarts left, ranks
that did not all stop within STOP_WAIT_S (or had ended their training: a loss after the last
step), or any failure on the way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from provision.cluster.providers.contract import Recoverable
from provision.job.following import SESSION_LOST, Starter, stop_job
from provision.job.launch import Join, node_command, promote_command
from provision.job.launchers import get_launcher
from provision.job.recovery import Failure, Recovery
from provision.job.watcher import EVENT_PREFIX, Watcher
from provision.model.errors import MgpuError
from provision.model.inventory import NodeRecord
from provision.model.nodejson import ResidentEvent, Unreadable, read, unreadable
from provision.nodes import NodeGroup, background

STOP_WAIT_S = 30.0  # for every rank left to stop on the lost peer (gloo: at once)
GRACE_S = 6.0  # ranks stopped and no node lost after this: a rank crash (relaunch)


@dataclass
class ResidentRanks:
    """The resident ranks' lines, fed as they arrive (any thread)."""

    world: int = 0
    gen: int = 0
    ranks: dict[str, set[int]] = field(default_factory=dict)  # node -> its global ranks
    waiting: dict[int, float] = field(default_factory=dict)  # rank -> when it stopped (gen)
    done: set[int] = field(default_factory=set)  # ranks whose training ended (gen)
    lock: threading.Lock = field(default_factory=threading.Lock)
    say: Callable[[str], None] | None = None  # an unreadable line, said

    def feed(self, node: str, text: str) -> None:
        if not text.startswith(EVENT_PREFIX) or '"resident"' not in text:
            return
        try:
            event = read(ResidentEvent, text[len(EVENT_PREFIX):])
        except Unreadable as exc:  # said, and the line is left out
            if self.say is not None and '"event": "resident"' in text:
                self.say(unreadable(node, "resident event", exc))
            return
        with self.lock:
            if event.phase == "formed":
                self.world = event.world
                for other, held in self.ranks.items():  # a newcomer took the rank over
                    if other != node:
                        held.discard(event.rank)
                self.ranks.setdefault(node, set()).add(event.rank)
            elif event.phase == "interrupted" and event.gen == self.gen:
                self.waiting.setdefault(event.rank, time.monotonic())
            elif event.phase == "done" and event.gen == self.gen:
                self.done.add(event.rank)

    def missing(self) -> str | None:
        """Why not every rank can be re-formed (None: all are known to be resident)."""
        with self.lock:
            if not self.world:
                return "the script does not use remote.resident.run"
            known = set().union(*self.ranks.values()) if self.ranks else set()
            if len(known) < self.world:
                return (f"{self.world - len(known)} of {self.world} rank(s) did not say they "
                        "run remote.resident.run")
        return None

    def stopped(self, nodes: list[str], deadline_s: float) -> list[int]:
        """Wait until every rank of `nodes` has stopped on the failure; the ranks that did
        not within `deadline_s` (empty: all did), at once when one of them has ended its
        training instead (it waits for no word: a loss after the last step)."""
        end = time.monotonic() + deadline_s
        while True:
            with self.lock:
                left = sorted(r for n in nodes for r in self.ranks.get(n, set())
                              if r not in self.waiting)
                ended = self.done.intersection(left)
            if not left or ended or time.monotonic() >= end:
                return left
            time.sleep(0.05)

    def ended(self, ranks: list[int]) -> list[int]:
        """Those of `ranks` that said their training ended, in this generation."""
        with self.lock:
            return sorted(self.done.intersection(ranks))

    def next_generation(self) -> int:
        with self.lock:
            self.gen += 1
            self.waiting.clear()
            self.done.clear()
            return self.gen

    def oldest_wait(self) -> float | None:
        with self.lock:
            return min(self.waiting.values(), default=None)


@dataclass
class Rejoin:
    """job/following.Rejoin for one attempt of `job_id` (see the module doc)."""

    run: Any  # attached.JobRun (job/attached.py imports this module)
    recovery: Recovery
    job_id: str
    restarts: int  # used before this attempt
    ranks: ResidentRanks = field(default_factory=ResidentRanks)
    gone_names: Callable[[], list[str]] | None = None  # liveness.GoneNodes
    forget_gone: Callable[[], None] | None = None  # GoneNodes.reset
    on_failure: Callable[[Failure], None] | None = None  # the ledger: lost work, recovery
    on_resumed: Callable[[], None] | None = None  # the ledger: training again
    on_reset: Callable[[str], None] | None = None  # the node's exit code forgotten (Watcher)
    used: int = 0  # resident restarts made in this attempt
    said: list[str] = field(default_factory=list)  # one line per restart, for the record
    alone: bool = False  # node 0's first launcher is gone: newcomers start alone
    busy: bool = False
    warm_spares: Any = None  # job/warmspares.WarmSpares: ready spares' waiting launchers

    def gone(self, running: list[NodeRecord]) -> list[NodeRecord]:
        names = set(self.gone_names()) if self.gone_names is not None else set()
        return [n for n in running if n.name in names]

    def stalled(self) -> str | None:
        since = self.ranks.oldest_wait()
        if self.busy or since is None or time.monotonic() - since < GRACE_S:
            return None
        return ("resident ranks stopped on an error and no node was lost: a rank crash "
                "(full relaunch)")

    def lost(self, nodes: list[NodeRecord],
             start: Starter) -> dict[Future[int], NodeRecord] | None:
        names = [n.name for n in nodes]
        kept = [n for n in self.run.inv.nodes if n.name not in names]
        with NodeGroup(self.run.inv, kept) as group:  # the cut and the word: one login each
            return self._lost(nodes, start, group)

    def _lost(self, nodes: list[NodeRecord], start: Starter,
              group: NodeGroup) -> dict[Future[int], NodeRecord] | None:
        names = [n.name for n in nodes]
        why = self._why_not()
        if why is None:
            self._cut(group, nodes)
            left = self.ranks.stopped([n.name for n in group.nodes], STOP_WAIT_S)
            ended = self.ranks.ended(left)
            why = (f"rank(s) {ended} had ended their training (done)" if ended else
                   f"rank(s) {left} did not stop within {STOP_WAIT_S:.0f} s" if left else None)
        if why is not None:
            self.run.log(f"{', '.join(names)} lost; full relaunch: {why}")
            return None
        self.busy = True
        started: dict[Future[int], NodeRecord] = {}
        try:
            return self._replace(nodes, start, started, group)
        except MgpuError as exc:
            self.run.log(f"resident restart failed ({exc.message}); full relaunch")
            if started:
                with NodeGroup(self.run.inv, list(started.values())) as group:
                    stop_job(group, grace=5.0)
            return None
        finally:
            self.busy = False

    def _cut(self, group: NodeGroup, lost: list[NodeRecord]) -> None:
        """The word to every other node (`group`) at once that the generation is over: its
        ranks shut their connections to every node of the cluster (remote/resident.py
        `cut`), so none waits in a collective for a peer that vanished without closing its
        connections, or for a healthy one that waits itself. Best effort."""
        hosts = sorted({n.private_address for n in [*group.nodes, *lost]})
        layout = group.layout
        group.run(layout.remote_command(
            "resident", "reform", "--dir", layout.job_dir(self.job_id), "--gen",
            str(self.ranks.gen), "--cut", *hosts), timeout=30)

    def warm(self, spares: Any) -> bool:
        """following.Rejoin.warm: the spares' waiting launchers, kept where a lost node can
        take this path at all."""
        if self._cannot() is not None:
            return False
        self.warm_spares = spares
        return True

    def _why_not(self) -> str | None:
        why = self._cannot()
        if why is not None:
            return why
        if self.restarts + self.used >= self.run.job.max_restarts:
            return f"no restart left (--max-restarts {self.run.job.max_restarts})"
        return self.ranks.missing()

    def _cannot(self) -> str | None:
        """Why no loss in this attempt can take this path (the job and the provider)."""
        run, job = self.run, self.run.job
        if not get_launcher(job.launcher).resident(job):
            return f"the {job.launcher} launcher{' with --rdzv' if job.rdzv else ''} has no " \
                   "resident restarts"
        if job.on_node_loss != "replace":
            return f"--on-node-loss {job.on_node_loss}: lost nodes are not replaced"
        if not isinstance(run.provider, Recoverable):
            return f"the {run.inv.provider} provider cannot replace a node"
        if job.min_nodes is not None:
            return "--min-nodes may go on without the node"
        return None

    def _replace(self, nodes: list[NodeRecord], start: Starter,
                 started: dict[Future[int], NodeRecord],
                 group: NodeGroup) -> dict[Future[int], NodeRecord]:
        """Replace `nodes`; each newcomer is started (into `started`) once bootstrapped,
        while the checkpoint goes back on every node: its ranks form the next generation's
        group with the others, which only come once the checkpoint is back and they have
        the word, so none reads the checkpoint before it is whole."""
        run, t0 = self.run, time.monotonic()
        names = [n.name for n in nodes]
        kept = [n for n in run.inv.nodes if n.name not in names]
        run.log(f"{', '.join(names)} lost: the ranks of {', '.join(n.name for n in kept)} keep "
                "their processes (resident restart); replacing it")
        failure = Failure("node lost", nodes, SESSION_LOST)
        run.event("node_lost", f"{failure.describe()}: resident restart", names)
        if self.on_failure is not None:
            self.on_failure(failure)
        keeper = self.recovery.keeper  # one last copy from the nodes still here, while
        copying = background(lambda: keeper.stop(gone=frozenset(names)))  # a node is readied
        gen = self.ranks.next_generation()
        self.alone = self.alone or any(n.rank == 0 for n in nodes)
        count = self.restarts + self.used + 1  # this restart's number (counted once it worked)

        def begin(new_nodes: list[NodeRecord]) -> None:
            master = run.inv.master.private_address
            for new in new_nodes:  # a promoted spare may have a name of its own: by rank
                old = next((n for n in nodes if n.rank == new.rank), new)
                for name in {old.name, new.name}:
                    if self.on_reset is not None:
                        self.on_reset(name)
                with self.ranks.lock:
                    base = min(self.ranks.ranks.get(old.name) or {0})
                join = Join(gen, master, base, self.ranks.world, self.alone)
                fut = None if self.warm_spares is None else self.warm_spares.take(
                    new, promote_command(run.inv, run.job, new, job_id=self.job_id,
                                         restart_count=count, join=join))
                if fut is None:  # no launcher waits warm there: started cold
                    fut = start(new, node_command(run.inv, run.job, new, job_id=self.job_id,
                                                  restart_count=count, join=join,
                                                  survive=run.survive))
                started[fut] = new

        try:
            self.recovery.bring_back(failure, bootstrapped=begin, group=group, copying=copying.result)
        finally:  # ended before a full relaunch stops the keeper again
            copying.result()
        keeper.start()
        layout = group.layout
        group.run(layout.remote_command(
            "resident", "reform", "--dir", layout.job_dir(self.job_id), "--gen", str(gen),
            "--master", run.inv.master.private_address)).raise_for(
            "telling the resident ranks to re-form", MgpuError)
        if self.forget_gone is not None:
            self.forget_gone()
        self.used += 1
        line = (f"resident restart {count} of {run.job.max_restarts}: "
                f"{', '.join(names)} replaced in {time.monotonic() - t0:.1f} s; "
                f"{len(kept)} node(s) kept their processes; generation {gen}")
        run.log(line)
        self.said.append(line)
        run.event("resumed", line)
        if self.on_resumed is not None:
            self.on_resumed()
        return dict(started)


def rejoin_for(run: Any, recovery: Recovery, job_id: str, restarts: int, watcher: Watcher,
               failed: Callable[[Failure], None] | None,
               resumed: Callable[[], None] | None) -> Rejoin:
    """One attempt's Rejoin, wired to its Watcher (a replaced node's exit code forgotten),
    liveness (a replaced node is not gone) and ledger (`failed`, `resumed`)."""
    def forget(name: str) -> None:
        with watcher.lock:
            watcher.codes.pop(name, None)
            watcher.first_failed[:] = [n for n in watcher.first_failed if n != name]

    gone = watcher.gone
    return Rejoin(run, recovery, job_id, restarts, ranks=ResidentRanks(say=run.log),
                  gone_names=gone,
                  forget_gone=getattr(gone, "reset", None), on_failure=failed,
                  on_resumed=resumed, on_reset=forget)
