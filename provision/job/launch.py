"""Start a job on every node at once and supervise it.

`node_command` turns (JobSpec, inventory, node) into ONE shell command line (every value
quoted); the launcher (provision/job/launchers/) decides the launcher's own argv. `run_job` runs
the commands together through the NodeGroup, streams each node's output with a `[node-R]`
prefix, and returns one exit code. When a node fails, or the user presses Ctrl-C, the other
nodes' process groups are stopped (`remote.pyz stop`); the job runs under
`remote.pyz job start --attach` (provision/job/jobs.py: the node keeps the job's log; end of stdin
stops it), so even a controller that dies takes its job with it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TextIO

from provision.job.ends import JobEnds
from provision.job.following import SESSION_LOST as SESSION_LOST
from provision.job.following import STOPPED as STOPPED
from provision.job.following import JobGate, JobMonitor, Rejoin, follow, stop_job
from provision.job.launchers import LaunchContext, get_launcher
from provision.job.nodelines import Detach, adhoc_job_id, follow_command, supervisor_words
from provision.job.output import PrefixWriter
from provision.job.warmspares import WarmSpares
from provision.model.errors import LaunchError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.model.timeline import mark
from provision.nodes import (
    CONTAINER_ROOT,
    HomePath,
    NodeConnection,
    NodeGroup,
    RemoteLayout,
    background,
    layout_of,
)
from provision.nodes.bootstrap import Workdir
from provision.nodes.container import EnvFile, check_job_image, container_name, container_run_argv
from provision.nodes.shell import assign, words


def job_env(inv: Inventory, job: JobSpec, layout: RemoteLayout,
            restart_count: int = 0) -> dict[str, str]:
    """Variables every process of the job sees: provider NCCL preset < the tool's < user's.

    MGPU_CHECKPOINT_DIR is kept safe off the nodes while the job runs and put back before a
    restart (provision/job/recovery.py); MGPU_RESTART_COUNT says which attempt this is. The
    tool's sitecustomize (faulthandler on SIGUSR2, for stack dumps of a hang) comes first on
    PYTHONPATH unless the job sets PYTHONPATH itself."""
    env = dict(inv.nccl_env)
    if job.nccl_debug:
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    env.update({
        "MGPU_CLUSTER": inv.name,
        "MGPU_OUTPUT_DIR": layout.outputs,
        "MGPU_CHECKPOINT_DIR": layout.checkpoints,
        "MGPU_RESTART_COUNT": str(restart_count),
        "PYTHONPATH": layout.python_path,
        "PYTHONUNBUFFERED": "1",
    })
    env.update(job.env)
    return env


def job_image(inv: Inventory, job: JobSpec) -> str | None:
    """The image `job` runs in (its own --image, else the cluster's; None: no container). Its
    own is checked against the cluster's GPUs here (UserInputError for a known NGC release
    too old for them): before its workdir is synced and before any node command is made."""
    check_job_image(inv, job.image)
    return job.image or inv.container_image


def _context(inv: Inventory, job: JobSpec, entry: list[str] | None = None) -> LaunchContext:
    image = job_image(inv, job)
    root: str = CONTAINER_ROOT if image else HomePath(inv.remote_root)
    layout = RemoteLayout(root)
    return LaunchContext(inv=inv, job=job, layout=layout, in_container=bool(image),
                         entry=tuple(_in_root(layout, entry or [])))


def _in_root(layout: RemoteLayout, words: list[str]) -> list[str]:
    """Words starting with "@root/" are paths in the node's remote folder."""
    return [layout.path(w[len("@root/"):]) if w.startswith("@root/") else w for w in words]


def launcher_argv(
    inv: Inventory, job: JobSpec, node: NodeRecord, root: str, program: list[str] | None = None
) -> list[str]:
    """The launcher's argv on `node` (paths under `root`, the remote folder as the job sees
    it). `program` replaces the job's script and arguments (e.g. remote.pyz allreduce)."""
    ctx = LaunchContext(inv=inv, job=job, layout=RemoteLayout(root), in_container=False)
    return get_launcher(job.launcher).argv(ctx, node, program)


