"""Preemption notices from the cloud's metadata service (used by `remote.pyz run`).

    aws   IMDSv2: PUT {url}/latest/api/token (X-aws-ec2-metadata-token-ttl-seconds), then GET
          {url}/latest/meta-data/spot/instance-action with X-aws-ec2-metadata-token: 404 while
          nothing is scheduled, else JSON {"action": "terminate|stop|hibernate",
          "time": "2026-..Z"} about two minutes ahead ("Spot Instance interruption notices",
          EC2 User Guide).
    gcp   GET {url}/computeMetadata/v1/instance/preempted (Metadata-Flavor: Google): "TRUE"
          once the VM is being preempted (~30 s ahead); and .../instance/maintenance-event:
          "NONE", "MIGRATE_ON_HOST_MAINTENANCE" or "TERMINATE_ON_HOST_MAINTENANCE" (~60 s
          ahead) ("Detect if a VM was preempted" and "Monitor maintenance events", Compute
          Engine docs). Only a TERMINATE event is a notice: a live migration keeps the VM and
          its processes running (GPU VMs are never migrated: onHostMaintenance TERMINATE).
          Compared by substring, as TensorFlow's gce_util does, since newer VMs may answer
          with a longer value.
    file  the docker provider's stand-in: {url} is a folder; a file `instance-action` in it
          holds the same JSON as aws's. The same polling, parsing and signalling code runs;
          only the transport differs (no token, file:// instead of http://).

`check(protocol, url)` returns a Notice or None and never raises for "no notice" answers;
network errors count as no notice (the watcher polls again).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Notice:
    action: str
    time: str
    source: str


def _get(url: str, headers: dict[str, str], method: str = "GET") -> str | None:
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 - fixed schemes
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def _aws_notice(text: str | None, source: str) -> Notice | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "action" not in data:
        return None
    return Notice(str(data["action"]), str(data.get("time", "")), source)


def check(protocol: str, url: str) -> Notice | None:
    base = url.rstrip("/")
    if protocol == "aws":
        token = _get(f"{base}/latest/api/token",
                     {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, method="PUT")
        headers = {"X-aws-ec2-metadata-token": token} if token else {}
        where = f"{base}/latest/meta-data/spot/instance-action"
        return _aws_notice(_get(where, headers), where)
    if protocol == "gcp":
        flavor = {"Metadata-Flavor": "Google"}
        preempted = _get(f"{base}/computeMetadata/v1/instance/preempted", flavor)
        if preempted and preempted.strip().upper() == "TRUE":
            return Notice("preempt", "", "instance/preempted")
        event = _get(f"{base}/computeMetadata/v1/instance/maintenance-event", flavor)
        if event and "TERMINATE_ON_HOST_MAINTENANCE" in event.upper():
            return Notice("TERMINATE_ON_HOST_MAINTENANCE", "", "instance/maintenance-event")
        return None
    if protocol == "file":
        path = Path(url) / "instance-action"
        try:
            return _aws_notice(path.read_text(), str(path))
        except OSError:
            return None
    raise SystemExit(f"unknown preemption protocol {protocol!r}")
