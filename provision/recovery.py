"""Supervise a running job; on a failure replace only what failed and resume from the last
checkpoint.

Detection (a Watcher is the launch.JobMonitor of the run):
    node lost    a node's session dropped or the job could not start there, and the node is
                 gone: the provider says so (contract.Recoverable.node_alive), or, for a
                 provider that cannot tell, a fresh SSH login fails
    rank crash   a launcher exited non-zero (launch has run the diagnosis on its output)
    hang         no output line from any node and no checkpoint change for --stall-timeout s;
                 every rank's Python stack is dumped into the run's output first
    preemption   a node's supervisor saw a notice (remote/preempt.py) and signalled its ranks;
                 the other nodes' ranks get the same signal, the save is copied, then stop
Recovery (run_supervised), at most --max-restarts times:
    keep the last checkpoint -> lost / preempted nodes: replace (Recoverable.replace), or wait
    for the same hosts (--on-node-loss restart), or stop (fail) -> bootstrap the new nodes and
    update the others -> restore the checkpoint on every node -> launch again with
    MGPU_RESTART_COUNT + 1. Every replacement is recorded in the inventory.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from provision.checkpoints import CheckpointKeeper, local_checkpoint_dir
from provision.errors import LaunchError, MgpuError
from provision.inventory import Inventory, InventoryStore, NodeRecord, Replacement
from provision.launch import SESSION_LOST, job_container, run_job
from provision.nodes import NodeGroup
from provision.providers.contract import Provider, Recoverable
from provision.spec import JobSpec

if TYPE_CHECKING:
    from provision.gate_injob import InJobGate

Log = Callable[[str], None]
EVENT_PREFIX = "MGPU-EVENT "  # remote/supervise.py prints events with this prefix
PREEMPT_SAVE_DEADLINE_S = 90.0  # AWS gives ~120 s, GCP ~30 s: what a save may take at most
REACHABLE_DEADLINE_S = 10.0  # a fresh login to a node said to be alive
RETURN_DEADLINE_S = 600.0  # --on-node-loss restart: how long to wait for the same host


@dataclass
class Failure:
    kind: str  # "node lost" | "preemption" | "hang" | "rank crash"
    nodes: list[NodeRecord]
    code: int

    def describe(self) -> str:
        where = ", ".join(n.name for n in self.nodes)
        return f"{self.kind} ({where})" if where else self.kind


@dataclass
class Watcher:
    """launch.JobMonitor: hang and preemption detection, per-node exit codes."""

    inv: Inventory
    job: JobSpec
    keeper: CheckpointKeeper
    log: Log
    codes: dict[str, int] = field(default_factory=dict)
    first_failed: list[str] = field(default_factory=list)  # the node that failed first
    preempted: dict[str, dict[str, str]] = field(default_factory=dict)
    reason: str | None = None
    last_output: float = field(default_factory=time.monotonic)
    notice_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, node: NodeRecord, text: str) -> None:
        self.last_output = time.monotonic()
        if text.startswith(EVENT_PREFIX):
            try:
                event = json.loads(text[len(EVENT_PREFIX):])
            except json.JSONDecodeError:
                return
            if event.get("event") == "preemption":
                with self.lock:
                    self.preempted.setdefault(node.name, event)
                    self.notice_at = self.notice_at or time.monotonic()

    def finished(self, node: NodeRecord, code: int) -> None:
        with self.lock:
            self.codes[node.name] = code
            if code != 0 and not self.first_failed and self.reason is None:
                self.first_failed.append(node.name)

    def poll(self) -> str | None:
        if self.preempted and self.reason is None:
            self.reason = "preemption"
            return self._preemption()
        timeout = self.job.stall_timeout
        if timeout is not None and self.reason is None:
            quiet = time.monotonic() - max(self.last_output, self.keeper.last_change)
            if quiet > timeout:
                self.reason = "hang"
                self.log(f"no output and no checkpoint for {quiet:.0f} s (--stall-timeout "
                         f"{timeout:g}): the job looks hung; dumping every rank's stack")
                dump_stacks(self.inv, self.job, self.log)
                return f"hang: no progress for {quiet:.0f} s"
        return None

    def _preemption(self) -> str:
        names = sorted(self.preempted)
        first = self.preempted[names[0]]
        signame = self.job.preempt_signal
        self.log(f"{', '.join(names)}: preemption notice ({first.get('action', '?')}"
                 f"{' at ' + first['time'] if first.get('time') else ''}); every rank is asked "
                 f"to save now ({signame}); waiting for the checkpoint")
        with NodeGroup(self.inv) as group:  # the notified nodes signalled their own ranks
            others = [n for n in self.inv.nodes if n.name not in self.preempted]
            layout = group.layout
            group.run(layout.remote_command("signal", "--pidfile", layout.pidfile,
                                            "--signal", signame,
                                            *_container_words(self.inv, self.job)),
                      nodes=others, timeout=60)
        if self.keeper.wait_for_copy(after=self.notice_at, deadline_s=PREEMPT_SAVE_DEADLINE_S):
            self.log("the checkpoint saved after the notice is kept")
        else:
            self.log(f"no checkpoint was saved within {PREEMPT_SAVE_DEADLINE_S:.0f} s of the "
                     "notice; the last one kept will be used")
        return f"preemption notice on {', '.join(names)}"


def _container_words(inv: Inventory, job: JobSpec) -> list[str]:
    container = job_container(inv, job)
    return ["--container", container] if container else []


def dump_stacks(inv: Inventory, job: JobSpec, log: Log) -> None:
    """Every rank's Python stack: py-spy output comes back here; faulthandler's goes to the
    job's own output (already streamed with its [node-R] prefix)."""
    with NodeGroup(inv) as group:
        layout = group.layout
        res = group.run(layout.remote_command("stacks", "--pidfile", layout.pidfile,
                                              *_container_words(inv, job)), timeout=150)
    for name, r in res.items():
        text = r.value.stdout if r.value is not None else r.why()
        for line in text.splitlines():
            log(f"[{name}] {line}")


