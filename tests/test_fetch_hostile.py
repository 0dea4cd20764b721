"""The copies that bring a node's files here (rank 0's outputs at the end, the checkpoint
copies every few seconds) go through THE extractor: a crafted archive is refused naming the
node, and nothing of it is written, through the fake transport a hostile `tar` answers on."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from fake_nodes import FakeConnector

from provision.job.checkpoints import CheckpointKeeper
from provision.job.collect import fetch_outputs
from provision.model.errors import BootstrapError, MgpuError
from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import NodeGroup


def _inv() -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2) for r in range(2)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def _climbing(outside: Path) -> bytes:
    """A link to a folder outside, then a file through it (what `extractall` without a
    filter writes outside; the shape the `data` filter's nested-link hole builds on)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        link = tarfile.TarInfo("./up")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        data = b"written by the node"
        info = tarfile.TarInfo("./up/planted")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        ok = tarfile.TarInfo("./model.pt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
    return buf.getvalue()


def _model() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("model.pt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
    return buf.getvalue()


def test_a_crafted_outputs_archive_is_refused_naming_the_node(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    fake = FakeConnector()
    fake.send(r"tar -czf - .*outputs", _climbing(outside), node="node-0")
    inv = _inv()
    with pytest.raises(MgpuError, match=r"outputs of node-0 failed: the archive from node-0 "
                                        r"was refused \('\./up' -> .* symbolic link"):
        fetch_outputs(inv, tmp_path / "out", log=lambda m: None,
                      group=NodeGroup(inv, connector=fake))
    assert list(outside.iterdir()) == []
    assert list((tmp_path / "out").iterdir()) == []  # not even model.pt: all or nothing
    fake.assert_ran("node-0", r"tar -czf - --dereference --hard-dereference ")


def test_a_crafted_checkpoint_copy_is_refused_the_same_way(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    fake = FakeConnector()
    fake.on("ckpt-manifest", stdout='{"files": {"model.pt": [2, 1.0]}, "now": 100.0}\n')
    fake.send(r"tar -czf - .*checkpoints", _climbing(outside), node="node-1")
    fake.send(r"tar -czf - .*checkpoints", _model(), node="node-0")
    keeper = CheckpointKeeper(_inv(), tmp_path / "ckpt", log=lambda m: None, connector=fake)
    with pytest.raises(BootstrapError, match=r"checkpoints from node-1 failed: the archive "
                                             r"from node-1 was refused"):
        keeper.sync()
    assert list(outside.iterdir()) == []
    assert (tmp_path / "ckpt" / "model.pt").read_bytes() == b"ok"  # node-0's own copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "outside"]
    assert "model.pt" not in keeper.synced.get("node-1", {})  # asked again next pass


def test_the_last_copy_goes_on_when_a_node_goes_between_its_manifest_and_its_copy(
        tmp_path: Path) -> None:
    """Seen under Kueue (test_k8s_kueue): the evicted pod answered its manifest, then its
    port-forward said 404; the last copy's exception ended the run with a traceback. Now the
    other nodes are still copied, the failure is said, and stop() returns."""
    fake = FakeConnector()
    fake.on("ckpt-manifest", stdout='{"files": {"model.pt": [2, 1.0]}, "now": 100.0}\n')
    fake.on(r"tar -czf - .*checkpoints", node="node-0",
            raises=RuntimeError("Handshake status 404 Not Found"))
    fake.send(r"tar -czf - .*checkpoints", _model(), node="node-1")
    said: list[str] = []
    keeper = CheckpointKeeper(_inv(), tmp_path / "ckpt", log=said.append, connector=fake)
    keeper.stop()
    assert (tmp_path / "ckpt" / "model.pt").read_bytes() == b"ok"  # node-1's, after node-0's
    assert any("last checkpoint copy failed (Handshake status 404" in m for m in said), said
    assert "model.pt" not in keeper.synced.get("node-0", {})
    with pytest.raises(RuntimeError, match="404"):  # a pass says it (the loop logs it)
        keeper.sync()
