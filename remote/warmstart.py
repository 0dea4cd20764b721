"""A job's start through the node's warm launcher (remote/warmhost.py, whose doc says what it
is and what it saves): which launcher may serve a job (`plan`: its variables but LATE, its
python), and `hand_over`, which asks it (starting it when none runs) to fork the job's
supervisor. Stdlib only.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

READY_S = 180.0  # how long a start waits for a new launcher's imports (then: afresh)
BUSY = 3  # `serve`'s exit: another launcher holds this socket's lock
PAD = " " * 4096
LATE = ("SSH_", "MGPU_RESTART_COUNT", "MGPU_NODE_RANK", "MGPU_RESIDENT_", "MASTER_ADDR",
        "MASTER_PORT", "PWD", "OLDPWD", "SHLVL", "_")
OFF = "MGPU_WARM_LAUNCHER"
SOCKET_MAX = 100  # sun_path holds 108 bytes


def _late(name: str) -> bool:
    return any(name.startswith(p) if p.endswith("_") and len(p) > 1 else name == p
               for p in LATE)


def key(env: dict[str, str], python: str) -> str:
    """The launcher a job with `env` may use: its python and every variable but LATE."""
    kept = sorted((k, v) for k, v in env.items() if not _late(k))
    limits = [resource_limit(n) for n in ("RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_STACK")]
    text = json.dumps([python, kept, limits, os.getuid()])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def resource_limit(name: str) -> list[int]:
    import resource

    return list(resource.getrlimit(getattr(resource, name)))


def shebang_python(torchrun: str) -> str | None:
    """The interpreter `torchrun` runs with (its first line), or None."""
    try:
        with open(torchrun, "rb") as fh:
            first = fh.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if len(words) == 1 and os.path.isabs(words[0]) and os.access(words[0], os.X_OK):
        return words[0]
    return None


def plan(cmd: list[str], env: dict[str, str]) -> tuple[str, str, str] | None:
    """(socket, python, remote.pyz) for a job that a warm launcher may start, else None:
    a bare `torchrun` line, run from remote.pyz, not switched off, a plain torchrun script."""
    pyz = os.path.abspath(sys.argv[0]) if sys.argv else ""
    if cmd[:1] != ["torchrun"] or env.get(OFF, "1") == "0" or not pyz.endswith(".pyz"):
        return None
    found = shutil.which("torchrun", path=env.get("PATH"))
    python = shebang_python(found) if found else None
    if python is None:
        return None
    path = os.path.join(os.path.dirname(pyz), "warm", key(env, python) + ".sock")
    return (path, python, pyz) if len(path) <= SOCKET_MAX else None


def hand_over(args: argparse.Namespace, cmd: list[str], report: int) -> bool:
    """Ask a warm launcher (started here when none runs) to fork this job's supervisor, which
    reports on `report` as remote/jobs.py's own does. False: nothing was started (no launcher
    for this job, it could not come up, or it said no): the caller starts the job afresh.
    Once the request is sent, only the launcher's own "no" is False: whatever else (no answer,
    a launcher that died) the report pipe tells, so a job is never started twice."""
    env = dict(os.environ)
    where = plan(cmd, env)
    if where is None:
        return False
    path, python, pyz = where
    try:
        conn = _connect(path) or _start(path, python, pyz)
    except OSError:  # its folder cannot be made, the python cannot run: afresh
        return False
    if conn is None:
        return False
    title = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]  # 3.10+: as typed
    request = {"args": vars(args), "cmd": cmd, "env": env, "title": title,
               "cwd": args.cwd or os.getcwd(), "python": python}
    with conn:
        try:
            conn.settimeout(60)
            conn.sendmsg([json.dumps(request).encode() + b"\n"],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [report]))])
        except OSError:
            return False  # not sent: nothing started
        try:
            reply = json.loads(conn.makefile("rb").readline() or b"{}")
        except (OSError, ValueError):
            return True
    return not (isinstance(reply, dict) and reply.get("ok") is False)


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def _start(path: str, python: str, pyz: str) -> socket.socket | None:
    """A launcher for `path`, started with this job's variables; its socket once it answers
    (None: it ended, e.g. torch does not import, or READY_S passed)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.stat(folder).st_uid != os.getuid():
        return None  # not ours: nobody else's folder holds our launchers
    os.chmod(folder, 0o700)
    with open(path[:-len(".sock")] + ".log", "ab") as log:
        proc = subprocess.Popen([python, pyz, "warmhost", "serve", "--socket", path, PAD],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=folder, start_new_session=True)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if proc.poll() not in (None, BUSY):  # another start's launcher took the lock: wait
            return None
        time.sleep(0.05)
    return None
