"""Every node's preflight report (`remote.pyz preflight --json`, uploaded at bootstrap).

The judging is provision.nodes.checks (pure functions); this module only runs the node side
and gathers its JSON.
"""

from __future__ import annotations

import json
from typing import Any

from provision.model import nodetext
from provision.model.inventory import Inventory
from provision.model.nodejson import MAX_ANSWER, PreflightReport, Unreadable, read_value, unreadable
from provision.model.spec import DEFAULT_MASTER_PORT
from provision.nodes import NodeGroup, borrowed


def parse_last_json(text: str) -> dict[str, Any] | None:
    """The JSON object on the last line of `text` (split on `\n` only; at most
    nodejson.MAX_ANSWER characters), if it is one."""
    lines = nodetext.lines(text.strip())
    if not lines or len(lines[-1]) > MAX_ANSWER:
        return None
    try:
        value = json.loads(lines[-1])
    except (ValueError, RecursionError):
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
            reports[name] = report_of(name, report) if report is not None else {
                "error": res.why()[-500:]}
    return reports


def report_of(node: str, value: dict[str, Any]) -> dict[str, Any]:
    """A node's report as nodes/checks.py may read it (nodejson.PreflightReport: the fields
    it judges typed, exactly the keys sent); an unreadable one is a preflight that did not
    run, said so."""
    try:
        return read_value(PreflightReport, value).model_dump(exclude_unset=True)
    except Unreadable as exc:
        return {"error": unreadable(node, "preflight report", exc)}
