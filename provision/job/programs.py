"""Programs of the tool's own run across the cluster like a job (under the job's launcher):
the all-reduce benchmark of `check --bandwidth`, and anything else `remote.pyz` provides.
"""

from __future__ import annotations

import io
import json
from typing import Any

from provision.job.launch import run_job
from provision.model import nodetext
from provision.model.inventory import Inventory
from provision.model.logsink import Log
from provision.model.nodejson import MAX_ANSWER, GateLine, read_value
from provision.model.spec import DEFAULT_MASTER_PORT, JobSpec
from provision.nodes import NodeGroup


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
    sink = io.StringIO()
    code = run_job(inv, job, log=log, out=sink, program=program, group=group)
    return code, sink.getvalue()


def json_lines(output: str, node: str) -> list[dict[str, Any]]:
    """The JSON objects `node` printed (one per line) in `[node] `-prefixed output, each read
    as nodejson.GateLine (the fields the gate and `check --bandwidth` use, typed and bounded;
    its other fields kept as printed). A line that is not one is left out."""
    prefix = f"[{node}] {{"
    records: list[dict[str, Any]] = []
    for line in nodetext.lines(output):
        if line.startswith(prefix):
            text = line[len(prefix) - 1:]
            if len(text) > MAX_ANSWER:
                continue
            try:
                value: dict[str, Any] = json.loads(text)
                typed = read_value(GateLine, value)  # not an object: Unreadable
            except (ValueError, RecursionError):  # Unreadable is a ValueError
                continue
            records.append({**value, **typed.model_dump(exclude_none=True)})
    return records