def job_container(inv: Inventory, job: JobSpec) -> str | None:
    """The Docker container the job runs in on each node (container mode), or None (no
    container, or a runtime like Apptainer whose processes stay the supervisor's own)."""
    in_docker = job_image(inv, job) and inv.container_runtime == "docker"
    return container_name(inv) if in_docker else None


def workdir_of(inv: Inventory, job: JobSpec) -> Workdir:
    """What `job` places on every node: its folder and its launcher's files (the first
    thing every launch path asks of a job, so its image is checked here first)."""
    job_image(inv, job)
    files = get_launcher(job.launcher).files(job, layout_of(inv), inv.wait_for_gpu)
    return Workdir(job.local_workdir, list(job.excludes), files)


def resident_port(job: JobSpec) -> int:
    """The port of the store resident ranks meet in (remote/resident.py), on global rank 0's
    node: the one after torchrun's (which its first launcher's store holds)."""
    return job.master_port + 1 if job.master_port < 65535 else job.master_port - 1


@dataclass(frozen=True)
class Join:
    """A newcomer joining resident ranks (provision/job/resident.py): the generation they
    form, the address of global rank 0's node (their store), its first global rank, the
    world size, and whether its launcher starts alone (node 0's first launcher, whose store
    a static rendezvous joins, is gone)."""

    gen: int
    master: str
    base: int
    world: int
    alone: bool

    def env(self) -> dict[str, str]:
        return {"MGPU_RESIDENT_GEN": str(self.gen), "MGPU_RESIDENT_MASTER": self.master,
                "MGPU_RESIDENT_BASE": str(self.base), "MGPU_RESIDENT_WORLD": str(self.world)}


def launching_nodes(inv: Inventory, job: JobSpec) -> list[NodeRecord]:
    """Where the launcher starts: every node, or node 0 for a runner that fans out itself."""
    return get_launcher(job.launcher).starting_nodes(_context(inv, job))


