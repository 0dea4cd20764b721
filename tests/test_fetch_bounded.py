"""What a node sends back is bounded while it arrives, over the real SSH transport to a real
sshd (a node container): an endless archive stops at unpack.MAX_DOWNLOAD bytes with the node
named (before, only the unpacking counted bytes: the whole stream was first written to this
machine's disk), and a node's stderr keeps its last 64 KiB, not all of it. The node's `tar`
is the job's to replace (it runs as root), which is what these tests do."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import engine
import pytest

from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import generate_ed25519, host_key_only, write_private_key
from provision.nodes import NodeStepError, SshConnection, fetch_tree, retry_open
from provision.nodes import unpack as unpack_module
from provision.nodes.sshconn import write_cluster_known_hosts

CAP = 1 << 20
HOSTILE_TAR = "/usr/local/bin/tar"  # before /usr/bin on root's PATH


@pytest.fixture(scope="module")
def node(node_image: str) -> Iterator[tuple[str, int, object, object]]:
    name = f"mgpu-bounded-{secrets.token_hex(3)}"
    user_key, host_key = generate_ed25519("controller"), generate_ed25519("node")
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--label", engine.LABEL, "-p", "127.0.0.1::22",
         "-e", f"MGPU_HOST_KEY={host_key.private_openssh}",
         "-e", f"MGPU_AUTHORIZED_KEY={user_key.public_openssh}", node_image],
        check=True, capture_output=True, text=True)
    try:
        port = subprocess.run(["docker", "port", name, "22/tcp"], capture_output=True,
                              text=True, check=True).stdout.strip().rsplit(":", 1)[-1]
        yield name, int(port), user_key, host_key
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


@pytest.fixture
def conn(node: tuple[str, int, object, object], tmp_path: Path) -> Iterator[SshConnection]:
    _, port, user_key, host_key = node
    key_file = tmp_path / "id_ed25519"
    write_private_key(key_file, user_key)  # type: ignore[arg-type]
    record = NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=port,
                        private_address="node-0", user="root",
                        host_key=host_key_only(host_key.public_openssh))  # type: ignore[attr-defined]
    inv = Inventory(name=f"fb-{secrets.token_hex(2)}", provider="gcp", nodes=[record],
                    key_path=str(key_file))
    store = InventoryStore()
    store.create(inv)
    write_cluster_known_hosts(inv, store)
    connection = SshConnection(inv, record)
    retry_open(connection, deadline_s=120)
    yield connection
    connection.close()


def _hostile_tar(name: str, body: str) -> None:
    subprocess.run(["docker", "exec", name, "sh", "-c",
                    f"printf '#!/bin/sh\\n{body}\\n' > {HOSTILE_TAR} && chmod +x {HOSTILE_TAR}"],
                   check=True, capture_output=True)


def test_an_endless_archive_stops_at_the_cap_naming_the_node(
        node: tuple[str, int, object, object], conn: SshConnection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpack_module, "MAX_DOWNLOAD", CAP)
    _hostile_tar(node[0], "exec head -c 200000000 /dev/zero")  # 200 MB: 190x the cap
    dest = tmp_path / "outputs"
    with pytest.raises(NodeStepError, match=rf"the archive from node-7 was refused: it sent "
                                            rf"more than {CAP} bytes for one archive"):
        fetch_tree(conn, ".mgpu-cloud/outputs", dest, node="node-7")
    assert not dest.exists() or list(dest.iterdir()) == []
    assert conn.run("echo still usable").stdout == "still usable\n"  # the channel, not the link


def test_a_nodes_stderr_keeps_its_tail_only(node: tuple[str, int, object, object],
                                            conn: SshConnection, tmp_path: Path) -> None:
    _hostile_tar(node[0], "yes x | head -c 5000000 >&2; echo the-end >&2; exit 3")
    res = conn.run_to_file("tar -czf - .", tmp_path / "a.tgz")
    assert res.exit_code == 3
    assert res.stderr.endswith("the-end\n"), res.stderr[-200:]
    assert len(res.stderr) == 64 << 10 and set(res.stderr[:-8]) == {"x", "\n"}, len(res.stderr)
