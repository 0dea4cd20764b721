"""The ssh provider against real sshd in containers that stand in for the user's machines.

The containers (fixture `lab`) are made by the test, never by the provider; every test drives
the CLI as a separate process and checks the machines afterwards: our folder gone, the user's
files and the machines themselves untouched.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from provision.model.keys import generate_ed25519, host_key_only, write_private_key

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("ssh_lab")]  # one lab


def write_inventory(path: Path, key: Path, hosts: list[dict[str, Any]]) -> Path:
    lines = ["user: root", f"identity_file: {key}", "hosts:"]
    for h in hosts:
        lines.append("  - " + json.dumps(h))  # JSON is YAML
    path.write_text("\n".join(lines) + "\n")
    return path


def direct(lab: Any, name: str, slots: int = 2) -> dict[str, Any]:
    h = lab.hosts[name]
    return {"name": name, "address": "127.0.0.1", "port": h.published, "slots": slots,
            "private_address": name}


def behind(lab: Any, name: str, jump: str, slots: int = 2) -> dict[str, Any]:
    return {"name": name, "address": name, "slots": slots,
            "proxy_jump": f"root@127.0.0.1:{lab.hosts[jump].published}"}


def assert_untouched(lab: Any, name: str) -> None:
    """Our folder is gone; the user's file, ~/.ssh and the machine itself are as they were."""
    assert lab.running(name), f"{name} was stopped"
    res = lab.sh(name, "test ! -e ~/.mgpu-cloud && cat ~/keep.txt && ls -A ~/.ssh "
                       "&& test ! -e ~/.deepspeed_env")
    assert res.returncode == 0, f"{name}: {res.stdout}{res.stderr}"
    assert res.stdout == "the user's own file\nauthorized_keys\n"