def _alive(provider: Provider, inv: Inventory, node: NodeRecord) -> bool:
    if isinstance(provider, Recoverable):
        try:
            if not provider.node_alive(inv, node):
                return False
        except MgpuError:
            pass  # cannot tell: try to log in
    with NodeGroup(inv, [node]) as group:
        return group.wait_until_reachable(REACHABLE_DEADLINE_S)[node.name].ok


def classify(code: int, watcher: Watcher, provider: Provider, inv: Inventory) -> Failure:
    """What went wrong, once the job has stopped everywhere (code != 0)."""
    if watcher.reason == "preemption":
        nodes = [n for n in inv.nodes if n.name in watcher.preempted]
        return Failure("preemption", nodes, code)
    lost = [n for n in inv.nodes if not _alive(provider, inv, n)]
    if lost:
        return Failure("node lost", lost, code)
    if watcher.reason == "hang":
        return Failure("hang", [], code)
    # the node that failed first; the others were stopped because of it
    return Failure("rank crash", [n for n in inv.nodes if n.name in watcher.first_failed], code)


@dataclass
class Recovery:
    provider: Provider
    inv: Inventory
    store: InventoryStore
    job: JobSpec
    log: Log
    keeper: CheckpointKeeper

    def bring_back(self, failure: Failure) -> None:
        """Make the cluster whole again for a restart (replaced nodes bootstrapped, the
        others told about them, the checkpoint on every node). Raises MgpuError if not."""
        t0 = time.monotonic()
        nodes = failure.nodes if failure.kind in ("node lost", "preemption") else []
        replaced: list[NodeRecord] = []
        if nodes:
            mode = self.job.on_node_loss
            if mode == "fail":
                raise MgpuError(f"{failure.describe()}: --on-node-loss fail")
            if mode == "replace":
                replaced = self._replace(nodes, failure.kind)
            else:
                self._wait_for(nodes)
        t1 = time.monotonic()
        if replaced:
            from provision.bootstrap import bootstrap_cluster, refresh_peers

            with NodeGroup(self.inv, replaced) as group:
                bootstrap_cluster(self.inv, self.store, job=self.job, log=self.log, group=group)
            others = [n for n in self.inv.nodes if n not in replaced]
            with NodeGroup(self.inv, others) as group:
                refresh_peers(self.inv, self.store, group)
        t2 = time.monotonic()
        with NodeGroup(self.inv) as group:
            restored = self.keeper.restore(group)
        t3 = time.monotonic()
        self.log(f"ready to restart in {t3 - t0:.1f} s: replacement {t1 - t0:.1f} s, "
                 f"bootstrap {t2 - t1:.1f} s, restore {t3 - t2:.1f} s "
                 f"({restored} checkpoint file(s) on every node)")

    def _replace(self, nodes: list[NodeRecord], why: str) -> list[NodeRecord]:
        if not isinstance(self.provider, Recoverable):
            raise MgpuError(
                f"provider {self.inv.provider!r} cannot replace nodes ({', '.join(n.name for n in nodes)})",
                hint="restart on the same machines with --on-node-loss restart, or stop with "
                "--on-node-loss fail",
            )
        new_nodes = []
        for node in nodes:
            self.log(f"replacing {node.name} ({why}) ...")
            new = self.provider.replace(self.inv, self.store, node)
            self.inv.replacements.append(Replacement(rank=node.rank, old=node.resource_id,
                                                     new=new.resource_id, reason=why))
            self.store.save(self.inv)
            new_nodes.append(new)
        return new_nodes

    def _wait_for(self, nodes: list[NodeRecord]) -> None:
        self.log(f"waiting up to {RETURN_DEADLINE_S:.0f} s for {', '.join(n.name for n in nodes)}"
                 " to come back (--on-node-loss restart)")
        with NodeGroup(self.inv, nodes) as group:
            group.wait_until_reachable(RETURN_DEADLINE_S).raise_for("waiting for the nodes")


