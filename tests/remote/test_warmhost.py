"""The node's warm launcher (remote/warmhost.py, remote/warmstart.py) for real, on this
machine: `job start` from a built remote.pyz, torchrun of this venv. The first torchrun job
starts the launcher and gets its agent forked from it, later jobs with the same variables
too; what the job sees and what ps sees is what `torchrun` run afresh shows; a job with other
variables, a changed remote.pyz or the switch off never gets that launcher's state."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.model.assets import templates_dir
from provision.nodes.bootstrap import remote_zipapp
from remote import warmstart
from remote.jobs import alive

VENV_BIN = str(Path(sys.executable).parent)
SCRIPT = """
import os, sys, time
import torch
print("rank", os.environ["RANK"], "torch before the script:", "torch" in sys.modules,
      "dynamo:", "torch._dynamo" in sys.modules, "flag:", os.environ.get("FLAG"),
      "threads:", torch.get_num_threads(), "cwd:", os.getcwd(), "argv:", sys.argv,
      "path:", sys.path, flush=True)
if sys.argv[1:2] == ["exit"] and os.environ["RANK"] == "1":
    sys.exit(int(sys.argv[2]))
if sys.argv[1:2] == ["sleep"]:
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def node() -> Iterator[Path]:
    """A node's folder: remote.pyz, a workdir with the script; its launchers ended after. A
    short path, as a node's ~/.mgpu-cloud: a socket's path holds 108 bytes."""
    tmp_path = Path(tempfile.mkdtemp(prefix="wh-"))
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "remote.pyz").write_bytes(remote_zipapp())
    (tmp_path / "root" / "py").mkdir()  # the job's PYTHONPATH: the node's sitecustomize
    shutil.copy(templates_dir() / "node" / "sitecustomize.py", tmp_path / "root" / "py")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.py").write_text(SCRIPT)
    yield tmp_path
    for log in (tmp_path / "root" / "warm").glob("*.log"):
        for pid in re.findall(r"\(pid (\d+)\)", log.read_text()):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(tmp_path, ignore_errors=True)


def start(node: Path, job: str, port: int, *words: str, attach: bool = True,
          **env: str) -> subprocess.CompletedProcess[str]:
    """`job start` of a 2-rank torchrun job, as a node's controller runs it; `words`: the
    script's (`exit 7`: rank 1 exits 7; `sleep S`)."""
    root = node / "root"
    argv = [sys.executable, str(root / "remote.pyz"), "job", "start", "--dir",
            str(root / "jobs" / job), "--cwd", str(node / "work"),
            *(["--attach", "--survive-eof"] if attach else []), "--",
            "torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--master_port", str(port),
            "--run_path", "--start_method", "fork", str(root / "remote.pyz"), "script", "--",
            "job.py", *words]
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLAG")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=node,
                          env={**clean, "PATH": VENV_BIN + os.pathsep + clean["PATH"],
                               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "py"), **env})


def rank_line(res: subprocess.CompletedProcess[str], rank: str) -> str:
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(f"rank {rank} ")]
    assert len(lines) == 1, res.stdout + res.stderr
    return lines[0]


def launchers(node: Path) -> dict[str, int]:
    """socket name -> pid of every launcher that said it is ready."""
    found = {}
    for log in sorted((node / "root" / "warm").glob("*.log")):
        pids = re.findall(r"ready in [\d.]+ s \(pid (\d+)\)", log.read_text())
        if pids:
            found[log.stem] = int(pids[-1])
    return found


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def test_the_late_variables_are_the_only_ones_a_launcher_overlooks() -> None:
    """A variable is left out of the launcher's key only when it is one of LATE (the session's
    SSH_*, the tool's per-launch ones); a name that only looks like one still counts."""
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    one = warmstart.key(base, "/py")
    for late in ("SSH_CONNECTION", "MGPU_RESTART_COUNT", "MGPU_RESIDENT_DIR", "MASTER_PORT",
                 "MGPU_NODE_RANK", "PWD", "_"):
        assert warmstart.key({**base, late: "x"}, "/py") == one, late
    for read_at_import in ("OMP_NUM_THREADS", "TORCH_LOGS", "PYTHONPATH", "MGPU_RESTART_COUNTER",
                           "SSH", "MY_FLAG", "MGPU_WARM_IMPORTS", "LD_PRELOAD"):
        assert warmstart.key({**base, read_at_import: "2"}, "/py") != one, read_at_import
    assert warmstart.key(base, "/other/python") != one


