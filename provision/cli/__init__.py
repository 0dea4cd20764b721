"""`mgpu-cloud` command line. The only package that prints or exits.

    app.py       the Typer app, error handling, the option-signature helper
    options.py   option tables (core + every provider's flags from the registry) -> spec models
    commands.py  cluster commands (up, down, launch, run, status, exec, ssh, check, gc)
    jobs.py      jobs, logs, cancel
    day2.py      ssh-config, monitor, cost, scale
    dashboard.py the local web dashboard (provision/operations/dashboard/)
Providers may add their own sub-commands (ProviderInfo.commands).
"""

from __future__ import annotations

import os
import sys

from provision.cli import commands as _commands  # noqa: F401 - registers the commands
from provision.cli import dashboard as _dashboard  # noqa: F401 - the web dashboard
from provision.cli import jobs as _jobs  # noqa: F401 - jobs, logs, cancel

# isort: split
# (the order of these imports is the order of the commands in --help)
from provision.cli import day2 as _day2  # noqa: F401 - ssh-config, monitor, cost, scale
from provision.cli import managed as _managed  # noqa: F401 - attach (issue 18)
from provision.cli.app import app, load_provider_commands

load_provider_commands()


def main() -> None:
    import logging

    # pydantic scans every installed distribution's entry points for its plugins (logfire
    # and the like) when it builds the first model: 12-20 ms of each command's start in a
    # training venv, for plugins a CLI never wants. Its documented switch turns that off
    # here (a value the caller set is left as it is).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("mgpu_cloud")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if "_MGPU_CLOUD_COMPLETE" in os.environ:  # shell completion (README): only when asked
        from typer._completion_classes import completion_init

        completion_init()
    try:
        app()
    finally:
        # Everything alive now dies with the process: frozen objects skip the interpreter's
        # final garbage collection, which costs ~0.15 s once the docker SDK/Fabric are loaded.
        import gc

        gc.freeze()


__all__ = ["app", "main"]
