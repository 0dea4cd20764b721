"""Host keys of the user's machines: taken from known_hosts, never trusted on first use.

    known      the host's key in the user's known_hosts (`MGPU_CLOUD_SSH_KNOWN_HOSTS` overrides
               the default ~/.ssh/known_hosts; tests point it at a temp file). Hashed entries
               and `[host]:port` entries are understood (paramiko.HostKeys).
    fetched    the key the host presents now: an SSH key exchange only (paramiko Transport,
               no login), restricted to the key types known_hosts holds for it, as OpenSSH does.
               Behind a jump host, the jump host is logged in to (its own key resolved the same
               way first) and the exchange runs through a direct-tcpip channel.

Rules: known == fetched -> pinned; known != fetched -> refused ("host key CHANGED");
not known -> refused, unless --accept-new-host-keys: then the fetched key is pinned (in the
cluster's inventory; the user's known_hosts is never written).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

CONNECT_TIMEOUT_S = float(os.environ.get("MGPU_CLOUD_SSH_CONNECT_TIMEOUT", "10"))

# Why a TCP connection failed, by errno (never by message text).
SOCKET_ERRNO_REASONS: dict[int, str] = {
    errno.ECONNREFUSED: "connection refused (is sshd running on that port?)",
    errno.ETIMEDOUT: "connection timed out (host down, or a firewall drops SSH)",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.ECONNRESET: "connection reset by the host",
}
# paramiko ChannelException codes (RFC 4254 section 5.1) when a jump host cannot forward.
CHANNEL_OPEN_REASONS: dict[int, str] = {
    1: "the jump host refused to forward (AllowTcpForwarding no?)",
    2: "the jump host could not connect to it",
    3: "the jump host does not support forwarding",
    4: "the jump host ran out of resources",
}


class HostKeyProblem(Exception):
    """A host's key is unknown or changed; `kind` is 'unknown' or 'changed'."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Unreachable(Exception):
    """The host (or its jump host) could not be reached or logged in to."""


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


@dataclass(frozen=True)
class Jump:
    """A jump host with its resolved (pinned) key."""

    endpoint: Endpoint
    user: str
    identity_file: str
    host_key: str  # "type base64"


def user_known_hosts_path() -> Path:
    return Path(os.environ.get("MGPU_CLOUD_SSH_KNOWN_HOSTS", "~/.ssh/known_hosts")).expanduser()


def load_known_hosts(path: Path | None = None) -> paramiko.HostKeys:
    """The user's known_hosts (empty when the file does not exist).

    Lines that cannot be parsed, and marker lines (@cert-authority, @revoked), are skipped
    rather than failing the whole file: a host is then simply "unknown", which is refused.
    """
    path = path or user_known_hosts_path()
    keys = paramiko.HostKeys()
    if not path.is_file():
        return keys
    for lineno, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
            continue
        if entry is None or entry.key is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)
    return keys


