"""`stacks`: print the Python stack of every process of a running job (a hang's evidence).

    remote.pyz stacks --pidfile F [--container NAME]
    remote.pyz stacks --all            (inside a job's container: every process there)

For each process of the job (remote/supervise.py: the supervisor's descendants) that runs
Python: `py-spy dump --pid P` when py-spy is installed, else SIGUSR2 + SIGCONT: every job
process loads the tool's sitecustomize, which registers faulthandler for SIGUSR2, so the
process writes all its threads' stacks to its own stderr (the job's log). SIGCONT first
resumes a process that was stopped (SIGSTOP), so even a frozen rank reports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time

from remote.supervise import everything_here, job_pids, read_pidfile


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def in_container_stacks(container: str) -> int:
    res = subprocess.run(["sudo", "-n", "docker", "exec", container, "python3",
                          "/mgpu/remote.pyz", "stacks", "--all"], capture_output=True,
                         text=True, timeout=120)
    print(res.stdout + res.stderr, end="", flush=True)
    return 0


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--pidfile")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--container", default=None)
    parser.add_argument("--wait", type=float, default=1.5, help="seconds for stacks to appear")
    args = parser.parse_args(argv)
    if args.container:  # the job's processes live in its container
        return in_container_stacks(args.container)
    if args.all:
        pids = everything_here()
    else:
        found = read_pidfile(args.pidfile) if args.pidfile else None
        if found is None:
            print("stacks: no running job")
            return 0
        pids = job_pids(*found)
    pyspy = shutil.which("py-spy")
    signalled = 0
    for pid in pids:
        cmd = _cmdline(pid)
        if "python" not in cmd.split(" ", 1)[0] and " -m " not in cmd and ".py" not in cmd:
            continue
        print(f"=== stack of pid {pid}: {cmd[:200]}", flush=True)
        if pyspy:
            res = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True,
                                 text=True, timeout=30)
            if res.returncode == 0:
                print(res.stdout, flush=True)
                continue
        try:
            os.kill(pid, signal.SIGUSR2)  # faulthandler (registered by sitecustomize)
            os.kill(pid, signal.SIGCONT)  # a stopped process handles it as it resumes
            signalled += 1
        except ProcessLookupError:
            continue
    if signalled:
        print(f"stacks: {signalled} process(es) write their stacks to the job's output",
              flush=True)
        time.sleep(args.wait)
    return 0