Begin = Callable[[NodeGroup], str]  # a job record for the next attempt: its id
End = Callable[[str, NodeGroup], None]  # the attempt `id` has ended: record how
Gate = Callable[[], "InJobGate"]  # each attempt's in-job fabric gate (provision/gate_injob.py)


def run_supervised(provider: Provider, inv: Inventory, store: InventoryStore, job: JobSpec,
                   *, log: Log, group: NodeGroup | None = None, begin: Begin | None = None,
                   end: End | None = None, gate: Gate | None = None) -> int:
    """Run `job`, keeping its checkpoints safe; on a failure, recover and restart (at most
    job.max_restarts times). Each attempt is a job of its own (`begin` gives its id, `end`
    records its outcome). `gate`: every attempt starts with the fabric gate in the job's
    own processes; FabricGateError when it failed (the job did not start: no restart).
    Returns the job's exit code (0, or the last failure's)."""
    keeper = CheckpointKeeper(inv, local_checkpoint_dir(inv), log=log)
    recovery = Recovery(provider, inv, store, job, log, keeper)
    restarts = 0
    while True:
        watcher = Watcher(inv, job, keeper, log)
        nodes = group or NodeGroup(inv)
        job_id = begin(nodes) if begin is not None else None
        keeper.start()
        launch_error: LaunchError | None = None
        in_job = gate() if gate is not None else None
        try:
            code = run_job(inv, job, log=log, group=nodes, monitor=watcher,
                           restart_count=restarts, job_id=job_id, gate=in_job)
        except LaunchError as exc:
            launch_error, code = exc, SESSION_LOST
        finally:
            keeper.stop()
            if job_id is not None and end is not None:
                with NodeGroup(inv) as fresh:
                    end(job_id, fresh)
            if nodes is not group:
                nodes.close()
        group = None  # after a failure the nodes may have changed: fresh connections
        if in_job is not None and in_job.record is not None:
            in_job.finish(code)  # FabricGateError when the gate kept the job from starting
        failure = None if code == 0 else classify(code, watcher, provider, inv)
        if in_job is not None and in_job.record is None and (
                failure is None or failure.kind != "node lost"):
            in_job.finish(code)  # the gate never finished (a lost node is recovered instead)
        if failure is None:
            return 0
        if launch_error is not None and failure.kind != "node lost":
            raise launch_error  # e.g. the nodes cannot run the image: not worth a restart
        log(f"failure: {failure.describe()}")
        if restarts >= job.max_restarts:
            if launch_error is not None:
                raise launch_error
            used = f"{restarts} of {job.max_restarts} restart(s) used"
            log(f"giving up: {failure.describe()}; {used}" if job.max_restarts else
                f"not restarting: {failure.describe()} (use --max-restarts N to recover)")
            return code if code != 0 else 1
        restarts += 1
        log(f"restart {restarts} of {job.max_restarts}: recovering from {failure.describe()}")
        recovery.bring_back(failure)
