"""One node's transport: the NodeConnection seam, SSH as its default, and the steps that
use a single connection (opening with retries, copying a folder back).

A `Connector` makes one `NodeConnection` per node: SSH with pinned host keys by default
(`SshConnection`, provision.nodes.sshconn); a provider may supply its own (Slurm's srun
through the login node: ProviderInfo.connector); tests supply a fake (tests/fake_nodes.py).
"""

from __future__ import annotations

import os
import random
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provision.model import nodetext
from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, NodeRecord

CONNECT_TIMEOUT_S = 10.0
# How long a first connection waits past a host key that is not the pinned one, or a refused
# login: a fresh cloud VM's guest agent loads the published keys and creates the login user
# within seconds of publishing them; longer, the key is wrong (and a user's own machine with a
# changed key is named within this, not after the whole SSH deadline).
KEY_SETTLE_S = float(os.environ.get("MGPU_CLOUD_KEY_SETTLE", "45"))
SSH_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_SSH_DEADLINE", "180"))


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
        text = nodetext.lines((self.stderr or self.stdout).strip())[-lines:]
        return " | ".join(nodetext.shown(line) for line in text)


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

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        """Run a shell line whose stdout, bytes as they come, goes into the file `local` (an
        archive packed on the fly: no copy on the node's disk, no second step to fetch and
        remove it). The result holds the exit code and stderr."""
        ...

    def close(self) -> None:
        ...


Connector = Callable[[Inventory, NodeRecord], NodeConnection]


class SshConnection:
    """NodeConnection over SSH (Fabric/paramiko) with pinned host keys (sshconn.connect)."""

    def __init__(self, inv: Inventory, node: NodeRecord, timeout: float = CONNECT_TIMEOUT_S):
        from provision.nodes.sshconn import connect

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

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        """ONE channel; stderr is read on a thread alongside stdout, so that neither can fill
        the channel's window while the other is being read."""
        import shutil
        import threading

        from provision.nodes.unpack import CappedWriter

        self._conn.open()
        chan = self._conn.client.get_transport().open_session()
        err = bytearray()

        def drain_stderr() -> None:  # its last 64 KiB: a node's stderr is not bounded
            for chunk in iter(lambda: chan.recv_stderr(1 << 16), b""):
                err.extend(chunk)
                del err[:-(64 << 10)]

        try:
            chan.exec_command(command)
            drain = threading.Thread(target=drain_stderr, daemon=True)
            drain.start()
            with open(local, "wb") as fh:  # UnsafeArchive past unpack.MAX_DOWNLOAD bytes
                shutil.copyfileobj(chan.makefile("rb"), CappedWriter(fh), 1 << 16)
            drain.join()
            code = chan.recv_exit_status()
            if code == -1 and not chan.get_transport().is_active():  # not the command's end
                raise EOFError("the SSH connection to the node was lost during the copy")
        finally:
            chan.close()
        return CommandResult(int(code), "", err.decode(errors="replace"))

    def close(self) -> None:
        self._conn.close()


def ssh_connector(inv: Inventory, node: NodeRecord) -> NodeConnection:
    return SshConnection(inv, node)


def default_connector(inv: Inventory) -> Connector:
    """The provider's own transport when it declares one (ProviderInfo.connector), else SSH."""
    from provision.model.registry import connector_for

    custom = connector_for(inv.provider)
    return custom(inv) if custom is not None else ssh_connector


class NodeStepError(Exception):
    """A step failed on one node; the message says what and why (no type name is added)."""


