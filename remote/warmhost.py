"""The node's warm launcher: a bare torchrun job's agent forked from a process that has
imported torch once (issue 45; the job's side: remote/warmstart.py).

A torchrun agent costs every node ~1.9 CPU-s before its first rank runs: an interpreter,
`import torch`, and torch._dynamo (the ranks' first optimizer needs it, so the node's
sitecustomize imports it in a forking agent and the ranks inherit it). The first torchrun job
on a node starts this launcher with the job's own variables and has its agent forked from it;
every later job (a restart, the next launch) whose variables are the same gets its agent
forked too: 0.05 CPU-s and 0.13 s in a quiet node container, against 1.26 CPU-s and 1.35 s
for `torchrun` run afresh (the same 2-rank job).

    warmhost serve --socket S [PAD]
        imports torchrun's agent and what a forking agent's sitecustomize imports
        (remote/warm.py preloads), then answers on the unix socket S (0600, its folder 0700):
        each request forks a supervisor (remote/jobs.py, in a session of its own) whose job
        is torchrun's main() in a child that looks like `torchrun ARGS` run afresh: its own
        session, the job's folder, variables, argv and /proc cmdline (PAD: spaces that keep
        room for it), stdin /dev/null. Ends after IDLE_S without a request, when its socket
        is gone (the cluster's folder removed: `down` of an ssh cluster), or when what it
        imported changed on disk (torch, remote.pyz, sitecustomize: that request is refused).

Which launcher serves a job is decided by its variables: every one but LATE (the session's,
and the tool's per-launch ones that only the job's own code reads) is part of the socket's
name, so a job whose variables differ in anything torch could read at import (OMP_NUM_THREADS,
TORCH_*, PYTHONPATH, the user's --env) never gets another's state. MGPU_WARM_LAUNCHER=0 (the
job's --env): every start afresh. Stdlib only at import; `serve` imports torch.
"""

from __future__ import annotations

import argparse
import array
import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time
from typing import Any

from remote import jobs
from remote.files import write_atomic
from remote.supervise import reap
from remote.warmstart import BUSY

IDLE_S = 300.0  # a launcher nobody asked for this long ends (its memory: ~300 MB)


# --- the launcher ----------------------------------------------------------------------------
def _stamp(pyz: str, preloaded: list[str]) -> list[Any]:
    """What the launcher's imports came from (torch, remote.pyz, the node's sitecustomize, the
    preloaded modules): changed on disk -> it is stale."""
    import torch

    files = [torch.__file__, os.path.join(os.path.dirname(torch.__file__), "version.py"), pyz]
    for name in ["sitecustomize", *preloaded]:
        files.append(getattr(sys.modules.get(name), "__file__", None) or name)
    out: list[Any] = []
    for path in files:
        try:
            st = os.stat(path)
            out.append([path, st.st_ino, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([path, None])
    return out


def serve(path: str) -> int:
    lock = os.open(path[:-len(".sock")] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return BUSY
    t0 = time.monotonic()
    gc.disable()  # as sitecustomize's forking agent: these objects go to the permanent generation
    import torch.distributed.run  # noqa: F401 - the agent's module; torch with it

    from remote.warm import preloads

    names = preloads(os.environ)
    for name in names:
        with contextlib.suppress(Exception):  # the script's own import says what is wrong
            importlib.import_module(name)
    gc.enable()
    gc.freeze()
    pyz = os.path.abspath(sys.argv[0])
    stamp = _stamp(pyz, names)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o600)
    bound = os.stat(path).st_ino
    srv.listen(16)
    print(f"warm launcher ready in {time.monotonic() - t0:.2f} s (pid {os.getpid()})", flush=True)
    idle_until = time.monotonic() + IDLE_S
    while time.monotonic() < idle_until and _still_ours(path, bound):
        reap()  # the supervisors it forked, once they end
        if not select.select([srv], [], [], 1.0)[0]:
            continue
        conn, _ = srv.accept()
        with conn:
            if not _answer(conn, srv, lock, stamp == _stamp(pyz, names)):
                break
        idle_until = time.monotonic() + IDLE_S
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == bound:  # not a newer launcher's
            os.unlink(path)
    return 0


def _still_ours(path: str, bound: int) -> bool:
    """Whether our socket is still where starts look for it: `down` of an ssh cluster removes
    the cluster's folder (and so ends its launchers within a second), a newer launcher may
    have replaced it."""
    try:
        return os.stat(path).st_ino == bound
    except OSError:
        return False


def _answer(conn: socket.socket, srv: socket.socket, lock: int, fresh: bool) -> bool:
    """One request: fork its supervisor, say so. False: this launcher is stale and ends. Only
    this launcher's own user is answered (its folder is 0700 too)."""
    conn.settimeout(30)
    if peer_uid(conn) != os.getuid():
        return True
    fds = array.array("i")
    try:
        data, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(fds.itemsize))
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(raw[:len(raw) - len(raw) % fds.itemsize])
        while not data.endswith(b"\n"):
            more = conn.recv(1 << 16)
            if not more:
                raise ValueError("cut short")
            data += more
        request = json.loads(data)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return True
    if not fresh or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        why = "what it imported changed on disk since it started" if not fresh else "no report"
        conn.sendall(json.dumps({"ok": False, "why": why}).encode() + b"\n")
        return fresh
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the supervisor, in the forked process
        try:
            srv.close()
            conn.close()
            os.close(lock)
            _supervise(request, fds[0])
        finally:
            os._exit(1)
    os.close(fds[0])
    conn.sendall(json.dumps({"ok": True, "pid": pid}).encode() + b"\n")
    return True


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's user (SO_PEERCRED: pid, uid, gid), None where unknown."""
    try:
        return int(struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1])
    except (OSError, AttributeError, struct.error):
        return None


