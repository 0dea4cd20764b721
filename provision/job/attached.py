"""The attached supervision: this process follows the job, keeps its checkpoints, detects a
failure, recovers and starts it again, records every attempt and copies rank 0's outputs back.

    Attached().start(ready)     `run` and `launch` without --detach (provision/job/lifecycle)
    supervise(run, group)       start -> follow (checkpoints kept, failures detected) ->
                                record; on a failure recover and start again, at most
                                job.max_restarts times. The cluster's controller runs this
                                same function for a managed run (managed/supervisor.py),
                                with the store's sinks in its JobRun

    start, follow    job.launch      every node at once, `[node-R]` output, stop on failure
      keep checkpoints  job.checkpoints   $MGPU_CHECKPOINT_DIR copied off the nodes as it changes
      detect         job.watcher     node lost / rank crash / hang / preemption (a Watcher)
      recover        job.recovery    replace only what failed, restore, start again
    record           job.jobs        every attempt is a job record of its own, linked to the
                                     one it restarts; a lost node's log kept as streamed
    explain, recap   job.recovery, job.cause, job.recap   the failure's cause first; a run
                                     that restarted ends with a recap of every attempt
    fetch            job.collect     rank 0's outputs back

A job's life takes what it needs as arguments (`JobRun`: inventory, provider, stores, log
sink) and never reads the terminal: the same code supervises a job from the controller.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from provision.cluster.cost import record_goodput
from provision.cluster.providers.contract import AnyProvider
from provision.job import jobs
from provision.job.checkpoints import CheckpointKeeper, local_checkpoint_dir
from provision.job.elastic import Grower
from provision.job.ends import JobEnds
from provision.job.gate.injob import InJobGate
from provision.job.gate.step import GateFactory
from provision.job.launch import SESSION_LOST, launching_nodes, run_job
from provision.job.ledger import Ledger, from_timeline, queued_in, render
from provision.job.liveness import gone_nodes
from provision.job.recap import Recap
from provision.job.recovery import CANCELLED, FAILURE_EVENTS, Failure, Outcome, Recovery, classify
from provision.job.resident import rejoin_for
from provision.job.resumecheck import ResumeCheck, step_in
from provision.job.supervision import Ready, Started, Supervision, Target
from provision.job.watcher import OnEvent, Watcher
from provision.model import timeline
from provision.model.errors import LaunchError, MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.jobstore import JobRecord, JobStore, NodeJob
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup, background, borrowed


class Attached(Supervision):
    """This process supervises the job (the module doc) and returns its exit code."""

    follows_output = True

    def check(self, job: JobSpec, target: Target, log: Log) -> None:
        if job.notify is not None:  # the terminal shows every state change
            log("--notify is ignored on an attached run: it posts the state changes of a "
                "managed run (--detach --store URL); this terminal shows them")

    def keeper(self, inv: Inventory, log: Log) -> CheckpointKeeper:
        """Where the job's checkpoints are kept while it runs: here
        (./mgpu-outputs/NAME/checkpoints)."""
        return CheckpointKeeper(inv, local_checkpoint_dir(inv), log=log)

    def start(self, ready: Ready) -> Started:
        run = JobRun(ready.inv, ready.provider, ready.store, ready.job, ready.log,
                     keeper=self.keeper(ready.inv, ready.log), gate=ready.gate)
        group = ready.group
        code = supervise(run, group)
        # the same connections when no node changed (saves a round of SSH logins)
        _fetch(run, code, group if group.nodes == sorted(run.inv.nodes,
                                                        key=lambda n: n.rank) else None)
        return Started(code=code)


@dataclass
class JobRun:
    """Everything one job's life needs, passed in (never read from the environment)."""

    inv: Inventory
    provider: AnyProvider
    store: InventoryStore
    job: JobSpec
    log: Log
    records: JobStore = field(default_factory=JobStore)
    outputs: Path | None = None  # where rank 0's outputs go (default ./mgpu-outputs/NAME)
    # a managed run's sinks (provision/job/managed/; None: an attached run, as always):
    keeper: CheckpointKeeper | None = None  # where checkpoints go (default: here)
    out: TextIO | None = None  # the nodes' [node-R] output (the store's log)
    on_event: OnEvent | None = None  # every state change: started, node_lost, replaced ...
    stop: Callable[[], bool] | None = None  # True: end the job for good (a cancel)
    # each attempt's fabric gate in the job's own processes (job/gate/step.py)
    gate: GateFactory | None = None
    # a managed run's (issue 36): its attempts go on when the controller's channels close,
    # and a new controller takes the running one back (`take_back`: its id on the nodes)
    survive: bool = False
    take_back: str | None = None
    restarts: int = 0  # restarts used before this supervision began (a taken-back run's)
    ledger: Ledger | None = None  # the run's goodput ledger (given: a taken-back run's)

    def event(self, event: str, message: str, nodes: list[str] | None = None) -> None:
        if self.on_event is not None:
            self.on_event(event, message, nodes or [])



