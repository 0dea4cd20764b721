"""The lifecycle's fabric gate step: where the gate runs for a job, and running it there.

    gates = gate_step(inv, job, ..., followed=...)   the separate gate runs now, or each
                                                     attempt's InJobGate comes from `gates`
    where = placement(inv, job)                      "in-job" | "separate" (and why) | None

Every supervision takes this one step before its job starts (provision/job/lifecycle.py). The
gate runs in the job's own processes (provision/job/gate/injob.py: no torchrun of its own, no
second torch import) where this process follows the job's output: an attached run judges the
nodes' gate lines as they stream. The separate gate (provision/job/gate/separate.py: one
torchrun of `remote.pyz allreduce --gate` before the job) remains where that cannot work:
  - a job supervised away from this process (`--detach`: the nodes alone, or the cluster's
    controller): nothing here reads its output, so the gate is proven before it starts;
  - DeepSpeed's pdsh mode: node 0 starts every node's ranks over pdsh, so each node's output
    arrives inside node 0's stream and the per-node variables (MGPU_NODE_RANK) cannot differ;
  - a script that is not Python (the gate runs in the interpreter the launcher starts);
  - a job that sets NCCL_DEBUG_FILE (the gate reads NCCL's lines from the process's stdout,
    and NCCL keeps its debug settings for the process: the job's file would not be used).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from provision.job.gate.injob import InJobGate
from provision.job.gate.judge import should_run
from provision.job.gate.separate import gate_before_job
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.model.timeline import mark
from provision.nodes import NodeGroup

GateFactory = Callable[[], InJobGate]  # each launch attempt's in-job gate
NOT_FOLLOWED = "the job is supervised away from this process, which does not read its output"


def separate_reason(inv: Inventory, job: JobSpec) -> str | None:
    """Why this job's processes cannot run the gate themselves (None: they can)."""
    if job.launcher == "deepspeed" and job.deepspeed_launcher == "pdsh":
        return "DeepSpeed's pdsh mode starts every node from node 0"
    if not _is_python(job):
        return f"{job.script_in_workdir} is not a Python script"
    if "NCCL_DEBUG_FILE" in job.env:
        return "the job sets NCCL_DEBUG_FILE"
    return None


def _is_python(job: JobSpec) -> bool:
    script = Path(job.script)
    if script.suffix == ".py":
        return True
    path = script if script.is_absolute() else job.local_workdir / job.script_in_workdir
    try:
        with path.open("rb") as fh:
            first = fh.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def placement(inv: Inventory, job: JobSpec, *,
              followed: bool = True) -> tuple[str | None, str]:
    """("in-job" | "separate" | None, why): where the gate runs for this job, if at all.
    `followed`: whether this process follows the job's output (an attached run); a job
    supervised elsewhere gets the separate gate before it starts."""
    run, why = should_run(inv, job.fabric_check)
    if not run:
        return None, why
    reason = separate_reason(inv, job) if followed else NOT_FOLLOWED
    return ("separate", reason) if reason else ("in-job", "")


def gate_step(inv: Inventory, job: JobSpec, *, store: InventoryStore, log: Log,
              group: NodeGroup | None = None, followed: bool = True) -> GateFactory | None:
    """The lifecycle's gate step, the same for every supervision. Where the job's processes
    can run the gate themselves and this process follows their output (`followed`), the
    factory of each launch attempt's InJobGate; else the separate gate runs now
    (FabricGateError when it fails and the job did not say --allow-slow-network; the result
    recorded either way). None: no gate, or it ran already."""
    where, why = placement(inv, job, followed=followed)
    if where == "in-job":
        log(f"fabric gate: in the job's own processes on {len(inv.nodes)} nodes, before its "
            "script (--fabric-check off skips it)")
        return lambda: InJobGate(inv, job, store, log)
    if where == "separate":
        log(f"fabric gate: a run of its own before the job ({why})")
    before, since = inv.fabric_gate, time.time()
    try:
        gate_before_job(inv, job, store=store, log=log, group=group)
    finally:
        if inv.fabric_gate is not None and inv.fabric_gate is not before:  # it ran
            mark(inv, "gate", since=since, detail=f"a run of its own: {inv.fabric_gate.verdict}")
    return None
