"""A node's first SSH connection against a real sshd (the node image's, in a container this test
makes): a fresh cloud VM may answer with another host key first (its image's, until its guest
agent has made its own and sshd reloaded them) and may refuse the login (the user does not exist
yet). The transport waits through both, connects only once the PINNED key answers (nothing is
authenticated, no command runs before), and after its deadline refuses, naming what the node
presented. Runs under the Docker lock (it starts one container)."""

from __future__ import annotations

import re
import secrets
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import engine
import pytest

from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import KeyPair, generate_ed25519, host_key_only, write_private_key
from provision.nodes import FirstConnectionError, SshConnection, retry_open
from provision.nodes.sshconn import write_cluster_known_hosts

LABEL = "mgpu-cloud-test"


@dataclass
class Sshd:
    container: str
    port: int
    user_key: KeyPair

    def sh(self, command: str) -> str:
        out = subprocess.run(["docker", "exec", self.container, "sh", "-c", command],
                             capture_output=True, text=True, check=True)
        return out.stdout

    def serve_host_key(self, key: KeyPair) -> None:
        """Install `key` as the host key and make sshd load it (SIGHUP: sshd, PID 1,
        re-executes itself and reads its keys again), as a guest agent does at first boot."""
        private = key.private_openssh.strip()
        self.sh(f"umask 077 && printf '%s\\n' '{private}' > /etc/ssh/ssh_host_ed25519_key.new"
                " && mv /etc/ssh/ssh_host_ed25519_key.new /etc/ssh/ssh_host_ed25519_key"
                " && kill -HUP 1")

    def authorize(self, present: bool) -> None:
        if present:
            line = self.user_key.public_openssh.strip()
            self.sh(f"umask 077 && printf '%s\\n' '{line}' > /root/.ssh/authorized_keys")
        else:
            self.sh("rm -f /root/.ssh/authorized_keys")

    def log(self) -> str:
        out = subprocess.run(["docker", "logs", self.container], capture_output=True,
                             text=True, check=True)
        return out.stdout + out.stderr


@pytest.fixture(scope="module")
def sshd(node_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    name = f"mgpu-firstconn-{secrets.token_hex(3)}"
    user_key = generate_ed25519("controller")
    image_key = generate_ed25519("image")
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--label", f"{LABEL}=firstconn", "--label", engine.LABEL,
         "-p", "127.0.0.1::22", "-e", f"MGPU_HOST_KEY={image_key.private_openssh}",
         "-e", f"MGPU_AUTHORIZED_KEY={user_key.public_openssh}", node_image],
        check=True, capture_output=True, text=True)
    try:
        port = subprocess.run(["docker", "port", name, "22/tcp"], capture_output=True,
                              text=True, check=True).stdout.strip().rsplit(":", 1)[-1]
        yield Sshd(name, int(port), user_key)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _inventory(tmp_path: Path, sshd: Sshd, pinned: KeyPair) -> tuple[Inventory, NodeRecord]:
    store = InventoryStore()
    key_file = tmp_path / "id_ed25519"
    write_private_key(key_file, sshd.user_key)
    node = NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=sshd.port,
                      private_address="node-0", user="root",
                      host_key=host_key_only(pinned.public_openssh))
    inv = Inventory(name=f"fc-{secrets.token_hex(2)}", provider="gcp", nodes=[node],
                    key_path=str(key_file))
    store.create(inv)
    write_cluster_known_hosts(inv, store)
    return inv, node


def _refusals(log: str) -> int:
    """Connections sshd saw end before authentication (the client hung up on its key)."""
    return len(re.findall(r"\[preauth\]", log))


def test_a_node_serving_another_key_first_is_connected_to_only_once_the_pinned_key_answers(
        tmp_path: Path, sshd: Sshd) -> None:
    image_key, own_key = generate_ed25519("image-2"), generate_ed25519("vm-own")
    sshd.serve_host_key(image_key)
    sshd.authorize(True)
    inv, node = _inventory(tmp_path, sshd, pinned=own_key)
    before = sshd.log()
    conn = SshConnection(inv, node)
    outcome: dict[str, object] = {}

    def first_connection() -> None:
        try:
            retry_open(conn, deadline_s=120)
            outcome["ran"] = conn.run("echo ran; cat /etc/ssh/ssh_host_ed25519_key.pub || true")
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=first_connection)
    worker.start()
    # Wait (bounded) until the client has been shown the wrong key at least twice ...
    deadline = threading.Event()
    for _ in range(600):
        if _refusals(sshd.log()[len(before):]) >= 2 or not worker.is_alive():
            break
        deadline.wait(0.1)
    assert worker.is_alive(), f"gave up or connected to the wrong key: {outcome}"
    seen_before_swap = sshd.log()[len(before):]
    assert _refusals(seen_before_swap) >= 2
    # ... and it never authenticated, let alone ran a command, while the key was wrong
    assert "Accepted publickey" not in seen_before_swap
    assert "authenticating user" not in seen_before_swap  # not even tried
    sshd.serve_host_key(own_key)  # the guest agent's own key now
    worker.join(timeout=120)
    assert not worker.is_alive() and "error" not in outcome, outcome
    assert outcome["ran"].stdout.startswith("ran")  # type: ignore[attr-defined]
    assert "Accepted publickey for root" in sshd.log()[len(before):]
    conn.close()


