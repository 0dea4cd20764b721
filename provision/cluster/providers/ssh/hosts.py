"""The ssh provider's input: which existing machines, and how to log in to each.

Sources (exactly one per cluster):
    --inventory FILE   hosts YAML (format: inventories/onprem.example.yaml)
    --hostfile FILE    DeepSpeed/MPI hostfile: `node1 slots=8` per line (`node1` alone: slots
                       are detected at `up`); user/key/port come from flags or ~/.ssh/config
    ssh.hosts          the same host entries inline in a --config cluster YAML

Every host setting is resolved in this order (first one set wins):
    the host's own entry > CLI flag (--user, -i, --port) > the inventory file's top-level
    default > ~/.ssh/config (`Host` match: HostName, User, Port, IdentityFile, ProxyJump)
    > built-in default (local user name, port 22, ~/.ssh/id_ed25519|id_ecdsa|id_rsa).

`MGPU_CLOUD_SSH_CONFIG` names another ssh config file than ~/.ssh/config (tests use it).
Pure: reads files, never touches the network. Errors are UserInputError naming file and line.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from provision.cluster.providers.ssh.options import SshHostOptions, SshOptions
from provision.model.errors import UserInputError
from provision.model.spec import ClusterSpec
from provision.model.yamltext import YAML_HINT, YamlProblem

HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
HOSTFILE_LINE_RE = re.compile(r"^(\S+)(?:\s+slots=(\d+))?$")
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


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


class InventoryFile(BaseModel):
    """The hosts YAML: top-level defaults and a list of hosts."""

    model_config = ConfigDict(extra="forbid")

    user: str | None = None
    identity_file: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    proxy_jump: str | None = None
    hosts: list[SshHostOptions] = Field(min_length=1)


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


# ----------------------------------------------------------------------------- file readers


def _yaml_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at pydantic error location `loc` (nearest parent found)."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for part in loc:
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
        if nxt is None:
            break
        node, line = nxt, nxt.start_mark.line + 1
    return line


def read_inventory_file(path: str) -> tuple[InventoryFile, list[str]]:
    """Parse and validate a hosts YAML; returns it and a `FILE:LINE` source per host."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserInputError(f"inventory file {path!r} does not exist",
                             hint="see inventories/onprem.example.yaml for the format")
    text = p.read_text()
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        bad = YamlProblem.of(exc)
        where = f":{bad.line}" if bad.line is not None else ""
        raise UserInputError(f"{path}{where}: not valid YAML: {bad.problem}",
                             hint=YAML_HINT) from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected a mapping with a `hosts:` list",
                             hint="see inventories/onprem.example.yaml for the format")
    try:
        inv = InventoryFile.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown setting (check its spelling)"
            line = _yaml_line(root, loc)
            where = f"{path}:{line}" if line else path
            lines.append(f"{where}: {'.'.join(str(x) for x in loc)}: {msg}")
        raise UserInputError("invalid inventory file:\n  " + "\n  ".join(lines),
                             hint="see inventories/onprem.example.yaml for the format") from None
    sources = [f"{path}:{_yaml_line(root, ('hosts', i))}" for i in range(len(inv.hosts))]
    return inv, sources


