"""`scale`: the same short job on 1, 2, ... N nodes of ONE cluster; speedup, efficiency, cost.

The largest size is brought up once (or an existing cluster is used); for each size k the job
runs on the first k nodes (by rank) as a cluster of k: the launcher sees k nodes. Throughput
is the last `samples/s=X` (or `samples/s: X`) the job printed, else 1 / wall time. Against
the smallest size:

    speedup    = throughput_k / throughput_1    (wall time: t_1 / t_k)
    efficiency = speedup / (slots_k / slots_1)  (1.0 = perfect linear scaling)
    $ per job  = price of k nodes (the cluster's catalog $/h x k/N) x t_k

This is the seeds' "1 vs 4 vs 8 GPUs" cost analysis. A launcher that reads the cluster's
hostfile itself (DeepSpeed's pdsh mode) would use every node: use `--deepspeed-launcher
no_ssh` with `scale`.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from provision.model import nodetext
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.model.spec import JobSpec

THROUGHPUT = re.compile(r"samples/s\s*[=:]\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)")


def parse_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, each >= 1)."""
    try:
        sizes = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise UserInputError(f"--nodes {text!r}: expected sizes like 1,2,4") from None
    if not sizes or sizes[0] < 1:
        raise UserInputError(f"--nodes {text!r}: expected sizes like 1,2,4 (each at least 1)")
    return sizes


def throughput_in(lines: list[str]) -> float | None:
    """The last `samples/s=X` in the output, if any."""
    for line in reversed(lines):
        found = THROUGHPUT.findall(line)
        if found:
            return float(found[-1])
    return None


@dataclass
class SizeRun:
    nodes: int
    slots: int
    seconds: float
    exit_code: int
    throughput: float | None  # samples/s, as the job printed it


def slots_of(job: JobSpec, nodes: list[NodeRecord]) -> int:
    """Processes the job starts on `nodes` (--nproc-per-node, else each node's slots)."""
    n = job.nproc_per_node
    return sum(n if isinstance(n, int) else node.slots for node in nodes)


def analyse(runs: list[SizeRun], hourly_per_node: float) -> list[dict[str, Any]]:
    """Rows of the table (see the module doc). Runs that failed have no ratios."""
    ok = [r for r in runs if r.exit_code == 0]
    base = ok[0] if ok else None
    rows = []
    for r in runs:
        row: dict[str, Any] = {**asdict(r), "speedup": None, "efficiency": None,
                               "cost_per_job_usd": round(hourly_per_node * r.nodes * r.seconds
                                                         / 3600, 6)}
        if base is not None and r.exit_code == 0:
            if r.throughput and base.throughput:
                speedup = r.throughput / base.throughput
            else:
                speedup = base.seconds / r.seconds if r.seconds else 0.0
            row["speedup"] = round(speedup, 3)
            row["efficiency"] = round(speedup / (r.slots / base.slots), 3) if base.slots else None
        rows.append(row)
    return rows


