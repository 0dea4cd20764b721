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
#   keeps a line whole until its newline (or an explicit flush).
import atexit
import faulthandler
import os
import signal
import sys

faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=False)

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


atexit.register(_destroy_default_process_group)
