"""`stacks`: print the Python stack of every process of a running job (a hang's evidence).

    remote.pyz stacks --pidfile F

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

from remote.supervise import job_pids, read_pidfile


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--wait", type=float, default=1.5, help="seconds for stacks to appear")
    args = parser.parse_args(argv)
    found = read_pidfile(args.pidfile)
    if found is None:
        print("stacks: no running job")
        return 0
    pyspy = shutil.which("py-spy")
    signalled = 0
    for pid in job_pids(*found):
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
