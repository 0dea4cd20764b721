"""What a new user trips over (issue 23), for real on docker nodes: a refused second launch
must leave the running job alone, the state folder never travels with the workdir, `logs
--follow` stops on the first Ctrl-C, and the tables fit 80 columns.

One 2-node cluster is shared by the tests of this file (they run in file order).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import force_remove, unique
from kit import cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("first_use")]  # one cluster, tests in file order
NAME = unique("it23-user")
SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


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


# A job that reads a file of its workdir (relative to its cwd) once the file named by its
# argument exists on its node ("-": at once): it fails if anything replaced the workdir
# under it. It cannot end before its test lets it.
SLOW_READER = """\
import os, sys, time
waited = time.monotonic()
while sys.argv[1] != "-" and not os.path.exists(sys.argv[1]):
    assert time.monotonic() - waited < 600, "never let go"
    time.sleep(0.1)
with open("data.txt") as fh:
    print("rank", os.environ["RANK"], "read", fh.read().strip(), flush=True)
"""


def test_a_refused_second_launch_leaves_the_running_job_alone(home: Path,
                                                               tmp_path: Path) -> None:
    work = tmp_path / "job"
    work.mkdir()
    (work / "reader.py").write_text(SLOW_READER)
    (work / "data.txt").write_text("first\n")
    go = f"/tmp/{NAME}-go"  # noqa: S108 (a node's)
    first = cli("launch", NAME, "--detach", "--nproc-per-node", "1", "--", "reader.py", go,
                home=home, cwd=work)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    (work / "data.txt").write_text("second\n")
    second = cli("launch", NAME, "--detach", "--nproc-per-node", "1", "--", "reader.py", "-",
                 home=home, cwd=work)
    assert second.returncode != 0, second.stdout
    assert f"job {job_id} (reader.py {go}) is still running" in second.stderr, second.stderr
    assert "synced" not in second.stderr, "refused before any node was touched"
    # Without the controller's record (another machine, a lost state folder), the nodes
    # themselves refuse to replace the workdir of a running job.
    record = home / "jobs" / NAME / job_id / "job.json"
    saved = record.read_text()
    record.unlink()
    third = cli("launch", NAME, "--nproc-per-node", "1", "--", "reader.py", "-",
                home=home, cwd=work)
    record.write_text(saved)
    assert third.returncode != 0, third.stdout
    assert "a job is still running on node-0" in third.stderr, third.stderr
    assert cli("exec", NAME, "--", "touch", go, home=home).returncode == 0
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


# A job that says it started, then runs until it is cancelled.
LONG_JOB = """\
import os, time
print("rank", os.environ["RANK"], "started", flush=True)
time.sleep(900)
"""


def test_logs_follow_stops_on_the_first_ctrl_c_and_the_job_goes_on(home: Path,
                                                                    tmp_path: Path) -> None:
    """One SIGINT (what Ctrl-C sends) ends `logs --follow` while the job runs: the job runs
    for 15 minutes, so only the Ctrl-C can end the follower within the test's wait."""
    (tmp_path / "long.py").write_text(LONG_JOB)
    start = cli("launch", NAME, "--detach", "--nproc-per-node", "1", "--", "long.py",
                home=home, cwd=tmp_path)
    assert start.returncode == 0, start.stderr
    job_id = start.stdout.strip()
    follower = subprocess.Popen(
        [sys.executable, "-m", "provision.cli", "logs", NAME, job_id, "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MGPU_CLOUD_HOME": str(home)})
    try:
        lines: queue.Queue[str] = queue.Queue()
        assert follower.stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout or []],
                         daemon=True).start()
        started: set[str] = set()
        while len(started) < 2:  # both nodes' ranks are being followed now
            line = lines.get(timeout=120)
            if "started" in line:
                started.add(line.split()[0])
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 130, err
        assert f"stopped following job {job_id}; it goes on" in err, err
        listed = json.loads(cli("jobs", NAME, "--json", home=home).stdout)
        assert next(j["state"] for j in listed if j["id"] == job_id) == "running"
    finally:
        if follower.poll() is None:
            follower.kill()
        cli("cancel", NAME, job_id, "--grace", "1", home=home)


