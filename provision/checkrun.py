"""`mgpu-cloud check`: every node's preflight in one table, and the all-reduce benchmark.

The node side is remote.pyz (preflight / allreduce, uploaded at bootstrap); the judging is
provision.check (pure functions). This module only runs things and gathers their JSON.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from provision.inventory import Inventory
from provision.nodes import NodeGroup
from provision.spec import DEFAULT_MASTER_PORT, JobSpec

Log = Callable[[str], None]


def parse_last_json(text: str) -> dict[str, Any] | None:
    """The JSON object on the last line of `text`, if it is one."""
    lines = text.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def gather_preflights(
    inv: Inventory, master_port: int = DEFAULT_MASTER_PORT, *, group: NodeGroup | None = None,
) -> dict[str, dict[str, Any]]:
    """node name -> preflight report (or {"error": ...} for a node where it could not run)."""
    own = group is None
    group = group or NodeGroup(inv)
    layout = group.layout
    cmd = layout.remote_command("preflight", "--json", "--workdir", layout.root,
                                "--master-addr", inv.master.private_address,
                                "--master-port", str(master_port))
    reports: dict[str, dict[str, Any]] = {}
    try:
        for name, res in group.run(cmd).items():
            report = parse_last_json(res.value.stdout) if res.value is not None else None
            reports[name] = report if report is not None else {"error": res.why()[-500:]}
    finally:
        if own:
            group.close()
    return reports


def run_allreduce(
    inv: Inventory,
    *,
    min_bytes: str = "1M",
    max_bytes: str = "1G",
    iters: int = 20,
    nproc_per_node: int | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    log: Log = print,
    group: NodeGroup | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """torchrun `remote.pyz allreduce` across all nodes; returns (exit code, rank 0's records)."""
    from provision.launch import run_job

    # model_construct: no validation (the "script" lives on the nodes); defaults otherwise
    job = JobSpec.model_construct(script="remote.pyz", launcher="torchrun", excludes=[],
                                  nproc_per_node=nproc_per_node, master_port=master_port)
    program = ["@root/remote.pyz", "allreduce", "--min-bytes", min_bytes, "--max-bytes",
               max_bytes, "--iters", str(iters)]
    sink = io.StringIO()
    code = run_job(inv, job, log=log, out=sink, program=program, group=group)
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
