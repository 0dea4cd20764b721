"""The suite's own isolation on a shared Docker engine (tests/engine.py, issue 45): a killed
run's leftovers go at the next session start; a live run's objects, and objects of no leased
run (a developer's own clusters that happen to look alike), never do."""

from __future__ import annotations

import fcntl
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import engine
import pytest

# on the engine (docker): only the tests that make objects there or hold its lock; the rest
# would wait as engine tests while a serial test has it (one did, 48 s)


def token() -> str:
    return f"r{secrets.token_hex(3)}"


@pytest.fixture
def made(node_image: str) -> Iterator[list[str]]:
    """Containers made by the test (created, never started), removed afterwards."""
    names: list[str] = []
    yield names
    subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


def container(made: list[str], name: str, image: str, *labels: str) -> str:
    words = [w for label in labels for w in ("--label", label)]
    subprocess.run(["docker", "create", "--name", name, *words, image, "true"], check=True,
                   capture_output=True)
    made.append(name)
    return name


def exists(name: str) -> bool:
    return subprocess.run(["docker", "inspect", name], capture_output=True).returncode == 0


def lease(run: str, pid: int, start: str | None) -> Path:
    engine.LEASES.mkdir(exist_ok=True)
    path = engine.LEASES / run
    path.write_text(json.dumps({"pid": pid, "start": start}))
    return path


@pytest.mark.docker
def test_a_killed_runs_objects_go_and_nothing_else(made: list[str], node_image: str) -> None:
    killed, live, unleased = token(), token(), token()
    # a killed run: a lease whose process is gone (a pid's start time that is not its own)
    gone = lease(killed, 1, "not-a-start-time")
    by_name = container(made, f"it-up-{killed}-node-0", node_image,
                        f"{engine.CLUSTER_LABEL}=it-up-{killed}")
    by_label = container(made, f"squatter-{secrets.token_hex(2)}", node_image,
                         f"{engine.LABEL_KEY}={killed}")
    # a live run: a process of its own, alive
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        alive = lease(live, sleeper.pid, engine._start_time(sleeper.pid))
        theirs = container(made, f"it-up-{live}-node-0", node_image,
                           f"{engine.CLUSTER_LABEL}=it-up-{live}")
        # a developer's own cluster whose name happens to hold a token-like word
        mine = container(made, f"exp-{unleased}-node-0", node_image,
                         f"{engine.CLUSTER_LABEL}=exp-{unleased}")
        assert killed in engine.dead_runs() and live not in engine.dead_runs()
        assert live in engine.other_live_runs() and killed not in engine.other_live_runs()
        assert engine.RUN not in engine.other_live_runs(), "this run is not another"
        engine.sweep_killed_runs()
        assert not exists(by_name) and not exists(by_label) and not gone.exists()
        assert exists(theirs) and exists(mine) and alive.exists()
        assert engine.RUN not in engine.dead_runs(), "this run is alive"
    finally:
        sleeper.kill()
        sleeper.wait()
        (engine.LEASES / live).unlink(missing_ok=True)


def test_a_reused_pid_is_not_the_run_that_held_it() -> None:
    run = token()
    path = lease(run, 1, "not-the-start-time-of-pid-1")
    try:
        assert run in engine.dead_runs()
    finally:
        path.unlink()


@pytest.mark.parametrize("name,labels,owner", [
    ("it-up-r0a1b2c-node-0", {}, "r0a1b2c"),
    ("x", {"mgpu-cloud-cluster": "gp-some-test-r0a1b2c-p"}, "r0a1b2c"),
    ("x", {"mgpu-test-run": "r0a1b2c"}, "r0a1b2c"),
    ("it-up-r0a1b2cd-node-0", {}, None),  # 7 hex digits: not a token
    ("my-cluster-node-0", {}, None),
])
def test_owner(name: str, labels: dict[str, str], owner: str | None) -> None:
    assert engine.owner(name, labels) == owner


@pytest.mark.docker
def test_a_serial_test_waits_for_every_engine_test_and_they_share() -> None:
    def try_lock(kind: int) -> bool:
        with (engine.LEASES / f"{engine.RUN}.lock").open("a") as f:
            try:
                fcntl.flock(f, kind | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    with engine.engine_lock(exclusive=False):  # this test itself holds it shared (autouse)
        assert try_lock(fcntl.LOCK_SH), "engine tests share the engine"
        assert not try_lock(fcntl.LOCK_EX), "a serial test waits"