def test_torchrun_prints_no_omp_banner_and_ranks_get_one_thread(home: Path,
                                                                   tmp_path: Path) -> None:
    """Two processes per node: torchrun would set OMP_NUM_THREADS=1 and print its 5-line
    banner on each node; the tool sets the same value, so the banner never comes."""
    (tmp_path / "omp.py").write_text(
        "import os\nprint('rank', os.environ['RANK'], 'omp', os.environ.get('OMP_NUM_THREADS'))\n")
    res = cli("launch", NAME, "--", "omp.py", home=home, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert sorted(re.findall(r"rank (\d) omp 1\b", out)) == ["0", "1", "2", "3"], out
    assert "Setting OMP_NUM_THREADS" not in out and "*****" not in out, out


def test_the_day2_tables_fit_80_columns(home: Path) -> None:
    """On real nodes, after the jobs above: `status`, `jobs`, `cost` and `check` in an 80x24
    terminal; no line wider, the torch version whole."""
    wide = {}
    for args in (("status",), ("jobs", NAME), ("cost",), ("check", NAME)):
        res = cli(*args, home=home, env={"COLUMNS": "80"})
        assert res.returncode == 0, res.stdout + res.stderr
        out = res.stdout + res.stderr
        wide[args[0]] = [line for line in out.splitlines() if len(line) > 80]
        if args[0] == "check":
            assert "2.13.0" in out and "…" not in out, out
    assert wide == {"status": [], "jobs": [], "cost": [], "check": []}


def test_a_finished_accelerate_job_without_teardown_exits_cleanly(home: Path) -> None:
    """The held-out script leaves its process group to the interpreter; without the node
    sitecustomize's exit hook about one run in ten of it fails at exit on these nodes
    (benchmarks/exit_abort_rate.py). Five runs of it on every rank, in one job."""
    runs = 5
    # 20 fresh interpreters that import torch and accelerate (~3.7 CPU-s each): ~180 s in one
    # suite on 2 cores, and over 600 s with two suites at once (run 88, both clones). The
    # limit only guards against a hang.
    res = cli("launch", NAME, "--launcher", "accelerate", "--master-port", "29650", "--",
              "repeat_script.py", "accelerate_no_teardown.py", str(runs), home=home,
              cwd=SCRIPTS, timeout=1800)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    codes = re.findall(r"rank (\d) exit codes \[([-\d, ]+)\]", out)
    assert sorted(rank for rank, _ in codes) == ["0", "1", "2", "3"], out
    assert all(c == ", ".join(["0"] * runs) for _, c in codes), codes
    assert len(re.findall(r"rank \d/4 result", out)) == 4 * runs, "every rank of every run"
    assert "terminate called" not in out


def test_a_node_showing_an_unpinned_host_key_is_refused_before_any_command(
        home: Path) -> None:
    """node-1's address shows a host key that is not pinned for it: an impostor's key
    (pinned: another), or any key where none is pinned (its known_hosts line gone). The tool
    refuses the connection and runs nothing there; node-0 is unaffected. (Last in this file:
    it changes node-1's sshd and the pinned keys, and puts both back.)"""
    from impostor import show_own_key, show_unpinned_key

    status = json.loads(cli("status", NAME, "--json", home=home).stdout)
    port = next(n["port"] for n in status[0]["nodes"] if n["name"] == "node-1")
    known_hosts = home / "keys" / NAME / "known_hosts"
    pinned = known_hosts.read_text()

    def refused(why: str) -> None:
        node_shell(0, "rm -f /tmp/it23-ran")
        res = cli("exec", NAME, "--", "touch /tmp/it23-ran", home=home, timeout=120,
                  env={"MGPU_CLOUD_SSH_DEADLINE": "20"})
        assert res.returncode != 0, res.stdout
        assert "--- node-1 (exit 255) ---" in res.stdout, res.stdout
        assert why in res.stderr, res.stdout + res.stderr
        assert node_shell(1, "test -e /tmp/it23-ran && echo ran || echo never") == "never\n"
        assert node_shell(0, "test -e /tmp/it23-ran && echo ran || echo never") == "ran\n"

    show_unpinned_key(f"{NAME}-node-1", port)
    try:
        refused("does not match")  # paramiko's BadHostKeyException
    finally:
        show_own_key(f"{NAME}-node-1", port)
    known_hosts.write_text("".join(line for line in pinned.splitlines(keepends=True)
                                   if f"]:{port} " not in line))
    try:
        refused("presented an unknown ssh-ed25519 host key")
    finally:
        known_hosts.write_text(pinned)
    again = cli("exec", NAME, "--", "true", home=home)
    assert again.returncode == 0, again.stdout + again.stderr