def test_run_trains_across_two_hosts(lab: Any, ssh_user: Any, cli: Any, tmp_path: Path) -> None:
    """host-a on port 22 and host-b on port 2222, 2 slots each: all 4 ranks train."""
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_user.key,
                          [direct(lab, "host-a"), direct(lab, "host-b")])
    res = cli("run", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-run",
              EXAMPLE, "--steps", "10", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in range(4):
        host = "host-a" if rank < 2 else "host-b"
        assert re.search(rf"\[{host}\] rank {rank}/4 on {host}:", out), out
    assert "[host-a] done: world_size=4" in out
    ckpt = tmp_path / "mgpu-outputs" / "ssh-run" / "checkpoint.pt"
    metrics = json.loads((ckpt.parent / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["steps"] == 10 and ckpt.is_file()
    assert "cluster 'ssh-run' removed" in out
    for name in ("host-a", "host-b"):
        assert_untouched(lab, name)
    assert cli("status", "--json").stdout.strip() == "[]"


def test_up_exec_down_through_a_jump_host(lab: Any, ssh_user: Any, cli: Any,
                                          tmp_path: Path) -> None:
    """host-c is reachable only through host-a; its key is unknown and accepted by flag."""
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_user.key,
                          [direct(lab, "host-a"), behind(lab, "host-c", "host-a")])
    known_before = ssh_user.known_hosts.read_text()
    res = cli("up", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-jump",
              "--accept-new-host-keys")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "host-c: new host key SHA256:" in res.stderr
    try:
        res = cli("exec", "ssh-jump", "--", "hostname && ls ~/.mgpu-cloud/ssh/ssh-jump")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "--- host-a (exit 0) ---\nhost-a\n" in res.stdout
        assert "--- host-c (exit 0) ---\nhost-c\n" in res.stdout
        assert "hostfile" in res.stdout and "remote.pyz" in res.stdout
        rows = json.loads(cli("status", "--json", "ssh-jump").stdout)
        assert [(n["name"], n["address"]) for n in rows[0]["nodes"]] == [
            ("host-a", "127.0.0.1"), ("host-c", "host-c")]
        # The master port check (`nc -zv master 29500`) ran from every host to host-a.
        assert "unreachable" not in res.stderr
    finally:
        down = cli("down", "ssh-jump")
    assert down.returncode == 0, down.stderr
    for name in ("host-a", "host-c"):
        assert_untouched(lab, name)
    assert ssh_user.known_hosts.read_text() == known_before  # pinned in the inventory only
    assert cli("down", "ssh-jump").returncode == 0  # idempotent


def test_hostfile_with_login_settings_from_ssh_config(lab: Any, ssh_user: Any, cli: Any,
                                                      tmp_path: Path) -> None:
    a, b = lab.hosts["host-a"], lab.hosts["host-b"]
    ssh_user.ssh_config.write_text(
        f"Host host-a\n  HostName 127.0.0.1\n  Port {a.published}\n"
        f"Host host-b\n  HostName 127.0.0.1\n  Port {b.published}\n"
        f"Host *\n  IdentityFile {ssh_user.key}\n"
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("host-a slots=1\nhost-b slots=1\n")
    res = cli("up", "--provider", "ssh", "--hostfile", str(hostfile), "--user", "root",
              "--name", "ssh-hf")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        res = cli("exec", "ssh-hf", "--", "cat ~/.mgpu-cloud/ssh/ssh-hf/hostfile")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "host-a slots=1\nhost-b slots=1" in res.stdout
    finally:
        assert cli("down", "ssh-hf").returncode == 0
    for name in ("host-a", "host-b"):
        assert_untouched(lab, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("case", ["unreachable", "wrong-key", "changed-key", "unknown-key"])
def test_bad_host_is_named_before_anything_is_launched(lab: Any, ssh_user: Any, cli: Any,
                                                       tmp_path: Path, case: str) -> None:
    bad = direct(lab, "host-b")
    key = ssh_user.key
    expect = ""
    if case == "unreachable":
        bad = {"name": "host-dead", "address": "127.0.0.1", "port": _free_port(), "slots": 2,
               "private_address": "host-dead"}
        expect = "host-dead (root@127.0.0.1:{port}): unreachable: connection refused".format(
            port=bad["port"])
    elif case == "wrong-key":
        other = tmp_path / "other_key"
        write_private_key(other, generate_ed25519())
        bad["identity_file"] = str(other)
        expect = f"host-b (root@127.0.0.1:{bad['port']}): key authentication failed"
    elif case == "changed-key":
        ssh_user.known_hosts.write_text(
            lab.known_hosts_line("host-a") + "\n"
            + lab.known_hosts_line("host-b", host_key_only(generate_ed25519().public_openssh))
            + "\n")
        expect = f"host-b (root@127.0.0.1:{bad['port']}): host key CHANGED"
    else:
        ssh_user.known_hosts.write_text(lab.known_hosts_line("host-a") + "\n")
        expect = f"host-b (root@127.0.0.1:{bad['port']}): unknown host key"
    inv = write_inventory(tmp_path / "hosts.yaml", key, [direct(lab, "host-a"), bad])
    res = cli("run", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-bad",
              EXAMPLE, "--steps", "10", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode not in (0, 1), out  # a classified error, not a crash
    assert expect in res.stderr, out
    if case == "unknown-key":
        assert "--accept-new-host-keys" in res.stderr
    assert "rank 0/" not in out and not (tmp_path / "mgpu-outputs").exists()
    assert cli("status", "--json").stdout.strip() == "[]"
    assert_untouched(lab, "host-a")  # rolled back (or never touched)


def test_every_problem_is_reported_at_once(lab: Any, ssh_user: Any, cli: Any,
                                          tmp_path: Path) -> None:
    ssh_user.known_hosts.write_text(
        lab.known_hosts_line("host-a", host_key_only(generate_ed25519().public_openssh)) + "\n")
    dead = {"name": "host-dead", "address": "127.0.0.1", "port": _free_port(),
            "private_address": "host-dead"}
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_user.key,
                          [direct(lab, "host-a"), direct(lab, "host-b"), dead])
    res = cli("up", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-all")
    assert res.returncode == 4, res.stderr  # unreachable: ProviderUnavailableError
    assert "3 of 3 host(s) cannot be used" in res.stderr
    for text in ("host-a (", "host key CHANGED", "host-b (", "unknown host key",
                 "host-dead (", "connection refused", "ssh-keygen -R"):
        assert text in res.stderr, res.stderr


def test_login_node_that_is_not_a_node(lab: Any, ssh_user: Any, cli: Any,
                                       tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_user.key,
                          [direct(lab, "host-a"), behind(lab, "host-c", "host-j")])
    res = cli("up", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-login",
              "--accept-new-host-keys")
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        res = cli("exec", "ssh-login", "--", "hostname")
        assert "--- host-c (exit 0) ---\nhost-c" in res.stdout
    finally:
        cli("down", "ssh-login")
        for name in ("host-a", "host-c", "host-j"):
            assert_untouched(lab, name)


def test_a_host_showing_an_unpinned_key_is_refused_before_any_command(
        lab: Any, ssh_user: Any, cli: Any, tmp_path: Path) -> None:
    """After `up`, host-b's address shows a host key that is not the one pinned for it (an
    impostor's), or any key where none is pinned any more: the transport refuses it and runs
    nothing there; host-a is unaffected."""
    from impostor import show_own_key, show_unpinned_key

    from provision.model.inventory import InventoryStore

    b = lab.hosts["host-b"]
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_user.key,
                          [direct(lab, "host-a"), direct(lab, "host-b")])
    res = cli("up", "--provider", "ssh", "--inventory", str(inv), "--name", "ssh-pin")
    assert res.returncode == 0, res.stdout + res.stderr
    known_hosts = Path(InventoryStore().load("ssh-pin").known_hosts_path or "")
    pinned = known_hosts.read_text()

    def refused(why: str) -> None:
        lab.sh("host-a", "rm -f /tmp/pin-ran")
        res = cli("exec", "ssh-pin", "--", "touch /tmp/pin-ran")
        assert res.returncode != 0, res.stdout
        assert "--- host-b (exit 255) ---" in res.stdout, res.stdout
        assert why in res.stderr, res.stdout + res.stderr
        assert lab.sh("host-b", "test -e /tmp/pin-ran").returncode != 0, "ran on host-b"
        assert lab.sh("host-a", "test -e /tmp/pin-ran").returncode == 0

    try:
        show_unpinned_key(b.container, b.published)
        try:
            refused("does not match")
        finally:
            show_own_key(b.container, b.published)
        known_hosts.write_text("".join(line for line in pinned.splitlines(keepends=True)
                                       if f"]:{b.published} " not in line))
        try:
            refused("presented an unknown ssh-ed25519 host key")
        finally:
            known_hosts.write_text(pinned)
    finally:
        down = cli("down", "ssh-pin")
    assert down.returncode == 0, down.stdout + down.stderr
    for name in ("host-a", "host-b"):
        lab.sh(name, "rm -f /tmp/pin-ran")
        assert_untouched(lab, name)