def node_command(
    inv: Inventory, job: JobSpec, node: NodeRecord, program: list[str] | None = None, *,
    job_id: str | None = None, detach: Detach | None = None, restart_count: int = 0,
    entry: list[str] | None = None, survive: bool = False, join: Join | None = None,
    warm: bool = False,
) -> str:
    """The full shell command line run on `node` (every value quoted). `program` words
    starting with "@root/" are paths in the node's remote folder. The job runs under
    `remote.pyz job start` (provision/job/jobs.py): its log is kept on the node under `job_id`;
    attached (the default) it streams and stops with the controller, `detach` returns.
    `entry` (words, "@root/" as in `program`) runs before the job's script in the launcher's
    processes (the in-job fabric gate); they learn their node as $MGPU_NODE_RANK. A launcher
    whose newcomers can join resident ranks gives the job's script MGPU_RESIDENT_DIR (where
    the word to re-form arrives: the job's folder) and MGPU_RESIDENT_PORT; `join`: this node
    is such a newcomer (remote/resident.py); `warm`: `node` is a ready spare, whose launcher
    imports torch and waits to be promoted to a lost node's rank (remote/warm.py)."""
    home = RemoteLayout(HomePath(inv.remote_root))
    gated = bool(entry) and join is None and not warm
    if join is not None or warm or (entry is None and get_launcher(job.launcher).forks(job)):
        entry = list(SCRIPT_ENTRY)  # the ranks forked from their launcher, which imported torch
    ctx = _context(inv, job, entry)
    node = launch_rank(inv, node)
    job_id = job_id or adhoc_job_id()
    preempt = None
    if inv.preemption is not None:
        preempt = (inv.preemption.protocol, inv.preemption.url, job.preempt_signal)
    supervise = supervisor_words(home, job_id, detach, preempt, job_container(inv, job),
                                 survive)
    env = job_env(inv, job, ctx.layout, restart_count)
    if gated:
        env["MGPU_NODE_RANK"] = str(node.rank)
    if program is not None:
        program = _in_root(ctx.layout, program)
    launcher = get_launcher(job.launcher)
    if launcher.resident(job) and program is None:
        env.update({"MGPU_RESIDENT_DIR": ctx.layout.job_dir(job_id),
                    "MGPU_RESIDENT_PORT": str(resident_port(job)), **(join.env() if join else {})})
    argv = launcher.rejoin_argv(ctx, node, join.alone) if join else launcher.argv(ctx, node, program)
    if warm:
        argv = ["python3", ctx.layout.pyz, "warm", "wait", "--word", warm_word(ctx.layout, job_id)]
    prefix, container_extra = launcher.prepare(ctx, env)
    if ctx.in_container:
        image = job_image(inv, job) or ""
        # the job's own values through a 0600 file, not `docker run -e` (ps shows argv)
        mine = {k: env.pop(k) for k in job.env} if inv.container_runtime == "docker" else {}
        env_file = EnvFile(home.job_dir(job_id), ctx.layout.job_dir(job_id)) if mine else None
        docker = container_run_argv(inv, image, env, mount=home.root, extra=container_extra,
                                    env_file=env_file)
        write = env_file.write(mine) if env_file is not None else ""
        return f"{prefix}{write}exec {words(supervise + docker + argv)}"
    # exec: no shell stays behind with the values in its command line, whatever its version
    assignments = " ".join(assign(k, v) for k, v in env.items())
    return f"{prefix}exec env {assignments} {words(supervise + argv)}"


SCRIPT_ENTRY = ("@root/remote.pyz", "script", "--")  # a forked rank's start (remote/script.py)


def warm_word(layout: RemoteLayout, job_id: str) -> str:
    """Where a warm spare's launcher waits for its word (remote/warm.py), in the job's folder."""
    return layout.path("jobs", job_id, "warm.json")  # a HomePath stays one ("$HOME"/...)


def can_warm(inv: Inventory, job: JobSpec) -> str | None:
    """Why a ready spare's launcher cannot wait warm for this job (None: it can): torchrun with
    static ranks whose newcomers join resident ranks, on the node itself (not in a container,
    whose paths differ from the node's), with a numeric process count (the agent forks)."""
    if not (get_launcher(job.launcher).resident(job) and job.launcher == "torchrun"):
        return f"the {job.launcher} launcher{' with --rdzv' if job.rdzv else ''} has no warm start"
    if job_image(inv, job):
        return "the job runs in a container"
    if job.nproc_per_node == "gpu":
        return "--nproc-per-node gpu: the launcher would ask CUDA before it forks"
    return None


def promote_command(inv: Inventory, job: JobSpec, node: NodeRecord, *, job_id: str,
                    restart_count: int, join: Join) -> str:
    """`remote.pyz warm promote` on a warm spare that takes `node`'s rank: the words and the
    variables its waiting launcher runs torchrun with (remote/warm.py) - those of node_command's
    newcomer that differ from what the spare's launcher was started with."""
    ctx = _context(inv, job, list(SCRIPT_ENTRY))
    argv = get_launcher(job.launcher).rejoin_argv(ctx, launch_rank(inv, node), join.alone)
    env = {**join.env(), "MGPU_RESTART_COUNT": str(restart_count)}
    home = RemoteLayout(HomePath(inv.remote_root))
    pairs = [w for k, v in env.items() for w in ("--env", f"{k}={v}")]
    # words(): a HomePath is "$HOME"/..., so the word holds the paths the node's shell sees
    return words(["python3", home.pyz, "warm", "promote", "--word", warm_word(home, job_id),
                  *pairs, "--", *argv])


