"""Jobs on the nodes: start, follow, refresh, cancel, and their logs copied here.

On each node a job runs under `remote.pyz job start` (remote/jobs.py) in the folder
RemoteLayout.job_dir(ID): merged output in node.log, the exit status in `exit`. An attached
launch is `start --attach` (start + follow in one channel, cancelled when the channel closes);
a detached one returns at once and anyone may `follow` it later (logs --follow, a watcher).
The records are provision.model.jobstore's; `refresh` asks the nodes (one command per node)
and, the first time a job is seen ended, copies its logs here. Nothing here prints: callers log.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from provision.job.launch import node_command
from provision.job.nodelines import Detach
from provision.job.output import PrefixWriter
from provision.model.errors import LaunchError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.jobstore import (
    LOST_CODE,
    JobRecord,
    JobStore,
    NodeJob,
    is_current,
    now_iso,
)
from provision.model.logsink import Log, stderr_line
from provision.model.nodejson import JobStatus, Unreadable, read, read_value, unreadable
from provision.model.nodetext import read_lines, shown
from provision.nodes import GroupResult, NodeConnection, NodeGroup, get_file

if TYPE_CHECKING:
    from provision.model.spec import JobSpec


def command_of(job: JobSpec) -> str:
    """What a job's record says it runs: its script and arguments, quoted as a shell would."""
    return shlex.join([job.script_in_workdir, *job.args])


def begin(inv: Inventory, job: JobSpec, nodes: list[NodeRecord], *, detached: bool,
          self_stop: str | None = None, program: list[str] | None = None,
          store: JobStore | None = None, parent: JobRecord | None = None) -> JobRecord:
    """Record a job about to start on `nodes`; returns it with its new id. `parent`: the
    attempt of the same run that this one restarts."""
    what = " ".join(program) if program is not None else command_of(job)
    chain = {"attempt": parent.attempt + 1, "parent": parent.id} if parent is not None else {}
    return (store or JobStore()).new({
        "cluster": inv.name, "cluster_created_at": inv.created_at, "command": what,
        "launcher": job.launcher, "nodes": {n.name: NodeJob(rank=n.rank) for n in nodes},
        "detached": detached, "self_stop": self_stop, **chain,
    })


# --- on the nodes -----------------------------------------------------------------------------
def refuse_if_busy(inv: Inventory, group: NodeGroup, store: JobStore | None = None) -> None:
    """LaunchError if a job of this cluster still runs (asks the nodes only when a record
    says it might). One job at a time: two would fight over the GPUs and the master port."""
    store = store or JobStore()
    open_recs = [r for r in store.all(inv.name) if is_current(r, inv) and not r.final]
    if not open_recs:
        return
    running = [r for r in refresh(inv, open_recs, group, store=store) if r.state == "running"]
    if running:
        rec = running[-1]
        raise LaunchError(
            f"job {rec.id} ({rec.command}) is still running on cluster {inv.name!r}",
            hint=f"follow it: mgpu-cloud logs {inv.name} {rec.id} --follow; or stop it: "
                 f"mgpu-cloud cancel {inv.name} {rec.id}",
        )


def start_detached(inv: Inventory, job: JobSpec, rec: JobRecord, group: NodeGroup,
                   detach: Detach, store: JobStore | None = None) -> None:
    """Start `rec` on its nodes and return once every node runs it. A node that could not start
    it fails the whole start: the others are cancelled and LaunchError names every failure."""
    store = store or JobStore()
    nodes = [n for n in group.nodes if n.name in rec.nodes]
    results = group.run(lambda n: node_command(inv, job, n, job_id=rec.id, detach=detach),
                        nodes=nodes)
    if results.failed:
        cancel(rec, group, grace=5.0)
        for r in results.failed:
            rec.nodes[r.node.name].set("lost", LOST_CODE)
        rec.state, rec.ended_at = "failed", now_iso()
        store.save(rec)
        results.raise_for(f"starting job {rec.id}", LaunchError)


