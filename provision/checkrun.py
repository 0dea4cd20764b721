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
from provision.nodes import NodeGroup, borrowed
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
    reports: dict[str, dict[str, Any]] = {}
    with borrowed(inv, group) as nodes:
        layout = nodes.layout
        cmd = layout.remote_command("preflight", "--json", "--workdir", layout.root,
                                    "--master-addr", inv.master.private_address,
                                    "--master-port", str(master_port))
        for name, res in nodes.run(cmd).items():
            report = parse_last_json(res.value.stdout) if res.value is not None else None
            reports[name] = report if report is not None else {"error": res.why()[-500:]}
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
    # model_construct: no validation (the "script" lives on the nodes); defaults otherwise
    job = JobSpec.model_construct(script="remote.pyz", launcher="torchrun", excludes=[],
                                  nproc_per_node=nproc_per_node, master_port=master_port)
    program = ["@root/remote.pyz", "allreduce", "--min-bytes", min_bytes, "--max-bytes",
               max_bytes, "--iters", str(iters)]
    code, output = run_remote_program(inv, job, program, log=log, group=group)
    records = json_lines(output, inv.master.name)
    if code != 0:
        log(output[-3000:])
    return code, records


def run_remote_program(
    inv: Inventory, job: JobSpec, program: list[str], *, log: Log = print,
    group: NodeGroup | None = None,
) -> tuple[int, str]:
    """`program` (words; "@root/remote.pyz ..." is the node's copy) launched as `job` says
    (launcher, env, image, port) on every node; returns (exit code, every node's output as
    launch prints it: `[node] line`). The output is kept, not printed."""
    from provision.launch import run_job

    sink = io.StringIO()
    code = run_job(inv, job, log=log, out=sink, program=program, group=group)
    return code, sink.getvalue()


def json_lines(output: str, node: str) -> list[dict[str, Any]]:
    """The JSON objects `node` printed (one per line) in `[node] `-prefixed output."""
    prefix = f"[{node}] {{"
    records: list[dict[str, Any]] = []
    for line in output.splitlines():
        if line.startswith(prefix):
            try:
                value = json.loads(line[len(prefix) - 1:])
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                records.append(value)
    return records
