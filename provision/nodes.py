"""NodeGroup: the only way the controller talks to nodes.

    group = NodeGroup(inv)                          # connections are made lazily and reused
    res = group.run("hostname")                     # every node in parallel, one result each
    res.failed / res.succeeded                      # like Fabric's GroupResult
    group.upload(archive, steps)                    # one channel per node: archive -> stdin
    group.each(fn)                                  # fn(conn, node) on every node, in parallel
    group.close()

A result for EVERY node is returned, never the first failure only (`GroupResult.raise_for`
names every failed node). The transport is a seam: a `Connector` makes one `NodeConnection`
per node (SSH with pinned host keys by default; a provider may supply its own, e.g. Slurm's
srun through a login node; tests supply a fake). The remote folder layout lives here too
(`RemoteLayout`), so no other module spells a remote path.

`fan_out` is the one thread pool over nodes (and over anything else done per node).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from provision.errors import BootstrapError, MgpuError
from provision.inventory import Inventory, NodeRecord

T = TypeVar("T")
U = TypeVar("U")
MAX_WORKERS = 32
CONNECT_TIMEOUT_S = 10.0
SSH_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_SSH_DEADLINE", "180"))
CONTAINER_ROOT = "/mgpu"  # where the remote folder is mounted inside a training container


# --- the remote folder layout --------------------------------------------------------------
class HomePath(str):
    """A path relative to the node user's home. Shell-quoted as "$HOME"/'rel' (launch.word),
    so $HOME expands on the node and nothing else does."""


def join(root: str, *parts: str) -> str:
    """`root/parts...`, keeping the HomePath marker."""
    joined = "/".join([root, *parts])
    return HomePath(joined) if isinstance(root, HomePath) else joined


@dataclass(frozen=True)
class RemoteLayout:
    """Paths of the tool's folder on a node. `root` is home-relative on the node (e.g.
    ".mgpu-cloud", or ".mgpu-cloud/ssh/NAME" on the user's own machines), a HomePath for
    command lines that need $HOME, or CONTAINER_ROOT as a training container sees it."""

    root: str

    def path(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def pyz(self) -> str:
        return self.path("remote.pyz")

    @property
    def hostfile(self) -> str:
        return self.path("hostfile")

    @property
    def work(self) -> str:
        return self.path("work")

    @property
    def outputs(self) -> str:
        return self.path("outputs")

    @property
    def pidfile(self) -> str:
        return self.path("job.pid")

    @property
    def checkpoints(self) -> str:
        """$MGPU_CHECKPOINT_DIR: kept safe off the nodes, restored before a restart."""
        return self.path("checkpoints")

    @property
    def python_path(self) -> str:
        """Put first on the job's PYTHONPATH: the tool's sitecustomize.py lives here."""
        return self.path("py")

    @property
    def jobs(self) -> str:
        """Where every job's folder lives (remote/jobs.py)."""
        return self.path("jobs")

    def job_dir(self, job_id: str) -> str:
        return self.path("jobs", job_id)

    def job_log(self, job_id: str) -> str:
        """The job's merged stdout/stderr on this node (remote/jobs.py LOG)."""
        return self.path("jobs", job_id, "node.log")

    def remote_command(self, *args: str) -> str:
        """`python3 ROOT/remote.pyz ARGS...` as one shell line (every word quoted)."""
        return " ".join(shlex.quote(w) for w in ["python3", self.pyz, *args])


def layout_of(inv: Inventory) -> RemoteLayout:
    return RemoteLayout(inv.remote_root)


# --- one node's transport ------------------------------------------------------------------
@dataclass
class CommandResult:
    exit_code: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr (or stdout), for error messages."""
        text = (self.stderr or self.stdout).strip().splitlines()[-lines:]
        return " | ".join(text)


class Writer(Protocol):
    """Where streamed output goes (a text file, or launch.PrefixWriter)."""

    def write(self, data: str, /) -> int: ...

    def flush(self) -> None: ...


class NodeConnection(Protocol):
    """One node's transport. `run` never raises for a non-zero exit (it is the result); it
    raises for a transport failure (unreachable, authentication, host key)."""

    def open(self) -> None:
        """Connect now (raises on failure; `wait_until_reachable` retries it)."""
        ...

    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None) -> CommandResult:
        """Run a shell line. `stdin`: bytes written to the command, then EOF. `out`: stream
        stdout+stderr there as they come (the result then holds no output)."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy the node's file `remote` (home-relative) to `local`."""
        ...

    def close(self) -> None:
        ...


