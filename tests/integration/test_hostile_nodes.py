"""Nodes are hostile, on the real engine (issue 42): what a job does to its own node cannot
write on this machine outside its outputs folder, nor reach another cluster.

- a job puts its own `tar` first on PATH, answering every copy with a crafted archive (the
  CVE-2025-4517 shape: nested links that climb out, which `extractall(filter="data")` on this
  machine's Python 3.11.7 follows): the 2-node `run` writes nothing outside
  mgpu-outputs/NAME/ and fails naming the node, for the outputs and the checkpoint copy;
- a node of cluster A reaches A's other node, not cluster B's node (each cluster has its own
  bridge network; the engine drops traffic between bridges), not B's published SSH port, and
  cannot open a raw socket (NET_RAW dropped: no spoofing on its own bridge).

Every cluster name carries the test run's token (tests/engine.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine import force_remove, leftovers, unique
from kit import cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]

# The job: builds the archive for the destination it is given (the folder's path length
# decides how long the nested names must be to pass PATH_MAX, as in CPython's own test of
# the CVE, Lib/test/test_tarfile.py test_realpath_limit_attack), and makes every `tar` the
# tool runs on this node print it.
HOSTILE_JOB = r'''
import io, os, sys, tarfile

dest, with_checkpoint = sys.argv[1], sys.argv[2] == "yes"
steps = "abcdefghijklmnop"
comp = "d" * ((4096 - (len(dest) + 1)) // (len(steps) + 1))
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
    def add(name, kind, link="", data=b""):
        info = tarfile.TarInfo(name)
        info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                     "file": tarfile.REGTYPE}[kind]
        info.mode, info.linkname, info.size = 0o755, link, len(data)
        tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    path = ""
    for step in steps:
        add(path + comp, "dir")
        add(path + step, "sym", comp)
        path += comp + "/"
    linkpath = "/".join(steps) + "/" + "l" * 254
    add(linkpath, "sym", "/".join([".."] * len(steps)))
    add("escape", "sym", linkpath + "/..")
    add("escape/planted-by-node", "file", data=b"written by the node\n")
    add("model.pt", "file", data=b"weights")
if os.environ.get("LOCAL_RANK", "0") == "0":
    with open("/root/crafted.tgz", "wb") as fh:
        fh.write(buf.getvalue())
    with open("/usr/local/bin/tar.new", "w") as fh:
        fh.write("#!/bin/sh\nexec cat /root/crafted.tgz\n")
    os.chmod("/usr/local/bin/tar.new", 0o755)
    os.replace("/usr/local/bin/tar.new", "/usr/local/bin/tar")
    if with_checkpoint:
        with open(os.path.join(os.environ["MGPU_CHECKPOINT_DIR"], "model.pt"), "wb") as fh:
            fh.write(b"weights")
    out = os.environ["MGPU_OUTPUT_DIR"]
    with open(os.path.join(out, "result.txt"), "w") as fh:
        fh.write("done\n")
print("tar replaced", flush=True)
'''


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Clusters a test makes; afterwards each is taken down, and none may be left."""
    made: list[str] = []
    yield made
    left = {name: leftovers(name) for name in made}
    for name in made:
        cli("down", name)
        force_remove(name)
    assert all(not ids for ids in left.values()), left


