"""The ssh provider's input: which existing machines, and how to log in to each.

Sources (exactly one per cluster):
    --inventory FILE   hosts YAML (format: inventories/onprem.example.yaml)
    --hostfile FILE    DeepSpeed/MPI hostfile: `node1 slots=8` per line (`node1` alone: slots
                       are detected at `up`); user/key/port come from flags or ~/.ssh/config
    ssh.hosts          the same host entries inline in a --config cluster YAML

Every host setting is resolved in this order (first one set wins), by
provision/nodes/sshhosts.py (shared with the slurm provider's login node):
    the host's own entry > CLI flag (--user, -i, --port) > the inventory file's top-level
    default > ~/.ssh/config (`Host` match: HostName, User, Port, IdentityFile, ProxyJump)
    > built-in default (local user name, port 22, ~/.ssh/id_ed25519|id_ecdsa|id_rsa).

`MGPU_CLOUD_SSH_CONFIG` names another ssh config file than ~/.ssh/config (tests use it).
Pure: reads files, never touches the network. Errors are UserInputError naming file and line.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import paramiko
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from provision.cluster.providers.ssh.options import SshOptions
from provision.model.errors import UserInputError
from provision.model.spec import ClusterSpec
from provision.model.sshhost import SshHostOptions
from provision.model.yamltext import YAML_HINT, YamlProblem
from provision.nodes.sshhosts import (
    Host,
    HostDefaults,
    load_ssh_config,
    resolve_host,
)

HOSTFILE_LINE_RE = re.compile(r"^(\S+)(?:\s+slots=(\d+))?$")


class InventoryFile(BaseModel):
    """The hosts YAML: top-level defaults and a list of hosts."""

    model_config = ConfigDict(extra="forbid")

    user: str | None = None
    identity_file: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    proxy_jump: str | None = None
    hosts: list[SshHostOptions] = Field(min_length=1)


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
    flags = HostDefaults(user=opts.user, identity_file=opts.identity_file,
                         port=opts.port if "port" in opts.model_fields_set else None)
    layers = [flags] + ([HostDefaults(user=file_defaults.user, port=file_defaults.port,
                                      identity_file=file_defaults.identity_file,
                                      proxy_jump=file_defaults.proxy_jump, base=base)]
                        if file_defaults else [])
    hosts = [resolve_host(e, src, defaults=layers, config=config,
                          default_slots=spec.gpus_per_node, base=base) for e, src in entries]
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