Connector = Callable[[Inventory, NodeRecord], NodeConnection]


class SshConnection:
    """NodeConnection over SSH (Fabric/paramiko) with pinned host keys (sshconn.connect)."""

    def __init__(self, inv: Inventory, node: NodeRecord, timeout: float = CONNECT_TIMEOUT_S):
        from provision.sshconn import connect

        self._conn = connect(inv, node, timeout=timeout)

    def open(self) -> None:
        try:
            self._conn.open()
        except BaseException:
            self._conn.close()
            raise

    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None) -> CommandResult:
        if stdin is not None:
            return self._run_with_stdin(command, stdin)
        if out is not None:
            res = self._conn.run(command, out_stream=out, err_stream=out, hide=False, warn=True,
                                 in_stream=False, pty=False, timeout=timeout)
            return CommandResult(int(res.exited))
        res = self._conn.run(command, hide=True, warn=True, in_stream=False, timeout=timeout)
        return CommandResult(int(res.exited), str(res.stdout), str(res.stderr))

    def _run_with_stdin(self, command: str, data: bytes) -> CommandResult:
        """ONE channel: `data` goes to the command's stdin (e.g. an archive for `tar -x`): no
        SFTP session and its round trips, no copy on the node's disk."""
        import contextlib

        self._conn.open()
        chan = self._conn.client.get_transport().open_session()
        try:
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            with contextlib.suppress(OSError, EOFError):  # a command failing early stops reading
                chan.sendall(data)
                chan.shutdown_write()
            output = chan.makefile("rb").read().decode(errors="replace")
            code = chan.recv_exit_status()
        finally:
            chan.close()
        return CommandResult(int(code), output, "")

    def get(self, remote: str, local: Path) -> None:
        self._conn.get(remote, str(local))

    def close(self) -> None:
        self._conn.close()


def ssh_connector(inv: Inventory, node: NodeRecord) -> NodeConnection:
    return SshConnection(inv, node)


def default_connector(inv: Inventory) -> Connector:
    """The provider's own transport when it declares one (ProviderInfo.connector), else SSH."""
    from provision.providers import connector_for

    custom = connector_for(inv.provider)
    return custom(inv) if custom is not None else ssh_connector


# --- results -------------------------------------------------------------------------------
@dataclass
class NodeResult(Generic[T]):
    """What happened on one node: `value` when the step ran, `error` when it could not."""

    node: NodeRecord
    value: T | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return bool(getattr(self.value, "ok", True))

    def why(self) -> str:
        """One line saying why the node failed."""
        if self.error is not None:
            return self.error
        if isinstance(self.value, CommandResult):
            return f"exit {self.value.exit_code}: {self.value.tail()}"
        return "failed"


class GroupResult(dict[str, NodeResult[T]]):
    """node name -> NodeResult, in rank order."""

    @property
    def succeeded(self) -> list[NodeResult[T]]:
        return [r for r in self.values() if r.ok]

    @property
    def failed(self) -> list[NodeResult[T]]:
        return [r for r in self.values() if not r.ok]

    def raise_for(self, what: str, error: type[MgpuError] = BootstrapError,
                  hint: str | None = None) -> None:
        """`error` naming EVERY failed node, if any failed."""
        failed = self.failed
        if not failed:
            return
        detail = "\n  ".join(f"{r.node.name}: {r.why()}" for r in failed)
        raise error(
            f"{what} failed on {len(failed)} of {len(self)} node(s):\n  {detail}",
            hint=hint or "`mgpu-cloud status` shows the nodes; `mgpu-cloud ssh NAME --node R` "
            "to look",
        )


class NodeStepError(Exception):
    """A step failed on one node; the message says what and why (no type name is added)."""


