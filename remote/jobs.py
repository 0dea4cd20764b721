"""`job`: a job that outlives the SSH session that started it, with a log on the node.

    job start  --dir D [--cwd C] [--pidfile P] [--attach [--survive-eof]] [--then CMD]
               [--then-after S] -- CMD...
    job follow --dir D [--offset N] [--no-wait] [--end-line]
    job status --jobs J
    job cancel --dir D [--grace S]
    job idle   --pidfile P          exit 0 when no job runs on this node, else BUSY

A job's folder D (RemoteLayout.job_dir on the controller) holds:

    meta.json   argv, cwd, start time, host (written before the job starts; 0600)
    node.log    CMD's stdout and stderr, merged, as written (RemoteLayout.job_log)
    pid         "PGID SUPERVISOR_PID": the job's process group and its supervisor (a child
                subreaper: every process of the job stays its descendant, remote/supervise.py)
    exit        {"code": N, "ended": T} written atomically once every process has ended
    cancelled   present when `cancel` asked the job to stop

`start` double-forks a supervisor in a session of its own (stdin /dev/null, output to
node.log), so closing the SSH channel does not touch the job. The supervisor starts CMD in a
process group of its own, waits for it, stops any member left behind, writes `exit`, then runs
the optional `--then` line (e.g. the node powering itself off) after `--then-after` seconds.

Without --attach `start` prints the job's process group id and returns at once (a detached
job). With --attach it follows the log to stdout and exits with the job's exit code, and end of
stdin (the controller's channel closed: it crashed, or the user pressed Ctrl-C) cancels the
job, so an attached job never outlives its controller; unless --survive-eof (a managed run:
its controller may be lost and made again, issue 36, and follows the job again). After the
log, an attached `start` prints one last line, `MGPU-JOB-END {"job": ID, "state": ...,
"checkpoints": ...}`: the job's state as `status` reports it, and the manifest of the tool's
checkpoints/ folder (beside jobs/) as `ckpt-manifest` prints it, read off the stream the
controller follows anyway. `follow` is the same loop for anyone else (`logs --follow`, a
controller taking a job back: --end-line): it streams from byte N until `exit` appears and
exits with the job's code (255: the supervisor vanished without writing one, e.g. a reboot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from remote.ckpt import report as checkpoints_report
from remote.devices import SELECTOR, DeviceSelectionError
from remote.devices import expand as expand_devices
from remote.files import write_atomic
from remote.streams import LineEnd as _LineEnd
from remote.streams import Sink
from remote.supervise import become_subreaper, reap, stop_job, watch_preemption
from remote.warmstart import hand_over

LOG = "node.log"  # provision.nodes.RemoteLayout.job_log spells the same name
EXIT = "exit"
META = "meta.json"
PID = "pid"
CANCELLED = "cancelled"
THEN_LOG = "then.log"
LOST = 255  # exit code reported when a job's supervisor is gone without an exit status
BUSY = 75  # `idle`: a job still runs here (provision/nodes/bootstrap.py JOB_RUNNING spells it too)
POLL_S = 0.1
END = "MGPU-JOB-END "  # an attached start's last line (provision/job/ends.py reads it)
CHECKPOINTS = "checkpoints"  # beside jobs/ (provision.nodes.RemoteLayout.checkpoints)


# --- small file helpers ----------------------------------------------------------------------
def _write_atomic(path: str, text: str) -> None:
    write_atomic(path, text, mode=0o644)


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_pids_file(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            pgid, sup = fh.read().split()[:2]
        return int(pgid), int(sup)
    except (FileNotFoundError, ValueError):
        return None


def _read_pids(job_dir: str) -> tuple[int, int] | None:
    return _read_pids_file(os.path.join(job_dir, PID))


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a supervisor whose parent, e.g. sshd as a
    container's PID 1, has not reaped it yet is dead for us)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


# --- the supervisor --------------------------------------------------------------------------
def supervise(args: argparse.Namespace, cmd: list[str], report: int,
              spawn: Callable[[list[str]], Any] | None = None) -> NoReturn:
    """Runs in the double-forked child (or one a warm launcher forked, whose `spawn` forks the
    agent: remote/warmhost.py): never returns. `report` gets "ok PGID" or an error."""
    job_dir = args.dir
    log_fd = os.open(os.path.join(job_dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null)
    os.close(log_fd)
    become_subreaper()
    try:
        proc = spawn(cmd) if spawn else subprocess.Popen(
            cmd, cwd=args.cwd, start_new_session=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        os.write(2, f"job: cannot start {cmd[0]!r}: {exc}\n".encode())
        _write_atomic(os.path.join(job_dir, EXIT), json.dumps({"code": 127, "ended": time.time()}))
        os.write(report, f"error cannot start {cmd[0]!r}: {exc}\n".encode())
        os._exit(0)
    pgid, me = proc.pid, os.getpid()
    _write_atomic(os.path.join(job_dir, PID), f"{pgid} {me}\n")
    if args.pidfile:  # the cluster-wide "current job" (remote.pyz stop / signal / stacks)
        os.makedirs(os.path.dirname(os.path.abspath(args.pidfile)), exist_ok=True)
        _write_atomic(args.pidfile, f"{pgid} {me}\n")
    os.write(report, f"ok {pgid}\n".encode())
    os.close(report)

    stopping = threading.Event()

    def stop(*_: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=stop_job, args=(pgid, me, args.grace), daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stop())
    if args.preempt:
        protocol, url, signame = args.preempt
        threading.Thread(target=watch_preemption,
                         args=(protocol, url, signame, pgid, me, args.container),
                         daemon=True).start()
    code = proc.wait()
    stop_job(pgid, me, 0.5)  # whatever the leader did, leave nothing of the job behind
    reap()
    code = code if code >= 0 else 128 - code
    _write_atomic(os.path.join(job_dir, EXIT), json.dumps({"code": code, "ended": time.time()}))
    if args.pidfile:
        with contextlib.suppress(OSError, ValueError):
            with open(args.pidfile) as fh:
                mine = int(fh.read().split()[0]) == pgid
            if mine:
                os.unlink(args.pidfile)
    if args.then:
        time.sleep(max(0.0, args.then_after))
        with open(os.path.join(job_dir, THEN_LOG), "ab") as out:
            subprocess.call(["sh", "-c", args.then], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os._exit(0)


def _start(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("job start: no command given", file=sys.stderr)
        return 2
    if any(word.startswith(SELECTOR) for word in cmd):
        try:
            cmd = expand_devices(cmd)  # devices picked by driver on this node (devices.py)
        except DeviceSelectionError as exc:
            print(f"job start: {exc}", file=sys.stderr)
            return 2
    job_dir = args.dir
    os.makedirs(job_dir, exist_ok=True)
    if os.path.exists(os.path.join(job_dir, META)):
        print(f"job start: {job_dir} already holds a job", file=sys.stderr)
        return 2
    # 0600: the argv may hold what the job was given (another user of the node reads no more)
    write_atomic(os.path.join(job_dir, META), json.dumps({
        "argv": cmd, "cwd": args.cwd, "started": time.time(), "host": socket.gethostname(),
    }), mode=0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    if not hand_over(args, cmd, write_end):  # no warm launcher forked its supervisor: here
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the forked processes
            os.close(read_end)
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                supervise(args, cmd, write_end)
            finally:
                os._exit(1)
        os.waitpid(child, 0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        answer = fh.read().decode(errors="replace").strip()
    if not answer.startswith("ok "):
        print(f"job start: {answer.removeprefix('error ') or 'the supervisor died'}",
              file=sys.stderr)
        return 127
    if not args.attach:
        print(answer.split()[1])
        return 0
    if not args.survive_eof:
        threading.Thread(target=_cancel_on_eof, args=(job_dir, args.grace),
                         daemon=True).start()
    return tail(job_dir, 0)


def tail(job_dir: str, offset: int) -> int:
    """The log from byte `offset` to stdout until the job ends, then the END line."""
    out = _LineEnd(sys.stdout.buffer)
    code = follow(job_dir, offset, out)
    jobs_dir, job_id = os.path.split(os.path.normpath(job_dir))
    report = {"job": job_id, "state": state_of(job_dir),
              "checkpoints": checkpoints_report(os.path.join(os.path.dirname(jobs_dir),
                                                             CHECKPOINTS))}
    out.write(("" if out.ended else "\n").encode() + END.encode()
              + json.dumps(report, sort_keys=True).encode() + b"\n")
    out.flush()
    return code


def _cancel_on_eof(job_dir: str, grace: float) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    cancel(job_dir, grace)


# --- follow / status / cancel ----------------------------------------------------------------
def exit_status(job_dir: str) -> int | None:
    data = _read_json(os.path.join(job_dir, EXIT))
    return None if data is None else int(data.get("code", LOST))


def follow(job_dir: str, offset: int, out: Sink, *, wait: bool = True) -> int:
    """Copy node.log from byte `offset` to `out` until the job has ended (with `wait`); return
    the job's exit code (LOST if its supervisor is gone without one; with `wait=False` and a
    running job: 0 once the log so far was copied)."""
    path = os.path.join(job_dir, LOG)
    while not os.path.exists(path):
        if not os.path.isdir(job_dir):
            print(f"job: no job at {job_dir}", file=sys.stderr)
            return 2
        if not wait or exit_status(job_dir) is not None:
            return exit_status(job_dir) or 0
        time.sleep(POLL_S)
    quiet_checks = 0
    with open(path, "rb") as fh:
        fh.seek(offset)
        while True:
            chunk = fh.read(1 << 16)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            code = exit_status(job_dir)
            if code is not None:
                rest = fh.read()  # written between our last read and the exit file
                if rest:
                    out.write(rest)
                    out.flush()
                return code
            if not wait:
                return 0
            quiet_checks += 1
            if quiet_checks % 20 == 0 and state_of(job_dir)["state"] == "lost":
                return LOST
            time.sleep(POLL_S)


def state_of(job_dir: str) -> dict[str, Any]:
    """One job's state on this node: running | exited | cancelled | lost."""
    meta = _read_json(os.path.join(job_dir, META)) or {}
    pids = _read_pids(job_dir)
    # The supervisor's life before its exit record (written before it ends): read the other
    # way round, a job that ended between the two reads was "lost" (its follower exited 255).
    running = pids is not None and alive(pids[1])
    ended = _read_json(os.path.join(job_dir, EXIT))
    cancelled = os.path.exists(os.path.join(job_dir, CANCELLED))
    try:
        log_bytes = os.path.getsize(os.path.join(job_dir, LOG))
    except OSError:
        log_bytes = 0
    if ended is not None:
        state = "cancelled" if cancelled else "exited"
    elif pids is None:
        # between `start` writing meta.json and the supervisor writing its pids (a moment)
        state = "running" if time.time() - float(meta.get("started", 0)) < 30 else "lost"
    else:
        state = "running" if running else "lost"
    return {"state": state, "exit_code": None if ended is None else ended.get("code"),
            "started": meta.get("started"), "ended": None if ended is None else ended.get("ended"),
            "log_bytes": log_bytes}