def test_only_a_bare_torchrun_line_from_remote_pyz_and_not_switched_off_is_planned(
        node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = node / "root"  # short, as a node's ~/.mgpu-cloud
    pyz = tmp_path / "remote.pyz"
    monkeypatch.setattr(sys, "argv", [str(pyz), "job", "start"])
    env = {"PATH": VENV_BIN}
    where = warmstart.plan(["torchrun", "x.py"], env)
    assert where is not None and where[0].startswith(str(tmp_path / "warm") + "/")
    assert where[1] == warmstart.shebang_python(os.path.join(VENV_BIN, "torchrun"))
    assert warmstart.plan(["sudo", "torchrun", "x.py"], env) is None  # in a container
    assert warmstart.plan(["env", "torchrun"], env) is None
    assert warmstart.plan(["torchrun", "x.py"], {**env, "MGPU_WARM_LAUNCHER": "0"}) is None
    assert warmstart.plan(["torchrun", "x.py"], {"PATH": str(tmp_path)}) is None  # none there
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "remote" / "__main__.py")])
    assert warmstart.plan(["torchrun", "x.py"], env) is None  # not from remote.pyz
    deep = tmp_path / ("d" * 90)
    monkeypatch.setattr(sys, "argv", [str(deep / "remote.pyz")])
    assert warmstart.plan(["torchrun", "x.py"], env) is None  # no room in sun_path


def test_later_jobs_get_their_agent_forked_and_see_what_a_fresh_torchrun_shows(
        node: Path) -> None:
    first = start(node, "1", 29871)
    assert first.returncode == 0, first.stdout + first.stderr
    (name, pid), = launchers(node).items()
    second = start(node, "2", 29872, "sleep", "30", attach=False)
    assert second.returncode == 0, second.stderr
    agent = int(second.stdout.split()[0])  # the job's process group: its agent
    try:
        supervisor = ancestors(agent)[0]
        assert ancestors(supervisor)[0] == pid  # forked by the launcher, not started afresh
        cmdline = Path(f"/proc/{agent}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert [w.decode() for w in cmdline[1:4]] == [os.path.join(VENV_BIN, "torchrun"),
                                                       "--nnodes", "1"]
        assert cmdline[-3:] == [b"job.py", b"sleep", b"30"]  # `pgrep -f job.py` finds it
        assert Path(f"/proc/{agent}/comm").read_text().strip() in ("torchrun", "pt_elastic")
        starter = Path(f"/proc/{supervisor}/cmdline").read_bytes().split(b"\0")
        assert starter[2:4] == [b"job", b"start"]
    finally:
        subprocess.run([sys.executable, str(node / "root" / "remote.pyz"), "job", "cancel",
                        "--dir", str(node / "root" / "jobs" / "2"), "--grace", "5"], timeout=60)
    assert json.loads((node / "root" / "jobs" / "2" / "exit").read_text())["code"] != 0
    assert not alive(agent)
    third = start(node, "3", 29873, "exit", "7")
    out = third.stdout + third.stderr
    assert third.returncode == 1, out  # torchrun's own code for a failed rank, as afresh
    assert "exitcode: 7" in out and "ChildFailedError" in out, out
    assert launchers(node) == {name: pid}
    afresh = start(node, "4", 29874, MGPU_WARM_LAUNCHER="0")  # torchrun's own start
    assert afresh.returncode == 0 and launchers(node) == {name: pid}
    # what a rank sees (imports, variables, threads, folder, argv, sys.path): torchrun's own
    assert rank_line(first, "0") == rank_line(afresh, "0")
    assert "torch before the script: True dynamo: True flag: None threads: 1" in \
        rank_line(third, "0")


def test_other_variables_a_changed_pyz_or_the_switch_off_never_share_a_launcher(
        node: Path) -> None:
    assert start(node, "1", 29881).returncode == 0
    (name, pid), = launchers(node).items()
    other = start(node, "2", 29882, FLAG="on")
    assert "flag: on" in other.stdout, other.stdout + other.stderr
    assert len(launchers(node)) == 2 and launchers(node)[name] == pid
    off = start(node, "3", 29883, MGPU_WARM_LAUNCHER="0")
    assert off.returncode == 0 and len(launchers(node)) == 2
    pyz = node / "root" / "remote.pyz"
    pyz.write_bytes(pyz.read_bytes())  # the same bytes, a new file: an upgrade's upload
    again = start(node, "4", 29884)
    assert again.returncode == 0, again.stdout + again.stderr  # refused there: afresh here
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = (node / "root" / "warm" / f"{name}.log").read_text()
    assert not os.path.exists(node / "root" / "warm" / f"{name}.sock"), log
    assert start(node, "5", 29885).returncode == 0  # and the next start makes a new one
    assert launchers(node)[name] != pid


