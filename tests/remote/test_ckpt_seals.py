"""Verified resume (issue 36): a checkpoint cut short is never kept, and a restore takes only
whole, sealed steps and says what it skipped."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from storekit import StoreServer

from remote.ckpt import SEALS, report, step_of, whole
from remote.store import open_store
from remote.storesync import pull, push


def _torch_file(path: Path, step: int) -> bytes:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "w": torch.arange(2000, dtype=torch.float32)}, str(path))
    return path.read_bytes()


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what a kill in the middle of a save leaves


def test_steps_and_whole_files(tmp_path: Path) -> None:
    assert step_of("step_000300.pt") == 300
    assert step_of("global_step300/mp_rank_00_model_states.pt") == 300
    assert step_of("latest") is None and step_of("ckpt-12.safetensors") == 12
    pt = tmp_path / "step_000005.pt"
    _torch_file(pt, 5)
    assert whole(str(pt))
    _cut(pt)
    assert not whole(str(pt))
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    st = tmp_path / "ckpt-1.safetensors"
    st.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    assert whole(str(st))
    st.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 7)
    assert not whole(str(st))
    (tmp_path / "notes.txt").write_text("anything")
    assert whole(str(tmp_path / "notes.txt"))
    assert report(str(tmp_path))["incomplete"] == ["ckpt-1.safetensors", "step_000005.pt"]


def test_a_zip_whose_end_record_zipfile_refuses_is_not_whole_and_the_rest_is_listed(
        tmp_path: Path) -> None:
    """A zip64 locator naming a second disk makes zipfile raise BadZipFile, not answer False:
    a job's file with those bytes failed the whole `ckpt-manifest`, so the node's other,
    whole checkpoints were not kept either while it was there."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data.pkl", b"x" * 64)
    good = buf.getvalue()
    end = good.rfind(b"PK\x05\x06")
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 1, 0, 2)  # disk 1 of 2
    (tmp_path / "step_000002.pt").write_bytes(good[:end] + locator + good[end:])
    (tmp_path / "step_000001.pt").write_bytes(good)
    got = report(str(tmp_path))
    assert sorted(got["files"]) == ["step_000001.pt", "step_000002.pt"]
    assert got["incomplete"] == ["step_000002.pt"]


def _sealed_restore(url: str, tmp_path: Path) -> None:
    node = tmp_path / "node-0"
    for step in (5, 10):
        _torch_file(node / f"step_{step:06d}.pt", step)
    (node / "latest").write_text("10")
    store = open_store(url)
    got = push(store, str(node), ["step_000005.pt", "step_000010.pt", "latest"], seal="node-0")
    assert got["files"] == 3 and got["incomplete"] == []
    assert len([k for k in store.list() if k.startswith(SEALS)]) == 1
    # a cut-short file on the node is not copied, and is named
    _torch_file(node / "step_000015.pt", 15)
    _cut(node / "step_000015.pt")
    got = push(store, str(node), ["step_000015.pt"], seal="node-0")
    assert got["files"] == 0 and got["incomplete"] == ["step_000015.pt"]
    # a copy a crash interrupted: step 20's file reached the store, its seal never did
    store.upload_file(str(node / "step_000010.pt"), "step_000020.pt")
    # a sealed file whose bytes changed afterwards (a second writer, a bad disk)
    _torch_file(node / "step_000012.pt", 12)
    push(store, str(node), ["step_000012.pt"], seal="node-0")
    store.put_bytes("step_000012.pt", b"not what was sealed")
    dest = tmp_path / "restored"
    got = pull(store, str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["latest", "step_000005.pt",
                                                       "step_000010.pt"]
    assert got["newest_step"] == 10 and got["files"] == 3
    assert any("step 20: not sealed" in s for s in got["skipped"])
    assert any("step 12: its bytes differ" in s for s in got["skipped"])
    assert not (dest / ".mgpu").exists()


def test_file_store_restores_only_whole_sealed_steps(tmp_path: Path) -> None:
    _sealed_restore(f"file://{tmp_path}/store", tmp_path)


def test_s3_store_restores_only_whole_sealed_steps(tmp_path: Path,
                                                   s3_store: StoreServer) -> None:
    _sealed_restore(s3_store.url, tmp_path)


def test_a_folder_without_seals_is_pulled_as_before(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.put_bytes("step_000001.pt", b"x")
    dest = tmp_path / "dest"
    assert pull(store, str(dest))["files"] == 1 and (dest / "step_000001.pt").exists()


@pytest.mark.parametrize("cut", [True, False])
def test_the_keeper_never_copies_a_file_cut_short(cut: bool) -> None:
    from provision.job.checkpoints import parse_manifest
    from provision.model.nodejson import CheckpointManifest, read_value

    data = {"files": {"step_000001.pt": [10, 1.0], "step_000002.pt": [5, 2.0]},
            "incomplete": ["step_000002.pt"] if cut else [], "now": 9.0}
    files, _ = parse_manifest(read_value(CheckpointManifest, data))  # as a node's answer is read
    assert ("step_000002.pt" in files) is not cut
