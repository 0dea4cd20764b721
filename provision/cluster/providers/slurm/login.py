"""The login node: who we are there, its pinned host key, and SSH channels to it.

    LoginTarget     [user@]host[:port] resolved like the ssh provider resolves a host
                    (~/.ssh/config HostName/User/Port/IdentityFile/ProxyJump, then defaults)
    LoginSession    SSH connections to the login node shared by every node connection of one
                    NodeGroup. Every command is one channel; a connection carries at most
                    MAX_CHANNELS at once (OpenSSH's MaxSessions defaults to 10) and new
                    connections are opened one at a time (MaxStartups drops parallel
                    handshakes). Host keys are pinned (never trusted on first use).

Every Slurm command of the provider (sbatch, squeue, srun, scancel) runs on the login node
through this module; nothing is installed there.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import paramiko

from provision.model.base import StrictModel
from provision.model.errors import ProviderUnavailableError, UserInputError
from provision.nodes import CommandResult, Writer
from provision.nodes.hostkeys import CONNECT_TIMEOUT_S, describe_connect_error
from provision.nodes.sshconn import PinnedHostKeys

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

MAX_CHANNELS = 8
READ_CHUNK = 65536


class Hop(StrictModel):
    """One SSH hop with its pinned host key ("type base64")."""

    user: str
    address: str
    port: int
    host_key: str

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def text(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


class LoginTarget(StrictModel):
    """The login node as resolved at plan time (what the inventory records)."""

    login: Hop
    identity_file: str
    jump: Hop | None = None


def split_target(value: str, where: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` -> (user, host, port); UserInputError when malformed."""
    user, _, hostport = value.rpartition("@")
    host, _, port = hostport.partition(":")
    if not host or (port and not port.isdigit()) or "," in value or " " in value:
        raise UserInputError(f"{where} {value!r} is not `[user@]host[:port]`",
                             hint="e.g. --login alice@login.hpc.example.org or --login hpc "
                                  "(a Host of ~/.ssh/config)")
    return user or None, host, int(port) if port else None


class LoginError(ProviderUnavailableError):
    """The login node could not be reached or logged in to."""


def _pinned_client(hop: Hop) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(PinnedHostKeys())
    kind, b64 = hop.host_key.split()[:2]
    client.get_host_keys().add(hop.known_hosts_name, kind,
                               paramiko.PKey.from_type_string(kind, base64.b64decode(b64)))
    return client


def describe_login_failure(exc: BaseException, hop: Hop, identity: str) -> str:
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"{hop.text}: host key CHANGED since it was pinned"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"{hop.text} did not accept the key {identity}"
    reason = describe_connect_error(exc)
    return f"{hop.text}: {reason or f'{type(exc).__name__}: {exc}'}"


def connect(target: LoginTarget, timeout: float = CONNECT_TIMEOUT_S) -> list[paramiko.SSHClient]:
    """Logged-in clients [jump?, login] (the login client last). Raises LoginError."""
    clients: list[paramiko.SSHClient] = []
    try:
        sock: socket.socket | paramiko.Channel
        if target.jump is not None:
            jump = _pinned_client(target.jump)
            clients.append(jump)
            _login(jump, target.jump, target.identity_file, timeout, None)
            transport = jump.get_transport()
            assert transport is not None
            sock = transport.open_channel(
                "direct-tcpip", (target.login.address, target.login.port), ("127.0.0.1", 0),
                timeout=timeout)
        else:
            sock = socket.create_connection((target.login.address, target.login.port),
                                            timeout=timeout)
            # SSH writes small packets back to back: without this each waits for the peer's
            # delayed ACK (40 ms), as provision.nodes.sshconn measured.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        login = _pinned_client(target.login)
        clients.append(login)
        _login(login, target.login, target.identity_file, timeout, sock)
    except LoginError:
        for c in clients:
            c.close()
        raise
    except Exception as exc:
        for c in clients:
            c.close()
        hop = target.jump if target.jump is not None and len(clients) == 1 else target.login
        raise LoginError(f"cannot reach the Slurm login node: "
                         f"{describe_login_failure(exc, hop, target.identity_file)}",
                         hint="check --login/--proxy-jump and that `ssh "
                              f"{target.login.text.rsplit(':', 1)[0]}` works") from exc
    return clients


