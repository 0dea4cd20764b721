"""remote/store.py against real stores: a folder, moto's S3 server, fake-gcs-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from storekit import StoreServer

from remote.store import open_store, parse_url
from remote.storesync import pull, push

ROOT = Path(__file__).resolve().parents[2]


def test_urls_parse_and_bad_ones_say_what_a_good_one_is() -> None:
    assert str(parse_url("s3://b/p/q/")) == "s3://b/p/q"
    assert parse_url("gs://b").prefix == ""
    assert parse_url("file:///mnt/x/").prefix == "/mnt/x"
    assert str(parse_url("s3://b/p").child("c1", "checkpoints")) == "s3://b/p/c1/checkpoints"
    assert str(parse_url("file:///m").child("c1")) == "file:///m/c1"
    for bad in ("http://x/y", "s3://", "file://relative", "file:///", "/srv/x"):
        with pytest.raises(ValueError, match="store|bucket|absolute"):
            parse_url(bad)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _round_trip(url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "step9").mkdir(parents=True)
    (src / "step9" / "a.pt").write_bytes(os.urandom(20 * 1024 * 1024 + 17))  # multipart
    (src / "latest").write_text("step9")
    store = open_store(url)
    got = push(store, str(src), ["step9/a.pt", "latest"])
    assert got["files"] == 2 and got["bytes"] == 20 * 1024 * 1024 + 17 + 5
    assert store.list() == ["latest", "step9/a.pt"]
    assert store.list("step9") == ["step9/a.pt"]
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "stale").write_text("x")  # replaced, not merged
    pull(store, str(dest))
    assert _tree(dest) == _tree(src)
    store.put_bytes("jobs/1/events/000001.json", b"{}")
    assert store.get_bytes("jobs/1/events/000001.json") == b"{}"
    assert store.get_bytes("nothing/here") is None
    store.delete("jobs/1/events/000001.json")
    store.delete("jobs/1/events/000001.json")  # idempotent
    assert store.get_bytes("jobs/1/events/000001.json") is None


def test_file_store_round_trip(tmp_path: Path) -> None:
    _round_trip(f"file://{tmp_path}/store", tmp_path)


def test_s3_store_round_trip_through_moto_server(tmp_path: Path, s3_store: StoreServer) -> None:
    _round_trip(s3_store.url, tmp_path)


def test_gcs_store_round_trip_through_fake_gcs_server(tmp_path: Path,
                                                      gcs_store: StoreServer) -> None:
    _round_trip(gcs_store.url, tmp_path)


def test_the_node_command_takes_credentials_on_stdin_only(tmp_path: Path,
                                                          s3_store: StoreServer) -> None:
    """`remote.pyz store push --env-stdin`: the environment comes on stdin, nothing of it on
    the command line; a wrong endpoint is one line on stderr and exit 1."""
    (tmp_path / "f").write_text("hello")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cmd = [sys.executable, "-m", "remote", "store", "push", "--url", s3_store.url,
           "--root", str(tmp_path), "--env-stdin", "f"]
    ok = subprocess.run(cmd, input=json.dumps(s3_store.env), capture_output=True, text=True,
                        env=env, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["files"] == 1
    assert open_store(s3_store.url).get_bytes("f") == b"hello"
    bad = subprocess.run(cmd, input=json.dumps({**s3_store.env,
                                                "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}),
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert bad.returncode == 1 and "store push" in bad.stderr
