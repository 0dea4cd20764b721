"""A job as a whole: find, signal and stop every process of it.

A job's supervisor (remote/jobs.py) is a child subreaper (prctl PR_SET_CHILD_SUBREAPER):
every process the job starts, even in sessions of its own (torchrun's workers) or orphaned
when its parent dies, stays its descendant, so "the job" is exactly the supervisor's
descendants. The supervisor records "PGID SUPERVISOR_PID" in the cluster's pidfile.

    stop --pidfile F [--grace S]
         TERM to every process of the job, KILL after S seconds (a stopped process is
         continued so it can act on TERM). Idempotent: no pidfile or process -> exit 0.
    signal --pidfile F --signal SIG [--container NAME]
    signal --all --signal SIG
         SIG to every process of the job that handles it (e.g. SIGUSR1: "save a checkpoint
         now"); processes without a handler (the launcher) are left alone, and so are
         `docker`/`sudo`, which would relay it to the launcher. --container: the job runs in
         that container; its processes are reached with `docker exec ... signal --all` (every
         process of the container's pid namespace that handles SIG).

`watch_preemption` runs in the supervisor with `job start --preempt PROTOCOL URL SIGNAL`: it
polls the metadata service (remote/preempt.py); on a notice it signals the job like `signal`
and prints one line `MGPU-EVENT {"event": "preemption", ...}` into the job's output, which
tells the controller. A notice with a deadline far enough ahead (GCP host maintenance on a GPU
VM: an hour) is announced at once (`MGPU-EVENT {"event": "maintenance-scheduled", ...}`, again
when the deadline moves) while the job keeps running; the signal comes SAVE_LEAD_S before the
deadline.
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


# Processes that catch every signal only to pass it on to what they run: `docker run`'s signal
# proxy would hand SIGUSR1 to the container's first process (the launcher), `sudo` likewise.
RELAYS = frozenset({"docker", "sudo"})


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def notify(pgid: int, supervisor: int | None, sig: int, container: str | None = None) -> int:
    """Send `sig` to the job's processes that handle it (the ranks of a script that asked
    for it); the others are left alone: to a launcher (torchrun) or a data-loader worker
    without a handler, SIGUSR1 would be fatal. With `container` (the job runs in that
    container), the processes inside it are found and signalled through `docker exec`.
    Returns how many were signalled."""
    targets = [p for p in job_pids(pgid, supervisor) if catches(p, sig) and
               _comm(p) not in RELAYS]
    _send(targets, sig)
    told = len(targets)
    if container:
        told += in_container(container, "signal", "--all", "--signal", signal.Signals(sig).name)
    return told


def in_container(container: str, *args: str) -> int:
    """`remote.pyz ARGS` inside the job's container (the tool's folder is mounted at /mgpu);
    returns the count it prints ("signalled N process(es)"), 0 when it cannot run."""
    import subprocess

    res = subprocess.run(["sudo", "-n", "docker", "exec", container, "python3",
                          "/mgpu/remote.pyz", *args], capture_output=True, text=True,
                         timeout=60)
    sys.stdout.write(res.stdout)
    words = res.stdout.split()
    return int(words[1]) if res.returncode == 0 and len(words) > 1 and words[1].isdigit() else 0


def everything_here() -> list[int]:
    """Every process of this pid namespace but ourselves (inside a job's container: the
    job)."""
    return [p for p in _parents() if p != os.getpid()]


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


def watch_preemption(protocol: str, url: str, signame: str, pgid: int, me: int,
                     container: str | None = None) -> None:
    """Poll for a notice; on the first one, signal the job's processes and tell the
    controller (one line on our stdout, which is the job's output stream)."""
    from remote.preempt import check, save_at

    sig = getattr(signal, signame if signame.startswith("SIG") else f"SIG{signame}")
    announced: float | None = None  # the deadline last announced
    while True:
        notice = check(protocol, url)
        if notice is not None:
            when = save_at(notice)
            if when <= time.time():
                at = time.time()  # before the signal: a save it asks for is newer (mtime)
                told = notify(pgid, me, sig, container)
                _event({"event": "preemption", "action": notice.action, "time": notice.time,
                        "source": notice.source, "signal": sig.name, "processes": told,
                        "at": at})
                return
            if announced is None or abs((notice.deadline or 0) - announced) > 60:
                announced = notice.deadline
                _event({"event": "maintenance-scheduled", "action": notice.action,
                        "time": notice.time, "source": notice.source,
                        "deadline": notice.deadline, "save_at": when})
        elif announced is not None:
            announced = None
            _event({"event": "maintenance-cleared"})
        time.sleep(PREEMPT_POLL_S)


def _event(event: dict[str, object]) -> None:
    """One line into the job's output that the controller reads (provision/job/watcher.Watcher)."""
    import json

    sys.stdout.write("\n" + EVENT_PREFIX + json.dumps(event) + "\n")
    sys.stdout.flush()


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--pidfile")
    parser.add_argument("--grace", type=float, default=10.0)
    if command == "signal":
        parser.add_argument("--signal", required=True)
        parser.add_argument("--container", default=None)
        parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    if command == "signal":
        name = args.signal.upper()
        sig = getattr(signal, name if name.startswith("SIG") else f"SIG{name}")
        if args.all:
            targets = [p for p in everything_here() if catches(p, sig)]
            _send(targets, sig)
            print(f"signalled {len(targets)} process(es)")
            return 0
    found = read_pidfile(args.pidfile) if args.pidfile else None
    if found is None:
        if command == "signal":
            print("signalled 0 process(es)")
        return 0
    pgid, supervisor = found
    if command == "signal":
        told = notify(pgid, supervisor, sig, args.container)
        print(f"signalled {told} process(es)")
        return 0
    stop_job(pgid, supervisor, args.grace)
    return 0