def _login(client: paramiko.SSHClient, hop: Hop, identity: str, timeout: float,
           sock: socket.socket | paramiko.Channel | None) -> None:
    try:
        client.connect(hop.address, port=hop.port, username=hop.user, key_filename=identity,
                       sock=sock, look_for_keys=False, allow_agent=False, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout)
    except Exception as exc:
        raise LoginError(f"cannot log in to {'the Slurm login node' if sock else 'the jump host'}"
                         f": {describe_login_failure(exc, hop, identity)}",
                         hint="check the key (-i) and the user name (user@host)") from exc


class _Conn:
    def __init__(self, clients: list[paramiko.SSHClient]) -> None:
        self.clients = clients
        self.channels = 0

    @property
    def transport(self) -> paramiko.Transport | None:
        t = self.clients[-1].get_transport()
        return t if t is not None and t.is_active() else None

    def close(self) -> None:
        for c in reversed(self.clients):
            c.close()


class LoginSession:
    """Shared SSH connections to the login node (thread-safe). `users` counts the node
    connections using it: the SSH connections close when the last one closes (and reopen
    when used again)."""

    def __init__(self, target: LoginTarget) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self.users = 0

    # --- lifetime ------------------------------------------------------------------------
    def acquire(self) -> None:
        with self._lock:
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if self.users:
                return
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def open(self) -> None:
        """Connect now if no connection is open (raises LoginError)."""
        with self._slot():
            pass

    @contextlib.contextmanager
    def _slot(self) -> Iterator[_Conn]:
        with self._lock:  # connecting under the lock: one handshake at a time
            dead = [c for c in self._conns if c.transport is None and not c.channels]
            for c in dead:
                c.close()
                self._conns.remove(c)
            conn = next((c for c in self._conns
                         if c.transport is not None and c.channels < MAX_CHANNELS), None)
            if conn is None:
                conn = _Conn(connect(self.target))
                self._conns.append(conn)
            conn.channels += 1
        try:
            yield conn
        finally:
            with self._lock:
                conn.channels -= 1

    @contextlib.contextmanager
    def channel(self) -> Iterator[paramiko.Channel]:
        with self._slot() as conn:
            transport = conn.transport
            if transport is None:
                raise LoginError("the SSH connection to the Slurm login node closed")
            chan = transport.open_session()
            try:
                yield chan
            finally:
                chan.close()

    # --- commands ------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None, binary_out: SupportsWrite[bytes] | None = None) -> CommandResult:
        """Run `command` in the login user's shell. `stdin`: sent, then EOF (without it the
        command's stdin stays open until the channel closes: the job supervisor's
        --watch-stdin relies on that). `out`: stdout+stderr streamed as text; `binary_out`:
        stdout written there as bytes (stderr kept in the result). TimeoutError after
        `timeout` seconds (the channel is closed, which ends the command's stdin)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.channel() as chan:
            if out is not None:
                chan.set_combine_stderr(True)
            chan.exec_command(command)
            if stdin is not None:
                with contextlib.suppress(OSError, EOFError):  # a command may stop reading early
                    chan.sendall(stdin)
                    chan.shutdown_write()
            return _collect(chan, out, binary_out, deadline)


def _collect(chan: paramiko.Channel, out: Writer | None, binary_out: SupportsWrite[bytes] | None,
             deadline: float | None) -> CommandResult:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stdout, stderr = bytearray(), bytearray()

    def expired() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    while True:
        while chan.recv_ready():
            data = chan.recv(READ_CHUNK)
            if binary_out is not None:
                binary_out.write(data)
            elif out is not None:
                out.write(decoder.decode(data))
            else:
                stdout += data
        while chan.recv_stderr_ready():
            stderr += chan.recv_stderr(READ_CHUNK)
        if (chan.eof_received or chan.closed) and not chan.recv_ready() \
                and not chan.recv_stderr_ready():
            break
        if expired():
            raise TimeoutError("the command did not finish in time")
        # A channel is selectable: readable when stdout or stderr data (or EOF) arrived.
        select.select([chan], [], [], 1.0 if deadline is None
                      else max(0.0, min(1.0, deadline - time.monotonic())))
    if out is not None:
        tail = decoder.decode(b"", final=True)
        if tail:
            out.write(tail)
    while not chan.status_event.wait(0.5):
        if chan.closed or not chan.get_transport().is_active():
            raise LoginError("the SSH connection to the Slurm login node was lost")
        if expired():
            raise TimeoutError("the command did not finish in time")
    return CommandResult(int(chan.recv_exit_status()), stdout.decode(errors="replace"),
                         stderr.decode(errors="replace"))
