# Loaded by every Python process of a job started by mgpu-cloud (its folder is first on
# PYTHONPATH), so user scripts need no change for what it does:
# - SIGUSR2 makes the process write all its threads' stacks to stderr, which is how
#   `remote.pyz stacks` shows where a hung rank is when py-spy is not installed;
# - at exit, a default process group the script left initialised is destroyed while the
#   interpreter is still whole. Left to the interpreter's own shutdown, gloo's threads outlive
#   the objects they use and a rank that finished its work aborts about one run in ten
#   ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291).
#   MGPU_EXIT_DESTROY_PG=0 leaves the group to the interpreter, as before;
# - stdout and stderr write a line at a time. The job runs with PYTHONUNBUFFERED=1 (output
#   streams at once, also from a process that never loads this file), which makes every
#   `print("rank", r, "loss", x)` up to eight writes: the ranks of a node share one pipe, so
#   their lines came out interleaved word by word ("rank 3rank  omp2  1omp"). Line buffering
#   keeps a line whole until its newline (or an explicit flush);
# - a launcher's own process (torchrun's agent, DeepSpeed's runner and per-node launcher,
#   accelerate launch) hands its objects to the collector's permanent generation as its
#   last exit handler: with torch loaded, the shutdown's collections walk some 165,000
#   objects the process is about to drop anyway, about 0.37 s of CPU on every node at the
#   end of every launch (a process that imports torch and exits, in a node container: 1.38 ->
#   1.00 s, medians of 4). Launchers only: a user's script may count on cyclic garbage
#   being finalised at exit (a file in a cycle is flushed then). MGPU_EXIT_FREEZE=0: off;
# - torchrun's agent that forks the ranks (`--run_path --start_method fork`, what the tool asks
#   for: provision/job/launchers/torchrun.py) imports here, with the collector off, torchrun
#   and what a warm spare's launcher imports (remote/warm.py's preloads: torch._dynamo, which
#   DDP's constructor and the first optimizer import in every rank, and the job's
#   MGPU_WARM_IMPORTS), then hands those objects to the permanent generation (as
#   remote/injob.py does for the gate): the ranks it forks inherit them, and their collections
#   (their end's too: remote/script.py flushes files and collects, 0.2 s of CPU per rank over
#   torch's 300,000 objects) walk only what the script made. A node's torchrun of 2 DDP ranks:
#   4.2 CPU-s spawned, 2.8 forked, 1.9 forked from a frozen agent, 1.4 with torch._dynamo too
#   (MGPU_EXIT_FREEZE=0: off too);
# - the tool's node package (remote.pyz, beside this folder) is importable, last on the path
#   (a module of the job's own named `remote` comes first): a script opts in to resident
#   restarts with `from remote.resident import run` (issue 44).
import atexit
import faulthandler
import os
import signal
import sys

faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=False)

_PYZ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "remote.pyz")
if os.path.isfile(_PYZ) and _PYZ not in sys.path:
    sys.path.append(_PYZ)

# (program name, or the end of its path) of the launchers' processes
_LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "torch/distributed/run.py",
              "deepspeed/launcher/launch.py", "deepspeed/launcher/runner.py")


def _freezing_in(names=_LAUNCHERS):
    # this process is one of these launchers, and MGPU_EXIT_FREEZE is not 0
    program = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    return os.environ.get("MGPU_EXIT_FREEZE", "1") != "0" and any(
        program == name or program.endswith("/" + name) for name in names)


def _import_frozen_in_a_forking_agent():
    argv = sys.argv[1:]
    forks = "--start_method" in argv and argv[argv.index("--start_method") + 1:][:1] == ["fork"]
    agent = _freezing_in(("torchrun", "torch/distributed/run.py"))
    if not (forks and "--run_path" in argv and agent):
        return
    import gc
    import importlib

    gc.disable()
    try:
        import torch.distributed.run  # noqa: F401

        from remote.warm import preloads  # what a warm spare's launcher imports too

        for name in preloads(os.environ):
            try:
                importlib.import_module(name)
            except Exception:  # the script's own import of it says what is wrong
                pass
    except Exception:  # torchrun itself says what is wrong with its torch
        return
    finally:
        gc.enable()
    gc.freeze()


def _freeze_a_launcher_at_exit():
    # run last: after every other exit handler
    if not _freezing_in():
        return
    import gc

    gc.freeze()


for _stream in (sys.stdout, sys.stderr):
    try:
        _stream.reconfigure(line_buffering=True, write_through=False)
    except (AttributeError, ValueError, OSError):  # replaced or closed: leave it as it is
        pass


def _destroy_default_process_group():
    # atexit runs handlers last-registered first: this one, registered before the script
    # ran, comes after the script's own (which may still use the group).
    dist = sys.modules.get("torch.distributed")
    if dist is None or os.environ.get("MGPU_EXIT_DESTROY_PG", "1") == "0":
        return
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return
        import gc

        gc.collect()  # a DDP model nobody holds any more lets go of the group first
        dist.destroy_process_group()
    except Exception as exc:  # never turn a finished job into a failed one
        print(f"mgpu-cloud sitecustomize: destroy_process_group at exit: {exc}",
              file=sys.stderr)


def register_exit_handlers():
    # the freeze first, so it runs last (atexit: last in, first out); both before the script's
    # own. remote/injob.py calls this again in a worker torchrun forked from its agent, after
    # dropping the agent's handlers.
    atexit.register(_freeze_a_launcher_at_exit)
    atexit.register(_destroy_default_process_group)


register_exit_handlers()
_import_frozen_in_a_forking_agent()
