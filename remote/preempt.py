"""Preemption notices from the cloud's metadata service (used by `remote.pyz run`).

    aws   IMDSv2: PUT {url}/latest/api/token (X-aws-ec2-metadata-token-ttl-seconds), then GET
          {url}/latest/meta-data/spot/instance-action with X-aws-ec2-metadata-token: 404 while
          nothing is scheduled, else JSON {"action": "terminate|stop|hibernate",
          "time": "2026-..Z"} about two minutes ahead ("Spot Instance interruption notices",
          EC2 User Guide).
    gcp   GET {url}/computeMetadata/v1/instance/preempted (Metadata-Flavor: Google): "TRUE"
          once the VM is being preempted (~30 s ahead: act now); .../instance/maintenance-event:
          "NONE", "MIGRATE_ON_HOST_MAINTENANCE" or "TERMINATE_ON_HOST_MAINTENANCE" — for a VM
          with GPUs the TERMINATE value comes ONE HOUR ahead ("Compute Engine gives GPU VMs a
          1-hour stopping notice, while normal VMs receive only a 60-second notice", "Handle
          GPU host maintenance events", https://cloud.google.com/compute/docs/gpus/
          gpu-host-maintenance); and .../instance/upcoming-maintenance?alt=json: `{ }`, or
          {"maintenance_status": "PENDING"|"ONGOING", "window_start_time": RFC 3339, ...}
          ("Monitor and plan for a host maintenance event", https://cloud.google.com/compute/
          docs/instances/monitor-plan-host-maintenance-event). A maintenance notice carries
          its `deadline` (window_start_time, else one hour after the TERMINATE event was seen):
          the supervisor keeps the job running until SAVE_LEAD_S before it (an hour of a
          healthy node is not thrown away), then saves. Only a TERMINATE event is a notice: a
          live migration keeps the VM and its processes running (GPU VMs are never migrated:
          onHostMaintenance TERMINATE). Compared by substring, as TensorFlow's gce_util does,
          since newer VMs may answer with a longer value.
    file  the docker provider's stand-in: {url} is a folder; a file `instance-action` in it
          holds the same JSON as aws's. The same polling, parsing and signalling code runs;
          only the transport differs (no token, file:// instead of http://).

`check(protocol, url)` returns a Notice or None and never raises for "no notice" answers;
network errors count as no notice (the watcher polls again). `save_at(notice)` is when the job
should be asked to save: now, or SAVE_LEAD_S before a maintenance deadline.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 2.0
GPU_MAINTENANCE_NOTICE_S = 3600.0  # GCP: GPU VMs' stopping notice (see the docstring)
# How long before a maintenance deadline the job is asked to save: a save, its copy to the
# controller and the job's stop fit in it (recovery.PREEMPT_SAVE_DEADLINE_S is 90 s).
SAVE_LEAD_S = float(os.environ.get("MGPU_MAINTENANCE_SAVE_LEAD_S", "300"))


@dataclass(frozen=True)
class Notice:
    action: str
    time: str
    source: str
    deadline: float | None = None  # epoch seconds the VM stops; None: now (act at once)


def save_at(notice: Notice, lead_s: float | None = None) -> float:
    """Epoch seconds at which to ask the job to save: at once, or `lead_s` (SAVE_LEAD_S)
    before the notice's deadline."""
    if notice.deadline is None:
        return time.time()
    return notice.deadline - (SAVE_LEAD_S if lead_s is None else lead_s)


def _epoch(rfc3339: str) -> float | None:
    try:
        when = dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


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


_first_seen: dict[str, float] = {}  # a TERMINATE event's first sighting, per metadata URL


def _upcoming(base: str, flavor: dict[str, str]) -> dict[str, object]:
    text = _get(f"{base}/computeMetadata/v1/instance/upcoming-maintenance?alt=json", flavor)
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _gcp_maintenance(base: str, flavor: dict[str, str]) -> Notice | None:
    event = _get(f"{base}/computeMetadata/v1/instance/maintenance-event", flavor) or ""
    terminate = "TERMINATE_ON_HOST_MAINTENANCE" in event.upper()
    upcoming = _upcoming(base, flavor)
    status = str(upcoming.get("maintenance_status", ""))
    start = str(upcoming.get("window_start_time", ""))
    scheduled = status in ("PENDING", "ONGOING") and bool(start)
    if not terminate and not scheduled:
        _first_seen.pop(base, None)
        return None
    deadline = _epoch(start) if scheduled else None
    if status == "ONGOING":
        deadline = None  # under way: save now
    elif deadline is None:  # the TERMINATE event alone: an hour from when it was first seen
        deadline = _first_seen.setdefault(base, time.time()) + GPU_MAINTENANCE_NOTICE_S
    source = "instance/upcoming-maintenance" if scheduled else "instance/maintenance-event"
    return Notice("TERMINATE_ON_HOST_MAINTENANCE", start, source, deadline)


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
        return _gcp_maintenance(base, flavor)
    if protocol == "file":
        path = Path(url) / "instance-action"
        try:
            return _aws_notice(path.read_text(), str(path))
        except OSError:
            return None
    raise SystemExit(f"unknown preemption protocol {protocol!r}")