# --- the job's life -----------------------------------------------------------------------------
def _fetch(run: JobRun, code: int, group: NodeGroup | None) -> None:
    """Rank 0's outputs back; a failure to copy them fails only a job that succeeded."""
    from provision.job.collect import fetch_outputs

    outputs = run.outputs or Path("mgpu-outputs") / run.inv.name
    try:
        fetch_outputs(run.inv, outputs, log=run.log, group=group)
    except MgpuError as exc:
        if code == 0:
            raise
        run.log(f"could not copy the outputs back: {exc.message}")  # the failure matters more


def supervise(run: JobRun, group: NodeGroup) -> int:
    """start -> follow (checkpoints kept, failures detected) -> record; on a failure, recover
    and start again, at most job.max_restarts times. Each attempt is a job of its own, linked
    to the one it restarts (JobRecord.parent); a run that restarted ends with a recap."""
    keeper = run.keeper or CheckpointKeeper(run.inv, local_checkpoint_dir(run.inv), log=run.log)
    grower = Grower(run.provider, run.inv, run.store, run.job, run.log) \
        if run.job.min_nodes is not None else None
    recovery = Recovery(run.provider, run.inv, run.store, run.job, run.log, keeper,
                        run.on_event, grower)
    recovery.pool.on_change = lambda: run.event("replaced", "a new warm spare is ready", [])
    recap = Recap(run.inv.hourly_cost_usd)
    ledger = run.ledger = run.ledger or from_timeline(
        timeline.current(run.inv), len(run.inv.nodes), time.time(), spares=len(run.inv.spares))
    restarts = run.restarts
    nodes: NodeGroup | None = group
    rec: JobRecord | None = None
    taking = run.take_back
    try:
        while True:
            with borrowed(run.inv, nodes) as current:
                rec = _taken(run, taking) if taking else _begin(run, current, parent=rec)
                recap.begin(rec.id, time.monotonic(), len(current.nodes))
                ledger.begin_attempt(time.time(), "training" if taking else "recovery"
                                     if rec.attempt > 1 or restarts else "setup")
                _started(run, restarts, taking)
                gate = run.gate() if run.gate is not None and not taking else None
                outcome = attempt(run, current, keeper, rec, restarts, gate, ledger,
                                  take_back=taking is not None,
                                  grow=None if grower is None else
                                  lambda: grower.due(keeper.last_copy), recovery=recovery)
                taking = None
                restarts += outcome.resident_restarts
            seen = time.time(), time.monotonic()  # the failure's time, before it is classified
            failure = _ended(run, rec, outcome, recap, keeper)
            ledger.end_attempt(seen[0])
            _account(ledger, failure, keeper, seen)
            nodes = None
            if gate is not None and (gate.record is not None or outcome.code == 0):
                gate.finish(outcome.code)  # FabricGateError: the gate kept the job from starting
            if outcome.code == 0:
                return 0
            if failure is None:  # cancelled
                return CANCELLED
            if gate is not None and gate.record is None and failure.kind != "node lost":
                gate.finish(outcome.code)  # the gate never finished (a lost node is recovered)
            if outcome.launch_error is not None and failure.kind != "node lost":
                raise outcome.launch_error  # e.g. the nodes cannot run the image: no restart
            if failure.kind == "grow" and grower is not None:  # not one of --max-restarts
                restarts += 1
                recovery.grow_in(grower.take())
                ledger.resize(len(run.inv.nodes), time.time())
                continue
            _tell(run, failure)
            if restarts >= run.job.max_restarts:
                if outcome.launch_error is not None:
                    raise outcome.launch_error
                run.log(failure.give_up(restarts, run.job.max_restarts))
                return outcome.code
            restarts += 1
            run.log(f"restart {restarts} of {run.job.max_restarts}: recovering from "
                    f"{failure.describe()}")
            t0 = time.monotonic()
            recovery.bring_back(failure)  # fewer nodes with --min-nodes; a spare taken
            ledger.resize(len(run.inv.nodes), time.time(), spares=recovery.pool.held())
            ledger.queued(queued_in(timeline.current(run.inv)) * ledger.nodes)
            recap.recovered(time.monotonic() - t0)
    finally:
        if grower is not None:
            grower.stop()
        recovery.pool.stop()  # a spare being made is recorded before `down` may run
        recovery.pool.wait()
        for line in recap.lines(time.monotonic()):
            run.log(line)
        _close(run, ledger, rec)


