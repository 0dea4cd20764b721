"""remote/jobs.py for real, on this machine: a job that outlives the process that started
it, its log, its exit status, follow, cancel, and an attached job stopped by end of stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from provision.nodes import RemoteLayout
from remote import jobs as remote_jobs

ROOT = Path(__file__).resolve().parents[2]


def job(*args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remote", "job", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def attached(*args: str) -> tuple[int, str]:
    """An attached start whose stdin stays open (the controller's channel) until it ends."""
    proc = subprocess.Popen([sys.executable, "-m", "remote", "job", "start", "--attach", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdin is not None
    stdout = proc.stdout.read()
    code = proc.wait(timeout=30)
    proc.stdin.close()
    return code, stdout


def status(jobs_dir: Path) -> dict[str, dict[str, object]]:
    res = job("status", "--jobs", str(jobs_dir))
    assert res.returncode == 0, res.stderr
    data: dict[str, dict[str, object]] = json.loads(res.stdout)
    return data


def wait_for(check, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_layout_and_remote_agree_on_the_log_name() -> None:
    assert RemoteLayout("r").job_log("7") == f"r/jobs/7/{remote_jobs.LOG}"
    # the end line's manifest: checkpoints/ beside jobs/
    layout = RemoteLayout("r")
    assert layout.checkpoints == os.path.join(
        os.path.dirname(os.path.dirname(layout.job_dir("7"))), remote_jobs.CHECKPOINTS)


def test_detached_job_outlives_start_and_records_exit(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "1"
    go = tmp_path / "go"  # the job ends only once this exists: start returned while it ran
    res = job("start", "--dir", str(d), "--pidfile", str(tmp_path / "job.pid"), "--",
              "sh", "-c", f"echo one; while [ ! -e '{go}' ]; do sleep 0.05; done; "
              "echo two >&2; exit 3")
    assert res.returncode == 0, res.stderr
    pgid = int(res.stdout)
    assert status(tmp_path / "jobs")["1"]["state"] == "running"
    assert int((tmp_path / "job.pid").read_text().split()[0]) == pgid  # "PGID SUPERVISOR"
    go.touch()
    followed = job("follow", "--dir", str(d))
    assert followed.returncode == 3
    assert followed.stdout == "one\ntwo\n"
    st = status(tmp_path / "jobs")["1"]
    assert st["state"] == "exited" and st["exit_code"] == 3
    assert not (tmp_path / "job.pid").exists()
    # follow from an offset, and without waiting on an ended job
    assert job("follow", "--dir", str(d), "--offset", "4").stdout == "two\n"


def test_meta_json_is_the_owners_alone(tmp_path: Path) -> None:
    """meta.json holds the job's argv (which can carry what the job was given): 0600, not
    readable by another user of the node, whatever the umask."""
    d = tmp_path / "jobs" / "9"
    res = job("start", "--dir", str(d), "--", "echo", "token=s3cr3t")
    assert res.returncode == 0, res.stderr
    meta = d / remote_jobs.META
    assert json.loads(meta.read_text())["argv"] == ["echo", "token=s3cr3t"]
    assert meta.stat().st_mode & 0o777 == 0o600
    assert job("follow", "--dir", str(d)).returncode == 0


def test_attached_start_ends_with_the_jobs_state_and_checkpoints(tmp_path: Path) -> None:
    """The last line of an attached start: what `job status` and `ckpt-manifest` would say,
    on a line of its own even after a last line the job left unterminated; the log is the
    job's output only."""
    from remote.ckpt import manifest

    d, ckpt = tmp_path / "jobs" / "5", tmp_path / remote_jobs.CHECKPOINTS
    (ckpt / "step-2").mkdir(parents=True)
    (ckpt / "step-2" / "model.pt").write_bytes(b"12345")
    code, stdout = attached("--dir", str(d), "--", "sh", "-c",
                            "echo one; printf unterminated; exit 4")
    assert code == 4
    lines = stdout.split("\n")
    assert lines[:2] == ["one", "unterminated"] and lines[3:] == [""]
    assert lines[2].startswith(remote_jobs.END)
    said = json.loads(lines[2][len(remote_jobs.END):])
    assert said["job"] == "5" and said["state"] == status(tmp_path / "jobs")["5"]
    assert said["state"]["exit_code"] == 4 and said["state"]["state"] == "exited"
    assert said["checkpoints"]["files"] == manifest(str(ckpt))
    assert list(said["checkpoints"]["files"]) == [os.path.join("step-2", "model.pt")]
    assert (d / "node.log").read_text() == "one\nunterminated"
    # after a whole last line: no empty line before it
    _, stdout = attached("--dir", str(tmp_path / "jobs" / "6"), "--", "echo", "hi")
    first, end, rest = stdout.split("\n")
    assert first == "hi" and rest == "" and end.startswith(remote_jobs.END)


def test_cancel_stops_the_whole_process_group(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "2"
    marker = tmp_path / "child-alive"
    script = f"(while true; do touch {marker}; sleep 0.1; done) & wait"
    res = job("start", "--dir", str(d), "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    wait_for(marker.exists)
    assert job("cancel", "--dir", str(d), "--grace", "2").returncode == 0
    st = status(tmp_path / "jobs")["2"]
    assert st["state"] == "cancelled" and st["exit_code"] is not None
    marker.unlink()
    time.sleep(0.4)
    assert not marker.exists(), "a member of the job's process group survived cancel"
    assert job("cancel", "--dir", str(d)).returncode == 0  # idempotent


def test_attached_job_streams_and_stops_when_stdin_closes(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote", "job", "start", "--attach", "--grace", "1", "--dir",
         str(d), "--", "sh", "-c", "echo started; sleep 60"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "started\n"
    proc.stdin.close()  # the controller's channel went away
    assert proc.wait(timeout=20) == 143
    st = status(tmp_path / "jobs")["3"]
    assert st["state"] == "cancelled"
    assert (d / "node.log").read_text() == "started\n"


def test_a_command_that_cannot_start(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "4"
    res = job("start", "--dir", str(d), "--", "/nonexistent/program")
    assert res.returncode == 127 and "cannot start" in res.stderr
    assert status(tmp_path / "jobs")["4"]["exit_code"] == 127
    assert job("start", "--dir", str(d), "--", "true").returncode == 2  # the folder is taken


def test_then_runs_after_the_job(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "5"
    done = tmp_path / "then-ran"
    res = job("start", "--dir", str(d), "--then", f"touch {done}", "--then-after", "0", "--",
              "true")
    assert res.returncode == 0
    wait_for(done.exists)


def test_a_vanished_supervisor_is_lost(tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "6"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"argv": ["x"], "started": time.time() - 100}))
    (d / "pid").write_text("999999 999999\n")  # no such process
    assert status(tmp_path / "jobs")["6"]["state"] == "lost"
    res = job("follow", "--dir", str(d), "--no-wait")
    assert res.returncode == 0


@pytest.mark.parametrize("state", ["Z", "S"])
def test_alive_treats_zombies_as_dead(monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    real_open = open

    def fake_open(path, *a, **kw):  # type: ignore[no-untyped-def]
        if str(path) == f"/proc/{os.getpid()}/stat":
            import io
            return io.StringIO(f"{os.getpid()} (python3) {state} 1 2 3")
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", fake_open)
    assert remote_jobs.alive(os.getpid()) is (state == "S")


def test_idle_says_whether_a_job_runs_on_the_node(tmp_path: Path) -> None:
    from provision.nodes.bootstrap import JOB_RUNNING

    assert JOB_RUNNING == remote_jobs.BUSY, "the controller reads the same code"
    pidfile = tmp_path / "job.pid"
    assert job("idle", "--pidfile", str(pidfile)).returncode == 0, "no pidfile: idle"
    res = job("start", "--dir", str(tmp_path / "jobs" / "1"), "--pidfile", str(pidfile), "--",
              "sleep", "30")
    assert res.returncode == 0, res.stderr
    busy = job("idle", "--pidfile", str(pidfile))
    assert busy.returncode == remote_jobs.BUSY
    assert f"a job is still running on this node (process group {int(res.stdout)})" in busy.stderr
    assert job("cancel", "--dir", str(tmp_path / "jobs" / "1"), "--grace", "1").returncode == 0
    wait_for(lambda: job("idle", "--pidfile", str(pidfile)).returncode == 0)


@pytest.mark.parametrize("supervisor_writes", [True, False])
def test_cancel_returns_once_the_exit_record_is_written_or_the_supervisor_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, supervisor_writes: bool) -> None:
    """After its TERM/KILL, cancel waits for the supervisor's last sweep: its exit record
    (then `status` says cancelled at once, never "running"), or its end without one. The
    supervisor here is a process this test ends when it says; the job's group is already gone
    (stop_job does nothing)."""
    d = tmp_path / "jobs" / "9"
    d.mkdir(parents=True)
    sup = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                           stdin=subprocess.PIPE)
    (d / remote_jobs.PID).write_text(f"{sup.pid} {sup.pid}\n")
    monkeypatch.setattr(remote_jobs, "stop_job", lambda *a: None)
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (remote_jobs.cancel(str(d), 1.0), returned.set()))
    waiter.start()
    try:
        # still waiting while the supervisor lives without a record (any time: 0.5 s here)
        assert not returned.wait(0.5), "cancel returned before the supervisor's exit record"
        if supervisor_writes:
            (d / remote_jobs.EXIT).write_text(json.dumps({"code": -15, "ended": time.time()}))
        else:
            assert sup.stdin is not None
            sup.stdin.close()
            sup.wait(timeout=30)
        assert returned.wait(20), "cancel did not return after the record or the end"
        assert (d / remote_jobs.CANCELLED).exists()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        waiter.join(timeout=35)


def test_a_job_that_ends_while_its_state_is_read_is_exited_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor writes the exit record, then ends. A state read between the two (the
    record not there yet, the supervisor gone by its liveness check) said "lost", and an
    attached start's follower exited 255 for a job that had exited 0 (seen once, a k8s run)."""
    d = tmp_path / "jobs" / "7"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"argv": ["x"], "started": time.time()}))
    (d / "pid").write_text("999999 999999\n")

    def ends_now(pid: int) -> bool:  # the supervisor writes its record and ends, just now
        (d / "exit").write_text(json.dumps({"code": 0, "ended": time.time()}))
        return False

    monkeypatch.setattr(remote_jobs, "alive", ends_now)
    assert remote_jobs.state_of(str(d))["state"] == "exited"
    assert remote_jobs.state_of(str(d))["exit_code"] == 0
