"""The Role docs/kubernetes.md gives, as a rules layer: every request the provider sent to
the stand-in (as the user) must be one that Role allows, so the docs cannot fall behind the
code. Discovery (/api, /apis, /version) is every authenticated user's (system:discovery)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

DOC = Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md"


@cache
def role() -> dict[str, Any]:
    text = DOC.read_text()
    block = re.search(r"## The Role.*?```yaml\n(.*?)```", text, re.S)
    assert block, f"no Role in {DOC}"
    doc: dict[str, Any] = yaml.safe_load(block.group(1))
    assert doc["kind"] == "Role"
    return doc


def attributes(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str] | None:
    """(apiGroup, resource[/subresource], verb) of a request; None for discovery."""
    parts = [p for p in path.split("/") if p]
    if path.rstrip("/") in ("/api", "/apis", "/version"):
        return None
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    resource = rest[2] if rest[:1] == ["namespaces"] and len(rest) > 2 else rest[0]
    name = rest[3] if rest[:1] == ["namespaces"] and len(rest) > 3 else None
    if rest[:1] == ["namespaces"] and len(rest) > 4:
        resource += "/" + rest[4]
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
    if verb is None:
        verb = "get" if name else ("watch" if query.get("watch") else "list")
    return group, resource, verb


def denied(requests: list[Any]) -> list[str]:
    """The requests (Seen: method, path, query) the Role does not allow."""
    rules = role()["rules"]
    out = []
    for r in requests:
        attrs = attributes(r.method, r.path, r.query)
        if attrs is None:
            continue
        group, resource, verb = attrs
        if not any(group in rule["apiGroups"] and resource in rule["resources"]
                   and verb in rule["verbs"] for rule in rules):
            out.append(f"{r.method} {r.path}: {verb} {resource} ({group or 'core'})")
    return sorted(set(out))