def _started(run: JobRun, restarts: int, taking: str | None) -> None:
    if taking:
        run.event("taken_back", f"job {taking} on the nodes followed again by a new "
                                "controller (the last one was lost)")
    elif restarts:
        run.event("resumed", f"restart {restarts} of {run.job.max_restarts}: running again "
                             "(full relaunch: every rank started anew)")
    else:
        run.event("started",
                  f"running on {len(run.inv.nodes)} node(s): {run.job.script_in_workdir}")


def _taken(run: JobRun, job_id: str) -> JobRecord:
    """The record of attempt `job_id`, which runs on the nodes already (issue 36: another
    controller started it); this one's later attempts get the ids after it."""
    rec = JobRecord(id=job_id, cluster=run.inv.name, cluster_created_at=run.inv.created_at,
                    command=jobs.command_of(run.job),
                    launcher=run.job.launcher, attempt=run.restarts + 1,
                    nodes={n.name: NodeJob(rank=n.rank)
                           for n in launching_nodes(run.inv, run.job)})
    run.records.save(rec)
    return rec


def _account(ledger: Ledger, failure: Failure | None, keeper: CheckpointKeeper,
             seen: tuple[float, float] | None = None) -> None:
    """After an attempt: a failure's lost work (since the last kept checkpoint) is redone
    work, and recovery starts; a success or a cancel is the end of the training."""
    now, mono = seen or (time.time(), time.monotonic())  # seen: when the attempt ended
    if failure is None:
        ledger.switch("idle", now)
        return
    if failure.kind == "grow":  # planned, right after a checkpoint: nothing to redo
        ledger.switch("recovery", now)
        return
    since = mono - keeper.last_copy if keeper.last_copy > 0 else None
    trained = ledger.seconds["training"] / max(ledger.nodes, 1)
    ledger.failed(min(since, trained) if since is not None else trained, now)


def _close(run: JobRun, ledger: Ledger, rec: JobRecord | None) -> None:
    """The ledger ends with the job: kept in the last attempt's record and the cost history,
    told, and shown after the recap of a run that restarted (one that did not ends with its
    own last lines, as before)."""
    ledger.close(time.time())
    data = ledger.to_json()
    text = render(data)
    restarted = rec is not None and rec.attempt > 1  # the recap was printed
    for line in text.splitlines() if restarted else []:
        run.log(line)
    if rec is not None:
        rec.ledger = data
        run.records.save(rec)
    with contextlib.suppress(OSError):  # `cost` shows it beside what the cluster cost
        record_goodput(run.inv, data, run.store.home)
    run.event("ledger", text)


def _ended(run: JobRun, rec: JobRecord, outcome: Outcome, recap: Recap,
           keeper: CheckpointKeeper) -> Failure | None:
    """After an attempt: what went wrong (None: it succeeded or was cancelled), the record
    updated (a lost node's log kept as streamed, why it ended), the recap told."""
    failure = None
    if outcome.code != 0 and outcome.watcher.reason != "cancelled":
        failure = classify(outcome, run.provider, run.inv)
        if failure.kind == "node lost":
            jobs.keep_streamed(rec, [n.name for n in failure.nodes], outcome.watcher.output,
                               store=run.records)
    if outcome.code != 0:  # a node may be gone or replaced: fresh connections
        with NodeGroup(run.inv, [n for n in run.inv.nodes
                                 if n.name not in outcome.gone]) as fresh:
            jobs.refresh(run.inv, [rec], fresh, store=run.records,  # exit codes, logs here
                         log=run.log)
    if failure is not None:
        rec.failure = failure.describe() + (f": {failure.cause}" if failure.cause else "")
        run.records.save(rec)
    outcome_text = "succeeded" if outcome.code == 0 else rec.failure or "cancelled"
    kept = keeper.last_copy if keeper.last_copy > 0 else None
    recap.end(outcome_text, time.monotonic(), outcome.watcher.output, kept)
    return failure