def _supervise(request: dict[str, Any], report: int) -> None:
    os.setsid()
    set_cmdline(request["title"], "python3")  # as the start's own fork would show: its words
    args = argparse.Namespace(**request["args"])
    if os.path.exists(os.path.join(args.dir, jobs.CANCELLED)):  # while its launcher started
        write_atomic(os.path.join(args.dir, jobs.EXIT), mode=0o644, data=json.dumps(
            {"code": 128 + signal.SIGTERM, "ended": time.time()}))
        os.write(report, b"error cancelled before it started\n")
        return
    env, cwd, python = request["env"], request["cwd"], request["python"]
    jobs.supervise(args, request["cmd"], report,
                   spawn=lambda cmd: Forked(_agent(cmd, env, cwd, python, report)))


class Forked:
    """The forked agent, as the supervisor waits for a Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self) -> int:
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])  # EINTR: retried (PEP 475)


def _agent(cmd: list[str], env: dict[str, str], cwd: str, python: str, report: int) -> int:
    """Fork the job's agent: `torchrun ARGS` as if run afresh (module doc); the supervisor's
    `report` pipe is not its (the start reads that pipe to its end). Returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 127  # pragma: no cover - below runs in the forked agent
    try:
        _become_torchrun(cmd, env, cwd, python, report)
    except OSError as exc:  # as a Popen that cannot start it: said in the job's log
        sys.stderr.write(f"job: cannot start {cmd[0]!r}: {exc}\n")
    else:
        code = _console(cmd[1:])
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _become_torchrun(cmd: list[str], env: dict[str, str], cwd: str, python: str,
                     report: int) -> None:
    """This forked process, made what `torchrun ARGS` started afresh in `cwd` would be."""
    os.close(report)
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    torchrun = shutil.which("torchrun", path=env.get("PATH")) or "torchrun"
    sys.argv = [torchrun, *cmd[1:]]
    pyz, sys.path[0] = sys.path[0], os.path.dirname(torchrun)  # as torchrun's own start
    if pyz not in sys.path:  # last, as the node's sitecustomize puts it
        sys.path.append(pyz)
    set_cmdline([python, torchrun, *cmd[1:]], "torchrun")
    importlib.invalidate_caches()  # zipimport reads remote.pyz's table of contents again


def _console(argv: list[str]) -> int:
    """torchrun's main() as its console script runs it: `sys.exit(main())`."""
    import traceback

    import torch.distributed.run as torchrun

    try:
        torchrun.main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, exit 1
        traceback.print_exc()
        return 1
    return 0


def set_cmdline(words: list[str], comm: str) -> None:
    """This process's /proc cmdline (what ps and pgrep -f see) becomes `words`, cut to the
    room its own argv had (the launcher's PAD), and its name `comm`. Linux only."""
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5))
        raw = "\0".join(words).encode()[:end - start - 1]
        ctypes.memmove(start, raw + b"\0" * (end - start - len(raw)), end - start)
        libc = ctypes.CDLL(None)
        libc.prctl(15, comm.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    sub = parser.add_subparsers(dest="action", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--socket", required=True)
    srv.add_argument("pad", nargs="*")
    args = parser.parse_args(argv)
    return serve(args.socket)