def test_after_the_deadline_it_refuses_naming_what_the_node_presented(
        tmp_path: Path, sshd: Sshd) -> None:
    shown, pinned = generate_ed25519("shown"), generate_ed25519("pinned")
    sshd.serve_host_key(shown)
    sshd.authorize(True)
    inv, node = _inventory(tmp_path, sshd, pinned=pinned)
    conn = SshConnection(inv, node)
    with pytest.raises(FirstConnectionError) as info:
        retry_open(conn, deadline_s=3)
    import io

    import paramiko

    shown_fp = paramiko.Ed25519Key.from_private_key(io.StringIO(shown.private_openssh)).fingerprint
    pinned_fp = paramiko.Ed25519Key.from_private_key(
        io.StringIO(pinned.private_openssh)).fingerprint
    message = str(info.value)
    assert f"presented host key ssh-ed25519 {shown_fp}, not the pinned ssh-ed25519 " \
           f"{pinned_fp}" in message
    assert "for 3 s" in message and "never trusted on first use" in message


def test_a_login_refused_until_the_user_exists_is_waited_for(tmp_path: Path,
                                                              sshd: Sshd) -> None:
    key = generate_ed25519("vm")
    sshd.serve_host_key(key)
    sshd.authorize(False)  # the guest agent has not made the login user yet
    inv, node = _inventory(tmp_path, sshd, pinned=key)
    conn = SshConnection(inv, node)
    with pytest.raises(FirstConnectionError, match="the login was refused for 2 s"):
        retry_open(conn, deadline_s=2)
    outcome: dict[str, object] = {}

    def first_connection() -> None:
        try:
            retry_open(conn, deadline_s=120)
            outcome["ok"] = conn.run("true").ok
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    before = sshd.log()
    worker = threading.Thread(target=first_connection)
    worker.start()
    for _ in range(600):  # refused at least once more, then the agent makes the user
        if _refusals(sshd.log()[len(before):]) >= 1 or not worker.is_alive():
            break
        threading.Event().wait(0.1)
    assert worker.is_alive()
    sshd.authorize(True)
    worker.join(timeout=120)
    assert outcome == {"ok": True}
    conn.close()


# --- the two bounds, on a scripted connection and an injected clock (no sshd, no sleeping) ----
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _ScriptedNode:
    """open() fails as scripted by the clock: connection refused (sshd not started) until
    `sshd_up_at`, then the login refused until `user_at` (the guest agent's user), then OK."""

    def __init__(self, clock: _Clock, sshd_up_at: float, user_at: float) -> None:
        self.clock, self.sshd_up_at, self.user_at = clock, sshd_up_at, user_at
        self.opened = False

    def open(self) -> None:
        import paramiko

        self.clock.now += 0.05  # one attempt's own time
        if self.clock.now < self.sshd_up_at:
            raise ConnectionRefusedError(111, "Connection refused")
        if self.clock.now < self.user_at:
            raise paramiko.AuthenticationException("Authentication failed.")
        self.opened = True


def test_the_key_settle_time_counts_from_sshds_first_answer(monkeypatch) -> None:
    """sshd answers only after 40 s (a slow boot), the user appears 30 s after that: with a
    45 s settle time counted from the first attempt the login would be given up at 45 s;
    counted from sshd's first answer it is waited for (and the overall deadline still holds)."""
    from provision.nodes import transport

    monkeypatch.setattr(transport, "KEY_SETTLE_S", 45.0)
    clock = _Clock()
    node = _ScriptedNode(clock, sshd_up_at=40.0, user_at=70.0)
    retry_open(node, deadline_s=180, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert node.opened and 70.0 <= clock.now < 72.0


def test_a_login_never_accepted_is_given_up_settle_seconds_after_sshd_answered(
        monkeypatch) -> None:
    from provision.nodes import transport

    monkeypatch.setattr(transport, "KEY_SETTLE_S", 45.0)
    clock = _Clock()
    node = _ScriptedNode(clock, sshd_up_at=40.0, user_at=10_000.0)
    with pytest.raises(FirstConnectionError, match="the login was refused"):
        retry_open(node, deadline_s=180, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert 85.0 <= clock.now < 87.0 and not node.opened


def test_the_overall_deadline_bounds_a_settle_time_that_would_run_past_it(monkeypatch) -> None:
    from provision.nodes import transport

    monkeypatch.setattr(transport, "KEY_SETTLE_S", 45.0)
    clock = _Clock()
    node = _ScriptedNode(clock, sshd_up_at=170.0, user_at=10_000.0)
    with pytest.raises(FirstConnectionError, match="the login was refused for 180 s"):
        retry_open(node, deadline_s=180, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert 180.0 <= clock.now < 181.0