def describe_exception(exc: BaseException) -> str:
    """One line for a node's failure: the message of our own errors, else type + text."""
    if isinstance(exc, NodeStepError | MgpuError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# --- the one pool --------------------------------------------------------------------------
def fan_out(items: Iterable[U], fn: Callable[[U], T]) -> list[T]:
    """fn(item) for every item in parallel (results in order). The one thread pool of the
    controller: exceptions propagate (the first, after every call has ended)."""
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        return list(pool.map(fn, items))


def background(fn: Callable[[], T]) -> Future[T]:
    """fn() on a thread of its own while the caller goes on (e.g. one engine call that
    overlaps the tool's own work); `.result()` waits and re-raises."""
    fut: Future[T] = Future()

    def target() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return fut


class NodeGroup:
    """Parallel operations on a cluster's nodes (all, or the `nodes` given), one result per
    node. Connections are made on first use and reused until `close()`; use as a context
    manager. Thread-safe per node (each node's connection is used by one thread at a time)."""

    def __init__(self, inv: Inventory, nodes: Iterable[NodeRecord] | None = None, *,
                 connector: Connector | None = None) -> None:
        self.inv = inv
        self.nodes = sorted(inv.nodes if nodes is None else nodes, key=lambda n: n.rank)
        self.layout = layout_of(inv)
        self.connector = connector or default_connector(inv)
        self._conns: dict[str, NodeConnection] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> NodeGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self, node: NodeRecord) -> NodeConnection:
        conn = self._conns.get(node.name)
        if conn is None:
            conn = self._conns[node.name] = self.connector(self.inv, node)
        return conn

    def drop(self, node: NodeRecord) -> None:
        """Close and forget a node's connection (the next use connects again)."""
        conn = self._conns.pop(node.name, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in list(self._conns.values()):
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - closing is best effort
                pass
        self._conns.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # --- fan-out ---------------------------------------------------------------------------
    def submit(self, fn: Callable[[NodeConnection, NodeRecord], T],
               nodes: Iterable[NodeRecord] | None = None) -> dict[Future[T], NodeRecord]:
        """Start fn(conn, node) on every node; the caller waits (launch streams this way)."""
        targets = self.nodes if nodes is None else sorted(nodes, key=lambda n: n.rank)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, max(1, len(self.nodes))))
        return {self._pool.submit(self._call, fn, n): n for n in targets}

    def _call(self, fn: Callable[[NodeConnection, NodeRecord], T], node: NodeRecord) -> T:
        return fn(self.connection(node), node)

    def each(self, fn: Callable[[NodeConnection, NodeRecord], T],
             nodes: Iterable[NodeRecord] | None = None) -> GroupResult[T]:
        """fn(conn, node) on every node in parallel; an exception is that node's result."""

        def one(node: NodeRecord) -> NodeResult[T]:
            try:
                return NodeResult(node, value=fn(self.connection(node), node))
            except Exception as exc:  # noqa: BLE001 - reported per node
                self.drop(node)  # a failed transport is not reused
                return NodeResult(node, error=describe_exception(exc))

        targets = self.nodes if nodes is None else sorted(nodes, key=lambda n: n.rank)
        return GroupResult((r.node.name, r) for r in fan_out(targets, one))

    def run(self, command: str | Callable[[NodeRecord], str], *, stdin: bytes | None = None,
            timeout: float | None = None,
            nodes: Iterable[NodeRecord] | None = None) -> GroupResult[CommandResult]:
        """A shell line (or one per node) on every node; never stops early."""

        def step(conn: NodeConnection, node: NodeRecord) -> CommandResult:
            line = command(node) if callable(command) else command
            return conn.run(line, stdin=stdin, timeout=timeout)

        return self.each(step, nodes)

    def upload(self, archive: bytes, steps: list[str],
               nodes: Iterable[NodeRecord] | None = None) -> GroupResult[CommandResult]:
        """Stream a gzip tar to every node and run `steps` (joined with &&), which must
        include the `tar -xzf - ...` that reads it from stdin."""
        return self.run(" && ".join(steps), stdin=archive, nodes=nodes)

    def wait_until_reachable(self, deadline_s: float = SSH_DEADLINE_S,
                             nodes: Iterable[NodeRecord] | None = None) -> GroupResult[None]:
        """Open every node's connection (retry_open: until the deadline, through a fresh
        node's refused connections, not-yet-pinned host key and not-yet-made login user;
        only the pinned key is ever accepted)."""

        def step(conn: NodeConnection, node: NodeRecord) -> None:
            retry_open(conn, deadline_s)

        return self.each(step, nodes)


@contextlib.contextmanager
def borrowed(inv: Inventory, group: NodeGroup | None,
             nodes: Iterable[NodeRecord] | None = None) -> Iterator[NodeGroup]:
    """The caller's group (left open for its next use), or a new one closed at the end."""
    if group is not None:
        yield group
        return
    with NodeGroup(inv, nodes) as own:
        yield own


