"""The test kit: what many test files share, defined once (tests/ is on sys.path through
tests/conftest.py, so a test file says `from kit import cli, IN_CI`).

- `IN_CI`: CI=1/true/yes. A test whose tool or engine is missing fails there and skips
  elsewhere (scripts/setup.sh installs everything CI needs).
- `cli(...)`: `python -m provision.cli ARGS` as a separate process, so exit codes, stdout and
  stderr are the real ones, with the code of THIS checkout first on PYTHONPATH.
- `until(check)`: what happens in the background (a kubelet's housekeeping, a controller's
  resync), waited for: check()'s first truthy answer, or a failure after `timeout` s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cli(*args: str, home: Path | None = None, cwd: Path | None = None, timeout: float = 600,
        env: dict[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI and wait (text output captured).

    home: its MGPU_CLOUD_HOME (None: the one the environment has, e.g. the autouse
    `mgpu_home` fixture's) and, unless `cwd` is given, its working folder once it exists
    (so a project file where pytest runs never leaks into a test); env: variables
    over the current environment (`home` wins for MGPU_CLOUD_HOME); stdin: text fed to it."""
    return subprocess.run([sys.executable, "-m", "provision.cli", *args],
                          cwd=cwd or (home if home and home.is_dir() else None),
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          env=cli_env(home, env))


def cli_env(home: Path | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `cli` gives the CLI (for a test that starts it with Popen itself)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    if home is not None:
        full["MGPU_CLOUD_HOME"] = str(home)
    return full


def until(check: Callable[[], Any], timeout: float = 90, what: str = "never happened") -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found
