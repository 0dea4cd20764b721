"""A job as a whole: find, signal and stop every process of it.

A job's supervisor (remote/jobs.py) is a child subreaper (prctl PR_SET_CHILD_SUBREAPER):
every process the job starts, even in sessions of its own (torchrun's workers) or orphaned
when its parent dies, stays its descendant, so "the job" is exactly the supervisor's
descendants. The supervisor records "PGID SUPERVISOR_PID" in the cluster's pidfile.

    stop --pidfile F [--grace S]
         TERM to every process of the job, KILL after S seconds (a stopped process is
         continued so it can act on TERM). Idempotent: no pidfile or process -> exit 0.
    signal --pidfile F --signal SIG
         SIG to every process of the job that handles it (e.g. SIGUSR1: "save a checkpoint
         now"); processes without a handler (the launcher) are left alone.

`watch_preemption` runs in the supervisor with `job start --preempt PROTOCOL URL SIGNAL`: it
polls the metadata service (remote/preempt.py); on a notice it signals the job like `signal`
and prints one line `MGPU-EVENT {"event": "preemption", ...}` into the job's output, which
tells the controller.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
EVENT_PREFIX = "MGPU-EVENT "
PREEMPT_POLL_S = 1.0


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: process-group signalling still reaches most of the job


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux /proc)."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            out[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(root: int) -> list[int]:
    """Every live descendant of `root` (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def read_pidfile(path: str) -> tuple[int, int | None] | None:
    """(job's process group, supervisor pid) from `run`'s pidfile, or None."""
    try:
        with open(path) as fh:
            words = fh.read().split()
        return int(words[0]), int(words[1]) if len(words) > 1 else None
    except (OSError, ValueError, IndexError):
        return None


def job_pids(pgid: int, supervisor: int | None) -> list[int]:
    """The job's processes: the supervisor's descendants (it is a subreaper); without one,
    the process group's members."""
    if supervisor is not None:
        return [p for p in descendants(supervisor) if p != os.getpid()]
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return []
    return [pgid]


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def notify(pgid: int, supervisor: int | None, sig: int) -> int:
    """Send `sig` to the job's processes that handle it (the ranks of a script that asked
    for it); the others are left alone: to a launcher (torchrun) or a data-loader worker
    without a handler, SIGUSR1 would be fatal. Returns how many were signalled."""
    targets = [p for p in job_pids(pgid, supervisor) if catches(p, sig)]
    _send(targets, sig)
    return len(targets)


def stop_job(pgid: int, supervisor: int | None, grace: float) -> None:
    """TERM (and CONT, for stopped processes) to the whole job; KILL what is left after
    `grace` seconds."""
    pids = job_pids(pgid, supervisor)
    if supervisor is None:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
    _send(pids, signal.SIGTERM)
    _send(pids, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not job_pids(pgid, supervisor):
            return
        time.sleep(0.1)
    _send(job_pids(pgid, supervisor), signal.SIGKILL)
    if supervisor is None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap() -> None:
    """Collect exit statuses of adopted orphans (we are their subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def watch_preemption(protocol: str, url: str, signame: str, pgid: int, me: int) -> None:
    """Poll for a notice; on the first one, signal the job's processes and tell the
    controller (one line on our stdout, which is the job's output stream)."""
    import json

    from remote.preempt import check

    sig = getattr(signal, signame if signame.startswith("SIG") else f"SIG{signame}")
    while True:
        notice = check(protocol, url)
        if notice is not None:
            told = notify(pgid, me, sig)
            event = {"event": "preemption", "action": notice.action, "time": notice.time,
                     "source": notice.source, "signal": sig.name, "processes": told}
            sys.stdout.write("\n" + EVENT_PREFIX + json.dumps(event) + "\n")
            sys.stdout.flush()
            return
        time.sleep(PREEMPT_POLL_S)


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    if command == "signal":
        parser.add_argument("--signal", required=True)
    args = parser.parse_args(argv)
    found = read_pidfile(args.pidfile)
    if found is None:
        return 0
    pgid, supervisor = found
    if command == "signal":
        name = args.signal.upper()
        told = notify(pgid, supervisor, getattr(signal, name if name.startswith("SIG")
                                               else f"SIG{name}"))
        print(f"signalled {told} process(es)")
        return 0
    stop_job(pgid, supervisor, args.grace)
    return 0
