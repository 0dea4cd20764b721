"""`script -- SCRIPT ARGS`: the job's script in this process, as `python SCRIPT ARGS` would
run it. What torchrun starts each rank with where its agent forks the workers (`--run_path
--start_method fork`: provision/job/launchers/torchrun.py): the agent has imported torch, so
no rank imports it again. A worker the agent forked is first made to look like a new
interpreter (`as_a_new_process`) and ends like one (`run_script_forked`); started as a new
interpreter, it just runs the script. remote/injob.py (the fabric gate in the job's
processes) starts the script the same way. Stdlib only at import."""

from __future__ import annotations

import atexit
import gc
import io
import itertools
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable


def main(command: str, argv: list[str]) -> int:
    script = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not script:
        print(f"remote.pyz {command}: no script after `--`", file=sys.stderr)
        return 2
    made_new()(script)
    return 0


def made_new() -> Callable[[list[str]], None]:
    """This process made ready to run a script as a new interpreter would, and how to run it:
    a worker torchrun's agent forked is first made to look like a new interpreter and runs it
    with `run_script_forked` (which ends like one); a new interpreter with `run_script`."""
    if forked():
        as_a_new_process()
        return run_script_forked
    return run_script


def run_script(argv: list[str]) -> None:
    """SCRIPT ARGS in this process, as `python SCRIPT ARGS` would run it."""
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def forked() -> bool:
    """True in a worker that torchrun's agent forked (`--run_path --start_method fork`, what
    provision/job/launchers/torchrun.py asks for), not in one it started as a new
    interpreter: then the agent's `import torch` is this process's too."""
    mp = sys.modules.get("multiprocessing")  # a new interpreter has not imported it
    return mp is not None and mp.parent_process() is not None


def as_a_new_process() -> None:
    """What a forked worker inherits of the agent and a new interpreter would not have: its
    signal handlers (elastic's, which turn SIGTERM into an exception in the script), its
    exit handlers (they are the agent's, and a forked worker ends with os._exit, so they would
    not run anyway) and multiprocessing's idea that this is a child. The tool's own
    sitecustomize handlers are registered again."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()
    # multiprocessing's view: the main process, no parent (a library may check either to
    # tell whether it runs in a worker of its own), no children
    from multiprocessing import process

    this = process.current_process()
    this._identity, this.name = (), "MainProcess"
    process._parent_process = None  # type: ignore[attr-defined]
    process._children = set()  # type: ignore[attr-defined]
    process._process_counter = itertools.count(1)  # type: ignore[attr-defined]
    register = getattr(sys.modules.get("sitecustomize"), "register_exit_handlers", None)
    if register is not None:
        register()


def run_script_forked(argv: list[str]) -> None:
    """run_script, then what a new interpreter does at its end, which a forked worker would
    skip (multiprocessing ends it with os._exit): the traceback of an exception on stderr
    (torch's wrapper would only hand it to the agent), the wait for non-daemon threads and the
    exit handlers. The exit code is the interpreter's: sys.exit's, 1 after an exception."""
    try:
        run_script(argv)
    except SystemExit:
        _at_exit()
        raise
    except BaseException as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        _at_exit()
        if isinstance(exc, KeyboardInterrupt):  # as the interpreter: killed by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    _at_exit()


def _at_exit() -> None:
    main = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    flush_files()


def flush_files() -> None:
    """What a new interpreter's shutdown does for the script's files and a forked worker's
    os._exit would skip: a file a module of the job keeps open is flushed when the shutdown
    clears the modules (the worker's modules are never cleared). So every file object still
    open is flushed (those in unreachable cycles too: before the collection, whose finalizers
    run in no set order and may close a buffer before its text layer wrote into it), then
    cyclic garbage is collected (its finalizers run). Without it, in a worker torchrun forked,
    a module's open log lost what it had buffered (tests/remote/test_script.py)."""
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):  # closed underneath, a pipe whose reader left
                pass
    gc.collect()