def cancel(rec: JobRecord, group: NodeGroup, grace: float = 10.0) -> None:
    """Stop the job's process group on every node it runs on (idempotent)."""
    layout = group.layout
    nodes = [n for n in group.nodes if n.name in rec.nodes]
    group.run(layout.remote_command("job", "cancel", "--dir", layout.job_dir(rec.id),
                                    "--grace", f"{grace:g}"), nodes=nodes, timeout=grace + 10)


def _combine(rec: JobRecord) -> str:
    states = [n.state for n in rec.nodes.values()]
    if "running" in states:
        return "running"
    if "unreachable" in states:
        return "unknown"
    if "cancelled" in states:
        return "cancelled"
    if "lost" in states:
        return "lost"
    return "failed" if any(n.exit_code for n in rec.nodes.values()) else "succeeded"


def refresh(inv: Inventory, recs: Iterable[JobRecord], group: NodeGroup, *,
            store: JobStore | None = None,
            reported: dict[str, dict[str, Any]] | None = None,
            log: Log = stderr_line) -> list[JobRecord]:
    """Ask the nodes (one command each) how the records' jobs are; save what changed; copy
    the logs of a job seen ended for the first time. Records of other clusters of that name
    and finished ones are left as they are. Returns the records, updated. `reported`: node ->
    {job id: state} that nodes already told (job/ends.py); a node that told of every record
    here is not asked. Every answer is read as nodejson.JobStatus: an unreadable one is said
    on `log` and that node counts as not answering (its part "unreachable" this time)."""
    store = store or JobStore()
    recs = list(recs)
    todo = [r for r in recs if is_current(r, inv) and (not r.final or not r.logs_saved)]
    if not todo:
        return recs
    wanted = {name for r in todo for name in r.nodes if name not in r.streamed}
    ids = {r.id for r in todo}
    seen: dict[str, JobStatus | None] = {}
    for name, told in (reported or {}).items():
        if ids <= set(told):
            seen[name] = _status(name, told, log)
    layout = group.layout
    nodes = [n for n in group.nodes if n.name in wanted and n.name not in seen]
    results = group.run(layout.remote_command("job", "status", "--jobs", layout.jobs),
                        nodes=nodes, timeout=30) if nodes else {}
    for name, res in results.items():
        answer = res.value.stdout if res.ok and res.value is not None else None
        seen[name] = None if answer is None else _status(name, answer.strip() or "{}", log)
    for rec in todo:
        if not rec.final:
            ended: list[float] = []
            for name in rec.nodes:
                if name in rec.streamed:
                    continue  # a lost node: keep_streamed told its story
                report = seen.get(name)
                if report is None:
                    rec.nodes[name].set("unreachable")
                    continue
                one = report.root.get(rec.id)
                if one is None:
                    rec.nodes[name].set("lost", LOST_CODE)
                else:
                    code = LOST_CODE if one.state == "lost" else one.exit_code
                    rec.nodes[name].set(one.state, code, one.ended)
                    if one.ended is not None:
                        ended.append(one.ended)
            rec.state = _combine(rec)
            if rec.final:  # when the last node's part ended (the nodes' clocks), else now
                rec.ended_at = (dt.datetime.fromtimestamp(max(ended), dt.UTC)
                                .isoformat(timespec="seconds") if ended else now_iso())
        if rec.final and not rec.logs_saved:
            save_logs(rec, group, store=store)
        store.save(rec)
    return recs


def _status(node: str, said: str | dict[str, Any], log: Log) -> JobStatus | None:
    """A node's status (its answer, or what it told as its job ended), or None (said on
    `log`) when it cannot be read."""
    try:
        return read(JobStatus, said) if isinstance(said, str) else read_value(JobStatus, said)
    except Unreadable as exc:
        log(unreadable(node, "status", exc) + "; counted as not answering")
        return None


def save_logs(rec: JobRecord, group: NodeGroup, *,
              store: JobStore | None = None) -> dict[str, str]:
    """Copy every node's log of `rec` here (replacing older copies; a lost node's streamed
    copy is kept); returns each node whose log could not be copied, with why. Marks the
    record's logs saved when all were."""
    store = store or JobStore()
    layout = group.layout
    nodes = [n for n in group.nodes if n.name in rec.nodes and n.name not in rec.streamed]

    def get(conn: NodeConnection, node: NodeRecord) -> None:
        target = store.log_path(rec, node.name)
        part = target.with_suffix(".part")
        get_file(conn, layout.job_log(rec.id), part)
        os.replace(part, target)

    results = group.each(get, nodes)
    failed = {r.node.name: r.why() for r in results.failed}
    failed.update({name: "not a node of the cluster any more" for name in rec.nodes
                   if name not in rec.streamed and name not in {n.name for n in nodes}})
    if not failed:
        rec.logs_saved = True
        store.save(rec)
    return failed


