"""Every node's preflight report (`remote.pyz preflight --json`, uploaded at bootstrap).

The judging is provision.nodes.checks (pure functions); this module only runs the node side
and gathers its JSON.
"""

from __future__ import annotations

import json
from typing import Any

from provision.model.inventory import Inventory
from provision.model.spec import DEFAULT_MASTER_PORT
from provision.nodes import NodeGroup, borrowed


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
