"""Plain OpenSSH access to a cluster: `ssh NAME`, `ssh NAME-node-R`, scp, rsync, VS Code, pdsh.

`config_text` is an OpenSSH config with one Host block per node (aliases `NAME` for node 0
and `NAME-node-R`), the cluster's key, and the cluster's own known_hosts with
StrictHostKeyChecking=yes (the host keys the tool pinned; never trust on first use). Nodes
behind a jump host reach it through a `NAME-jump-J` alias pinned the same way; a provider's
own transport (k8s: the API's port-forward) is the node's ProxyCommand (registry.proxy_for).

`install` writes it to $MGPU_CLOUD_HOME/ssh/NAME.conf (removed by `down` with the inventory)
and makes sure ~/.ssh/config starts with ONE `Include` of that folder's *.conf, written by
the tool between marker lines, so every cluster installed later is reachable without touching
~/.ssh/config again. The Include goes first: OpenSSH uses the first value it finds for each
option, and an Include after a `Host` line would only apply inside that block.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, InventoryStore
from provision.nodes.sshconn import node_identity, proxy_command
from remote.files import write_atomic

BEGIN = "# >>> mgpu-cloud >>>"
END = "# <<< mgpu-cloud <<<"
# ssh(1) options that take a value (OpenSSH 9): `-L 6006:localhost:6006`, `-p 2222`, ...
SSH_OPTIONS_WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def _quote(value: str) -> str:
    """A config value; quoted when it has spaces (ssh_config(5) accepts double quotes)."""
    return f'"{value}"' if any(c.isspace() for c in value) else value


def config_text(inv: Inventory) -> str:
    """The cluster's OpenSSH config (see the module doc). Needs the inventory's known_hosts."""
    if not inv.nodes:
        raise MgpuError(f"cluster {inv.name!r} has no nodes yet")
    if not inv.known_hosts_path or not Path(inv.known_hosts_path).exists():
        raise MgpuError(f"cluster {inv.name!r} has no pinned host keys on this machine",
                        hint=f"it was not bootstrapped; remove it: mgpu-cloud down {inv.name}")
    known = _quote(inv.known_hosts_path)
    jumps: dict[str, str] = {}
    out = [f"# mgpu-cloud cluster {inv.name} ({inv.provider}): written by `mgpu-cloud "
           f"ssh-config {inv.name}`", ""]
    for node in sorted(inv.nodes, key=lambda n: n.rank):
        if node.proxy_jump and node.proxy_jump not in jumps:
            alias = f"{inv.name}-jump-{len(jumps)}"
            jumps[node.proxy_jump] = alias
            user, _, hostport = node.proxy_jump.rpartition("@")
            host, _, port = hostport.partition(":")
            out += [f"Host {alias}", f"  HostName {host}", f"  Port {port or 22}"]
            out += [f"  User {user}"] if user else []
            out += _common(_quote(node_identity(inv, node)), known) + [""]
        aliases = ([inv.name] if node.rank == 0 else []) + [f"{inv.name}-node-{node.rank}"]
        out += [f"Host {' '.join(aliases)}", f"  HostName {node.address}",
                f"  Port {node.port}", f"  User {node.user}"]
        out += _common(_quote(node_identity(inv, node)), known)
        proxy = proxy_command(inv, node)
        if proxy:
            out.append(f"  ProxyCommand {proxy}")
        elif node.proxy_jump:
            out.append(f"  ProxyJump {jumps[node.proxy_jump]}")
        out.append("")
    return "\n".join(out)


def _common(identity: str, known: str) -> list[str]:
    return [f"  IdentityFile {identity}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known}", "  StrictHostKeyChecking yes",
            "  GlobalKnownHostsFile /dev/null"]


def user_ssh_config() -> Path:
    return Path(os.path.expanduser("~")) / ".ssh" / "config"


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, text, mode=mode)


def install(inv: Inventory, store: InventoryStore, user_config: Path | None = None) -> Path:
    """Write the cluster's config where the tool owns it and Include that folder from
    ~/.ssh/config (once). Idempotent. Returns the cluster's config file."""
    path = store.ssh_config_path(inv.name)
    _write(path, config_text(inv))
    user_config = user_config or user_ssh_config()
    include = f"Include {_quote(str(path.parent / '*.conf'))}"
    block = f"{BEGIN}\n# clusters made by mgpu-cloud; their files are removed by `down`\n" \
            f"{include}\n{END}\n"
    old = user_config.read_text() if user_config.exists() else ""
    if include in old:
        return path
    lines = old.splitlines(keepends=True)
    if BEGIN in old and END in old:  # an older block (another MGPU_CLOUD_HOME): replace it
        start = next(i for i, ln in enumerate(lines) if ln.strip() == BEGIN)
        end = next(i for i, ln in enumerate(lines) if ln.strip() == END)
        lines = lines[:start] + lines[end + 1:]
    _write(user_config, block + "".join(lines))
    return path


def split_ssh_args(words: list[str]) -> tuple[list[str], list[str]]:
    """`-L 6006:localhost:6006 -v nvidia-smi -l` -> (ssh options, the remote command).
    Options come first; `--` or the first word that is not an option ends them."""
    opts: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        opts.append(word)
        if len(word) == 2 and word[1] in SSH_OPTIONS_WITH_VALUE and i + 1 < len(words):
            opts.append(words[i + 1])
            i += 1
        i += 1
    return opts, words[i:]


def ssh_command(base: list[str], words: list[str]) -> list[str]:
    """`base` (sshconn.ssh_argv without a command: `--` and the destination last) with the
    user's ssh options before them and the remote command after the destination."""
    opts, command = split_ssh_args(words)
    cut = len(base) - (2 if base[-2:-1] == ["--"] else 1)
    argv = [*base[:cut], *opts, *base[cut:]]
    if command:
        argv.append(" ".join(shlex.quote(c) for c in command))
    return argv