def launch_rank(inv: Inventory, node: NodeRecord) -> NodeRecord:
    """`node` with the rank it launches as: its place among the cluster's nodes, which is its
    own rank unless the cluster runs on fewer nodes than it was made with (--min-nodes,
    job/elastic.py: ranks stay contiguous from 0)."""
    place = sorted(n.rank for n in inv.nodes).index(node.rank) \
        if any(n.rank == node.rank for n in inv.nodes) else node.rank
    return node if place == node.rank else node.model_copy(update={"rank": place})


def run_job(
    inv: Inventory,
    job: JobSpec,
    *,
    log: Log = print,
    out: TextIO | None = None,
    program: list[str] | None = None,
    group: NodeGroup | None = None,
    job_id: str | None = None,
    monitor: JobMonitor | None = None,
    restart_count: int = 0,
    gate: JobGate | None = None,
    ends: JobEnds | None = None,
    survive: bool = False,
    take_back: bool = False,
    rejoin: Rejoin | None = None,
) -> int:
    """Run `job` on the cluster; returns 0 or the first failing node's exit code (STOPPED when
    `monitor.poll()` asked to stop it). `gate`: the fabric gate runs first in the job's own
    processes (job/gate/injob.py; the caller asks it for the verdict afterwards). `program`
    (words; "@root/" is the node's remote folder) replaces the job's script (`check
    --bandwidth`: `@root/remote.pyz allreduce`). Each node keeps the job's log under `job_id`
    (job/jobs.py; default: an unrecorded ad hoc id), its first line printed marks the open
    timeline; without a monitor a failure is explained here. `ends`: each node's last word.
    `survive`: the job outlives this process's channels (managed runs); `take_back`: it runs
    already: followed, not started. `rejoin`: a lost node replaced while the others' resident
    ranks go on (job/resident.py; a spare's launcher waits warm: job/warmspares.py)."""
    job_id = ends.job_id if ends is not None else job_id or adhoc_job_id()
    ends = ends or JobEnds(job_id)
    own_group, group = group is None, group or NodeGroup(inv)
    nodes, journal = launching_nodes(inv, job), deque[str](maxlen=20000)
    writers = _writers(inv, nodes, out or sys.stdout, monitor, gate, ends, journal)
    cancelled = threading.Event()

    def one(conn: NodeConnection, node: NodeRecord, command: str | None = None) -> int:
        w = writers[node.name]
        try:
            command = command or (follow_command(inv, job_id) if take_back else node_command(
                inv, job, node, program, job_id=job_id, restart_count=restart_count,
                entry=gate.entry if gate is not None else None, survive=survive))
            code = conn.run(command, out=w).exit_code
        except Exception as exc:
            if cancelled.is_set():
                return 143
            raise LaunchError(f"{node.name}: could not run the job: {exc}") from exc
        finally:
            w.finish()
        if monitor is not None:
            monitor.finished(node, code)
        return code

    warm = _warm_spares(inv, job, job_id, restart_count, group, writers, monitor, log, rejoin) \
        if not take_back and program is None else None
    log(_starting(job, program, len(nodes), job_id if take_back else None, gate is not None))
    t0 = time.monotonic()
    # Stopping runs on connections of their own: the launch connections are busy streaming.
    stopper = NodeGroup(inv, connector=group.connector)
    try:
        code = follow(group.submit(one, nodes), stopper, log, monitor, gate, cancelled,
                      rejoin, start=lambda node, command: _start(group, one, node, command),
                      tend=warm.keep if warm is not None else None)
    except BaseException as exc:
        cancelled.set()
        for w in writers.values():  # the ranks' noise after a stop the user asked for
            w.muted = w.muted or isinstance(exc, KeyboardInterrupt)
        log(_stopping(exc, inv.name, job_id))
        stop_job(stopper, nodes, grace=5.0)
        raise
    finally:
        if warm is not None:
            warm.close()
        stopper.close()
        if own_group:
            group.close()
    if code == 0:
        what = f"restart {restart_count}" if restart_count else "job"
        log(f"{what} finished on all {len(nodes)} node(s) in {time.monotonic() - t0:.1f} s")
    elif monitor is None and not (gate is not None and gate.stopped(nodes[0].name)):
        _report_failure(journal, log)  # a monitor's owner explains it, knowing more
    return code


