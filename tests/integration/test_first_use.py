"""What a new user trips over (issue 23), for real on docker nodes: a refused second launch
must leave the running job alone, the state folder never travels with the workdir, `logs
--follow` stops on the first Ctrl-C, and the tables fit 80 columns.

One 2-node cluster is shared by the tests of this file (they run in file order).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]
NAME = "it23-user"


def cli(*args: str, home: Path, cwd: Path | None = None, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision.cli", *args], cwd=cwd or home,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "MGPU_CLOUD_HOME": str(home), **(env or {})})


def force_remove(name: str) -> None:
    subprocess.run(f"docker rm -f $(docker ps -aq --filter label=mgpu-cloud-cluster={name}) "
                   f"2>/dev/null; docker network rm {name}-net 2>/dev/null", shell=True)


def node_shell(node: int, command: str) -> str:
    """A command in a node container as root (docker exec, not the tool's transport)."""
    return subprocess.run(["docker", "exec", f"{NAME}-node-{node}", "sh", "-c", command],
                          capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project folder; the tool's state folder is inside it (test 2)."""
    return tmp_path_factory.mktemp("project")


@pytest.fixture(scope="module")
def home(project: Path, node_image: str) -> Iterator[Path]:
    home = project / "state"
    home.mkdir()
    res = cli("up", "--nodes", "2", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        cli("down", NAME, home=home)
        force_remove(NAME)


# A job that reads a file of its workdir (relative to its cwd) after a while: it fails if
# anything replaced the workdir under it.
SLOW_READER = """\
import os, sys, time
time.sleep(float(sys.argv[1]))
with open("data.txt") as fh:
    print("rank", os.environ["RANK"], "read", fh.read().strip(), flush=True)
"""


def test_a_refused_second_launch_leaves_the_running_job_alone(home: Path,
                                                               tmp_path: Path) -> None:
    work = tmp_path / "job"
    work.mkdir()
    (work / "reader.py").write_text(SLOW_READER)
    (work / "data.txt").write_text("first\n")
    first = cli("launch", NAME, "--detach", "--nproc-per-node", "1", "--", "reader.py", "12",
                home=home, cwd=work)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    (work / "data.txt").write_text("second\n")
    second = cli("launch", NAME, "--detach", "--nproc-per-node", "1", "--", "reader.py", "0",
                 home=home, cwd=work)
    assert second.returncode != 0, second.stdout
    assert f"job {job_id} (reader.py 12) is still running" in second.stderr, second.stderr
    assert "synced" not in second.stderr, "refused before any node was touched"
    # Without the controller's record (another machine, a lost state folder), the nodes
    # themselves refuse to replace the workdir of a running job.
    record = home / "jobs" / NAME / job_id / "job.json"
    saved = record.read_text()
    record.unlink()
    third = cli("launch", NAME, "--nproc-per-node", "1", "--", "reader.py", "0",
                home=home, cwd=work)
    record.write_text(saved)
    assert third.returncode != 0, third.stdout
    assert "a job is still running on node-0" in third.stderr, third.stderr
    followed = cli("logs", NAME, job_id, "--follow", home=home)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "[node-0] rank 0 read first" in followed.stdout
    assert "[node-1] rank 1 read first" in followed.stdout


def test_the_state_folder_never_goes_to_the_nodes(home: Path, project: Path) -> None:
    (project / "hello.py").write_text("print('hello')\n")
    (project / "notes.txt").write_text("kept\n")
    assert (home / "keys" / NAME / "id_ed25519").exists(), "the fixture's state is in project/"
    res = cli("launch", NAME, "--nproc-per-node", "1", "--", "hello.py", home=home, cwd=project)
    assert res.returncode == 0, res.stderr
    listing = cli("exec", NAME, "--", "cd .mgpu-cloud/work && find . -type f | sort",
                  home=home).stdout
    assert "./notes.txt" in listing and "./hello.py" in listing
    assert "./state" not in listing and "id_ed25519" not in listing, listing
    assert "history.jsonl" not in listing and "known_hosts" not in listing, listing
