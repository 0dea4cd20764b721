"""Run a job command in its own process group, so it can be stopped as a whole.

    run  --pidfile F [--watch-stdin] [--cwd D] -- CMD ...
         starts CMD in a new session, writes its process-group id to F, forwards TERM/INT/HUP
         to the group, exits with CMD's exit code. With --watch-stdin, end of stdin (the
         controller's SSH channel closed: it crashed, or the user pressed Ctrl-C) stops the
         group too, so no training process outlives its controller.
    stop --pidfile F [--grace S]
         TERM to the group, KILL after S seconds. Idempotent: no pidfile, no process -> exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import NoReturn


def _kill_group(pgid: int, grace: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("supervise run: no command given", file=sys.stderr)
        return 2
    proc = subprocess.Popen(cmd, cwd=args.cwd, start_new_session=True, stdin=subprocess.DEVNULL)
    pgid = proc.pid
    os.makedirs(os.path.dirname(os.path.abspath(args.pidfile)), exist_ok=True)
    with open(args.pidfile, "w") as fh:
        fh.write(f"{pgid}\n")

    stopping = threading.Event()

    def stop(*_: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=_kill_group, args=(pgid, args.grace), daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stop())

    if args.watch_stdin:
        def watch() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            stop()

        threading.Thread(target=watch, daemon=True).start()

    try:
        code = proc.wait()
    finally:
        try:
            os.unlink(args.pidfile)
        except FileNotFoundError:
            pass
    # Whatever the leader did, leave no member of its group behind.
    _kill_group(pgid, 0.5)
    return code if code >= 0 else 128 - code


def _exit_now(code: int) -> NoReturn:
    """Exit without joining the stdin watcher (it may sit in a blocking read forever)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop(args: argparse.Namespace) -> int:
    try:
        with open(args.pidfile) as fh:
            pgid = int(fh.read().strip())
    except (FileNotFoundError, ValueError):
        return 0
    _kill_group(pgid, args.grace)
    return 0


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    if command == "run":
        parser.add_argument("--watch-stdin", action="store_true")
        parser.add_argument("--cwd", default=None)
        parser.add_argument("cmd", nargs=argparse.REMAINDER)
        _exit_now(_run(parser.parse_args(argv)))
    return _stop(parser.parse_args(argv))
