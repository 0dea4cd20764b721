"""The dashboard's data: the state the CLI keeps, turned into plain JSON-able dicts.

Every page is one of these views rendered by a template, and the same dict is the page's JSON
(`?format=json`, `/api/...`). Nothing here writes or talks to a node: live data (monitor
samples, log lines) comes from provision/operations/dashboard/live.py and is merged in by the
web layer.

Sources, the same as the CLI's: inventories (InventoryStore), the job records through the one
job-record interface (provision/job/jobrecords.py: this machine's records, and a managed
cluster's store), the cost history (provision/cluster/cost.py). Two small functions are the
seams for state that other work adds to the inventory or beside it, each the ONE place to
change:

    bringup_phases(inv)       the latest bring-up timeline -> [{phase, start_s, seconds, detail}]
                              (Inventory.timelines; empty for clusters made before them)
    unattended_runs(name)     managed runs from their durable store -> [{id, state, ...}]

Contract: a view never raises for state that is merely missing or old (a removed cluster, a
job without logs); it raises NotFound for a name or id that nothing knows.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from provision.cluster.cost import cost_usd, report
from provision.job.jobrecords import JobSummary, summary_of
from provision.job.ledger import buckets, render
from provision.job.localrecords import LocalRecords
from provision.model.errors import UserInputError
from provision.model.gate_record import GateRecord
from provision.model.inventory import Inventory, InventoryStore, checked_name
from provision.model.jobstore import JobRecord, JobStore, is_current


class NotFound(Exception):
    """A cluster or job nobody knows: the web layer answers 404 with a link back."""

    def __init__(self, message: str, back: str = "/", back_text: str = "all clusters") -> None:
        super().__init__(message)
        self.message, self.back, self.back_text = message, back, back_text


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def epoch(iso: str | None) -> float | None:
    """ISO time -> seconds since the epoch (None for None or garbage)."""
    if not iso:
        return None
    try:
        return dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


# --- seams for state added by other work (see the module docstring) -------------------------
def bringup_phases(inv: Inventory) -> list[dict[str, Any]]:
    """The cluster's latest bring-up timeline (`up`, `run`, `launch` or a recovery), one
    dict per phase in order: {"phase": str (a part of a phase is named "PHASE: PART"),
    "start_s": float (seconds after the start), "seconds": float, "detail": str}. Empty when
    the inventory records no timeline (a cluster made before they were kept)."""
    if not inv.timelines:
        return []
    tl = inv.timelines[-1]
    return [{"phase": f"{p.part_of}: {p.phase}" if p.part_of else p.phase,
             "start_s": p.start_s, "seconds": p.seconds or 0.0,
             "detail": p.detail if p.seconds is not None else "not finished"}
            for p in tl.phases]


def unattended_runs(name: str, home: Path | None = None) -> list[dict[str, Any]]:
    """Managed runs of cluster `name` from their durable store (issue 18: the store named by
    the inventory's spec or by `attach`, as `mgpu-cloud jobs` finds it): {"id", "state",
    "started_at", "restarts", "detail"} each, oldest first, as recorded (nothing is acted on).
    A store that cannot be read is one row saying why (the page never fails for it); no
    store: none. `home` is not used: the store's pointer lives in $MGPU_CLOUD_HOME as the
    CLI reads it."""
    from provision.job.managed.storerecords import store_records

    records = store_records(name)
    if records is None:
        return []
    try:
        jobs = records.list(fresh=False)
    except Exception as exc:  # noqa: BLE001 - a store we cannot read is shown, not raised
        return [{"id": "-", "state": "unknown", "started_at": None, "restarts": None,
                 "detail": f"the store {records.url} could not be read: "
                           f"{type(exc).__name__}: {exc}"}]
    return [{"id": j.id, "state": j.state, "started_at": j.started_at, "restarts": j.restarts,
             "goodput": j.goodput,
             "detail": f"{j.command} · {' → '.join(j.events[-4:])}"
                       + ("" if j.goodput is None else f" · goodput {100 * j.goodput:.0f}%")}
            for j in jobs]


# --- clusters -------------------------------------------------------------------------------
def hours_left(inv: Inventory, now: dt.datetime | None = None) -> float | None:
    """Hours until the cluster's --max-hours ends (never below 0); None without a limit."""
    limit = inv.spec.max_hours if inv.spec is not None else None
    if limit is None:
        return None
    started = dt.datetime.fromisoformat(inv.created_at)
    used = ((now or _now()) - started).total_seconds() / 3600
    return round(max(0.0, limit - used), 3)


def cluster_row(inv: Inventory, now: dt.datetime | None = None) -> dict[str, Any]:
    """One line of the clusters table (`/`)."""
    gate = inv.fabric_gate
    return {
        "name": inv.name, "provider": inv.provider, "state": inv.status,
        "nodes": len(inv.nodes), "created_at": inv.created_at,
        "hourly_cost_usd": inv.hourly_cost_usd, "price_known": not inv.unpriced,
        "cost_usd": round(cost_usd(inv.hourly_cost_usd, inv.created_at, None), 4),
        "max_hours": inv.spec.max_hours if inv.spec is not None else None,
        "hours_left": hours_left(inv, now),
        "gate": gate.summary() if gate else None,
        "gate_verdict": gate.verdict if gate else None,
    }


