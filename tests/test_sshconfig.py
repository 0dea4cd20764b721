"""ssh-config: the OpenSSH config written for a cluster, `--install`, and ssh argument
pass-through. The config is also checked by OpenSSH itself (`ssh -G` resolves it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.nodes.sshconfig import BEGIN, config_text, install, split_ssh_args, ssh_command


def _inv(store: InventoryStore, name: str = "demo", jump: str | None = None) -> Inventory:
    keys = store.keys_dir(name)
    (keys / "id_ed25519").write_text("key")
    (keys / "known_hosts").write_text("")
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", proxy_jump=jump) for r in range(2)]
    inv = Inventory(name=name, provider="docker", nodes=nodes, status="ready",
                    key_path=str(keys / "id_ed25519"),
                    known_hosts_path=str(keys / "known_hosts"))
    store.create(inv)
    return inv


def _resolve(config: Path, host: str) -> dict[str, str]:
    """What OpenSSH makes of `host` with this config (`ssh -G`)."""
    out = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_aliases_keys_and_pinned_host_keys(tmp_path: Path) -> None:
    store = InventoryStore()
    inv = _inv(store)
    text = config_text(inv)
    assert "Host demo demo-node-0\n" in text and "Host demo-node-1\n" in text
    assert text.count("StrictHostKeyChecking yes") == 2
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client to resolve the config")
    config = tmp_path / "config"
    config.write_text(text)
    for host, port in (("demo", "4000"), ("demo-node-0", "4000"), ("demo-node-1", "4001")):
        got = _resolve(config, host)
        assert (got["hostname"], got["port"], got["user"]) == ("127.0.0.1", port, "root")
        assert got["stricthostkeychecking"] == "true"
        assert got["userknownhostsfile"] == inv.known_hosts_path
        assert got["identityfile"] == inv.key_path


def test_jump_host_gets_its_own_pinned_alias(tmp_path: Path) -> None:
    store = InventoryStore()
    inv = _inv(store, jump="alice@login.example.org:2222")
    inv.resources.append(ResourceRecord(kind="pinned-host-key", id="[login.example.org]:2222",
                                        name="login.example.org"))
    text = config_text(inv)
    assert text.count("Host demo-jump-0") == 1
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client to resolve the config")
    config = tmp_path / "config"
    config.write_text(text)
    assert _resolve(config, "demo-node-1")["proxyjump"] == "demo-jump-0"
    jump = _resolve(config, "demo-jump-0")
    assert (jump["hostname"], jump["port"], jump["user"]) == ("login.example.org", "2222",
                                                              "alice")
    assert jump["stricthostkeychecking"] == "true"


def test_no_config_without_pinned_host_keys() -> None:
    store = InventoryStore()
    inv = _inv(store)
    inv.known_hosts_path = None
    with pytest.raises(MgpuError, match="no pinned host keys"):
        config_text(inv)


def test_install_includes_once_first_and_down_removes_the_file(tmp_path: Path) -> None:
    store = InventoryStore()
    inv = _inv(store)
    user_config = tmp_path / ".ssh" / "config"
    user_config.parent.mkdir()
    user_config.write_text("Host work\n  HostName work.example.org\n")
    path = install(inv, store, user_config)
    assert path == store.ssh_config_path("demo") and path.exists()
    text = user_config.read_text()
    assert text.startswith(BEGIN) and text.endswith("Host work\n  HostName work.example.org\n")
    install(_inv(store, "other"), store, user_config)
    assert user_config.read_text() == text, "the Include covers every cluster: written once"
    store.delete("demo")
    assert not path.exists() and store.ssh_config_path("other").exists()


@pytest.mark.parametrize("words,opts,command", [
    (["-L", "6006:localhost:6006"], ["-L", "6006:localhost:6006"], []),
    (["-v", "-L6006:x:6006", "nvidia-smi", "-l", "1"], ["-v", "-L6006:x:6006"],
     ["nvidia-smi", "-l", "1"]),
    (["--", "-weird"], [], ["-weird"]),
    (["hostname"], [], ["hostname"]),
])
def test_ssh_options_then_command(words: list[str], opts: list[str], command: list[str]) -> None:
    assert split_ssh_args(words) == (opts, command)


def test_ssh_command_places_options_before_the_destination() -> None:
    base = ["ssh", "-i", "k", "root@127.0.0.1"]
    assert ssh_command(base, ["-L", "1:x:1", "echo", "a b"]) == [
        "ssh", "-i", "k", "-L", "1:x:1", "root@127.0.0.1", "echo 'a b'"]
