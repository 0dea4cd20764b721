"""A machine the user already has, named the way the user names it for `ssh`, resolved to
everything a login takes; and the rules for pinning its host key. Shared by the providers
that log in to existing machines (ssh: the hosts; slurm: the login node), so neither imports
the other's modules.

A host setting is taken from the first of: the host's own entry > each `HostDefaults` given,
in order (the ssh provider: CLI flags, then the hosts file's top level) > ~/.ssh/config
(`Host` match: HostName, User, Port, IdentityFile, ProxyJump) > built-in default (local user
name, port 22, ~/.ssh/id_ed25519|id_ecdsa|id_rsa). `MGPU_CLOUD_SSH_CONFIG` names another ssh
config file than ~/.ssh/config (tests use it). Pure: reads files, never the network.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from provision.model.errors import UserInputError
from provision.model.sshhost import SshHostOptions
from provision.nodes.hostkeys import (
    Endpoint,
    Jump,
    fingerprint,
    load_known_hosts,
    resolve_host_key,
    user_known_hosts_path,
)

HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
KeyResolver = Callable[..., tuple[str, str]]
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
# What to do about a host key that cannot be pinned, by HostKeyProblem.kind (and unreachable).
HOST_KEY_HINTS = {
    "changed": "a CHANGED key means the machine was reinstalled or someone is intercepting the "
               "connection; only if you know it was reinstalled: ssh-keygen -R HOST -f {known}",
    "unknown": "check the fingerprints above, then rerun with --accept-new-host-keys (pins them "
               "for this cluster only), or add them to {known} (ssh-keyscan)",
    "unreachable": "check the address, port and jump host, and that sshd runs there "
                   "(ssh -p PORT USER@HOST)",
}


@dataclass(frozen=True)
class HostDefaults:
    """One layer of defaults under a host's own entry. A relative identity_file is taken from
    `base` (None: the current folder)."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    base: Path | None = None


@dataclass(frozen=True)
class Host:
    """One machine, every login setting resolved. `source` says where it was declared."""

    name: str
    address: str
    port: int
    user: str
    identity_file: str
    slots: int | None
    private_address: str
    proxy_jump: str | None  # "user@host:port", the form provision.nodes.sshconn.connect expects
    source: str

    @property
    def target(self) -> str:
        """How ssh would name it: user@address[:port]."""
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.user}@{self.address}{port}"


def ssh_config_path() -> Path:
    return Path(os.environ.get("MGPU_CLOUD_SSH_CONFIG", "~/.ssh/config")).expanduser()


def load_ssh_config(path: Path | None = None) -> paramiko.SSHConfig:
    """The user's ssh config (empty when there is none)."""
    path = path or ssh_config_path()
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ConfigParseError) as exc:
        raise UserInputError(f"ssh config {str(path)!r} cannot be read: {exc}") from None


def split_jump(value: str) -> tuple[str, Endpoint]:
    """'user@host:port' (Host.proxy_jump) -> (user, endpoint)."""
    user, _, hostport = value.rpartition("@")
    host, _, port = hostport.partition(":")
    return user, Endpoint(host, int(port or 22))


def _default_identity() -> str | None:
    for candidate in DEFAULT_IDENTITIES:
        if Path(candidate).expanduser().is_file():
            return candidate
    return None


def _expand(path: str, base: Path | None) -> str:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (base or Path.cwd()) / p
    return str(p)


def normalize_proxy_jump(value: str, config: paramiko.SSHConfig, default_user: str,
                         where: str) -> str:
    """`[user@]host[:port]` (host may be an ssh config alias) -> `user@host:port`."""
    if "," in value:
        raise UserInputError(f"{where}: proxy_jump {value!r} has several hops; "
                             "only one jump host is supported")
    user, _, hostport = value.rpartition("@")
    host, _, port = hostport.partition(":")
    if not host or (port and not port.isdigit()):
        raise UserInputError(f"{where}: proxy_jump {value!r} is not `[user@]host[:port]`")
    found = config.lookup(host)
    real_host = str(found.get("hostname") or host)
    user = user or str(found.get("user") or default_user)
    port = port or str(found.get("port") or 22)
    return f"{user}@{real_host}:{port}"


def _identity(entry: SshHostOptions, name: str, source: str, defaults: Sequence[HostDefaults],
              config_keys: list[str], base: Path | None) -> str:
    candidates = [(entry.identity_file, base),
                  *((d.identity_file, d.base) for d in defaults),
                  (config_keys[0] if config_keys else None, None), (_default_identity(), None)]
    chosen = next(((p, b) for p, b in candidates if p), None)
    if chosen is None:
        raise UserInputError(
            f"{source}: no SSH key for host {name!r}",
            hint="pass -i/--identity-file KEY, set identity_file in the inventory, "
            "or add IdentityFile to ~/.ssh/config",
        )
    identity = _expand(*chosen)
    if not Path(identity).is_file():
        raise UserInputError(f"{source}: SSH key {identity!r} of host {name!r} does not exist")
    return identity


def resolve_host(entry: SshHostOptions, source: str, *, defaults: Sequence[HostDefaults] = (),
                 config: paramiko.SSHConfig, default_slots: int | None,
                 base: Path | None) -> Host:
    """Apply the precedence of the module docstring to one entry (`base`: where a relative
    identity_file of the entry itself is taken from). UserInputError naming `source`."""
    found = config.lookup(entry.address)
    address = str(found.get("hostname") or entry.address)
    name = entry.name or entry.address
    if not HOST_NAME_RE.match(name):
        raise UserInputError(f"{source}: host name {name!r} is not usable as a node name "
                             "(letters, digits, '.', '_', '-')")
    user = entry.user or next((d.user for d in defaults if d.user), None) \
        or found.get("user") or getpass.getuser()
    port = (entry.port if "port" in entry.model_fields_set else None) \
        or next((d.port for d in defaults if d.port), None) or int(found.get("port") or 22)
    identity = _identity(entry, name, source, defaults, found.get("identityfile") or [], base)
    jump = entry.proxy_jump or next((d.proxy_jump for d in defaults if d.proxy_jump), None) \
        or found.get("proxyjump")
    if jump and str(jump).lower() == "none":
        jump = None
    return Host(
        name=name, address=address, port=int(port), user=str(user), identity_file=identity,
        slots=entry.slots or default_slots, private_address=entry.private_address or address,
        proxy_jump=normalize_proxy_jump(str(jump), config, str(user), source) if jump else None,
        source=source,
    )


class HostKeys:
    """The user's known_hosts and the pinning rule (hostkeys.py) for one plan. `pin` returns
    (key, 'known' | 'accepted') or raises HostKeyProblem / Unreachable; `resolve` is the
    key lookup (tests inject a fake)."""

    def __init__(self, accept_new: bool, resolve: KeyResolver = resolve_host_key) -> None:
        self.file = user_known_hosts_path()
        self.known = load_known_hosts(self.file)
        self.accept_new = accept_new
        self._resolve = resolve

    def pin(self, endpoint: Endpoint, jump: Jump | None = None) -> tuple[str, str]:
        return self._resolve(endpoint, self.known, accept_new=self.accept_new,
                             known_hosts_file=self.file, jump=jump)

    def hint(self, kind: str) -> str:
        """What to do about a key of this HostKeyProblem.kind (or 'unreachable')."""
        return HOST_KEY_HINTS[kind].format(known=self.file)

    @staticmethod
    def accepted(what: str, key: str) -> str:
        """The plan's note for a key pinned only because --accept-new-host-keys was given."""
        return f"{what}: new host key {fingerprint(key)} will be pinned (--accept-new-host-keys)"