def clusters_view(home: Path | None = None) -> dict[str, Any]:
    """`/`: every cluster that exists, and the removed ones the history remembers."""
    invs = InventoryStore(home).all()
    rows = [cluster_row(inv) for inv in invs]
    rep = report(home=home)
    jobs = JobStore(home)
    removed = [{**r, "jobs": len(jobs.ids(r["cluster"]))} for r in rep["clusters"]
               if r["removed"]]
    removed.reverse()  # newest first
    return {
        "clusters": rows, "removed": removed, "total_usd": rep["total_usd"],
        "hourly_usd": round(sum(r["hourly_cost_usd"] for r in rows), 4),
    }


def _known_name(name: str) -> str:
    try:
        return checked_name(name)
    except UserInputError:  # an invalid name is simply not a cluster
        raise NotFound(f"{name!r} is not a cluster name") from None


def _inventory(name: str, home: Path | None) -> Inventory | None:
    store = InventoryStore(home)
    return store.load(name) if store.exists(name) else None


def cluster_view(name: str, home: Path | None = None, runs: bool = True) -> dict[str, Any]:
    """`/clusters/NAME`: the cluster (or what is kept of a removed one), its nodes, the fabric
    gate's last result, recovery replacements, the bring-up timeline, its jobs and (`runs`)
    its managed runs (read from their store: remote for s3/gs, so not on every poll)."""
    name = _known_name(name)
    inv = _inventory(name, home)
    recs = LocalRecords(name, home=home).list(fresh=False)  # as recorded: no node is asked
    history = [r for r in report(name, home=home)["clusters"] if r["cluster"] == name]
    if inv is None and not recs and not history:
        known = ", ".join(InventoryStore(home).names()) or "none"
        raise NotFound(f"no cluster named {name!r} (clusters here: {known})")
    out: dict[str, Any] = {
        "name": name, "exists": inv is not None,
        "cluster": cluster_row(inv) if inv is not None else None,
        "history": history, "nodes": [], "spares": [], "gate": None, "replacements": [],
        "bringup": [],
        "jobs": [job_row(r) for r in reversed(recs)],
        "runs": unattended_runs(name, home) if runs else [],
    }
    if inv is not None:
        out["nodes"] = [
            {"name": n.name, "rank": n.rank, "address": n.address, "port": n.port,
             "private_address": n.private_address, "user": n.user, "slots": n.slots,
             "zone": n.zone, "resource_id": n.resource_id}
            for n in sorted(inv.nodes, key=lambda n: n.rank)
        ]
        out["spares"] = [{"name": n.name, "address": n.address, "port": n.port,
                          "user": n.user, "resource_id": n.resource_id} for n in inv.spares]
        out["gate"] = gate_view(inv.fabric_gate)
        out["replacements"] = [r.model_dump(mode="json") for r in inv.replacements]
        out["bringup"] = bringup_phases(inv)
    return out


# --- the fabric gate as a node-pair matrix --------------------------------------------------
def gate_view(gate: GateRecord | None) -> dict[str, Any] | None:
    """The gate's record plus `matrix`: {"nodes": [names], "cells": rows of None (pair not
    measured) or {"busbw_gbps", "verdict", "round", "ratio"}}, symmetric. `ratio` is the
    pair's bandwidth over the gate's pair reference (None when there is none)."""
    if gate is None:
        return None
    names = [n.node for n in gate.nodes]
    for p in gate.pairs:
        names += [x for x in p.nodes if x not in names]
    index = {n: i for i, n in enumerate(names)}
    cells: list[list[dict[str, Any] | None]] = [[None] * len(names) for _ in names]
    ref = gate.pair_reference_gbps
    for p in gate.pairs:
        cell = {"busbw_gbps": p.busbw_gbps, "verdict": p.verdict, "round": p.round,
                "measurements": p.measurements,
                "ratio": round(p.busbw_gbps / ref, 3) if ref else None}
        a, b = index[p.nodes[0]], index[p.nodes[1]]
        cells[a][b] = cells[b][a] = cell
    return {**gate.model_dump(mode="json"), "summary": gate.summary(),
            "matrix": {"nodes": names, "cells": cells}}


# --- jobs -----------------------------------------------------------------------------------
def exit_summary(codes: list[int | None]) -> str:
    """Per-node exit codes in rank order, short: '0,0,1' for a few nodes; '0 x63, 1 x1' for
    many; '-' stands for a node without one yet."""
    words = ["-" if c is None else str(c) for c in codes]
    if len(words) <= 4:
        return ",".join(words) or "-"
    counts: dict[str, int] = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    return ", ".join(f"{w} x{n}" for w, n in counts.items())


