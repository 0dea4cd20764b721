"""`mgpu-cloud run` as a process read line by line, and a per-test cluster name that checks
nothing was left behind (tests/integration/test_recovery.py, test_failure_story.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import force_remove, leftovers, unique

RUNS: list[Run] = []


class Run:
    """`mgpu-cloud run ...` as a process whose output we read line by line."""

    def __init__(self, name: str, args: list[str], cwd: Path) -> None:
        RUNS.append(self)
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "provision.cli", "run", "--provider", "docker", "--name",
             name, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_for(self, pattern: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"{pattern!r} never appeared:\n{self.output}")

    def interrupt(self) -> None:
        """Ctrl-C, as a terminal sends it."""
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 300) -> int:
        """The rest of the output, then the exit code. Read through the same text stream
        `wait_for` reads (communicate(timeout=) reads the pipe's descriptor directly: what
        readline had buffered already would be lost)."""
        assert self.proc.stdout is not None
        stream = self.proc.stdout
        reader = threading.Thread(target=lambda: self.lines.append(stream.read()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            self.proc.kill()
            reader.join(10)
            raise subprocess.TimeoutExpired(self.proc.args, timeout, self.output)
        return self.proc.wait(timeout=60)

    @property
    def output(self) -> str:
        return "".join(self.lines)


def cluster_name(prefix: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fixture's body: the test's cluster name (`prefix` + the test's name + this run's
    token, tests/engine.py), and afterwards every run stopped and nothing of that cluster left
    (the test fails otherwise)."""
    name = unique(prefix + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:20].strip("-"))
    yield name
    for run in RUNS:  # a test that failed half-way: SIGTERM makes `run` tear down
        if run.proc.poll() is None:
            run.proc.terminate()
            run.proc.wait(timeout=120)
    RUNS.clear()
    left = leftovers(name)
    force_remove(name)
    assert left == [], f"left behind: {left}"