def cancel(job_dir: str, grace: float) -> int:
    """TERM to every process of the job, KILL after `grace` s; returns once its supervisor
    wrote the exit record (`status` says cancelled), or is gone. Idempotent."""
    if not os.path.isdir(job_dir):
        return 0
    with contextlib.suppress(OSError):
        open(os.path.join(job_dir, CANCELLED), "a").close()
    pids = _read_pids(job_dir)
    if pids is not None and exit_status(job_dir) is None:
        stop_job(pids[0], pids[1], grace)
        deadline = time.monotonic() + 30  # its sweep and reap after the group ended: < 1 s
        while (exit_status(job_dir) is None and alive(pids[1])
               and time.monotonic() < deadline):
            time.sleep(0.05)
    return 0


def idle(pidfile: str) -> int:
    """0 when the node's current-job pidfile names no live supervisor; else BUSY, saying
    so on stderr. The workdir sync runs this right before it replaces the workdir, so files
    are never replaced under a running job, whoever started it."""
    pids = _read_pids_file(pidfile)
    if pids is None or not alive(pids[1]):
        return 0
    print(f"a job is still running on this node (process group {pids[0]})", file=sys.stderr)
    return BUSY


def _status(args: argparse.Namespace) -> int:
    jobs: dict[str, Any] = {}
    if os.path.isdir(args.jobs):
        for name in sorted(os.listdir(args.jobs)):
            path = os.path.join(args.jobs, name)
            if os.path.isdir(path):
                jobs[name] = state_of(path)
    print(json.dumps(jobs))
    return 0


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start")
    start.add_argument("--dir", required=True)
    start.add_argument("--cwd", default=None)
    start.add_argument("--pidfile", default=None)
    start.add_argument("--attach", action="store_true")
    start.add_argument("--survive-eof", action="store_true")
    start.add_argument("--grace", type=float, default=10.0)
    start.add_argument("--then", default=None)
    start.add_argument("--then-after", type=float, default=0.0)
    start.add_argument("--preempt", nargs=3, metavar=("PROTOCOL", "URL", "SIGNAL"))
    start.add_argument("--container", default=None, help="the job runs in this container")
    start.add_argument("cmd", nargs=argparse.REMAINDER)
    fol = sub.add_parser("follow")
    fol.add_argument("--dir", required=True)
    fol.add_argument("--offset", type=int, default=0)
    fol.add_argument("--no-wait", action="store_true")
    fol.add_argument("--end-line", action="store_true")
    st = sub.add_parser("status")
    st.add_argument("--jobs", required=True)
    can = sub.add_parser("cancel")
    can.add_argument("--dir", required=True)
    can.add_argument("--grace", type=float, default=10.0)
    sub.add_parser("idle").add_argument("--pidfile", required=True)
    args = parser.parse_args(argv)
    if args.action == "start":
        code = _start(args)
        if args.attach:  # never join the stdin watcher (it may sit in a blocking read)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    if args.action == "follow" and args.end_line:
        return tail(args.dir, args.offset)
    if args.action == "follow":
        return follow(args.dir, args.offset, sys.stdout.buffer, wait=not args.no_wait)
    if args.action == "status":
        return _status(args)
    if args.action == "idle":
        return idle(args.pidfile)
    return cancel(args.dir, args.grace)
