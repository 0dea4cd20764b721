"""The Roles docs/kubernetes.md gives, as a rules layer: every request the provider sent to
the stand-in as the user must be one the user's Role (or the optional ClusterRole the docs
name) allows, and every request the
controller pod sent as its ServiceAccount one the controller's Role allows, so the docs
cannot fall behind the code. Discovery (/api, /apis, /version) is every authenticated
user's (system:discovery). `allows` is also the stand-in's RBAC evaluation (resourceNames
included) of the Roles the API holds (standin_incluster.py)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

DOC = Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md"
USER = "## The Role the provider needs"
CONTROLLER = "## The Role of the controller"
OPTIONAL = "## An optional ClusterRole"


@cache
def role(heading: str = USER) -> dict[str, Any]:
    text = DOC.read_text()
    block = re.search(re.escape(heading) + r".*?```yaml\n(.*?)```", text, re.S)
    assert block, f"no Role under {heading!r} in {DOC}"
    doc: dict[str, Any] = yaml.safe_load(block.group(1))
    assert doc["kind"] == ("ClusterRole" if heading == OPTIONAL else "Role")
    return doc


def controller_role(cluster: str) -> dict[str, Any]:
    """The controller's Role of the docs for cluster `cluster` (NAME in its names)."""
    text = yaml.safe_dump(role(CONTROLLER))
    out: dict[str, Any] = yaml.safe_load(text.replace("NAME", cluster))
    return out


def attributes(method: str, path: str, query: dict[str, str]
               ) -> tuple[str, str, str, str | None] | None:
    """(apiGroup, resource[/subresource], verb, name) of a request; None for discovery."""
    parts = [p for p in path.split("/") if p]
    if path.rstrip("/") in ("/api", "/apis", "/version") or (parts[:1] == ["apis"]
                                                               and len(parts) <= 3):
        return None
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        resource, name = rest[2], (rest[3] if len(rest) > 3 else None)
        if len(rest) > 4:
            resource += "/" + rest[4]
    else:
        resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
    if verb is None:
        verb = "get" if name else ("watch" if query.get("watch") else "list")
    return group, resource, verb, name


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str,
           name: str | None) -> bool:
    """RBAC's rule match (kubernetes pkg/apis/rbac/v1/evaluation_helpers.go RuleAllows):
    group, resource and verb each listed (or `*`); resourceNames, when a rule lists them,
    only for a request naming one of them (never a list, watch or create)."""
    def has(items: list[str], value: str) -> bool:
        return "*" in items or value in items

    return any(has(r.get("apiGroups", []), group) and has(r.get("resources", []), resource)
               and has(r.get("verbs", []), verb)
               and (not r.get("resourceNames") or name in r["resourceNames"])
               for r in rules)


def denied(requests: list[Any], rules: list[dict[str, Any]] | None = None) -> list[str]:
    """The requests (Seen: method, path, query) the rules (default: the user's Role of the
    docs) do not allow."""
    rules = role()["rules"] if rules is None else rules
    out = []
    for r in requests:
        attrs = attributes(r.method, r.path, r.query)
        if attrs is None:
            continue
        group, resource, verb, name = attrs
        if not allows(rules, group, resource, verb, name):
            out.append(f"{r.method} {r.path}: {verb} {resource} ({group or 'core'})")
    return sorted(set(out))


def denied_to_anyone(requests: list[Any]) -> list[str]:
    """Every request judged by the Role of docs/kubernetes.md for who sent it: the user's,
    or a controller's ServiceAccount (system:serviceaccount:NS:NAME-controller)."""
    out = denied([r for r in requests if r.who == "user"],
                 role()["rules"] + role(OPTIONAL)["rules"])
    for who in sorted({r.who for r in requests if r.who.startswith("system:serviceaccount:")}):
        sa = who.rsplit(":", 1)[1]
        assert sa.endswith("-controller"), f"an unexpected identity sent requests: {who}"
        rules = controller_role(sa.removesuffix("-controller"))["rules"]
        out += [f"{who}: {d}" for d in denied([r for r in requests if r.who == who], rules)]
    return out
