from __future__ import annotations

from pathlib import Path

import pytest

from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
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
    assert argv[:5] == ["ssh", "-i", str(tmp_path / "id_ed25519"), "-p", "22"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/k/known_hosts" in argv
    assert argv[argv.index("-J") + 1] == "ubuntu@203.0.113.9"
    assert argv[-2:] == ["root@10.0.0.5", "nvidia-smi '-L; rm -rf /'"]


def test_ssh_argv_unknown_rank(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no node 5"):
        ssh_argv(_inv(tmp_path), 5, [])
