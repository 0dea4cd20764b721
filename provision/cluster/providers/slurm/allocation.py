"""The held allocation: submit, wait (showing why it pends), find its nodes, cancel.

All through the login node (LoginSession); every wait polls with a growing interval (squeue
is a request to slurmctld: a busy site's scheduler should not hear from us every 100 ms).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from provision.cluster.providers.slurm.login import LoginSession
from provision.cluster.providers.slurm.slurmcmd import (
    NEVER_REASONS,
    SETTLING_REASONS,
    STATE_FORMAT,
    AllocationRequest,
    JobState,
    parse_state,
    sbatch_argv,
    section_script,
    sections,
    shell,
)
from provision.model.errors import CapacityError, ProvisionError
from provision.model.logsink import Log

SETTLE_S = 10.0  # a PartitionConfig reason this old is not the submission's first moment
POLL_MIN_S, POLL_MAX_S = 0.25, 5.0
ENDED = {
    "CANCELLED": "it was cancelled (scancel, by you or an administrator)",
    "TIMEOUT": "its time limit (--time, from --max-hours) was reached",
    "NODE_FAIL": "a node of the allocation failed",
    "PREEMPTED": "a higher-priority job preempted it",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "its deadline passed",
    "OUT_OF_MEMORY": "it ran out of memory",
    "FAILED": "its batch step failed",
    "COMPLETED": "its batch step ended",
}


def describe_end(job_id: str, state: str | None, reason: str | None) -> str:
    """One line saying that, and why, the allocation is over."""
    if state is None:
        return (f"the Slurm allocation {job_id} is gone (Slurm no longer lists it: it ended "
                "a while ago)")
    why = ENDED.get(state.split()[0], "")
    extra = f", reason {reason}" if reason and reason != "None" else ""
    return f"the Slurm allocation {job_id} ended: {state}{extra}" + (f" ({why})" if why else "")


def submit(session: LoginSession, req: AllocationRequest) -> str:
    """sbatch; the job id. ProvisionError with Slurm's own message when refused."""
    res = session.run(shell(shlex.join(sbatch_argv(req))), timeout=60)
    job_id = res.stdout.strip().split(";")[0]
    if res.exit_code != 0 or not job_id.isdigit():
        raise ProvisionError(f"Slurm refused the allocation: {res.tail(5)}",
                             hint="`mgpu-cloud up --dry-run` checks the request with "
                                  "`sbatch --test-only`")
    return job_id


def state_of(session: LoginSession, job_id: str) -> JobState | None:
    res = session.run(shell(f"squeue -h -t all -j {shlex.quote(job_id)} "
                            f"-o {shlex.quote(STATE_FORMAT)}"), timeout=30)
    return parse_state(res.stdout.splitlines()[0] if res.stdout.strip() else "")


def wait_running(session: LoginSession, job_id: str, *, log: Log,
                 timeout_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> JobState:
    """Until the job RUNS; logs each new pending reason (Priority, Resources, ...) with
    Slurm's expected start. ProvisionError when it ended or will never start as asked,
    CapacityError when `timeout_s` passes (the caller's rollback cancels it)."""
    start = clock()
    shown: tuple[str, str] | None = None
    interval = POLL_MIN_S
    while True:
        state = state_of(session, job_id)
        if state is None:
            raise ProvisionError(describe_end(job_id, None, None))
        if state.running:
            return state
        if not state.waiting:
            raise ProvisionError(describe_end(job_id, state.state, state.reason))
        if (state.state, state.reason) != shown:
            shown = (state.state, state.reason)
            when = f"; Slurm expects it to start at {state.start}" \
                if state.start not in ("N/A", "", "Unknown") else ""
            log(f"allocation {job_id}: {state.state} ({state.reason}){when}")
        waited = clock() - start
        never = NEVER_REASONS.get(state.reason)
        if never is None and state.reason in SETTLING_REASONS and waited > SETTLE_S:
            never = "no node of the partition can satisfy the request"
        if never:
            raise ProvisionError(f"allocation {job_id} will never start: Slurm says "
                                 f"{state.reason} ({never})",
                                 hint="fix --nodes/--max-hours/--partition/--account/--qos/"
                                      "--constraint; `mgpu-cloud up --dry-run` checks them")
        if timeout_s is not None and waited > timeout_s:
            raise CapacityError(f"allocation {job_id} did not start within "
                                f"{timeout_s / 60:g} min (still {state.state}: {state.reason})",
                                hint="try later, fewer --nodes, another --partition, or a "
                                     "larger --queue-timeout")
        sleep(interval)
        interval = min(POLL_MAX_S, interval * 1.5)


@dataclass(frozen=True)
class AllocatedNode:
    name: str
    address: str  # NodeAddr: where the other nodes reach it


def nodes_of(session: LoginSession, nodelist: str) -> tuple[list[AllocatedNode], list[str]]:
    """The allocation's nodes in Slurm's order (SLURM_NODEID 0, 1, ...) with their NodeAddr,
    and which of our parent folders do not exist yet in the login node's home."""
    q = shlex.quote(nodelist)
    res = session.run(shell(section_script({
        "names": f"scontrol show hostnames {q}",
        "addrs": f"sinfo -h -N -n {q} -o '%N|%o'",
        "missing": 'cd "$HOME" && for p in .mgpu-cloud .mgpu-cloud/slurm; do '
                   '[ -e "$p" ] || echo "$p"; done',
    })), timeout=60)
    parts = sections(res.stdout)
    names = parts.get("names", "").split()
    if not names:
        raise ProvisionError(f"cannot list the allocation's nodes ({nodelist}): {res.tail()}")
    addrs: dict[str, str] = {}
    for line in parts.get("addrs", "").splitlines():
        name, _, addr = line.partition("|")
        if addr:
            addrs.setdefault(name, addr)
    nodes = [AllocatedNode(n, addrs.get(n, n)) for n in names]
    return nodes, parts.get("missing", "").split()


def cancel(session: LoginSession, job_id: str, *, wait_s: float = 15.0) -> JobState | None:
    """scancel, then wait (briefly) until Slurm no longer counts the job as running or
    pending. Idempotent: a job that has ended already is fine. Returns the last state seen."""
    session.run(shell(f"scancel {shlex.quote(job_id)}"), timeout=60)
    deadline = time.monotonic() + wait_s
    interval = 0.1
    while True:
        state = state_of(session, job_id)
        if state is None or not (state.running or state.waiting):
            return state
        if time.monotonic() > deadline:
            return state
        time.sleep(interval)
        interval = min(1.0, interval * 2)
