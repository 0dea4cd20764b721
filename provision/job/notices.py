"""What the controller says about a node's notices (remote/supervise.py prints them)."""

from __future__ import annotations

import time
from typing import Any

from provision.model.inventory import NodeRecord


def maintenance_message(node: NodeRecord, event: dict[str, Any]) -> str:
    """What the controller says about a maintenance notice a node announced ahead of its
    deadline (remote/supervise.py): nothing is stopped now; the node saves, then it is
    replaced, close to the deadline."""
    if event.get("event") == "maintenance-cleared":
        return f"{node.name}: the scheduled host maintenance was withdrawn; training goes on"
    try:
        deadline, save = float(event["deadline"]), float(event["save_at"])
    except (KeyError, TypeError, ValueError):
        return f"{node.name}: host maintenance scheduled ({event.get('source', '?')})"
    stamp = time.strftime("%H:%M:%SZ", time.gmtime(deadline))
    return (f"{node.name}: host maintenance stops this VM at {stamp} (in "
            f"{max(0.0, deadline - time.time()) / 60:.0f} min); training goes on until "
            f"{max(0.0, deadline - save) / 60:.0f} min before, then every rank saves and the "
            "node is replaced")