def read_hostfile(path: str) -> list[tuple[SshHostOptions, str]]:
    """Parse a DeepSpeed/MPI hostfile: `HOST [slots=N]` lines, `#` comments, blank lines."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserInputError(f"hostfile {path!r} does not exist",
                             hint="one line per machine, e.g. `node1 slots=8`")
    out: list[tuple[SshHostOptions, str]] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(p.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE_RE.match(line)
        if not match:
            raise UserInputError(
                f"{path}:{n}: expected `HOST slots=N`, got {raw.strip()!r}",
                hint="one machine per line, e.g. `node1 slots=8` (DeepSpeed/MPI hostfile format)",
            )
        host, slots = match.group(1), match.group(2)
        if host in seen:
            raise UserInputError(f"{path}:{n}: host {host!r} is listed twice "
                                 f"(first at line {seen[host]})")
        if slots is not None and int(slots) < 1:
            raise UserInputError(f"{path}:{n}: slots must be at least 1")
        seen[host] = n
        # The hostfile's name is how the nodes know each other (DeepSpeed's pdsh logs in to
        # it from node-0), so it is the rendezvous address; ~/.ssh/config may map the
        # controller's login elsewhere (HostName).
        entry = SshHostOptions.model_validate(
            {"name": host, "address": host, "private_address": host,
             "slots": int(slots) if slots else None})
        out.append((entry, f"{path}:{n}"))
    if not out:
        raise UserInputError(f"hostfile {path!r} lists no hosts",
                             hint="one machine per line, e.g. `node1 slots=8`")
    return out


# ----------------------------------------------------------------------------- resolution


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


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


def resolve_host(entry: SshHostOptions, source: str, *, opts: SshOptions,
                 file_defaults: InventoryFile | None, config: paramiko.SSHConfig,
                 default_slots: int | None, base: Path | None) -> Host:
    """Apply the precedence of the module docstring to one entry."""
    found = config.lookup(entry.address)
    flag_port = opts.port if "port" in opts.model_fields_set else None
    fd = file_defaults
    address = str(found.get("hostname") or entry.address)
    name = entry.name or entry.address
    if not HOST_NAME_RE.match(name):
        raise UserInputError(f"{source}: host name {name!r} is not usable as a node name "
                             "(letters, digits, '.', '_', '-')")
    user = entry.user or opts.user or (fd.user if fd else None) or found.get("user") \
        or getpass.getuser()
    port_set = "port" in entry.model_fields_set
    port = (entry.port if port_set else None) or flag_port or (fd.port if fd else None) \
        or int(found.get("port") or 22)
    config_keys = found.get("identityfile") or []
    # Relative paths: from the inventory file's folder when written there, else from the cwd.
    candidates = [
        (entry.identity_file, base), (opts.identity_file, None),
        (fd.identity_file if fd else None, base),
        (config_keys[0] if config_keys else None, None), (_default_identity(), None),
    ]
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
    jump = entry.proxy_jump or (fd.proxy_jump if fd else None) or found.get("proxyjump")
    if jump and str(jump).lower() == "none":
        jump = None
    return Host(
        name=name,
        address=address,
        port=int(port),
        user=str(user),
        identity_file=identity,
        slots=entry.slots or default_slots,
        private_address=entry.private_address or address,
        proxy_jump=normalize_proxy_jump(str(jump), config, str(user), source) if jump else None,
        source=source,
    )


def load_hosts(spec: ClusterSpec, config: paramiko.SSHConfig | None = None) -> list[Host]:
    """Every host of the spec, in rank order. UserInputError for any bad input."""
    opts = spec.options_as(SshOptions)
    given = [x for x in (opts.inventory, opts.hostfile, opts.hosts or None) if x]
    if len(given) != 1:
        raise UserInputError(
            "the ssh provider needs exactly one list of hosts"
            + (" (several were given)" if given else ""),
            hint="pass --inventory FILE (see inventories/onprem.example.yaml) or "
            "--hostfile FILE (`node1 slots=8` lines)",
        )
    config = config if config is not None else load_ssh_config()
    file_defaults: InventoryFile | None = None
    base: Path | None = None
    if opts.inventory:
        file_defaults, sources = read_inventory_file(opts.inventory)
        entries = list(zip(file_defaults.hosts, sources, strict=True))
        base = Path(opts.inventory).expanduser().resolve().parent
    elif opts.hostfile:
        entries = read_hostfile(opts.hostfile)
    else:
        entries = [(h, f"ssh.hosts[{i}]") for i, h in enumerate(opts.hosts)]
    hosts = [
        resolve_host(e, src, opts=opts, file_defaults=file_defaults, config=config,
                     default_slots=spec.gpus_per_node, base=base)
        for e, src in entries
    ]
    names: dict[str, str] = {}
    endpoints: dict[tuple[str, int, str | None], str] = {}
    for h in hosts:
        if h.name in names:
            raise UserInputError(f"{h.source}: host name {h.name!r} is used twice "
                                 f"(also at {names[h.name]}); give each host its own `name`")
        key = (h.address, h.port, h.proxy_jump)
        if key in endpoints:
            raise UserInputError(f"{h.source}: {h.target} is listed twice "
                                 f"(also at {endpoints[key]})")
        names[h.name], endpoints[key] = h.source, h.source
    if len(hosts) > 1:
        for h in hosts:
            if _is_loopback(h.private_address):
                raise UserInputError(
                    f"{h.source}: host {h.name!r} would be reached by the other nodes at "
                    f"{h.private_address}, a loopback address (each node would talk to itself)",
                    hint="set `private_address:` for it to the address the nodes share",
                )
    if "nodes" in spec.model_fields_set and spec.nodes != len(hosts):
        if spec.nodes > len(hosts):
            raise UserInputError(
                f"--nodes {spec.nodes} asked, but only {len(hosts)} host(s) are listed",
                hint="drop --nodes (all listed hosts are used) or add hosts",
            )
        hosts = hosts[: spec.nodes]
    return hosts
