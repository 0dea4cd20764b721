"""Supervise a running job; on a failure replace only what failed, resume from the last
checkpoint (a lost node under resident ranks without a relaunch: job/resident.py).

Detection is job/watcher.py (node lost, rank crash, hang, preemption, slow node); here, which
nodes are gone after a dropped session (classify: the provider, else a fresh SSH login), and
what follows. A resume below the restored step is flagged by job/resumecheck.py.
Recovery (the loop is provision/job/attached.supervise), at most --max-restarts times:
    keep the last checkpoint -> lost / preempted nodes: a warm spare or a replacement (the
    pool, job/sparepool.py), or wait for the same hosts (--on-node-loss restart), or stop
    (fail) -> bootstrap the new nodes and update the others -> restore the checkpoint on every
    node -> launch again with MGPU_RESTART_COUNT + 1. Every replacement is in the inventory."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from provision.cluster.providers.contract import AnyProvider, Recoverable
from provision.job.checkpoints import CheckpointKeeper
from provision.job.elastic import Grower
from provision.job.launch import workdir_of
from provision.job.sparepool import SparePool
from provision.job.watcher import OnEvent, Watcher
from provision.model import timeline
from provision.model.errors import LaunchError, MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, Replacement
from provision.model.logsink import Log
from provision.model.nodetext import shown
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup, borrowed, fan_out
from provision.nodes.bootstrap import bootstrap_cluster, refresh_peers

FAILURE_EVENTS = {"node lost": "node_lost", "preemption": "preempted", "hang": "hang",
                  "rank crash": "crashed", "slow node": "slow_node", "grow": "growing"}
REPLACED_KINDS = ("node lost", "preemption", "slow node")  # failures whose nodes are replaced
CANCELLED = 130  # a cancel's exit code
REACHABLE_DEADLINE_S = 10.0  # a fresh login to a node said to be alive
RETURN_DEADLINE_S = 600.0  # --on-node-loss restart: how long to wait for the same host


@dataclass
class Failure:
    kind: str  # "node lost" | "preemption" | "hang" | "rank crash"
    nodes: list[NodeRecord]
    code: int
    cause: str | None = None  # a rank crash: "rank 2, exit 1: ValueError: ... (train.py:7)"
    story: list[str] = field(default_factory=list)  # what to print about it, the cause first

    def describe(self) -> str:
        where = ", ".join(n.name for n in self.nodes)
        return f"{self.kind} ({where})" if where else self.kind

    def give_up(self, restarts: int, max_restarts: int) -> str:
        if not max_restarts:
            return f"not restarting: {self.describe()} (use --max-restarts N to recover)"
        return f"giving up: {self.describe()}; {restarts} of {max_restarts} restart(s) used"


def _lost(provider: AnyProvider, inv: Inventory, gone: frozenset[str]) -> list[NodeRecord]:
    """`gone`, and the nodes the provider is sure are gone (node_alive: "cannot tell" is
    alive) or a fresh login cannot reach: all asked at once (not one login per node)."""
    ask = [n for n in inv.nodes if n.name not in gone]
    said = fan_out(ask, lambda n: not isinstance(provider, Recoverable)
                   or provider.node_alive(inv, n))
    with NodeGroup(inv, [n for n, ok in zip(ask, said, strict=True) if ok]) as group:
        reached = group.wait_until_reachable(REACHABLE_DEADLINE_S)
    return [n for n in inv.nodes if n.name in gone or n.name not in reached
            or not reached[n.name].ok]


@dataclass
class Outcome:
    """How one attempt ended: its exit code (SESSION_LOST when it could not even start on a
    node: `launch_error`), and what its Watcher saw."""

    code: int
    watcher: Watcher
    launch_error: LaunchError | None = None
    gone: frozenset[str] = frozenset()  # nodes the provider said were gone as it ended
    resident_restarts: int = 0  # lost nodes replaced while it ran (job/resident.py)


def classify(outcome: Outcome, provider: AnyProvider, inv: Inventory) -> Failure:
    """What went wrong, once the job has stopped everywhere (outcome.code != 0)."""
    code, watcher = outcome.code, outcome.watcher
    if watcher.reason == "grow":
        return Failure("grow", [], code)
    if watcher.reason == "preemption":
        nodes = [n for n in inv.nodes if n.name in watcher.preempted]
        slow = all(watcher.preempted[n.name].get("action") == "slow" for n in nodes)
        return Failure("slow node" if slow and nodes else "preemption", nodes, code)
    lost = _lost(provider, inv, outcome.gone)  # gone: the provider said so as it ended
    if lost:
        names = ", ".join(n.name for n in lost)
        return Failure("node lost", lost, code, story=[  # the provider or a login said so
            f"{names} was lost: the errors the other nodes printed after that follow from it"])
    if watcher.reason == "hang":
        return Failure("hang", [], code)
    return _crash(watcher, inv, code)


def _crash(watcher: Watcher, inv: Inventory, code: int) -> Failure:
    """A rank crash: the rank that failed first (by its traceback; else the node whose
    launcher exited first); the others were stopped because of it."""
    from provision.job.cause import explain, first_failure, rank_failures

    first = first_failure(rank_failures(watcher.output))
    names = list(watcher.first_failed)
    if first is not None and first.node is not None and not first.consequence:
        names = [first.node]
    story = explain(watcher.output, watcher.codes)
    cause = shown(first.summary(with_node=False)) if first is not None else None
    return Failure("rank crash", [n for n in inv.nodes if n.name in names], code, cause, story)


@dataclass
class Recovery:
    provider: AnyProvider
    inv: Inventory
    store: InventoryStore
    job: JobSpec
    log: Log
    keeper: CheckpointKeeper
    on_event: OnEvent | None = None
    grower: Grower | None = None  # --min-nodes: dropped nodes asked for again
    pool: SparePool = field(init=False)  # where a node for a rank comes from (issue 44)

    def __post_init__(self) -> None:
        self.pool = SparePool(self.provider, self.inv, self.store, self.log)

    def bring_back(self, failure: Failure,
                   bootstrapped: Callable[[list[NodeRecord]], None] | None = None,
                   group: NodeGroup | None = None,
                   copying: Callable[[], object] | None = None) -> None:
        """Make the cluster whole again (new nodes bootstrapped, the others told, the
        checkpoint on every node) or raise MgpuError; a "recovery" timeline. job/resident.py
        gives `bootstrapped` (called before the restore), `group` (its connections to the
        nodes that stay: one login per node) and `copying` (waits for its last copy)."""
        timeline.begin(self.inv, "recovery")
        t0 = time.monotonic()
        nodes = failure.nodes if failure.kind in REPLACED_KINDS else []
        replaced: list[NodeRecord] = []
        if nodes:
            mode = self.job.on_node_loss
            if mode == "fail":
                raise MgpuError(f"{failure.describe()}: --on-node-loss fail")
            with timeline.timed(self.inv, "replacement" if mode == "replace" else "nodes back"):
                if mode == "replace" or failure.kind == "slow node":
                    replaced = self._replace(nodes, failure.kind)
                else:
                    self._wait_for(nodes)
        t1 = time.monotonic()
        with borrowed(self.inv, group) as conns:
            if replaced:
                with timeline.timed(self.inv, "bootstrap"):
                    bootstrap_cluster(self.inv, self.store, log=self.log,
                                      workdir=workdir_of(self.inv, self.job),
                                      group=conns.subset(replaced))
                refresh_peers(self.inv, self.store,
                              conns.subset([n for n in self.inv.nodes if n not in replaced]))
                if bootstrapped is not None:
                    bootstrapped(replaced)
            t2 = time.monotonic()
            with timeline.timed(self.inv, "restore"):
                if copying is not None:
                    copying()
                restored = self.keeper.restore(conns.subset(self.inv.nodes))
        self.store.save(self.inv)
        t3 = time.monotonic()
        self.log(f"ready to restart in {t3 - t0:.1f} s: replacement {t1 - t0:.1f} s, "
                 f"bootstrap {t2 - t1:.1f} s, restore {t3 - t2:.1f} s "
                 f"({restored} checkpoint file(s) on every node)")

    def _replace(self, nodes: list[NodeRecord], why: str) -> list[NodeRecord]:
        new_nodes = []
        for node in nodes:
            if why == "slow node":
                from provision.model.blocklist import remember

                remember(self.inv.provider, self.inv.name, node, why)
            new = self._replace_or_drop(node, why)
            if new is None:
                continue
            self.inv.replacements.append(Replacement(rank=node.rank, old=node.resource_id,
                                                     new=new.resource_id, reason=why))
            self.store.save(self.inv)
            new_nodes.append(new)
            if self.on_event is not None:
                self.on_event("replaced", f"{node.name} replaced ({why})", [node.name])
        return new_nodes

    def _replace_or_drop(self, node: NodeRecord, why: str) -> NodeRecord | None:
        """The replacement of `node`; None when it could not be had (an error, or not within
        --replace-timeout) and --min-nodes lets the run go on without it (job/elastic.py)."""
        pending = self.pool.node_for(node, why)  # a warm spare first (job/sparepool.py)
        try:
            return pending.result(timeout=self.job.replace_timeout)
        except (MgpuError, FutureTimeout) as exc:
            left = len(self.inv.nodes) - 1
            if self.grower is None or self.job.min_nodes is None or left < self.job.min_nodes:
                if isinstance(exc, FutureTimeout):
                    raise MgpuError(f"{node.name}: no replacement within --replace-timeout "
                                    f"{self.job.replace_timeout:g} s") from None
                raise
            why_not = (f"not within --replace-timeout {self.job.replace_timeout:g} s"
                       if isinstance(exc, FutureTimeout) else exc.message)
            self.inv.nodes = [n for n in self.inv.nodes if n.name != node.name]
            self.store.save(self.inv)
            self.grower.drop(node, pending if isinstance(exc, FutureTimeout) else None)
            self.log(f"{node.name} cannot be replaced now ({why_not}): going on with {left} "
                     f"node(s) (--min-nodes {self.job.min_nodes}); asking again meanwhile")
            if self.on_event is not None:
                self.on_event("shrunk", f"going on with {left} node(s) without {node.name} "
                                        f"({why_not})", [node.name])
            return None

    def grow_in(self, nodes: list[NodeRecord]) -> None:
        """Dropped nodes made again (job/elastic.Grower) join: the others learn them, every
        node restores the checkpoint."""
        others = list(self.inv.nodes)
        self.inv.nodes = sorted([*others, *nodes], key=lambda n: n.rank)
        # made anew like any replacement: counted, so the user's machine adopts the
        # controller's copy of the cluster (Inventory.adopt) with the new node's resources
        self.inv.replacements.extend(Replacement(rank=n.rank, old=None, new=n.resource_id,
                                                 reason="grown back") for n in nodes)
        self.store.save(self.inv)
        with NodeGroup(self.inv) as group:  # one login per node for both
            refresh_peers(self.inv, self.store, group.subset(others))
            restored = self.keeper.restore(group)
        names = ", ".join(n.name for n in nodes)
        self.log(f"growing back to {len(self.inv.nodes)} node(s) with {names} "
                 f"({restored} checkpoint file(s) on every node)")
        if self.on_event is not None:
            self.on_event("grown", f"back to {len(self.inv.nodes)} node(s): {names}",
                          [n.name for n in nodes])

    def _wait_for(self, nodes: list[NodeRecord]) -> None:
        self.log(f"waiting up to {RETURN_DEADLINE_S:.0f} s for {', '.join(n.name for n in nodes)}"
                 " to come back (--on-node-loss restart)")
        with NodeGroup(self.inv, nodes) as group:
            group.wait_until_reachable(RETURN_DEADLINE_S).raise_for("waiting for the nodes")
