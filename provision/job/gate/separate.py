"""The separate fabric gate: one torchrun of `remote.pyz allreduce --gate` on every node, as a
run of its own before the job (where the job's own processes cannot run it, and wherever this
process does not follow the job's output: provision/job/gate/step.py), and `check --fabric`.

    gate_before_job(inv, job, store=..., log=...)  run it when the mode says so, keep the
                                                   result, FabricGateError when it failed
    run_gate(inv, job, mode=...)                   measure + judge -> GateRecord (no raising)
    check_fabric(name)                             `check NAME --fabric`

The judging is provision/job/gate/judge.py's.
"""

from __future__ import annotations

import time

from provision.job.gate.judge import (
    MAX_PAIR_ROUNDS,
    PAIR_SLOW_FRACTION,
    announce,
    evaluate,
    gate_error,
    should_run,
    threshold_gbps,
)
from provision.job.programs import run_remote_program
from provision.model.gate_record import GateRecord
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from provision.model.spec import DEFAULT_MASTER_PORT, JobSpec
from provision.nodes import NodeGroup, borrowed


def node_program(inv: Inventory) -> list[str]:
    """The words torchrun runs on every node (remote.pyz is the node's copy)."""
    limit = threshold_gbps(inv)
    return ["@root/remote.pyz", "allreduce", "--gate",
            "--pairwise-below", "inf" if limit is None else f"{limit:g}",
            "--pair-rounds", str(MAX_PAIR_ROUNDS), "--pair-fraction", f"{PAIR_SLOW_FRACTION:g}"]


def gate_job(job: JobSpec | None, *, gpus: bool = True) -> JobSpec:
    """The gate runs as the job will (its env, image, processes per node, port), under
    torchrun, with NCCL's INFO lines on (they name the transport). Without GPUs (`gpus`
    False: gloo on CPU) one process per node: every CPU process shares the node's one
    network path, so more processes would measure CPU contention, and each costs a torch
    import (seconds on a small machine)."""
    env = dict(job.env) if job is not None else {}
    env.pop("NCCL_DEBUG_FILE", None)  # the lines must reach the output
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    nproc = job.nproc_per_node if job is not None else None
    # model_construct: no validation (the "script" lives on the nodes)
    return JobSpec.model_construct(
        script="remote.pyz", launcher="torchrun", excludes=[], env=env, rdzv=False,
        nproc_per_node=nproc if gpus else 1,
        master_port=job.master_port if job is not None else DEFAULT_MASTER_PORT,
        image=job.image if job is not None else None, nccl_debug=False)


GPU_COUNT = "nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true"


def any_gpu(group: NodeGroup) -> bool:
    """Whether any node lists a GPU (one command on the group's connections; a node that
    does not answer counts as none: the gate's run then reports it)."""
    counts = []
    for res in group.run(GPU_COUNT).values():
        out = res.value.stdout.strip() if res.value is not None else ""
        counts.append(int(out) if out.isdigit() else 0)
    return any(counts)


def run_gate(inv: Inventory, job: JobSpec | None, *, mode: str, log: Log = print,
             group: NodeGroup | None = None) -> GateRecord:
    """Measure and judge. Never raises for a bad fabric (that is the record's verdict)."""
    t0 = time.monotonic()
    with borrowed(inv, group) as nodes:
        # the probe opens the connections the gate's launch then reuses
        code, output = run_remote_program(inv, gate_job(job, gpus=any_gpu(nodes)),
                                          node_program(inv),
                                          log=lambda m: log(f"fabric gate: {m}"), group=nodes)
    return evaluate(inv, output, code, mode=mode, seconds=time.monotonic() - t0)


def gate_before_job(inv: Inventory, job: JobSpec, *, store: InventoryStore, log: Log,
                    group: NodeGroup | None = None) -> GateRecord | None:
    """The pipeline's hook before a job: run the gate when the mode says so, keep its result
    in the inventory, and raise FabricGateError when it failed (unless
    job.allow_slow_network: then a warning, and the job goes on). None when skipped."""
    run, why = should_run(inv, job.fabric_check)
    if not run:
        if job.fabric_check == "on":
            log(f"fabric gate: skipped ({why})")
        return None
    log(f"fabric gate: all-reduce on {len(inv.nodes)} nodes before the job "
        "(--fabric-check off skips it) ...")
    record = run_gate(inv, job, mode=job.fabric_check, log=log, group=group)
    announce(record, job.allow_slow_network, log)
    inv.fabric_gate = record
    store.save(inv)
    if record.verdict == "pass" or job.allow_slow_network:
        return record
    raise gate_error(record)


def check_fabric(name: str, *, store: InventoryStore | None = None,
                 log: Log = print) -> GateRecord:
    """`check NAME --fabric`: the gate now, as `--fabric-check on` would run it before a job
    (the job's defaults: every slot, port 29500, no image); the result is kept."""
    from provision.model.errors import UserInputError

    store = store or InventoryStore()
    with store.lock(name):
        inv = store.load(name)
        run, why = should_run(inv, "on")
        if not run:
            raise UserInputError(f"no fabric gate for cluster {name!r}: {why}")
        record = run_gate(inv, None, mode="on", log=log)
        inv.fabric_gate = record
        store.save(inv)
    return record
