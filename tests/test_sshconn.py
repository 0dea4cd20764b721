from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.nodes.sshconfig import ssh_command
from provision.nodes.sshconn import ssh_argv, write_cluster_known_hosts


def _inv(tmp_path: Path) -> Inventory:
    nodes = [
        NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=40022,
                   private_address="node-0", host_key="ssh-ed25519 AAAAkey0"),
        NodeRecord(name="node-1", rank=1, address="10.0.0.5", port=22,
                   private_address="10.0.0.5", host_key="ssh-ed25519 AAAAkey1",
                   proxy_jump="ubuntu@203.0.113.9"),
    ]
    return Inventory(name="demo", provider="docker", nodes=nodes,
                     key_path=str(tmp_path / "id_ed25519"))


def test_known_hosts_pins_every_node_and_jump_host(tmp_path: Path) -> None:
    store = InventoryStore()
    inv = _inv(tmp_path)
    inv.resources.append(ResourceRecord(kind="pinned-host-key", id="login", name="login.example",
                                        extra={"port": "2200", "key": "ssh-ed25519 AAAAjump"}))
    store.create(inv)
    path = write_cluster_known_hosts(inv, store)
    assert path.read_text().splitlines() == [
        "[127.0.0.1]:40022 ssh-ed25519 AAAAkey0",
        "10.0.0.5 ssh-ed25519 AAAAkey1",
        "[login.example]:2200 ssh-ed25519 AAAAjump",
    ]
    assert (path.stat().st_mode & 0o777) == 0o600
    assert store.load("demo").known_hosts_path == str(path)


def test_ssh_argv_pins_host_keys(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    inv.known_hosts_path = "/k/known_hosts"
    argv = ssh_argv(inv, 1, ["nvidia-smi", "-L; rm -rf /"])
    assert argv[:5] == ["ssh", "-p", "22", "-o", f"IdentityFile={tmp_path / 'id_ed25519'}"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/k/known_hosts" in argv
    assert "-J" not in argv  # -J would check the jump host against the user's known_hosts
    assert argv[-3:] == ["--", "root@10.0.0.5", "nvidia-smi '-L; rm -rf /'"]


def test_the_jump_host_is_pinned_like_the_node(tmp_path: Path) -> None:
    """`mgpu-cloud ssh` through a jump host: a ProxyCommand that runs ssh with the same
    pinning (the cluster's known_hosts holds the jump host's key), checked by OpenSSH itself
    (`ssh -G`: how it reads the options, %-tokens and quotes included)."""
    odd = tmp_path / "a dir%d"  # a space (a list in UserKnownHostsFile) and an ssh %-token
    odd.mkdir()
    inv = _inv(odd)
    inv.known_hosts_path = str(odd / "known_hosts")
    argv = ssh_argv(inv, 1, [])
    proxy = argv[argv.index("-o", argv.index("GlobalKnownHostsFile=/dev/null")) + 1]
    assert proxy.startswith("ProxyCommand=")
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client to read the options")
    main = _resolved([*argv[:-2], "-G", *argv[-2:]])
    assert main["userknownhostsfile"] == str(odd / "known_hosts")  # one file, not two
    # -G shows IdentityFile before ssh's token expansion (%% -> %), which loading it does
    assert main["identityfile"] == str(odd / "id_ed25519").replace("%", "%%")
    assert main["stricthostkeychecking"] == "true" and main["hostname"] == "10.0.0.5"
    assert main["proxycommand"] == proxy.removeprefix("ProxyCommand=")
    # what runs: ssh replaces its %-tokens, the shell splits the words
    run = shlex.split(re.sub(r"%(.)", lambda m: {"%": "%", "h": "10.0.0.5", "p": "22"}[m[1]],
                             main["proxycommand"]))
    assert run[run.index("-W"):] == ["-W", "[10.0.0.5]:22", "--", "ubuntu@203.0.113.9"]
    at = run.index("-W")
    jump = _resolved([*run[:at], "-G", *run[at + 2:]])
    assert (jump["hostname"], jump["port"], jump["user"]) == ("203.0.113.9", "22", "ubuntu")
    assert jump["userknownhostsfile"] == str(odd / "known_hosts")
    assert jump["identityfile"] == str(odd / "id_ed25519").replace("%", "%%")
    assert jump["stricthostkeychecking"] == "true" and jump["globalknownhostsfile"] == "/dev/null"
    assert jump["identitiesonly"] == "yes"


def _resolved(argv: list[str]) -> dict[str, str]:
    """What OpenSSH makes of this command line (`ssh -G` among its words); of an option it
    lists several times (identityfile), the first."""
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    got: dict[str, str] = {}
    for key, _, value in (line.partition(" ") for line in out.splitlines()):
        got.setdefault(key, value)
    return got


def test_user_options_go_before_the_destination_and_its_dashes(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    inv.known_hosts_path = "/k/known_hosts"
    argv = ssh_command(ssh_argv(inv, 0, []), ["-L", "1:x:1", "--", "-weird"])
    assert argv[-5:] == ["-L", "1:x:1", "--", "root@127.0.0.1", "-weird"]


def test_ssh_argv_unknown_rank(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no node 5"):
        ssh_argv(_inv(tmp_path), 5, [])
