"""What clusters cost: a history of every cluster made from this machine, also after `down`.

    $MGPU_CLOUD_HOME/history.jsonl     one JSON object per line, appended, never rewritten:
        {"event": "up",   "cluster", "created_at", "provider", "type", "nodes", "spot",
                          "hourly_cost_usd"}
        {"event": "down", "cluster", "created_at", "removed_at"}
        {"event": "goodput", "cluster", "created_at", "goodput", "node_seconds"}   a run's
                          ledger (job/ledger.py), when its job ended here

A cluster is (name, created_at): a name may be reused. The cost is the catalog price the plan
showed (Inventory.hourly_cost_usd, whole cluster, USD/hour; spot prices where the spec asked
for spot) times the hours from creation to removal (or to now while it exists). It is an
estimate: the bill also has disks, traffic and per-second rounding, and nodes that powered
themselves off before `down` (a detached run) are counted until `down`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from provision.model.inventory import Inventory, InventoryStore, state_home


def history_path(home: Path | None = None) -> Path:
    return (home or state_home()) / "history.jsonl"


def _append(event: dict[str, Any], home: Path | None = None) -> None:
    """One line, one write with O_APPEND: concurrent writers never interleave inside it."""
    path = history_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def node_type(inv: Inventory) -> str | None:
    """The provider's node type from the spec (ProviderInfo.machine_type), if it has one."""
    from provision.model.registry import provider_info

    field = provider_info(inv.provider).machine_type
    if field is None or inv.spec is None:
        return None
    options = getattr(inv.spec, inv.provider, None)
    value = getattr(options, field, None)
    return None if value is None else str(value)


def record_up(inv: Inventory, home: Path | None = None) -> None:
    """Best effort: a history that cannot be written never stops `up`."""
    with contextlib.suppress(OSError):
        _append({
            "event": "up", "cluster": inv.name, "created_at": inv.created_at,
            "provider": inv.provider, "type": node_type(inv),
            "nodes": inv.spec.nodes if inv.spec else len(inv.nodes),
            "spot": bool(inv.spec and inv.spec.spot), "hourly_cost_usd": inv.hourly_cost_usd,
        }, home)


def record_down(inv: Inventory, home: Path | None = None) -> None:
    with contextlib.suppress(OSError):
        _append({"event": "down", "cluster": inv.name, "created_at": inv.created_at,
                 "removed_at": _now().isoformat(timespec="seconds")}, home)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _hours(start: str, end: str | None) -> float:
    t0 = dt.datetime.fromisoformat(start)
    t1 = dt.datetime.fromisoformat(end) if end else _now()
    return max(0.0, (t1 - t0).total_seconds() / 3600)


def cost_usd(hourly: float, created_at: str, removed_at: str | None) -> float:
    return hourly * _hours(created_at, removed_at)


def record_goodput(inv: Inventory, ledger: dict[str, Any], home: Path | None = None) -> None:
    _append({"event": "goodput", "cluster": inv.name, "created_at": inv.created_at,
             "goodput": ledger.get("goodput"), "node_seconds": ledger.get("node_seconds")},
            home)


def report(name: str | None = None, home: Path | None = None) -> dict[str, Any]:
    """{"clusters": [row, ...] oldest first, "total_usd": ...}. A row: cluster, provider,
    type, nodes, spot, created, removed (None while it exists), hours, node_hours,
    hourly_cost_usd, cost_usd, goodput (its last run's training share, None: not known).
    Clusters that exist but predate the history come from their inventories."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    path = history_path(home)
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            ev = json.loads(line)
            key = (str(ev["cluster"]), str(ev["created_at"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn or foreign line is skipped, never fatal
        if ev.get("event") == "up":
            rows[key] = {
                "cluster": key[0], "provider": ev.get("provider"), "type": ev.get("type"),
                "nodes": int(ev.get("nodes") or 0), "spot": bool(ev.get("spot")),
                "created": key[1], "removed": None,
                "hourly_cost_usd": float(ev.get("hourly_cost_usd") or 0.0),
            }
        elif ev.get("event") == "down" and key in rows:
            rows[key]["removed"] = ev.get("removed_at")
        elif ev.get("event") == "goodput" and key in rows:
            rows[key]["goodput"] = ev.get("goodput")
    for inv in InventoryStore(home).all():
        key = (inv.name, inv.created_at)
        if key not in rows:
            rows[key] = {"cluster": inv.name, "provider": inv.provider, "type": node_type(inv),
                         "nodes": len(inv.nodes), "spot": bool(inv.spec and inv.spec.spot),
                         "created": inv.created_at, "removed": None,
                         "hourly_cost_usd": inv.hourly_cost_usd}
    out = []
    for row in sorted(rows.values(), key=lambda r: (r["created"], r["cluster"])):
        if name is not None and row["cluster"] != name:
            continue
        hours = _hours(row["created"], row["removed"])
        row["hours"] = round(hours, 4)
        row["node_hours"] = round(hours * row["nodes"], 4)
        row["cost_usd"] = round(hours * row["hourly_cost_usd"], 4)
        row.setdefault("goodput", None)
        out.append(row)
    return {"clusters": out, "total_usd": round(sum(r["cost_usd"] for r in out), 2)}


def describe(hourly: float, created_at: str, removed_at: str | None, spot: bool) -> str:
    """One line for the end of `run`: hours x price = cost."""
    hours = _hours(created_at, removed_at)
    kind = "spot catalog price" if spot else "catalog price"
    return (f"cost: {hours * 60:.1f} min x ${hourly:,.2f}/h ({kind}) = "
            f"${hours * hourly:,.2f}")
