"""Hosts a run named slow and replaced (issue 36), per provider, in
$MGPU_CLOUD_HOME/blocklist.json: {"docker": [{"resource": ID, "address": A, "zone": Z,
"cluster": NAME, "reason": TEXT, "at": ISO}], ...}.

What a provider can do with it differs: none of docker (one engine), aws (an instance's
physical host is chosen by EC2 unless it runs on a Dedicated Host) and gcp (likewise without
sole-tenant nodes) can be asked to avoid a host, so `up` names the list instead (the plan's
notes) and a user can act on it (another zone, capacity reservation or instance type).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from provision.model.inventory import NodeRecord, state_home
from remote.files import write_atomic

FILE = "blocklist.json"


def _read() -> dict[str, list[dict[str, Any]]]:
    path = state_home() / FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(provider: str, cluster: str, node: NodeRecord, reason: str) -> None:
    data = _read()
    data.setdefault(provider, []).append({
        "resource": node.resource_id, "address": node.address, "zone": node.zone,
        "cluster": cluster, "reason": reason,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    home = state_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(home / FILE, json.dumps(data, indent=1))


def hosts(provider: str) -> list[dict[str, Any]]:
    return list(_read().get(provider, []))