def job_row(job: JobSummary) -> dict[str, Any]:
    """One job as the jobs table and the job page show it."""
    return {
        "id": job.id, "state": job.state, "detached": job.note == "detached",
        "command": job.command, "launcher": job.launcher, "started_at": job.started_at,
        "ended_at": job.ended_at, "duration_s": job.duration_s(), "exit_code": job.exit_code,
        "exit_codes": {n.name: n.exit_code for n in job.nodes},
        "exit_summary": exit_summary([n.exit_code for n in job.nodes]),
        "nodes": [{"name": n.name, "rank": n.rank, "state": n.state, "exit_code": n.exit_code}
                  for n in job.nodes],
        "restarts": job.restarts, "logs_saved": job.logs_here,
        "current": job.current, "final": job.final, "goodput": job.goodput,
        "ledger_text": render(job.data["ledger"]) if job.data.get("ledger") else "",
        "ledger": [{"bucket": label, "node_hours": round(hours, 4), "share": round(share, 4)}
                   for label, hours, share in buckets(job.data["ledger"])]
        if job.data.get("ledger") else [],
    }


def load_job(name: str, job_id: str, home: Path | None = None) -> tuple[JobRecord,
                                                                           Inventory | None]:
    """The record and the cluster it ran on (None when that cluster is gone); NotFound for an
    unknown cluster or job."""
    name = _known_name(name)
    store = JobStore(home)
    if not job_id.isdigit() or job_id not in store.ids(name):
        known = ", ".join(store.ids(name)) or "none"
        raise NotFound(f"cluster {name!r} has no job {job_id!r} (jobs: {known})",
                       back=f"/clusters/{name}", back_text=f"cluster {name}")
    rec = store.load(name, job_id)
    inv = _inventory(name, home)
    return rec, inv if is_current(rec, inv) else None


def recovery_events(rec: JobSummary, inv: Inventory | None,
                    log_events: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What happened to the job, oldest first, each {"t": epoch s, "at": ISO, "kind", "node",
    "detail"}: its start and end, nodes replaced while it ran (the inventory's recovery
    record), and the events the nodes printed into its log (MGPU-EVENT lines, e.g. a
    preemption notice; `log_events` as metrics.LogParser collects them)."""
    start = epoch(rec.started_at) or 0.0
    end = epoch(rec.ended_at)
    events: list[dict[str, Any]] = [
        {"t": start, "at": rec.started_at, "kind": "start", "node": None,
         "detail": f"job {rec.id} started on {len(rec.nodes)} node(s)"}]
    if inv is not None:
        for r in inv.replacements:
            t = epoch(r.at)
            if t is not None and t >= start and (end is None or t <= end):
                events.append({"t": t, "at": r.at, "kind": "replaced", "node": r.old,
                               "detail": f"rank {r.rank}: {r.old or '-'} -> {r.new or '-'} "
                                         f"({r.reason})"})
    for ev in log_events or []:
        t = ev.get("t")
        if isinstance(t, int | float):
            events.append({"t": float(t), "at": dt.datetime.fromtimestamp(t, dt.UTC).isoformat(
                timespec="seconds"), "kind": str(ev.get("event", "event")),
                "node": ev.get("node"), "detail": ev.get("detail", "")})
    if end is not None and rec.ended_at is not None:
        events.append({"t": end, "at": rec.ended_at, "kind": "end", "node": None,
                       "state": rec.state,
                       "detail": f"{rec.state} (exit code {rec.exit_code})"})
    return sorted(events, key=lambda e: e["t"])


def job_view(rec: JobRecord, inv: Inventory | None,
             log_events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`/clusters/NAME/jobs/ID` without the live log lines and metrics (the web layer adds
    them): the record, and its recovery events (`log_events` from the job's log)."""
    job = summary_of(rec, inv)
    return {"cluster": rec.cluster, "cluster_exists": inv is not None,
            "job": job_row(job), "events": recovery_events(job, inv, log_events)}


# --- cost -----------------------------------------------------------------------------------
def cost_series(rows: list[dict[str, Any]], now: dt.datetime | None = None) -> dict[str, Any]:
    """Cumulative spend over time from `cost.report` rows: {"t": [epoch s], "usd": [...]}.
    Spend is piecewise linear between the moments clusters start and stop, so its value at
    those moments draws it exactly."""
    t_now = (now or _now()).timestamp()
    spans = []
    for r in rows:
        t0 = epoch(r["created"])
        if t0 is None:
            continue
        t1 = epoch(r["removed"]) or t_now
        spans.append((t0, max(t0, t1), float(r["hourly_cost_usd"])))
    marks = sorted({t for s in spans for t in s[:2]} | ({t_now} if spans else set()))
    usd = [round(sum(h * max(0.0, min(t, t1) - t0) / 3600 for t0, t1, h in spans), 4)
           for t in marks]
    return {"t": marks, "usd": usd}


def cost_view(home: Path | None = None) -> dict[str, Any]:
    """`/cost`: `mgpu-cloud cost --json` plus the cumulative spend as a series."""
    rep = report(home=home)
    return {**rep, "series": cost_series(rep["clusters"])}
