"""This run of the suite on a shared Docker engine (issue 45): its names, its lease, and the
removal of what killed runs left.

    RUN          a token of this run of the suite (`r` + 6 hex digits), the same in every
                 xdist worker (the first import sets $MGPU_TEST_RUN and workers inherit it)
    unique(n)    `n-RUN`: every cluster, container, network or namespace a test makes on the
                 engine carries it, so two runs of the suite on one engine (two clones, CI
                 and a developer) never meet; within a run, names differ by test
    LABEL        `mgpu-test-run=RUN` on what the tests make themselves (squatter containers,
                 the k8s stand-in's pods, ssh/slurm hosts); what the tool makes carries RUN
                 in its cluster's name
    lease        while a run lives, a file named after its token in LEASES holds the pid and
                 start time of its main process (the xdist controller)
    sweep()      at session start: the containers, networks and volumes of runs whose lease
                 holder is gone (a killed run) are removed, then their lease. A live run's
                 objects, and anything carrying no leased token (a developer's own
                 clusters), are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

RUN = os.environ.setdefault("MGPU_TEST_RUN", f"r{secrets.token_hex(3)}")
LABEL_KEY = "mgpu-test-run"
LABEL = f"{LABEL_KEY}={RUN}"
LEASES = Path(tempfile.gettempdir()) / "mgpu-test-runs"
TOKEN = re.compile(r"r[0-9a-f]{6}")
TOKEN_IN_NAME = re.compile(r"(?:^|[-_])(r[0-9a-f]{6})(?=[-_.]|$)")
CLUSTER_LABEL = "mgpu-cloud-cluster"  # provision.model.inventory.CLUSTER_TAG


def unique(name: str) -> str:
    """`name` for this run of the suite: `NAME-RUN`."""
    return f"{name}-{RUN}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a pid
    reused by another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def take_lease() -> None:
    """Mark this run alive (its main process: the controller under xdist)."""
    LEASES.mkdir(mode=0o755, exist_ok=True)
    pid = os.getpid()
    (LEASES / RUN).write_text(json.dumps({"pid": pid, "start": _start_time(pid)}))


def drop_lease() -> None:
    (LEASES / RUN).unlink(missing_ok=True)
    (LEASES / f"{RUN}.lock").unlink(missing_ok=True)


def _alive(lease: Path) -> bool:
    try:
        held = json.loads(lease.read_text())
        return _start_time(int(held["pid"])) == held["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _other_runs(alive: bool) -> set[str]:
    """Tokens of the other runs' leases whose holder lives (`alive`), or is gone."""
    if not LEASES.is_dir():
        return set()
    return {p.name for p in LEASES.iterdir()
            if TOKEN.fullmatch(p.name) and p.name != RUN and _alive(p) == alive}


def dead_runs() -> set[str]:
    """Tokens of runs whose lease holder is gone (never this run's)."""
    return _other_runs(alive=False)


def other_live_runs() -> set[str]:
    """Tokens of the other runs of the suite on this machine whose main process lives: a
    `serial` test has the engine to itself within its run (conftest's engine lock), not
    against another run's load."""
    return _other_runs(alive=True)


def owner(name: str, labels: dict[str, str] | None) -> str | None:
    """The run token an engine object carries: its test label, else one in its name (or its
    cluster's name)."""
    labels = labels or {}
    if labels.get(LABEL_KEY):
        return labels[LABEL_KEY]
    for text in (labels.get(CLUSTER_LABEL, ""), name):
        found = TOKEN_IN_NAME.search(text)
        if found:
            return found.group(1)
    return None


def sweep(runs: Iterable[str], log: object = print) -> list[str]:
    """Remove the engine objects of `runs` (tokens); returns what was removed."""
    import docker

    runs = set(runs)
    if not runs:
        return []
    client = docker.from_env(timeout=60)
    removed: list[str] = []
    gone = docker.errors.NotFound  # another run (or the test itself) removed it meanwhile
    for c in client.containers.list(all=True, ignore_removed=True):
        if owner(c.name, c.labels) in runs:
            with contextlib.suppress(gone):
                c.remove(force=True)
                removed.append(f"container {c.name}")
    for n in client.networks.list():
        if owner(n.name, n.attrs.get("Labels")) in runs:
            with contextlib.suppress(gone):
                n.remove()
                removed.append(f"network {n.name}")
    for v in client.volumes.list():
        if owner(v.name, v.attrs.get("Labels")) in runs:
            with contextlib.suppress(gone):
                v.remove(force=True)
                removed.append(f"volume {v.name}")
    for line in removed:
        log(f"removing {line}, left by a killed test run")  # type: ignore[operator]
    return removed


def sweep_killed_runs() -> None:
    """Session start: what killed runs left, then their leases."""
    runs = dead_runs()
    sweep(runs)
    for run in runs:
        (LEASES / run).unlink(missing_ok=True)
        (LEASES / f"{run}.lock").unlink(missing_ok=True)


@contextlib.contextmanager
def engine_lock(exclusive: bool) -> Iterator[None]:
    """This run's engine lock (LEASES/RUN.lock): shared by the tests that use the engine,
    exclusive for a `serial` one. Other runs of the suite have locks of their own."""
    LEASES.mkdir(mode=0o755, exist_ok=True)
    with (LEASES / f"{RUN}.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def leftovers(name: str) -> list[str]:
    """Containers and networks still carrying cluster `name`'s label."""
    label = f"label={CLUSTER_LABEL}={name}"
    found = []
    for kind in ("container", "network"):
        cmd = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            cmd.insert(3, "-a")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
        found += [f"{kind}:{x}" for x in out]
    return found


def force_remove(name: str) -> None:
    """Whatever of cluster `name` a failed test left on the engine (after it asserted)."""
    subprocess.run(f"docker rm -f $(docker ps -aq --filter label={CLUSTER_LABEL}={name}) "
                   f"2>/dev/null; docker network rm {name}-net 2>/dev/null", shell=True)  # noqa: S602


def created_since(since: float, cluster: str) -> list[str]:
    """The containers the engine made for cluster `cluster` since `since` (a time.time()),
    even those removed since (the engine's event log; its network events carry no labels)."""
    out = subprocess.run(
        ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
         "--filter", f"label={CLUSTER_LABEL}={cluster}", "--filter", "event=create",
         "--format", "{{.Type}} {{.Actor.Attributes.name}}"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    return out.split("\n")[:-1]
