"""`mgpu-cloud check`: every node's preflight in one table, and the all-reduce benchmark.

The node side is remote.pyz (preflight / allreduce, uploaded at bootstrap); the judging is
provision.check (pure functions). This module only runs things and gathers their JSON.
"""

from __future__ import annotations

import io
import json
import shlex
from collections.abc import Callable
from typing import Any

from provision.bootstrap import remote_path
from provision.inventory import Inventory, InventoryStore
from provision.remote_exec import exec_on_nodes
from provision.spec import JobSpec

Log = Callable[[str], None]


def gather_preflights(
    inv: Inventory, store: InventoryStore, master_port: int = 29500
) -> dict[str, dict[str, Any]]:
    """node name -> preflight report (or {"error": ...} for a node where it could not run)."""
    q = shlex.quote
    master = inv.master
    cmd = (f"python3 {q(remote_path(inv, 'remote.pyz'))} preflight --json "
           f"--workdir {q(inv.remote_root)} --master-addr {q(master.private_address)} "
           f"--master-port {master_port}")
    reports: dict[str, dict[str, Any]] = {}
    for node, res in exec_on_nodes(inv, store, cmd).items():
        try:
            reports[node] = json.loads(res.stdout)
        except json.JSONDecodeError:
            reports[node] = {"error": (res.stderr or res.stdout).strip()[-500:]
                             or f"preflight exited {res.exit_code}"}
    return reports


def run_allreduce(
    inv: Inventory,
    store: InventoryStore,
    *,
    min_bytes: str = "1M",
    max_bytes: str = "1G",
    iters: int = 20,
    nproc_per_node: int | None = None,
    master_port: int = 29500,
    log: Log = print,
) -> tuple[int, list[dict[str, Any]]]:
    """torchrun `remote.pyz allreduce` across all nodes; returns (exit code, rank 0's records)."""
    from provision.launch import run_job

    job = JobSpec.model_construct(
        script="remote.pyz", args=[], launcher="torchrun", nproc_per_node=nproc_per_node,
        env={}, workdir=None, excludes=[], master_port=master_port, rdzv=False, image=None,
        nccl_debug=False, deepspeed_launcher="pdsh", deepspeed_config=None,
    )
    program = ["@root/remote.pyz", "allreduce", "--min-bytes", min_bytes, "--max-bytes",
               max_bytes, "--iters", str(iters)]
    sink = io.StringIO()
    code = run_job(inv, store, job, log=log, out=sink, program=program)
    records: list[dict[str, Any]] = []
    master = f"[{inv.master.name}] "
    for line in sink.getvalue().splitlines():
        if line.startswith(master + "{"):
            try:
                records.append(json.loads(line[len(master):]))
            except json.JSONDecodeError:
                continue
    if code != 0:
        log(sink.getvalue()[-3000:])
    return code, records