def _starting(job: JobSpec, program: list[str] | None, nodes: int, taken: str | None,
              gate: bool) -> str:
    what = " ".join(program) if program is not None else job.script_in_workdir
    if taken is not None:
        return f"following job {taken} on {nodes} node(s) again: {what}"
    return (f"launching {job.launcher} on {nodes} node(s): {what}"
            + (" (the fabric gate first, in the same processes)" if gate else ""))


def _start(group: NodeGroup, one: Callable[[NodeConnection, NodeRecord, str], int],
           node: NodeRecord, command: str) -> Future[int]:
    """A newcomer's command, on a thread of its own (the group's may be held by a session
    that hangs), through a new connection (the name's old one led to the lost node)."""
    group.drop(node)
    return background(lambda: one(group.connection(node), node, command))


def _warm_spares(inv: Inventory, job: JobSpec, job_id: str, restart_count: int,
                 group: NodeGroup, writers: dict[str, PrefixWriter], monitor: JobMonitor | None,
                 log: Log, rejoin: Rejoin | None) -> WarmSpares | None:
    """The ready spares' launchers waiting warm (job/warmspares.py), where `rejoin` takes
    them: resident restarts, a launcher that can wait warm (can_warm) and spares to run on."""
    if rejoin is None or not inv.spares or can_warm(inv, job) is not None:
        return None
    warm = WarmSpares(inv, lambda spare: node_command(
        inv, job, spare, job_id=job_id, restart_count=restart_count, warm=True),
        group.connector, writers, monitor.finished if monitor is not None else None, log)
    return warm if rejoin.warm(warm) else None


def _stopping(exc: BaseException, cluster: str, job_id: str) -> str:
    """What run_job says when it is interrupted (Ctrl-C: the ranks' output is hidden)."""
    if not isinstance(exc, KeyboardInterrupt):
        return "stopping the job on every node ..."
    kept = "" if job_id.startswith("adhoc-") else f" (its logs: mgpu-cloud logs {cluster} {job_id})"
    return (f"stopped by you (Ctrl-C): stopping job {job_id} on every node; the ranks' "
            f"messages about it are not shown{kept}")


def _writers(inv: Inventory, nodes: list[NodeRecord], out: TextIO, monitor: JobMonitor | None,
             gate: JobGate | None, ends: JobEnds, journal: deque[str]) -> dict[str, PrefixWriter]:
    """One PrefixWriter per node: lines to `monitor`, the gate's lines to `gate`, the node's
    end line to `ends`, every line shown to `journal` in arrival order, and the first line
    shown marked on the inventory's open timeline."""
    lock = threading.Lock()
    since = time.time()
    first = threading.Event()

    def shown() -> None:
        if not first.is_set():
            first.set()
            mark(inv, "first output line", since=since)

    def writer(node: NodeRecord) -> PrefixWriter:
        on_line = None if monitor is None else (lambda text: monitor.line(node, text))
        def take(text: str) -> bool:
            return ends.take(node.name, text) or (gate is not None and gate.take(node.name, text))

        return PrefixWriter(node.name, out, lock, on_line=on_line, take=take, journal=journal,
                            on_show=shown)

    writers = {n.name: writer(n) for n in nodes}
    if gate is not None:
        gate.attach([n.name for n in nodes], lambda node, line: writers[node].show([line]))
    return writers


def _report_failure(lines: deque[str], log: Log) -> None:
    from provision.job.cause import explain

    for line in explain(lines):
        log(line)