def test_a_folder_that_is_gone_fails_the_job_as_a_start_afresh_would(node: Path) -> None:
    """The forked agent cannot enter the job's folder: the job's log says it could not start
    torchrun and why, and the job's code is 127, as when Popen cannot start it."""
    assert start(node, "1", 29892).returncode == 0
    shutil.rmtree(node / "work")
    res = start(node, "2", 29893)
    assert res.returncode == 127, res.stdout + res.stderr
    assert "job: cannot start 'torchrun': [Errno 2]" in res.stdout, res.stdout
    assert len(launchers(node)) == 1


def test_a_job_cancelled_while_its_launcher_started_never_runs(node: Path) -> None:
    """The first job waits for the launcher's imports; a `job cancel` meanwhile (the
    controller gave up) leaves its mark, and the supervisor starts nothing."""
    job_dir = node / "root" / "jobs" / "1"
    job_dir.mkdir(parents=True)
    (job_dir / "cancelled").touch()
    res = start(node, "1", 29891, attach=False)
    assert res.returncode == 127 and "cancelled before it started" in res.stderr, res.stderr
    assert json.loads((job_dir / "exit").read_text())["code"] == 143
    assert not (job_dir / "node.log").exists() or "rank" not in (job_dir / "node.log").read_text()


def test_a_request_from_another_user_is_not_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever connects must be the launcher's own user (SO_PEERCRED): another user's request
    is dropped unread, its report pipe never reaches a supervisor."""
    import socket

    from remote import warmhost

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, theirs:
        assert warmhost.peer_uid(mine) == os.getuid()
        monkeypatch.setattr(warmhost.os, "getuid", lambda: os.geteuid() + 1)
        theirs.sendall(b'{"cmd": ["torchrun"]}\n')
        assert warmhost._answer(mine, mine, -1, True) is True  # not forked: nothing to close
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):
            theirs.recv(1)  # no reply


@pytest.mark.parametrize(("answer", "handed"), [
    (b'{"ok": false, "why": "stale"}\n', False),  # its own no: nothing started, start afresh
    (b"", True),  # no answer: what it did is for the report pipe to tell, never a 2nd start
    (b"garbage\n", True),
    (b'{"ok": true, "pid": 1}\n', True),
])
def test_once_sent_only_the_launchers_own_no_starts_the_job_afresh(
        node: Path, monkeypatch: pytest.MonkeyPatch, answer: bytes, handed: bool) -> None:
    import argparse
    import socket
    import threading

    path = str(node / "root" / "w.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            got.append(data)
            for _, _, raw in ancdata:
                os.close(int.from_bytes(raw[:4], sys.byteorder))
            conn.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    monkeypatch.setattr(warmstart, "plan", lambda cmd, env: (path, sys.executable, "x.pyz"))
    read, write = os.pipe()
    try:
        args = argparse.Namespace(cwd=str(node), dir=str(node / "j"))
        assert warmstart.hand_over(args, ["torchrun", "x.py"], write) is handed
    finally:
        thread.join(10)
        srv.close()
        os.close(read)
        os.close(write)
    assert json.loads(got[0])["cmd"] == ["torchrun", "x.py"]


def test_launchers_live_only_in_a_folder_of_the_users_own_closed_to_others(node: Path) -> None:
    """A `warm` folder open to others is closed (0700) before a launcher's socket goes in it;
    one owned by someone else is not used at all: the job starts afresh."""
    warm = node / "root" / "warm"
    warm.mkdir(mode=0o755)
    warm.chmod(0o777)
    assert start(node, "1", 29894).returncode == 0
    assert len(launchers(node)) == 1 and (warm.stat().st_mode & 0o777) == 0o700
    other = node / "other"
    (other / "root").mkdir(parents=True)
    shutil.copy(node / "root" / "remote.pyz", other / "root")
    shutil.copytree(node / "root" / "py", other / "root" / "py")
    shutil.copytree(node / "work", other / "work")
    (other / "root" / "warm").mkdir()
    os.chown(other / "root" / "warm", os.getuid() + 4242, -1)
    res = start(other, "1", 29895)
    assert res.returncode == 0, res.stdout + res.stderr
    assert list((other / "root" / "warm").iterdir()) == []  # nothing of ours went in there


def test_a_launcher_ends_when_its_folder_is_removed(node: Path) -> None:
    """`down` of an ssh cluster stops the job, then removes the cluster's folder on the
    user's machine: its launchers end with it, nothing of the tool is left running there."""
    assert start(node, "1", 29896).returncode == 0
    (_, pid), = launchers(node).items()
    shutil.rmtree(node / "root")
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