def keep_streamed(rec: JobRecord, lost: list[str], lines: Iterable[str], *,
                  store: JobStore | None = None) -> None:
    """The log of each `lost` node (gone with its job) kept here as the run saw it streamed:
    its `[node-R] ` lines of `lines`. Its part of the record becomes "lost"."""
    store = store or JobStore()
    for name in lost:
        if name not in rec.nodes:
            continue
        prefix = f"[{name}] "
        text = "".join(line[len(prefix):] + "\n" for line in lines if line.startswith(prefix))
        store.log_path(rec, name).write_text(
            text + f"(mgpu-cloud: {name} was lost; this is its output as the run saw it)\n")
        rec.nodes[name].set("lost", LOST_CODE)
        if name not in rec.streamed:
            rec.streamed.append(name)
    store.save(rec)


def follow(rec: JobRecord, group: NodeGroup, out: TextIO,
           nodes: list[NodeRecord] | None = None, *, wait: bool = True) -> GroupResult[int]:
    """Stream the job's log from every node (`[node-R] ` prefixed) from its start, until
    the job has ended there (with `wait`). One result per node: the node's exit code, or why
    it could not be followed."""
    import threading

    layout = group.layout
    targets = nodes if nodes is not None else [n for n in group.nodes if n.name in rec.nodes]
    lock = threading.Lock()
    extra = [] if wait else ["--no-wait"]

    def one(conn: NodeConnection, node: NodeRecord) -> int:
        writer = PrefixWriter(node.name, out, lock)
        try:
            return conn.run(layout.remote_command("job", "follow", "--dir",
                                                  layout.job_dir(rec.id), *extra),
                            out=writer).exit_code
        finally:
            writer.finish()

    return group.each(one, targets, streaming=True)


def print_saved_logs(rec: JobRecord, out: TextIO, nodes: list[str] | None = None,
                     store: JobStore | None = None) -> list[str]:
    """Print the copies kept here, node by node, `[node-R] ` prefixed. Returns the nodes
    that have no copy."""
    store = store or JobStore()
    missing = []
    for name in nodes if nodes is not None else list(rec.nodes):
        path = store.log_path(rec, name)
        if not path.exists():
            missing.append(name)
            continue
        for line in read_lines(path):
            out.write(f"[{name}] {shown(line)}\n")
    out.flush()
    return missing


def before_teardown(inv: Inventory, log: Log, store: JobStore | None = None) -> None:
    """Copy here the logs of this cluster's jobs that are not here yet; a job still running
    is recorded as "removed" (it ends with its nodes). Best effort: a node that cannot be
    reached never stops teardown."""
    store = store or JobStore()
    recs = [r for r in store.all(inv.name) if is_current(r, inv) and not r.logs_saved]
    if not recs or inv.status != "ready":
        return
    try:
        with NodeGroup(inv) as group:
            refresh(inv, recs, group, store=store)
            for rec in recs:
                if rec.state == "running":
                    rec.state, rec.ended_at = "removed", now_iso()
                failed = save_logs(rec, group, store=store) if not rec.logs_saved else {}
                for name, why in failed.items():
                    log(f"job {rec.id}: the log of {name} could not be copied before teardown "
                        f"({why}){_replaced_note(inv, rec, name)}")
                store.save(rec)
    except Exception as exc:  # noqa: BLE001 - never in the way of teardown
        log(f"could not copy job logs before teardown: {exc}")


def _replaced_note(inv: Inventory, rec: JobRecord, name: str) -> str:
    """Why a node may no longer have a job's log: it was replaced after the job."""
    rank = rec.nodes[name].rank
    if any(r.rank == rank for r in inv.replacements):
        return f"; {name} was replaced since, and the old node's log went with it"
    return ""