def _everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("checkpoint", ["no", "yes"])
def test_a_job_that_answers_copies_with_a_crafted_archive_writes_nothing_here(
        tmp_path: Path, names: list[str], checkpoint: str) -> None:
    name = unique(f"hx-{checkpoint}")
    names.append(name)
    work = tmp_path / "project"
    work.mkdir()
    (work / "hostile.py").write_text(HOSTILE_JOB)
    dest = work / "mgpu-outputs" / name
    res = cli("run", "--nodes", "2", "--name", name, str(work / "hostile.py"), str(dest),
              checkpoint, cwd=work, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    what = "checkpoints from node-" if checkpoint == "yes" else "the outputs of node-0"
    assert f"copying {what}" in out and "was refused" in out, out
    assert "symbolic link" in out and "nothing of it was kept" in out, out
    # nothing anywhere here but the script and the run's own (empty) folders
    allowed = {"hostile.py", "mgpu-outputs", f"mgpu-outputs/{name}",
               f"mgpu-outputs/{name}/checkpoints"}
    assert set(_everything_under(work)) <= allowed, _everything_under(work)
    assert not list(tmp_path.rglob("planted-by-node"))
    assert leftovers(name) == []  # the run still took its cluster down


def _inspect(container: str) -> Any:
    got = subprocess.run(["docker", "inspect", container], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(got)[0]


def _from(container: str, code: str) -> str:
    res = subprocess.run(["docker", "exec", container, "python3", "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


REACH = """
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("reached")
except OSError as exc:
    print(f"not reached: {type(exc).__name__}")
"""


def _reach(container: str, host: str, port: int) -> str:
    res = subprocess.run(["docker", "exec", container, "python3", "-c", REACH, host,
                          str(port)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_a_node_reaches_its_own_cluster_only_and_opens_no_raw_socket(
        names: list[str]) -> None:
    a, b = unique("isa"), unique("isb")
    names += [a, b]
    for name, count in ((a, "2"), (b, "1")):
        res = cli("up", "--nodes", count, "--name", name, "--no-bootstrap")
        assert res.returncode == 0, res.stderr
    nets = {name: _inspect(f"{name}-node-0")["NetworkSettings"] for name in (a, b)}
    assert list(nets[a]["Networks"]) == [f"{a}-net"]
    assert list(nets[b]["Networks"]) == [f"{b}-net"]
    peer = _inspect(f"{a}-node-1")["NetworkSettings"]["Networks"][f"{a}-net"]["IPAddress"]
    other = nets[b]["Networks"][f"{b}-net"]["IPAddress"]
    gateway = nets[a]["Networks"][f"{a}-net"]["Gateway"]
    published = int(nets[b]["Ports"]["22/tcp"][0]["HostPort"])
    assert _reach(f"{a}-node-0", peer, 22) == "reached"  # its own cluster: as before
    assert _reach(f"{a}-node-0", other, 22).startswith("not reached")
    assert _reach(f"{a}-node-0", gateway, published).startswith("not reached")
    raw = _from(f"{a}-node-0", "import socket\ntry:\n    socket.socket(socket.AF_PACKET, "
                "socket.SOCK_RAW)\n    print('raw')\nexcept PermissionError:\n    print('no')")
    assert raw == "no"
    caps = _inspect(f"{a}-node-0")["HostConfig"]["CapDrop"]
    assert caps == ["NET_RAW"], caps
    for name in (a, b):
        assert cli("down", name).returncode == 0
        assert leftovers(name) == []  # its network too


def test_a_managed_run_on_its_own_network_tears_it_down_from_inside(
        tmp_path: Path, names: list[str]) -> None:
    """The controller joins the cluster's network (it reaches the nodes and the store there);
    at the end it leaves it for the engine's default one, removes it with the nodes, then
    itself: nothing of the cluster is left."""
    import time

    from remote.store import open_store

    name = unique("hm")
    names.append(name)
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    example = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")
    res = cli("run", "--detach", "--provider", "docker", "--nodes", "2", "--name", name,
              "--store", url, example, "--steps", "3", home=tmp_path / "home", env={})
    assert res.returncode == 0, res.stdout + res.stderr
    ctl = _inspect(f"{name}-controller")
    assert list(ctl["NetworkSettings"]["Networks"]) == [f"{name}-net"]
    assert ctl["HostConfig"]["CapDrop"] == ["NET_RAW"]
    store, deadline, seen = open_store(url), time.monotonic() + 300, []
    while time.monotonic() < deadline and "torn_down" not in seen:
        seen = [json.loads(store.get_bytes(k) or b"{}")["event"]
                for k in store.list(f"{name}/jobs/1/events")]
        time.sleep(1)
    assert "finished" in seen and "torn_down" in seen, seen
    while time.monotonic() < deadline and leftovers(name):
        time.sleep(1)  # the controller removes itself last
    assert leftovers(name) == []


LINKING_JOB = r'''
import os
if os.environ.get("LOCAL_RANK", "0") == "0":
    for folder in (os.environ["MGPU_OUTPUT_DIR"], os.environ["MGPU_CHECKPOINT_DIR"]):
        os.makedirs(os.path.join(folder, "step_1"), exist_ok=True)
        with open(os.path.join(folder, "step_1", "model.pt"), "w") as fh:
            fh.write("weights\n")
        os.symlink("step_1", os.path.join(folder, "latest"))  # a folder's link
        os.symlink("step_1/model.pt", os.path.join(folder, "last.pt"))  # Lightning's "link"
        os.link(os.path.join(folder, "step_1", "model.pt"), os.path.join(folder, "hard.pt"))
print("saved", flush=True)
'''


def test_a_jobs_own_links_arrive_as_the_files_they_point_to(
        tmp_path: Path, names: list[str]) -> None:
    """The node's `tar` is asked to dereference (--dereference --hard-dereference): a real
    GNU tar's archive of a folder holding a symbolic and a hard link passes the extractor,
    both as plain files."""
    name = unique("hl")
    names.append(name)
    (tmp_path / "linking.py").write_text(LINKING_JOB)
    res = cli("run", "--nodes", "2", "--name", name, str(tmp_path / "linking.py"),
              cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    outputs = tmp_path / "mgpu-outputs" / name
    assert (outputs / "latest" / "model.pt").read_text() == "weights\n"  # the whole folder
    for folder in (outputs, outputs / "checkpoints"):  # (a checkpoint is kept file by file)
        for got in ("step_1/model.pt", "last.pt", "hard.pt"):
            assert (folder / got).read_text() == "weights\n", got
    links = [p for p in outputs.rglob("*") if p.is_symlink()]
    assert links == [] and (outputs / "hard.pt").stat().st_nlink == 1
