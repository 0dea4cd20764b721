"""Start a job on every node at once and supervise it.

`node_command` turns (JobSpec, inventory, rank) into ONE shell command line per node (every
value quoted); `run_job` runs them together over SSH, streams each node's output with a
`[node-R]` prefix, and returns one exit code. When a node fails, or the user presses Ctrl-C,
the other nodes' process groups are stopped (`remote.pyz stop`); the job runs under
`remote.pyz run --watch-stdin`, so even a controller that dies takes its job with it.
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TextIO

from provision.errors import LaunchError
from provision.inventory import Inventory, InventoryStore, NodeRecord
from provision.spec import JobSpec
from provision.sshconn import connect

Log = Callable[[str], None]
CONTAINER_FLAGS = [
    "--gpus", "all", "--network", "host", "--ipc", "host",
    "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
]
CONTAINER_ROOT = "/mgpu"


class HomePath(str):
    """A path relative to the node user's home: quoted as "$HOME"/'rel' so $HOME expands
    on the node and nothing else does."""


def word(value: str) -> str:
    """One shell word for `value` (HomePath keeps $HOME live, everything else is quoted)."""
    if isinstance(value, HomePath):
        return '"$HOME"/' + shlex.quote(str(value))
    return shlex.quote(value)


def words(parts: list[str]) -> str:
    return " ".join(word(p) for p in parts)


def _q(parts: list[str]) -> str:
    return " ".join(shlex.quote(p) for p in parts)


def _at(root: str, rel: str) -> str:
    """`root/rel`, keeping the HomePath marker."""
    joined = f"{root}/{rel}"
    return HomePath(joined) if isinstance(root, HomePath) else joined


def _assign(key: str, value: str) -> str:
    return f"{key}={word(value)}"


def nproc(job: JobSpec, node: NodeRecord) -> str:
    if job.nproc_per_node is None:
        return str(node.slots)
    return str(job.nproc_per_node)


def job_env(inv: Inventory, job: JobSpec, root: str) -> dict[str, str]:
    """Variables every process of the job sees: provider NCCL preset < user values."""
    env = dict(inv.nccl_env)
    if job.nccl_debug:
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    env.update({
        "MGPU_CLUSTER": inv.name,
        "MGPU_OUTPUT_DIR": _at(root, "outputs"),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(job.env)
    return env


def launcher_argv(
    inv: Inventory, job: JobSpec, node: NodeRecord, root: str, program: list[str] | None = None
) -> list[str]:
    """The launcher's argv on `node` (paths under `root`, the remote .mgpu-cloud folder).
    `program` replaces the job's script and arguments (e.g. remote.pyz allreduce)."""
    master = inv.master
    nnodes = len(inv.nodes)
    port = str(job.master_port)
    script = program if program is not None else [job.script_in_workdir, *job.args]
    if job.launcher == "torchrun":
        argv = ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", nproc(job, node)]
        if job.rdzv:
            argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint",
                     f"{master.private_address}:{port}", "--rdzv_id", f"{inv.name}-job"]
        else:
            argv += ["--node_rank", str(node.rank), "--master_addr", master.private_address,
                     "--master_port", port]
        return argv + script
    if job.launcher == "accelerate":
        total = sum(int(nproc(job, n)) for n in inv.nodes)
        return ["accelerate", "launch", "--multi_gpu", "--num_machines", str(nnodes),
                "--machine_rank", str(node.rank), "--main_process_ip", master.private_address,
                "--main_process_port", port, "--num_processes", str(total), *script]
    # deepspeed: the config the bootstrap placed (the user's, or templates/deepspeed/), unless
    # the script's own arguments name one.
    if program is None and "--deepspeed_config" not in job.args:
        script = [*script, "--deepspeed_config", _at(root, "ds_config.json")]
    argv = ["deepspeed", "--hostfile", _at(root, "hostfile"), "--master_addr",
            master.private_address, "--master_port", port]
    if job.deepspeed_launcher == "no_ssh":
        argv += ["--no_ssh", "--node_rank", str(node.rank), "--num_nodes", str(nnodes),
                 "--num_gpus", nproc(job, node)]
    else:
        argv += ["--launcher", "pdsh"]
    return argv + script


def launching_nodes(inv: Inventory, job: JobSpec) -> list[NodeRecord]:
    """DeepSpeed's pdsh mode starts from node 0 alone; every other mode starts on every node."""
    if job.launcher == "deepspeed" and job.deepspeed_launcher == "pdsh":
        return [inv.master]
    return sorted(inv.nodes, key=lambda n: n.rank)


