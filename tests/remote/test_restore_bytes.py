"""Issue 42: a restore compares every file's bytes with its seal (sha256), not only its size:
one byte changed in a sealed step, the size the same, leaves that step out whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote.store import open_store
from remote.storesync import pull, push


def _step(folder: Path, step: int) -> Path:
    path = folder / f"step_{step:06d}.pt"
    path.write_bytes(os.urandom(4096))  # no format check applies to it: only the seal
    return path


@pytest.mark.parametrize("where", [0, 2048, 4095])
def test_one_byte_changed_at_the_same_size_is_not_restored(tmp_path: Path, where: int) -> None:
    node = tmp_path / "node-0"
    node.mkdir()
    for step in (5, 10):
        _step(node, step)
    store = open_store(f"file://{tmp_path}/store")
    got = push(store, str(node), ["step_000005.pt", "step_000010.pt"], seal="node-0")
    assert got["files"] == 2
    data = bytearray(store.get_bytes("step_000010.pt") or b"")
    data[where] ^= 0x01  # one bit of one byte: the size is the same
    store.put_bytes("step_000010.pt", bytes(data))
    assert len(store.get_bytes("step_000010.pt") or b"") == 4096
    dest = tmp_path / "restored"
    got = pull(store, str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["step_000005.pt"]
    assert got["newest_step"] == 5
    assert any("step 10: its bytes differ from its seal" in s for s in got["skipped"]), got
    assert (dest / "step_000005.pt").read_bytes() == (node / "step_000005.pt").read_bytes()


def test_the_sealed_bytes_are_restored_as_they_were(tmp_path: Path) -> None:
    """The control: nothing changed, everything comes back."""
    node = tmp_path / "node-0"
    node.mkdir()
    sent = {p.name: p.read_bytes() for p in (_step(node, 5), _step(node, 10))}
    store = open_store(f"file://{tmp_path}/store")
    push(store, str(node), list(sent), seal="node-0")
    dest = tmp_path / "restored"
    got = pull(store, str(dest))
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == sent
    assert got["skipped"] == [] and got["newest_step"] == 10
