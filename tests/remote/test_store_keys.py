"""The store's one key rule and its conditional writes (issue 34: hostile-node battery).

Nodes write under CLUSTER/data/ whatever their code likes: S3 and GCS accept `../../x` and
`/abs/x` as object names, a file:// store can hold symbolic links. A pull on an honest node
must copy the honest objects, refuse and name the others, and write nothing outside its folder.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from storekit import StoreServer

from remote.store import open_store, parse_url
from remote.storekeys import UnsafeKey, checked_key, checked_name, inside, job_data
from remote.storesync import pull, push

HOSTILE = ["../../escaped", "/abs/escaped", "a/../../escaped", "a//b", "./x", "a\\..\\b",
           "ok\x00bad", "ok\nbad"]


@pytest.mark.parametrize("key", HOSTILE + ["", ".", ".."])
def test_a_key_that_leaves_its_folder_is_refused(key: str) -> None:
    with pytest.raises(UnsafeKey):
        checked_key(key)


def test_plain_keys_and_names_pass_and_bad_names_are_refused() -> None:
    assert checked_key("step9/a.pt") == "step9/a.pt"
    assert job_data("c1", "12") == "c1/data/jobs/12"
    for bad in ("../1", "1/2", "-rf", ".hidden", "", "a" * 64, "x y"):
        with pytest.raises(UnsafeKey):
            checked_name(bad)


def _raw_put(server: StoreServer | None, url: str, key: str, data: bytes) -> None:
    """Write an object under `key` the way a hostile node's own SDK would: no checks."""
    parsed = parse_url(url)
    name = f"{parsed.prefix}/{key}" if parsed.prefix else key
    if parsed.scheme == "s3":
        import boto3

        boto3.client("s3").put_object(Bucket=parsed.bucket, Key=name, Body=data)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage  # type: ignore[attr-defined]

        client = storage.Client(project="mgpu-test", credentials=AnonymousCredentials())
        client.bucket(parsed.bucket).blob(name).upload_from_string(data)


def _hostile_listing(url: str, server: StoreServer, tmp_path: Path) -> None:
    store = open_store(url)
    store.put_bytes("step1/model.pt", b"weights")
    for key in ("../../escaped", "/abs/escaped", "a/../../escaped"):
        _raw_put(server, url, key, b"pwned")
    dest = tmp_path / "node" / "ckpt"
    got = pull(store, str(dest))
    assert (dest / "step1" / "model.pt").read_bytes() == b"weights"
    assert got["files"] == 1 and len(got["refused"]) >= 2
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))
    assert not Path("/abs/escaped").exists()


def test_s3_hostile_listing_is_refused_key_by_key(s3_store: StoreServer,
                                                  tmp_path: Path) -> None:
    _hostile_listing(s3_store.url, s3_store, tmp_path)


def test_gcs_hostile_listing_is_refused_key_by_key(gcs_store: StoreServer,
                                                   tmp_path: Path) -> None:
    _hostile_listing(gcs_store.url, gcs_store, tmp_path)


def test_file_store_links_planted_by_a_node_lead_nowhere(tmp_path: Path) -> None:
    secret = tmp_path / "user" / "secret"
    secret.parent.mkdir()
    secret.write_text("the user's")
    root = tmp_path / "store"
    (root / "step1").mkdir(parents=True)
    (root / "step1" / "model.pt").write_text("weights")
    (root / "link").symlink_to(secret)  # a file link
    (root / "dir").symlink_to(secret.parent)  # a folder link
    store = open_store(f"file://{root}")
    assert store.list() == ["step1/model.pt"]
    for key in ("link", "dir/secret"):
        with pytest.raises(UnsafeKey):
            store.get_bytes(key)
    with pytest.raises(UnsafeKey):
        store.put_bytes("dir/secret", b"overwritten")
    assert secret.read_text() == "the user's"
    dest = tmp_path / "dest"
    assert pull(store, str(dest))["files"] == 1


def test_push_refuses_paths_outside_its_folder(tmp_path: Path) -> None:
    (tmp_path / "outside").write_text("not a checkpoint")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "ok").write_text("fine")
    (root / "link").symlink_to(tmp_path / "outside")
    store = open_store(f"file://{tmp_path}/store")
    got = push(store, str(root), ["ok", "../outside", "link"])
    assert got["files"] == 1 and sorted(got["refused"]) == ["../outside", "link"]
    assert store.list() == ["ok"]


def _two_writers(url: str) -> None:
    """Many writers of one key at once: exactly one wins, and its bytes are what is there."""
    store = open_store(url)
    wins: list[int] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        if open_store(url).put_new("c1/jobs/7/spec.json", str(i).encode()):
            with lock:
                wins.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.get_bytes("c1/jobs/7/spec.json") == str(wins[0]).encode()
    assert store.put_new("c1/jobs/7/spec.json", b"late") is False
    assert store.put_new("c1/jobs/8/spec.json", b"fresh") is True


def test_file_store_conditional_write(tmp_path: Path) -> None:
    _two_writers(f"file://{tmp_path}/store")
    assert not [p for p in (tmp_path / "store").rglob("*") if p.name.endswith(".tmp")]


def test_s3_conditional_write(s3_store: StoreServer) -> None:
    _two_writers(s3_store.url)


def test_gcs_conditional_write(gcs_store: StoreServer) -> None:
    _two_writers(gcs_store.url)


def test_inside_follows_links(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    os.symlink(tmp_path, tmp_path / "root" / "up")
    assert inside(str(tmp_path / "root"), "a/b") == str(tmp_path / "root" / "a" / "b")
    with pytest.raises(UnsafeKey):
        inside(str(tmp_path / "root"), "up/x")
