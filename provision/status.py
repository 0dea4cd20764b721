"""Rows for `mgpu-cloud status` (plain data; the CLI formats them)."""

from __future__ import annotations

from typing import Any

from provision.inventory import Inventory


def status_rows(invs: list[Inventory]) -> list[dict[str, Any]]:
    return [
        {
            "name": inv.name,
            "provider": inv.provider,
            "status": inv.status,
            "created_at": inv.created_at,
            "hourly_cost_usd": inv.hourly_cost_usd,
            "resources": len(inv.resources),
            "nodes": [
                {"name": n.name, "rank": n.rank, "address": n.address, "port": n.port,
                 "private_address": n.private_address, "user": n.user, "slots": n.slots}
                for n in sorted(inv.nodes, key=lambda n: n.rank)
            ],
        }
        for inv in invs
    ]
