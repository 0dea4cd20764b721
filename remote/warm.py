"""A warm spare's launcher (issue 44; the controller's side: provision/job/warmspares.py).

With `--spares K` and resident ranks (remote/resident.py), every ready spare runs this as its
part of the job, under `job start` like any node's launcher: it imports torch and torchrun's
agent, says so, and waits. When a node is lost and the spare takes its rank, the controller's
word names the launcher's words and the newcomer's variables; torchrun then runs in this
process, so the agent and the workers it forks (`--start_method fork`) start with torch
imported: what is left of a resident restart is the rendezvous, the group's formation and
the training function's first step, not an interpreter and `import torch` (1-2 s on a quiet
2-core machine, 8 s under load: benchmarks/recovery_time.py).

    warm wait --word FILE
        the launcher: imports torchrun's agent and what a training script's first lines
        would (`preloads`: torch._dynamo, the job's MGPU_WARM_IMPORTS), then prints `MGPU-EVENT {"event": "warm", "phase": "ready", ...}` once torch is
        imported, then polls FILE; its word {"argv": ["torchrun", ...], "env": {...}}: the
        variables set, then torchrun's `main(argv[1:])` as its console script runs it (its
        exit status is this part of the job's). Stopped like any job (`stop`): TERM ends it.
    warm promote --word FILE [--env NAME=VALUE ...] -- torchrun ARGS
        the controller's word, written atomically; exit 3 (nothing written) when no launcher
        waits for it (never started, or ended: FILE.pid names no live process): the
        controller then starts the newcomer cold, as without a warm spare.

Only torchrun (static ranks) is run this way: the word's argv must start with "torchrun".
Standard library only at import; `wait` imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from typing import Any

from remote.files import write_atomic
from remote.jobs import alive

EVENT_PREFIX = "MGPU-EVENT "  # remote/supervise.py's: the controller reads one stream
POLL_S = 0.02
NOT_WAITING = 3


def _pid_alive(path: str) -> bool:
    """Whether the process named in `path` runs (remote/jobs.alive: a zombie does not)."""
    try:
        with open(path) as fh:
            pid = int(fh.read().strip() or "0")
    except (OSError, ValueError):
        return False
    return pid > 0 and alive(pid)


def preloads(env: dict[str, str] | os._Environ[str]) -> list[str]:
    """What the launcher imports besides torchrun's agent: torch._dynamo (torch.optim imports
    it at a script's first optimizer: 0.9 s on a quiet 2-core node, on the restart's critical
    path) and the job's MGPU_WARM_IMPORTS (comma-separated module names: a script's heavy
    libraries, e.g. "transformers,datasets")."""
    extra = [n.strip() for n in env.get("MGPU_WARM_IMPORTS", "").split(",")]
    return ["torch._dynamo", *[n for n in extra if n and all(
        part.isidentifier() for part in n.split("."))]]


def read_word(path: str) -> dict[str, Any] | None:
    """The controller's word in `path`, or None (none yet, or not a word)."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    argv, env = data.get("argv"), data.get("env", {})
    if not (isinstance(argv, list) and argv[:1] == ["torchrun"]
            and all(isinstance(w, str) for w in argv)):
        return None
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        return None
    return data


def wait(word_path: str) -> int:
    """The launcher (module doc): torch imported, then the word awaited and torchrun run."""
    t0, cwd = time.monotonic(), os.getcwd()
    write_atomic(word_path + ".pid", str(os.getpid()), mode=0o644, fsync=False)
    import torch.distributed.run as torchrun  # the agent's module; torch with it

    for name in preloads(os.environ):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - said; the script imports it itself
            sys.stderr.write(f"mgpu-cloud warm: could not import {name}: {exc}\n")

    ready = {"event": "warm", "phase": "ready", "pid": os.getpid(),
             "import_s": round(time.monotonic() - t0, 3)}
    sys.stdout.write(EVENT_PREFIX + json.dumps(ready, sort_keys=True) + "\n")
    sys.stdout.flush()
    while True:
        word = read_word(word_path)
        if word is not None:
            break
        time.sleep(POLL_S)
    # what a launcher started now would see: the job's folder by its path (the spare's
    # bootstrap on promotion unpacks the workdir and remote.pyz again: new inodes)
    os.chdir(cwd)
    importlib.invalidate_caches()  # zipimport reads remote.pyz's table of contents again
    os.environ.update(word.get("env", {}))
    argv = list(word["argv"])
    sys.argv = argv[:]  # as `torchrun ARGS` would see them
    torchrun.main(argv[1:])  # a failed worker raises (exit 1 with its traceback), as there
    return 0


def _set_aside(job_dir: str) -> None:
    """A launcher that ended before its word leaves its job's folder (its log: why it ended);
    moved aside (to FOLDER.warm, an older one replaced) so that the newcomer's cold start
    under the same job id finds none."""
    if not os.path.isdir(job_dir):
        return
    aside = job_dir.rstrip("/") + ".warm"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(job_dir, aside)


def promote(word_path: str, env: list[str], argv: list[str]) -> int:
    if argv[:1] != ["torchrun"]:
        print("remote.pyz warm promote: the launcher's words must start with torchrun",
              file=sys.stderr)
        return 2
    pairs = dict(e.split("=", 1) for e in env if "=" in e)
    if not _pid_alive(word_path + ".pid"):
        _set_aside(os.path.dirname(word_path))
        print(json.dumps({"promoted": False, "why": "no warm launcher waits here"}))
        return NOT_WAITING
    write_atomic(word_path, json.dumps({"argv": argv, "env": pairs}), mode=0o600, fsync=False)
    print(json.dumps({"promoted": True}))
    return 0


def main(command: str, argv: list[str]) -> int:
    words = argv[argv.index("--") + 1:] if "--" in argv else []
    head = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("wait").add_argument("--word", required=True)
    pr = sub.add_parser("promote")
    pr.add_argument("--word", required=True)
    pr.add_argument("--env", action="append", default=[])
    args = ap.parse_args(head)
    path = os.path.expanduser(args.word)
    if args.action == "wait":
        return wait(path)
    return promote(path, args.env, words)