def node_command(
    inv: Inventory, job: JobSpec, node: NodeRecord, program: list[str] | None = None
) -> str:
    """The full shell command line run over SSH on `node` (every value quoted)."""
    home_root = HomePath(inv.remote_root)
    image = job.image or inv.container_image
    supervise = ["python3", _at(home_root, "remote.pyz"), "run", "--pidfile",
                 _at(home_root, "job.pid"), "--watch-stdin", "--cwd", _at(home_root, "work"), "--"]
    root: str = CONTAINER_ROOT if image else home_root
    env = job_env(inv, job, root)
    if program is not None:
        program = [_at(root, p[len("@root/"):]) if p.startswith("@root/") else p
                   for p in program]
    argv = launcher_argv(inv, job, node, root, program)
    prefix = ""
    if job.launcher == "deepspeed":
        # DeepSpeed's runner exports the variables of $DS_ENV_FILE (default ~/.deepspeed_env:
        # the user's own file, which we never overwrite) on every node it starts.
        env["DS_ENV_FILE"] = _at(root, "deepspeed_env")
        lines = " ".join(_assign(k, v) for k, v in env.items())
        prefix = f"printf '%s\\n' {lines} > {word(_at(home_root, 'deepspeed_env'))} && "
    if image:
        docker = ["sudo", "-n", "docker", "run", "--rm", "--name", f"mgpu-{inv.name}-job",
                  *CONTAINER_FLAGS, "-v", HomePath(f"{inv.remote_root}:{CONTAINER_ROOT}"),
                  "-w", f"{CONTAINER_ROOT}/work"]
        for key, value in env.items():
            docker += ["-e", f"{key}={value}"]
        if job.launcher == "deepspeed":
            docker += ["-v", HomePath(".ssh:/root/.ssh:ro")]
        return prefix + words(supervise + docker + [image] + argv)
    assignments = " ".join(_assign(k, v) for k, v in env.items())
    return f"{prefix}env {assignments} {words(supervise + argv)}"


class PrefixWriter:
    """File-like sink: splits a node's output into lines and prints `[node-R] line`."""

    def __init__(self, node: str, out: TextIO, lock: threading.Lock, keep: int = 4000) -> None:
        self.prefix = f"[{node}] "
        self.out = out
        self.lock = lock
        self.buf = ""
        self.lines: deque[str] = deque(maxlen=keep)

    def write(self, data: str) -> int:
        self.buf += data.replace("\r\n", "\n")
        *complete, self.buf = self.buf.split("\n")
        if complete:
            with self.lock:
                for line in complete:
                    self.lines.append(line)
                    self.out.write(self.prefix + line + "\n")
                self.out.flush()
        return len(data)

    def flush(self) -> None:
        """Called by Fabric between chunks: a partial line waits for the rest."""

    def finish(self) -> None:
        if self.buf:
            self.write("\n")


def stop_job(
    inv: Inventory, store: InventoryStore, nodes: list[NodeRecord], grace: float = 10.0
) -> None:
    """Stop the job's process group on `nodes` (idempotent; best effort: a node that is gone
    already is not an error)."""
    from provision.remote_exec import exec_on_nodes

    cmd = _q(["python3", f"{inv.remote_root}/remote.pyz", "stop", "--pidfile",
              f"{inv.remote_root}/job.pid", "--grace", str(grace)])
    exec_on_nodes(inv, store, cmd, nodes=nodes, timeout=5)


def run_job(
    inv: Inventory,
    store: InventoryStore,
    job: JobSpec,
    *,
    log: Log = print,
    out: TextIO | None = None,
    program: list[str] | None = None,
) -> int:
    """Run `job` on the cluster; returns 0 or the first failing node's exit code.

    `program` (words; a leading "@root/" means the node's .mgpu-cloud folder) replaces the
    job's script: `check --bandwidth` runs `@root/remote.pyz allreduce` this way."""
    out = out or sys.stdout
    nodes = launching_nodes(inv, job)
    lock = threading.Lock()
    writers = {n.name: PrefixWriter(n.name, out, lock) for n in nodes}
    conns = {n.name: connect(inv, n) for n in nodes}
    cancelled = threading.Event()

    def one(node: NodeRecord) -> int:
        w = writers[node.name]
        try:
            res = conns[node.name].run(
                node_command(inv, job, node, program), out_stream=w, err_stream=w, hide=False,
                warn=True, in_stream=False, pty=False,
            )
            return int(res.exited)
        except Exception as exc:
            if cancelled.is_set():
                return 143
            raise LaunchError(f"{node.name}: could not run the job: {exc}") from exc
        finally:
            w.finish()

    what = " ".join(program) if program is not None else job.script_in_workdir
    log(f"launching {job.launcher} on {len(nodes)} node(s): {what}")
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=len(nodes))
    futures: dict[Future[int], NodeRecord] = {pool.submit(one, n): n for n in nodes}
    code = 0
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                node_code = fut.result()
                if node_code != 0 and code == 0:
                    code = node_code
                    log(f"{futures[fut].name} exited with {node_code}; stopping the other nodes")
                    stop_job(inv, store, [futures[f] for f in pending])
    except BaseException:
        cancelled.set()
        log("stopping the job on every node ...")
        stop_job(inv, store, nodes, grace=5.0)
        raise
    finally:
        for conn in conns.values():
            conn.close()
        pool.shutdown(wait=True, cancel_futures=True)
    elapsed = time.monotonic() - t0
    if code == 0:
        log(f"job finished on all {len(nodes)} node(s) in {elapsed:.1f} s")
    else:
        _report_failure(writers, log)
    return code


def _report_failure(writers: dict[str, PrefixWriter], log: Log) -> None:
    try:
        from provision.diagnose import diagnose
    except ImportError:  # pragma: no cover - diagnose ships with the package
        return
    lines = [w.prefix + line for w in writers.values() for line in w.lines]
    for d in diagnose(lines):
        log(f"likely cause ({d.node or 'a node'}): {d.cause}\n  fix: {d.fix}")

