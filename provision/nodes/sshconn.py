"""SSH to nodes from the controller: Fabric connections with pinned host keys.

Host keys are never trusted on first use: every node's public host key is in the inventory
(made by the tool, or taken from the user's known_hosts for the ssh provider) and written to a
per-cluster known_hosts; paramiko's RejectPolicy refuses anything else.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko

from provision.model.errors import MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import known_hosts_line, write_known_hosts

# paramiko's transport thread logs a failed connection with its traceback (a booting node that
# resets it before sshd's banner) and then raises it to the caller, who says it once
# (transport.retry_open, NodeResult). With no logging set up, Python would print those records
# on stderr in the middle of a run's output: a handler that drops them keeps them out, and a
# handler the user sets up on the root logger still gets them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class UnknownHostKeyError(paramiko.SSHException):  # type: ignore[misc]
    """The node presented a host key of a type none is pinned for (never accepted)."""

    def __init__(self, hostname: str, key: Any) -> None:
        super().__init__(
            f"host {hostname} presented an unknown {key.get_name()} host key "
            f"({fingerprint(key)}); refusing to connect (keys are pinned, never trusted on "
            "first use)")
        self.hostname = hostname
        self.key = key


def fingerprint(key: Any) -> str:
    """'TYPE SHA256:...' as OpenSSH prints it."""
    return f"{key.get_name()} {key.fingerprint}"


class PinnedHostKeys(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        raise UnknownHostKeyError(hostname, key)

if TYPE_CHECKING:
    from fabric import Connection


# Read-and-write of a known_hosts is one step: a spare made in the background adds itself to
# the inventory and writes, while a recovery writes from the same inventory; the last writer
# read the inventory last.
_WRITING = threading.Lock()


def write_cluster_known_hosts(inv: Inventory, store: InventoryStore,
                              adding: Sequence[NodeRecord] = (),
                              then: Callable[[], None] | None = None) -> Path:
    """(Re)write KEYS/known_hosts (or `inv.known_hosts_path`) from the inventory's pinned
    host keys. `adding`: nodes not in the inventory yet, pinned too; `then` (which adds them
    to it) runs before any other rewrite, so that no thread can see them in the inventory
    before their keys are in the file (a spare made during a run: job/sparepool.py)."""
    path = Path(inv.known_hosts_path or store.keys_dir(inv.name) / "known_hosts")
    with _WRITING:
        lines = [known_hosts_line([n.address], n.port, n.host_key)  # warm spares too (44)
                 for n in [*inv.nodes, *inv.spares, *adding] if n.host_key]
        # Jump hosts that are not nodes themselves (ssh provider `proxy_jump`): pinned alike.
        lines += [known_hosts_line([r.name or r.id], int(r.extra["port"]), r.extra["key"])
                  for r in inv.resources_of("pinned-host-key")]
        write_known_hosts(path, lines)
        if then is not None:
            then()
    if inv.known_hosts_path != str(path):
        inv.known_hosts_path = str(path)
        store.save(inv)
    return path


def node_identity(inv: Inventory, node: NodeRecord) -> str:
    key = node.identity_file or inv.key_path
    if not key:
        raise MgpuError(f"cluster {inv.name!r} has no SSH key recorded",
                        hint=f"its inventory is incomplete; remove it with `mgpu-cloud down {inv.name}`")
    return os.path.expanduser(key)


@cache
def _connection_class() -> type[Connection]:
    from fabric import Connection

    class NoDelayConnection(Connection):  # type: ignore[misc]
        """Opens its TCP socket with TCP_NODELAY. SSH writes small packets back to back; with
        Nagle's algorithm each waits for the peer's delayed ACK (40 ms on Linux): measured,
        a connection took 85 ms to open instead of 40, and each further command 40 ms more."""

        keepalive_s = 0  # > 0: an SSH keepalive after that many seconds of not sending

        def open(self) -> Any:
            if self.is_connected or self.gateway is not None:
                return self._keep(super().open())
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connect_kwargs["sock"] = sock
            try:
                return self._keep(super().open())
            except BaseException:
                sock.close()
                raise
            finally:
                self.connect_kwargs.pop("sock", None)

        def _keep(self, result: Any) -> Any:
            if self.keepalive_s and self.transport is not None:
                self.transport.set_keepalive(self.keepalive_s)
            return result

    return NoDelayConnection


def connect(inv: Inventory, node: NodeRecord, *, timeout: float = 10.0) -> Connection:
    """A Fabric Connection to `node` that rejects unknown or changed host keys."""
    from fabric import Config

    Connection = _connection_class()  # noqa: N806 - a class

    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
    gateway: Any = None
    if node.proxy_jump:
        user, _, hostport = node.proxy_jump.rpartition("@")
        host, _, port = hostport.partition(":")
        gateway = Connection(
            host, user=user or None, port=int(port or 22), config=config,
            connect_kwargs={"key_filename": node_identity(inv, node), "look_for_keys": False,
                            "allow_agent": False},
        )
        _pin(gateway, inv)
    conn = Connection(
        node.address,
        user=node.user,
        port=node.port,
        config=config,
        gateway=gateway,
        connect_timeout=timeout,
        connect_kwargs={
            "key_filename": node_identity(inv, node),
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
        },
    )
    _pin(conn, inv)
    return conn


def _pin(conn: Any, inv: Inventory) -> None:
    conn.client.set_missing_host_key_policy(PinnedHostKeys())
    if inv.known_hosts_path and Path(inv.known_hosts_path).exists():
        conn.client.load_host_keys(inv.known_hosts_path)


def ssh_argv(inv: Inventory, rank: int, command: list[str]) -> list[str]:
    """argv for an interactive `ssh` to the node of that rank: its host key pinned, and its
    jump host's too (a ProxyCommand running ssh with the same pinning: `-J` would check the
    jump host against the user's own known_hosts, or trust it on first use). Destinations
    follow `--` (with NodeRecord's user/address syntax, neither can be read as an option)."""
    nodes = [n for n in inv.nodes if n.rank == rank]
    if not nodes:
        raise UserInputError(
            f"cluster {inv.name!r} has no node {rank}; nodes are 0..{len(inv.nodes) - 1}"
        )
    node = nodes[0]
    identity = node_identity(inv, node)
    argv = ["ssh", "-p", str(node.port), *_pinned(inv, identity)]
    proxy = proxy_command(inv, node)
    if proxy is None and node.proxy_jump:
        proxy = jump_command(inv, identity, node.proxy_jump)
    if proxy:
        argv += ["-o", f"ProxyCommand={proxy}"]
    argv += ["--", f"{node.user}@{node.address}"]
    if command:
        argv.append(" ".join(shlex.quote(c) for c in command))
    return argv


def _pinned(inv: Inventory, identity: str) -> list[str]:
    """ssh options that log in with the cluster's key alone and accept only the host keys the
    tool pinned (what `ssh-config` writes). Paths as ssh_config(5) values (-o IdentityFile,
    not -i: ssh drops an -i path it cannot stat before expanding its %-tokens)."""
    return ["-o", f"IdentityFile={_path_value(identity)}", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={_path_value(str(inv.known_hosts_path))}",
            "-o", "StrictHostKeyChecking=yes", "-o", "GlobalKnownHostsFile=/dev/null"]


def _path_value(path: str) -> str:
    """A path as an ssh option's value: its %-tokens kept as themselves, and double-quoted
    when it has spaces (UserKnownHostsFile would read a list of files)."""
    path = path.replace("%", "%%")
    return f'"{path}"' if any(c.isspace() for c in path) else path


def jump_command(inv: Inventory, identity: str, proxy_jump: str) -> str:
    """The ProxyCommand reaching a node through `proxy_jump` ('user@host:port'): ssh -W to the
    jump host, pinned like the node (the inventory's known_hosts holds the jump host's key).
    ssh runs it through the user's shell after replacing %-tokens: every word is quoted, and
    every % doubled but those of `-W '[%h]:%p'` (the node's host and port, as OpenSSH's own
    ProxyJump writes it; NodeRecord's address syntax keeps quotes out of %h)."""
    user, _, hostport = proxy_jump.rpartition("@")
    host, _, port = hostport.partition(":")
    before = ["ssh", "-p", port or "22", *_pinned(inv, identity)]
    after = ["--", f"{user}@{host}" if user else host]
    return " ".join([*map(_proxy_word, before), "-W", "'[%h]:%p'", *map(_proxy_word, after)])


def proxy_command(inv: Inventory, node: NodeRecord) -> str | None:
    """The provider's own ProxyCommand for `node` (registry.proxy_for: k8s's port-forward
    relay), its words quoted and % doubled; None when ssh reaches the node itself."""
    from provision.model.registry import proxy_for

    make = proxy_for(inv.provider)
    return " ".join(map(_proxy_word, make(inv, node))) if make is not None else None


def _proxy_word(word: str) -> str:
    """One word of a ProxyCommand: quoted for the shell, % doubled for ssh's tokens."""
    return shlex.quote(word).replace("%", "%%")