class _Capture(io.StringIO):
    """run_job's output sink: keeps the lines, echoes nothing (the table is the output);
    the caller prints the tail when a size fails."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self.lines.extend(nodetext.lines(text))
        return len(text)


def run_sizes(inv: Inventory, job: JobSpec, sizes: list[int], *, log: Log,
              sync: bool = True) -> list[SizeRun]:
    """Run `job` on the first k nodes for every k in `sizes` (one set of connections)."""
    from provision.job.launch import run_job, workdir_of
    from provision.nodes import NodeGroup
    from provision.nodes.bootstrap import sync_workdir

    ranked = sorted(inv.nodes, key=lambda n: n.rank)
    if sizes[-1] > len(ranked):
        raise UserInputError(f"cluster {inv.name!r} has {len(ranked)} node(s); "
                             f"--nodes asks for {sizes[-1]}")
    runs = []
    with NodeGroup(inv) as group:
        if sync:
            sync_workdir(inv, workdir_of(inv, job), log=log, group=group)
        for k in sizes:
            sub = inv.model_copy(update={"nodes": ranked[:k]})
            capture = _Capture()
            log(f"scale: {k} node(s) ...")
            t0 = time.monotonic()
            code = run_job(sub, job, log=lambda m: None, out=capture, group=group)
            seconds = time.monotonic() - t0
            run = SizeRun(k, slots_of(job, ranked[:k]), round(seconds, 3), code,
                          throughput_in(capture.lines))
            runs.append(run)
            tp = f", {run.throughput:g} samples/s" if run.throughput else ""
            log(f"scale: {k} node(s): exit {code}, {seconds:.1f} s{tp}")
            if code != 0:
                log("\n".join(capture.lines[-30:]))
    return runs


def scale(job: JobSpec, sizes: list[int], *, spec: Any = None, cluster: str | None = None,
          confirm: Callable[[Any], bool] | None = None, log: Log) -> dict[str, Any] | None:
    """On `cluster` (existing) or on a new cluster of `spec` (largest size, removed at the
    end in every case). Returns {"cluster", "provider", "hourly_cost_usd", "rows"}, or None
    when the plan was declined."""
    from provision.cluster.pipeline import (
        Declined,
        NewCluster,
        sigterm_raises,
        temporary_cluster,
    )
    from provision.job.launch import workdir_of
    from provision.job.lifecycle import keep_job_logs
    from provision.model.inventory import InventoryStore

    store = InventoryStore()
    if cluster is not None:
        with store.lock(cluster), sigterm_raises():
            inv = store.load(cluster)
            runs = run_sizes(inv, job, sizes, log=log)
    else:
        new = NewCluster(spec, confirm or (lambda plan: True))
        try:
            with temporary_cluster(new, store=store, log=log, before=keep_job_logs(log),
                                   workdir=lambda inv: workdir_of(inv, job)) as made:
                inv = made.inv
                runs = run_sizes(inv, job, sizes, log=log, sync=False)
        except Declined:
            return None
    per_node = inv.hourly_cost_usd / max(1, len(inv.nodes))
    return {"cluster": inv.name, "provider": inv.provider,
            "hourly_cost_usd": inv.hourly_cost_usd, "rows": analyse(runs, per_node)}


def table(result: dict[str, Any]) -> list[tuple[str, ...]]:
    head = ("NODES", "SLOTS", "SAMPLES/S", "SECONDS", "SPEEDUP", "EFFICIENCY", "$/JOB")
    rows: list[tuple[str, ...]] = [head]
    for r in result["rows"]:
        def num(v: Any, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)
        rows.append((str(r["nodes"]), str(r["slots"]),
                     num(r["throughput"], ".1f") if r["exit_code"] == 0 else f"exit {r['exit_code']}",
                     f"{r['seconds']:.1f}", num(r["speedup"], ".2f") + ("x" if r["speedup"] else ""),
                     num(None if r["efficiency"] is None else 100 * r["efficiency"], ".0f")
                     + ("%" if r["efficiency"] is not None else ""),
                     f"{r['cost_per_job_usd']:.4f}"))
    return rows


def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserInputError("--plot needs matplotlib",
                             hint="pip install 'mgpu-cloud[plot]' (or pip install matplotlib)")


def plot(result: dict[str, Any], path: str) -> None:
    """A PNG: speedup (against linear) and efficiency against nodes. Needs matplotlib."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["speedup"] is not None]
    nodes = [r["nodes"] for r in rows]
    fig, left = plt.subplots(figsize=(6, 4))
    left.plot(nodes, [r["speedup"] for r in rows], "o-", label="speedup")
    left.plot(nodes, [n / nodes[0] for n in nodes], "--", color="grey", label="linear")
    left.set_xlabel("nodes")
    left.set_ylabel("speedup")
    right = left.twinx()
    efficiency = [100 * r["efficiency"] for r in rows]
    right.plot(nodes, efficiency, "s:", color="tab:red", label="efficiency %")
    right.set_ylabel("efficiency %")
    right.set_ylim(0, max(110.0, 1.1 * max(efficiency, default=0.0)))
    left.set_xticks(nodes)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="upper left")
    fig.suptitle(f"{result['cluster']} ({result['provider']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