def fetch_tree(conn: NodeConnection, remote_dir: str, archive: str, dest: Path,
               files: list[str] | None = None) -> int:
    """Copy `remote_dir` (or only `files` in it) from a node into `dest`, merged over what is
    there: one tar on the node (at `archive`, removed after), one transfer. Returns the number
    of files. NodeStepError if the node cannot pack it."""
    import tarfile
    import tempfile

    q = shlex.quote
    what = "-- " + " ".join(q(f) for f in files) if files is not None else "."
    packed = conn.run(f"mkdir -p {q(remote_dir)} && tar -czf {q(archive)} -C {q(remote_dir)} "
                      f"{what}")
    if not packed.ok:
        raise NodeStepError(f"packing {remote_dir} failed: {packed.tail()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "tree.tgz"
        conn.get(archive, local)
        with tarfile.open(local) as tar:
            tar.extractall(dest, filter="data")  # "data": no absolute paths, no escapes
            count = sum(1 for m in tar.getmembers() if m.isfile())
    conn.run(f"rm -f {q(archive)}")
    return count


class FirstConnectionError(NodeStepError):
    """A node's first connection kept failing a check that a fresh node passes soon (its host
    key, its login); the message says what the node presented until the deadline."""


def _not_yet(exc: BaseException, deadline_s: float) -> FirstConnectionError | None:
    """The error for a key or login that never came right, or None for any other failure."""
    import paramiko

    from provision.sshconn import UnknownHostKeyError, fingerprint

    waited = f"for {deadline_s:.0f} s"
    if isinstance(exc, paramiko.BadHostKeyException):
        return FirstConnectionError(
            f"{exc.hostname} presented host key {fingerprint(exc.key)}, not the pinned "
            f"{fingerprint(exc.expected_key)}, {waited}; refusing to connect (host keys are "
            "pinned, never trusted on first use)")
    if isinstance(exc, UnknownHostKeyError):
        return FirstConnectionError(
            f"{exc.hostname} presented host key {fingerprint(exc.key)}, and no key of that "
            f"type is pinned for it, {waited}; refusing to connect (host keys are pinned, "
            "never trusted on first use)")
    if isinstance(exc, paramiko.AuthenticationException):
        return FirstConnectionError(f"the login was refused {waited} ({exc}): the node does "
                                    "not accept the cluster's key for its user")
    return None


def retry_open(conn: NodeConnection, deadline_s: float) -> None:
    """Open a node's first connection, retrying with short exponential backoff until
    `deadline_s`. Retried: refused, reset or timed-out connections (sshd starting), AND a host
    key that is not the pinned one, AND a refused login: a fresh cloud VM may answer with its
    image's host keys until its guest agent has made and loaded its own, and may not have
    the login user yet (the agent creates it asynchronously).

    Trust-on-nothing holds: the host key is checked during the key exchange, before any
    authentication, so nothing is sent to a node, and no command runs on it, until the PINNED
    key answers; a key that is not pinned is never accepted, only waited past. When the
    deadline passes: FirstConnectionError saying what the node presented (the group names the
    node), or the last connection error."""
    import paramiko
    from tenacity import (
        Retrying,
        retry_if_exception,
        stop_after_delay,
        wait_exponential,
        wait_random,
    )

    def transient(exc: BaseException) -> bool:
        return isinstance(exc, OSError | paramiko.SSHException | EOFError)

    try:
        for attempt in Retrying(
            retry=retry_if_exception(transient),
            # Short waits: sshd in a fresh node answers within a second or two, and every
            # oversleep here adds to `up` directly.
            wait=wait_exponential(multiplier=0.05, max=0.5) + wait_random(0, 0.05),
            stop=stop_after_delay(deadline_s),
            reraise=True,
        ):
            with attempt:
                conn.open()
    except Exception as exc:
        final = _not_yet(exc, deadline_s)
        if final is not None:
            raise final from exc
        raise


def poll(check: Callable[[], bool], deadline_s: float, interval_s: float = 5.0) -> bool:
    """True as soon as `check()` is; False when the deadline passes."""
    end = time.monotonic() + deadline_s
    while True:
        if check():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(interval_s)


__all__ = [
    "CONTAINER_ROOT", "CommandResult", "Connector", "GroupResult", "HomePath", "NodeConnection",
    "FirstConnectionError", "NodeGroup", "NodeResult", "NodeStepError", "RemoteLayout",
    "SshConnection", "background",
    "fan_out",
    "join", "layout_of", "poll", "retry_open", "ssh_connector",
]

