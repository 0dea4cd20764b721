"""Managed runs seen from outside, for the integration tests of managed runs
(tests/integration/test_managed*.py, test_k8s_managed.py): a job's events, log and
checkpoints read from its store, a node lost and the resume waited for, and no process of
mgpu-cloud left on this machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from provision.job.managed.records import JobView
from remote.ckpt import SEALS
from remote.store import open_store


def own_processes(home: Path, name: str) -> list[str]:
    """mgpu-cloud processes of this machine that belong to this test: started with its
    MGPU_CLOUD_HOME, or naming its cluster (other helpers' tests run beside it; the
    controller's processes run in a container, another PID namespace). There must be none."""
    mine = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) == os.getpid() or os.readlink(f"/proc/{pid}/ns/pid") != mine:
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        if "provision" not in args or "pytest" in args:
            continue
        if f"MGPU_CLOUD_HOME={home}".encode() in environ or name in args:
            found.append(f"{pid} {args}")
    return found


def wait_for(check: object, timeout: float, what: str,
             detail: Callable[[], str] | None = None) -> None:
    """Until check() is true; else an AssertionError saying `what`, and `detail()`: what the
    store showed then (a failure under load must say where the run was)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s" + (f"\n{detail()}" if detail else ""))


def where_it_was(url: str, name: str, job: str) -> str:
    """The job's events and its log's tail, as the store has them."""
    return (f"events: {events(url, name, job)}\n"
            f"log (its end):\n{log_text(url, name, job)[-3000:]}")


def events(url: str, name: str, job: str = "1") -> list[str]:
    store = open_store(url)
    keys = store.list(f"{name}/jobs/{job}/events")
    return [json.loads(store.get_bytes(k) or b"{}")["event"] for k in keys]


def log_text(url: str, name: str, job: str = "1") -> str:
    return "".join(text for _, text in JobView(open_store(url), name, job).log_chunks())


def resumed_steps(url: str, name: str, job: str = "1") -> list[int]:
    return [int(m) for m in re.findall(r"\[node-0\] resumed from step (\d+)",
                                       log_text(url, name, job))]


def steps_in(url: str, prefix: str) -> list[int]:
    return sorted(int(m.group(1)) for k in open_store(url).list(prefix)
                  if (m := re.search(r"step_(\d+)\.pt$", k)))


def sealed_steps(url: str, prefix: str, since: float = 0.0) -> list[int]:
    """The steps a seal written at or after `since` vouches for under a checkpoint prefix:
    what a restore takes (a file in the store without its seal, its copy still under way, is
    left out: remote/storesync; so is a file a later life is writing again under the same
    name, until its new seal comes: its bytes differ from the older seal)."""
    store = open_store(url)
    found = set()
    for key in store.list(f"{prefix}/{SEALS}"):
        seal = json.loads(store.get_bytes(key) or b"{}")
        if float(seal.get("at") or 0) < since:
            continue
        for rel in seal.get("files", {}):
            if m := re.search(r"step_(\d+)\.pt$", rel):
                found.add(int(m.group(1)))
    return sorted(found)


def kill(container: str) -> None:
    subprocess.run(["docker", "kill", container], check=True, capture_output=True)


def lose_and_resume(url: str, name: str, victim: int, job: str = "1") -> int:
    """Once the job's store has a checkpoint newer than its last resume, sealed since then,
    kill node `victim`; wait until rank 0 resumed again; the step it resumed from."""
    since = time.time()  # after the last resume: seals of this life only (a seal of the
    # life before may name a step this life is writing again: a restore then skips it)
    before = resumed_steps(url, name, job)
    floor = before[-1] if before else -1
    wait_for(lambda: any(s > floor for s in sealed_steps(
        url, f"{name}/data/jobs/{job}/checkpoints", since)),
             180, f"no sealed checkpoint after step {floor} reached the store",
             lambda: where_it_was(url, name, job))
    kill(f"{name}-node-{victim}")
    wait_for(lambda: len(resumed_steps(url, name, job)) > len(before)
             or "failed" in events(url, name, job), 300, f"no resume after node-{victim}",
             lambda: where_it_was(url, name, job))
    after = resumed_steps(url, name, job)
    assert len(after) > len(before), f"job {job} failed: {log_text(url, name, job)[-3000:]}"
    return after[-1]
