"""Fixtures for the ssh provider: "pre-existing hosts" are containers the TEST makes.

    lab       (module) a docker network and four node-image containers, all made here, never
              by the provider: host-a (sshd on 22, published on 127.0.0.1), host-b (sshd on
              2222, published), host-c (not published: reachable only through host-a or
              host-j), host-j (a login node, published). Each has a host key made here,
              the user's key in authorized_keys and a pre-existing ~/keep.txt.
    ssh_user  (function) the user's side: key in tmp, a known_hosts file with the hosts'
              keys (MGPU_CLOUD_SSH_KNOWN_HOSTS) and an empty ssh config (MGPU_CLOUD_SSH_CONFIG),
              so nothing of the real ~/.ssh is read.
"""

from __future__ import annotations

import io
import secrets
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine
import pytest
from kit import cli as run_cli  # one runner for every test file

from provision.model.keys import KeyPair, generate_ed25519, host_key_only, write_private_key

ROOT = Path(__file__).resolve().parents[3]
LABEL = "mgpu-cloud-test"
KEEP_TEXT = "the user's own file\n"


@dataclass
class LabHost:
    name: str
    container: str
    host_key: KeyPair
    published: int | None = None  # 127.0.0.1 port, None when not published
    sshd_port: int = 22


@dataclass
class Lab:
    network: str
    user_key: Path
    hosts: dict[str, LabHost] = field(default_factory=dict)

    def known_hosts_line(self, name: str, key: str | None = None) -> str:
        h = self.hosts[name]
        where = f"[127.0.0.1]:{h.published}" if h.published else h.name
        return f"{where} {host_key_only(key or h.host_key.public_openssh)}"

    def sh(self, name: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", self.hosts[name].container, "sh", "-c", command],
                              capture_output=True, text=True)

    def running(self, name: str) -> bool:
        out = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}",
                              self.hosts[name].container], capture_output=True, text=True)
        return out.stdout.strip() == "true"


def _files(host: KeyPair, authorized: str, sshd_port: int) -> bytes:
    buf = io.BytesIO()
    entries = [
        ("etc/ssh/ssh_host_ed25519_key", host.private_openssh, 0o600),
        ("etc/ssh/ssh_host_ed25519_key.pub", host.public_openssh + "\n", 0o644),
        ("root/.ssh/authorized_keys", authorized + "\n", 0o600),
        ("root/keep.txt", KEEP_TEXT, 0o644),
    ]
    if sshd_port != 22:
        entries.append(("etc/ssh/sshd_config.d/00-port.conf", f"Port {sshd_port}\n", 0o644))
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text, mode in entries:
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _wait_for_sshd(lab: Lab) -> None:
    from provision.nodes.hostkeys import Endpoint, Jump, Unreachable, fetch_server_key

    a = lab.hosts["host-a"]
    jump = Jump(Endpoint("127.0.0.1", a.published or 0), "root", str(lab.user_key),
                host_key_only(a.host_key.public_openssh))
    targets: list[tuple[Endpoint, Jump | None]] = [
        (Endpoint("127.0.0.1", h.published), None) for h in lab.hosts.values() if h.published
    ] + [(Endpoint("host-c", 22), jump)]
    deadline = time.monotonic() + 60
    for endpoint, via in targets:
        while True:
            try:
                fetch_server_key(endpoint, jump=via, timeout=5)
                break
            except Unreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture(scope="module")
def lab(node_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    import docker

    client = docker.from_env(timeout=120)
    tag = secrets.token_hex(3)
    labels = {LABEL: f"ssh-{tag}", engine.LABEL_KEY: engine.RUN}
    user_dir = tmp_path_factory.mktemp("user-ssh")
    user_key = generate_ed25519("user@controller")
    write_private_key(user_dir / "id_ed25519", user_key)
    network = client.networks.create(f"mgpu-ssh-test-{tag}", driver="bridge", labels=labels)
    lab = Lab(network=network.name, user_key=user_dir / "id_ed25519")
    made: list[Any] = []
    try:
        specs = [("host-a", 22, True), ("host-b", 2222, True), ("host-c", 22, False),
                 ("host-j", 22, True)]
        for name, sshd_port, publish in specs:
            key = generate_ed25519(name)
            container = client.containers.create(
                node_image, name=f"mgpu-ssh-test-{tag}-{name}", hostname=name, labels=labels,
                ports={f"{sshd_port}/tcp": ("127.0.0.1", None)} if publish else {},
                network=network.name,
                networking_config={network.name: client.api.create_endpoint_config(
                    aliases=[name])},
                detach=True,
            )
            made.append(container)
            container.put_archive("/", _files(key, user_key.public_openssh, sshd_port))
            lab.hosts[name] = LabHost(name, container.name, key, sshd_port=sshd_port)
        for container in made:
            container.start()
        for container, (name, sshd_port, publish) in zip(made, specs, strict=True):
            if publish:
                container.reload()
                port = container.attrs["NetworkSettings"]["Ports"][f"{sshd_port}/tcp"][0]
                lab.hosts[name].published = int(port["HostPort"])
        _wait_for_sshd(lab)
        yield lab
    finally:
        for container in made:
            container.remove(force=True)
        network.remove()


@dataclass
class UserSide:
    key: Path
    known_hosts: Path
    ssh_config: Path


@pytest.fixture
def ssh_user(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> UserSide:
    """The user's ~/.ssh stand-in: every lab host's key known, except host-c's."""
    known = tmp_path / "known_hosts"
    known.write_text("".join(lab.known_hosts_line(n) + "\n"
                             for n in ("host-a", "host-b", "host-j")))
    config = tmp_path / "ssh_config"
    config.write_text("")
    monkeypatch.setenv("MGPU_CLOUD_SSH_KNOWN_HOSTS", str(known))
    monkeypatch.setenv("MGPU_CLOUD_SSH_CONFIG", str(config))
    return UserSide(lab.user_key, known, config)


@pytest.fixture
def cli() -> Any:
    return run_cli