def _tell(run: JobRun, failure: Failure) -> None:
    """The failure's story (the cause first), its classification, and its record."""
    for line in failure.story:
        run.log(line)
    run.log(f"failure: {failure.describe()}")
    run.event(FAILURE_EVENTS[failure.kind],
              failure.describe() + (f": {failure.cause}" if failure.cause else ""),
              [n.name for n in failure.nodes])


def attempt(run: JobRun, group: NodeGroup, keeper: CheckpointKeeper, rec: JobRecord,
            restarts: int, gate: InJobGate | None = None,
            ledger: Ledger | None = None, *, take_back: bool = False,
            grow: Callable[[], bool] | None = None, recovery: Recovery | None = None) -> Outcome:
    """One start of the job on every node, followed to its end, its checkpoints kept and a
    Watcher looking for hangs and preemption notices. `gate`: the fabric gate first, in the
    job's own processes. A job that ended well gets its record (exit codes, logs) while the
    last copy of its checkpoints is made: each asks the nodes on connections of its own.
    With `recovery`, a lost node may be replaced while the others' resident ranks go on
    (job/resident.py): the outcome counts those restarts."""
    check = ResumeCheck(keeper.restored_step if restarts or keeper.restored_step else None,
                        lambda text: _regressed(run, text))

    liveness = gone_nodes(run.provider, run.inv)
    watcher = Watcher(run.inv, run.job, keeper, run.log, stop=run.stop, on_event=run.on_event,
                      grow=grow, gone=liveness)
    rejoin = None if recovery is None or take_back else rejoin_for(
        run, recovery, rec.id, restarts, watcher,
        None if ledger is None else lambda f: _account(ledger, f, keeper),
        None if ledger is None else lambda: ledger.switch("training", time.time()))

    def on_line(node: NodeRecord, text: str) -> None:
        check.feed(text)
        if ledger is not None:
            ledger.save_line(text, time.time())
            if step_in(text) is not None:  # training from here (job/ledger.py)
                ledger.step_seen(time.time())
        if rejoin is not None:
            rejoin.ranks.feed(node.name, text)

    watcher.on_line = on_line
    ends = JobEnds(rec.id)  # what each node said as its part ended: state, checkpoints
    keeper.start()
    last_copy: Future[None] | None = None
    try:
        try:
            code = run_job(run.inv, run.job, log=run.log, group=group, monitor=watcher,
                           restart_count=restarts, ends=ends, out=run.out, gate=gate,
                           survive=run.survive, take_back=take_back, rejoin=rejoin)
            outcome = Outcome(code, watcher)
        except LaunchError as exc:
            outcome = Outcome(SESSION_LOST, watcher, launch_error=exc)
        if rejoin is not None and rejoin.used:
            outcome.resident_restarts = rejoin.used
            rec.resident_restarts = rejoin.said
            run.records.save(rec)
        gone = _gone(run, watcher)
        last_copy = background(lambda: keeper.stop(known=ends.manifests(), gone=gone))
        outcome.gone = gone
        if outcome.code == 0:  # every node ended well: its connection is fine
            jobs.refresh(run.inv, [rec], group, store=run.records, log=run.log,  # exit codes, logs
                         reported=ends.states())
        return outcome
    finally:
        if last_copy is None:
            keeper.stop()
        else:
            last_copy.result()


def _gone(run: JobRun, watcher: Watcher) -> frozenset[str]:
    """Nodes whose session dropped and that the provider says are gone: nothing more is
    asked of them this attempt (a login to an address nobody answers waits its full
    timeout: 10 s a node on a controller's bridge, minutes on a cloud)."""
    from provision.cluster.providers.contract import Recoverable

    if not isinstance(run.provider, Recoverable):
        return frozenset()
    said = set(watcher.gone()) if watcher.gone is not None else set()
    dropped = [n for n in run.inv.nodes
               if watcher.codes.get(n.name) == SESSION_LOST or n.name in said]
    return frozenset(n.name for n in dropped if not run.provider.node_alive(run.inv, n))


def _regressed(run: JobRun, text: str) -> None:
    run.log(text)
    run.event("resume_regression", text)


def _begin(run: JobRun, group: NodeGroup, parent: JobRecord | None = None) -> JobRecord:
    """The attempt's record (its id names its log on the nodes and here); `parent`: the
    attempt it restarts."""
    rec = jobs.begin(run.inv, run.job, launching_nodes(run.inv, run.job), detached=False,
                     store=run.records, parent=parent)
    again = f", restart {rec.attempt - 1} of job {rec.parent}" if rec.parent else ""
    run.log(f"job {rec.id}{again} (its log: mgpu-cloud logs {run.inv.name} {rec.id})")
    return rec
