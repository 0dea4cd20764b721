"""Entry point on the nodes: `python3 remote.pyz COMMAND ...` (stdlib only at import).

Each command lives in its own module, imported only when called.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "stop": ("remote.supervise", "stop the running job, all of it (TERM, then KILL)"),
    "signal": ("remote.supervise", "send a signal to the running job's processes that handle it"),
    "preflight": ("remote.preflight", "report GPUs, topology, versions, disk, addresses"),
    "allreduce": ("remote.allreduce", "all-reduce bandwidth benchmark (run under torchrun)"),
    "stacks": ("remote.stacks", "print the Python stacks of a running job's processes"),
    "ckpt-manifest": ("remote.ckpt", "list the checkpoint folder (sizes, times) as JSON"),
    "monitor": ("remote.monitor", "GPU/CPU/memory/load samples, one JSON line each"),
    "job": ("remote.jobs", "start / follow / status / cancel a job that outlives its session"),
    "store": ("remote.storesync", "push files to / pull a folder from a durable store (s3, gs, file)"),
    "script": ("remote.script", "the job's script in this process, as python would run it"),
    "injob": ("remote.injob", "the fabric gate in the job's own processes, then its script"),
    "resident": ("remote.resident", "tell this node's resident ranks to re-form with a newcomer"),
    "warm": ("remote.warm", "a warm spare's launcher: torch imported, waiting for a lost rank"),
    "warmhost": ("remote.warmhost", "the node's warm launcher: torchrun agents forked, not started"),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # A launcher that runs `python PROGRAM --local_rank=N ARGS` (DeepSpeed's) puts its words
    # before the command: `injob` hands them to the job's script, in the same place.
    lead = []
    while args and args[0].startswith("--local_rank=") and "injob" in args:
        lead.append(args.pop(0))
    if lead and args[0] == "injob":
        args[1:1] = lead
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        width = max(len(c) for c in COMMANDS)
        print("usage: remote.pyz COMMAND [ARGS]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<{width}}  {text}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    code: int = module.main(args[0], args[1:])
    return code
