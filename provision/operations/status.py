"""Rows for `mgpu-cloud status` (plain data; the CLI formats them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from provision.model.inventory import Inventory, NodeRecord


def status_rows(invs: list[Inventory]) -> list[dict[str, Any]]:
    return [
        {
            "name": inv.name,
            "provider": inv.provider,
            "status": inv.status,
            "created_at": inv.created_at,
            "hourly_cost_usd": inv.hourly_cost_usd,
            "price_known": not inv.unpriced,
            "resources": len(inv.resources),
            "nodes": [_node(n) for n in sorted(inv.nodes, key=lambda n: n.rank)],
            "spares": [_node(n) for n in inv.spares],  # warm spares (issue 44), idle
        }
        for inv in invs
    ]


def _node(n: NodeRecord) -> dict[str, Any]:
    return {"name": n.name, "rank": n.rank, "address": n.address, "port": n.port,
            "private_address": n.private_address, "user": n.user, "slots": n.slots}


def text_table(rows: Sequence[Sequence[str]], right: set[int] | None = None) -> list[str]:
    """Rows (the first is the header) as aligned lines, columns two spaces apart; columns in
    `right` are right-aligned. Nothing is ever cut: a long cell widens its column."""
    right = right or set()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def when(iso: str | None) -> str:
    """'2025-01-02T03:04:05+00:00' -> '2025-01-02 03:04Z' (17 columns, never cut)."""
    import datetime as dt

    if not iso:
        return "-"
    try:
        t = dt.datetime.fromisoformat(iso).astimezone(dt.UTC)
    except ValueError:
        return iso
    return t.strftime("%Y-%m-%d %H:%MZ")


def _price(row: dict[str, Any]) -> str:
    """The cluster's $/hour; "+?" when part of it has no known price."""
    return f"{row['hourly_cost_usd']:.2f}" + ("" if row.get("price_known", True) else "+?")


def _node_lines(nodes: list[dict[str, Any]], spares: list[dict[str, Any]]) -> list[str]:
    """The nodes of one cluster under a header of their own: name, SSH login, and the
    private address where it differs; then its warm spares, named as such."""
    if not nodes and not spares:
        return []
    both = [*nodes, *spares]
    private = any(n["private_address"] != n["address"] for n in both)
    rows = [("NODE", "SSH", "PRIVATE") if private else ("NODE", "SSH")]
    for n in both:
        login = f"{n['user']}@{n['address']}:{n['port']}"
        name = n["name"] + (" (spare, idle)" if n in spares else "")
        rows.append((name, login, n["private_address"]) if private else (name, login))
    return text_table(rows)


def _count(row: dict[str, Any]) -> str:
    """NODES: the ranks' nodes, `+K` the warm spares."""
    spares = len(row.get("spares", []))
    return str(len(row["nodes"])) + (f"+{spares}" if spares else "")


def status_text(rows: list[dict[str, Any]], notes: dict[str, str] | None = None) -> str:
    """Plain lines that fit 80 columns for names up to 30 characters: one line per cluster,
    then its nodes under their own header (address and port never cut, unlike a table
    squeezed to the terminal),
    then the cluster's note if any (e.g. the fabric gate's last result)."""
    if not rows:
        return "no clusters (create one: mgpu-cloud up)"
    head = ("CLUSTER", "PROVIDER", "STATUS", "NODES", "CREATED", "$/HOUR")
    table = [head] + [(r["name"], r["provider"], r["status"], _count(r),
                       when(r["created_at"]), _price(r)) for r in rows]
    lines = text_table(table, right={3, 5})
    out = [lines[0]]
    for r, cells in zip(rows, lines[1:], strict=True):
        out.append(cells)
        out += ["  " + line for line in _node_lines(r["nodes"], r.get("spares", []))]
        if notes and r["name"] in notes:
            out.append(f"  {notes[r['name']]}")
    return "\n".join(out)


def timeline_rows(inv: Inventory) -> list[dict[str, Any]]:
    """`status NAME --timeline --json`: the cluster's timelines, oldest first, each with its
    phases ({phase, part_of, start_s, seconds, detail}) and the slowest phase's name."""
    out = []
    for tl in inv.timelines:
        slow = tl.slowest()
        out.append({**tl.model_dump(mode="json"), "summary": tl.summary(),
                    "slowest": slow[0].phase if slow else None})
    return out


def timeline_text(inv: Inventory) -> str:
    """`status NAME --timeline`: one table per timeline (a part indented under its phase),
    then the line naming the slowest phase."""
    import datetime as dt

    if not inv.timelines:
        return f"{inv.name}: no timeline recorded (made before timelines were kept?)"
    out: list[str] = []
    for tl in inv.timelines:
        start = dt.datetime.fromtimestamp(tl.started_at, dt.UTC).isoformat(timespec="seconds")
        out.append(f"{inv.name}: {tl.command} at {when(start)} ({inv.provider})")
        rows = [("PHASE", "START", "SECONDS", "DETAIL")]
        for p in tl.phases:
            secs = "-" if p.seconds is None else f"{p.seconds:.2f}"
            rows.append((("  " if p.part_of else "") + p.phase, f"{p.start_s:.2f}", secs,
                         p.detail))
        out += ["  " + line for line in text_table(rows, right={1, 2})]
        out.append(f"  {tl.summary()}")
    return "\n".join(out)