def key_text(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(key_or_text: paramiko.PKey | str) -> str:
    """OpenSSH-style `SHA256:...` fingerprint."""
    if isinstance(key_or_text, str):
        blob = base64.b64decode(key_or_text.split()[1])
    else:
        blob = key_or_text.asbytes()
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_keys(known: paramiko.HostKeys, endpoint: Endpoint) -> list[paramiko.PKey]:
    entry = known.lookup(endpoint.known_hosts_name)
    return list(entry.values()) if entry else []


def _base_type(algorithm: str) -> str:
    return "ssh-rsa" if algorithm in ("rsa-sha2-256", "rsa-sha2-512") else algorithm


def describe_connect_error(exc: BaseException) -> str | None:
    """A short reason for a network-level failure, or None when `exc` is not one."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {e.errno for e in exc.errors.values() if e is not None}
        return next((SOCKET_ERRNO_REASONS[c] for c in codes if c in SOCKET_ERRNO_REASONS),
                    "connection failed")
    if isinstance(exc, socket.gaierror):
        return "address cannot be resolved"
    if isinstance(exc, TimeoutError | socket.timeout):
        return SOCKET_ERRNO_REASONS[errno.ETIMEDOUT]
    if isinstance(exc, paramiko.ChannelException):
        return CHANNEL_OPEN_REASONS.get(exc.code, f"jump host channel error {exc.code}")
    if isinstance(exc, OSError) and exc.errno is not None:
        return SOCKET_ERRNO_REASONS.get(exc.errno, f"network error: {exc.strerror or exc}")
    return None


def _jump_client(jump: Jump, timeout: float) -> paramiko.SSHClient:
    from provision.nodes.sshconn import PinnedHostKeys

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(PinnedHostKeys())
    kind, b64 = jump.host_key.split()[:2]
    client.get_host_keys().add(jump.endpoint.known_hosts_name, kind,
                               paramiko.PKey.from_type_string(kind, base64.b64decode(b64)))
    try:
        client.connect(jump.endpoint.address, port=jump.endpoint.port, username=jump.user,
                       key_filename=jump.identity_file, look_for_keys=False, allow_agent=False,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except paramiko.AuthenticationException:
        client.close()
        raise Unreachable(f"jump host {jump.user}@{jump.endpoint.address}:{jump.endpoint.port} "
                          f"refused the key {jump.identity_file}") from None
    except Exception as exc:
        client.close()
        reason = describe_connect_error(exc) or f"{type(exc).__name__}: {exc}"
        raise Unreachable(f"jump host {jump.endpoint.address}:{jump.endpoint.port}: "
                          f"{reason}") from None
    return client


def fetch_server_key(endpoint: Endpoint, *, key_types: list[str] | None = None,
                     jump: Jump | None = None,
                     timeout: float = CONNECT_TIMEOUT_S) -> paramiko.PKey:
    """The host key `endpoint` presents (key exchange only; no login).

    Raises Unreachable for network/jump failures, HostKeyProblem('changed') when the host
    offers none of `key_types`.
    """
    client: paramiko.SSHClient | None = None
    sock: Any
    try:
        if jump is not None:
            client = _jump_client(jump, timeout)
            transport = client.get_transport()
            assert transport is not None
            sock = transport.open_channel("direct-tcpip", (endpoint.address, endpoint.port),
                                          ("127.0.0.1", 0), timeout=timeout)
        else:
            sock = socket.create_connection((endpoint.address, endpoint.port), timeout=timeout)
    except Unreachable:
        raise
    except Exception as exc:
        if client is not None:
            client.close()
        raise Unreachable(describe_connect_error(exc) or f"{type(exc).__name__}: {exc}") from None
    t = paramiko.Transport(sock)
    try:
        if key_types:
            opts = t.get_security_options()
            wanted = [k for k in opts.key_types if _base_type(k) in key_types]
            if wanted:
                opts.key_types = wanted
        t.banner_timeout = timeout
        try:
            t.start_client(timeout=timeout)
        except paramiko.IncompatiblePeer:
            raise HostKeyProblem(
                "changed", f"the host offers none of the key types known for it ({', '.join(key_types or [])})"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            reason = describe_connect_error(exc) or f"SSH handshake failed: {exc}"
            raise Unreachable(reason) from None
        return t.get_remote_server_key()
    finally:
        t.close()
        if client is not None:
            client.close()


def resolve_host_key(endpoint: Endpoint, known: paramiko.HostKeys, *, accept_new: bool,
                     known_hosts_file: Path, jump: Jump | None = None) -> tuple[str, str]:
    """(pinned key "type base64", how it was decided: 'known_hosts' | 'accepted').

    Raises HostKeyProblem (unknown without `accept_new`, or changed) or Unreachable.
    """
    expected = known_keys(known, endpoint)
    types = sorted({k.get_name() for k in expected})
    presented = fetch_server_key(endpoint, key_types=types or None, jump=jump)
    name = endpoint.known_hosts_name
    if expected:
        if any(k.get_name() == presented.get_name() and k.asbytes() == presented.asbytes()
               for k in expected):
            return key_text(presented), "known_hosts"
        olds = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in expected)
        raise HostKeyProblem(
            "changed",
            f"host key CHANGED: {known_hosts_file} has {olds} for {name}, but the host "
            f"presented {presented.get_name()} {fingerprint(presented)}",
        )
    if accept_new:
        return key_text(presented), "accepted"
    raise HostKeyProblem(
        "unknown",
        f"unknown host key: {name} is not in {known_hosts_file}; it presented "
        f"{presented.get_name()} {fingerprint(presented)}",
    )