def describe_exception(exc: BaseException) -> str:
    """One line for a node's failure: the message of our own errors, else type + text."""
    if isinstance(exc, NodeStepError | MgpuError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class FirstConnectionError(NodeStepError):
    """A node's first connection kept failing a check that a fresh node passes soon (its host
    key, its login); the message says what the node presented until the deadline."""


def _not_yet(exc: BaseException, deadline_s: float) -> FirstConnectionError | None:
    """The error for a key or login that never came right, or None for any other failure."""
    import paramiko

    from provision.nodes.sshconn import UnknownHostKeyError, fingerprint

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


_RANDOM = random.Random()  # retry_open's jitter, not the global generator


def _jitter(retry_state: object) -> float:
    return _RANDOM.uniform(0, 0.05)


def retry_open(conn: NodeConnection, deadline_s: float, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Open a node's first connection, retrying with short exponential backoff until
    `deadline_s`. Retried: refused, reset or timed-out connections (sshd starting), AND a host
    key that is not the pinned one, AND a refused login: a fresh cloud VM may answer with its
    image's host keys until its guest agent has made and loaded its own, and may not have
    the login user yet (the agent creates it asynchronously).

    Trust-on-nothing holds: the host key is checked during the key exchange, before any
    authentication, so nothing is sent to a node, and no command runs on it, until the PINNED
    key answers; a key that is not pinned is never accepted, only waited past. When the
    deadline passes: FirstConnectionError saying what the node presented (the group names the
    node), or the last connection error.

    Two bounds: `deadline_s` for the whole first connection, counted from the first attempt;
    KEY_SETTLE_S for a wrong key or a refused login, counted from sshd's FIRST ANSWER (the
    first such failure), so that a slow-starting sshd does not use up the time the guest
    agent gets to load the keys and make the user. `clock` / `sleep`: for tests."""
    import paramiko
    from tenacity import Retrying, retry_if_exception, wait_combine, wait_exponential

    from provision.nodes.sshconn import UnknownHostKeyError

    start = clock()
    settle = min(deadline_s, KEY_SETTLE_S)
    answered: list[float] = []  # when sshd first answered with a wrong key or a refusal

    def transient(exc: BaseException) -> bool:
        if isinstance(exc, paramiko.BadHostKeyException | paramiko.AuthenticationException
                      | UnknownHostKeyError):
            if not answered:
                answered.append(clock())
            return clock() - answered[0] < settle  # a key or login that never comes right
        return isinstance(exc, OSError | paramiko.SSHException | EOFError)

    def past_deadline(state: object) -> bool:
        return clock() - start >= deadline_s

    try:
        for attempt in Retrying(
            retry=retry_if_exception(transient),
            # Short waits: sshd in a fresh node answers within a second or two, and every
            # oversleep here adds to `up` directly.
            # The jitter has a generator of its own: tenacity's wait_random draws from
            # the global one, which hypothesis reports when a test's thread draws while
            # it does (seen once in tests/test_preflight_hostile.py).
            wait=wait_combine(wait_exponential(multiplier=0.05, max=0.5), _jitter),
            stop=past_deadline,
            sleep=sleep,
            reraise=True,
        ):
            with attempt:
                conn.open()
    except Exception as exc:
        final = _not_yet(exc, min(clock() - start, deadline_s))
        if final is not None:
            raise final from exc
        raise


def get_file(conn: NodeConnection, remote: str, local: Path) -> None:
    """Copy the node's file `remote` (home-relative) to `local`: one command (`cat`), not an
    SFTP session, whose opening alone is several exchanges with the node. NodeStepError when
    the node cannot read it."""
    res = conn.run_to_file(f"exec cat -- {shlex.quote(remote)}", local)
    if not res.ok:
        raise NodeStepError(f"copying {remote} failed (exit {res.exit_code}): {res.tail()}")


def fetch_tree(conn: NodeConnection, remote_dir: str, dest: Path,
               files: list[str] | None = None, *, node: str) -> int:
    """Copy `remote_dir` (or only `files` in it) from `node` into `dest`, merged over what is
    there: ONE command, a tar packed on the node straight into the transfer (nothing written
    on the node's disk; the pack-to-a-file, copy, remove sequence took three exchanges and
    an SFTP session), unpacked by THE extractor (nodes/unpack.py: files and folders only,
    all or nothing). The node's tar is asked to send what links point to, so a job's own
    links arrive as files. Returns the number of files. NodeStepError if the node cannot
    pack it or the archive is refused (naming `node`)."""
    import tempfile

    from provision.nodes.unpack import UnsafeArchive, unpack

    q = shlex.quote
    what = "-- " + " ".join(q(f) for f in files) if files is not None else "."
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "tree.tgz"
        try:  # a connection writes through unpack.CappedWriter
            packed = conn.run_to_file(f"mkdir -p {q(remote_dir)} && tar -czf - --dereference "
                                      f"--hard-dereference -C {q(remote_dir)} {what}", local)
        except UnsafeArchive as exc:
            raise NodeStepError(f"the archive from {node} was refused: {exc}") from None
        if not packed.ok:
            raise NodeStepError(f"packing {remote_dir} failed: {packed.tail()}")
        try:
            return unpack(local, dest, node=node)
        except UnsafeArchive as exc:
            raise NodeStepError(str(exc)) from None
