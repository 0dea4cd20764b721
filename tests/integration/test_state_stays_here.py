"""Issue 42 on real docker containers: a managed run whose script's folder holds the state
folder (MGPU_CLOUD_HOME inside the project, with another cluster's keys in it too) ships no
key of any cluster: not to the controller's job folder at the hand-off, not to the nodes'
job folders at bootstrap, nor at the controller's own sync to a node it made anew after a
loss. Read from the containers' filesystems."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from engine import unique
from kit import cli

from provision.model.keys import ensure_cluster_key, ensure_controller_key, ensure_records_key
from remote.store import open_store

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
KEY_NAMES = ("records.key", "controller_ed25519", "id_ed25519")


def _wait(check: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(1.0)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def _events(url: str, name: str) -> str:
    store = open_store(url)
    return " ".join((store.get_bytes(k) or b"").decode(errors="replace")
                    for k in store.list(f"{name}/jobs/1/events"))


def _folder(container: str, path: str) -> dict[str, bytes]:
    """Every regular file under `path` in `container` (its tar, read here; {} when absent)."""
    out = subprocess.run(["docker", "exec", container, "sh", "-c",
                          f"cd {path} 2>/dev/null && tar -cf - . || true"],
                         capture_output=True, check=True).stdout
    if not out:
        return {}
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def _remove(name: str) -> None:
    subprocess.run(f"docker rm -f $(docker ps -aq --filter label=mgpu-cloud-cluster={name})"
                   " 2>/dev/null", shell=True, check=False)


def test_no_key_of_any_cluster_reaches_a_job_folder(tmp_path: Path) -> None:
    name = unique("ship")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "train_ddp.py", project / "train.py")
    home = project / "state"  # MGPU_CLOUD_HOME inside the script's folder
    other = home / "keys" / "another-cluster"
    other.mkdir(parents=True, mode=0o700)
    ensure_cluster_key(other)
    ensure_controller_key(other)
    ensure_records_key(other)
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    try:
        up = cli("up", "--provider", "docker", "--nodes", "2", "--name", name, "--store", url,
                 home=home, cwd=project, env={})
        assert up.returncode == 0, up.stderr
        res = cli("launch", name, "--detach", "--max-restarts", "2", "--",
                  str(project / "train.py"), "--steps", "100000", "--save-every", "5",
                  "--sleep", "0.1", home=home, cwd=project, env={})
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
        assert f"left out of {project} (the tool's state and key files never leave this " \
               "machine): state" in res.stderr, res.stderr
        # a node lost: the controller makes it anew and sends it the job's folder itself
        _wait(lambda: '"started"' in _events(url, name), 120, "the job did not start")
        subprocess.run(["docker", "kill", f"{name}-node-1"], check=True, capture_output=True)
        _wait(lambda: '"resumed"' in _events(url, name), 300, "no resume after the loss")

        keys = {str(p): p.read_bytes() for p in (home / "keys").rglob("*")
                if p.is_file() and p.name in KEY_NAMES}
        assert len(keys) == 6, sorted(keys)  # both clusters' three keys
        folders = {f"{name}-controller": "/root/.mgpu-cloud/controller/jobs",
                   f"{name}-node-0": "/root/.mgpu-cloud/work",
                   f"{name}-node-1": "/root/.mgpu-cloud/work"}
        for container, path in folders.items():
            files = _folder(container, path)
            assert any(f.endswith("train.py") for f in files), (container, sorted(files))
            leaked = [f for f, data in files.items()
                      if f.rsplit("/", 1)[-1] in KEY_NAMES or f.split("/")[1:2] == ["state"]
                      or "/state/" in f or any(k in data for k in keys.values())]
            assert leaked == [], (container, leaked)
        assert cli("down", name, home=home, cwd=project, env={}).returncode == 0
    finally:
        _remove(name)
