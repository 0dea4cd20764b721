"""What the controller or the user's machine writes to the store, and the other acts on,
carries a MAC.

The store is shared with the nodes' credentials in places (a file:// store every node mounts
in part, an S3-compatible endpoint without policies, a GCS emulator without any auth), and the
nodes run the user's code: everything the user's machine or the controller acts on is
HMAC-SHA256'd with the cluster's records key (provision.model.keys.ensure_records_key: made by
the user's machine, uploaded to the controller, never to a node):

    CLUSTER/cluster.json              the controller's inventory (adopted here)     cluster_kind
    CLUSTER/jobs/ID/events/SEQ.json   a record (`down` on torn_down, take-back)     records.Record
    CLUSTER/jobs/ID/spec.json         the job (a take-back hands it over again)     spec_kind
    CLUSTER/jobs/ID/control/heartbeat the controller alive (a take-back when old)   heartbeat_kind
    CLUSTER/jobs/ID/control/cancel    `cancel` (the controller stops the job)       cancel_kind

A copy whose MAC does not verify is refused and named; nothing of it is used. A malformed MAC
(not a string, not ASCII, not 64 hex digits) is a refusal like a wrong one, never an error.

The MAC covers a kind naming the object and the cluster (and job, sequence) it belongs to, so
an object signed for one place cannot be replayed in another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from provision.model.errors import MgpuError

KEY_FILE = "records.key"  # in the cluster's keys folder (both machines)
MAC_HEX = 64  # hex digits of an HMAC-SHA256


class Unsigned(MgpuError):
    """A store object that should carry the controller's MAC does not (or a wrong one)."""


def mac(key: bytes, kind: str, body: bytes) -> str:
    return hmac.new(key, kind.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def verify(key: bytes, kind: str, body: bytes, given: object) -> bool:
    """Whether `given` is the MAC of `body` for `kind` with `key`. Anything that is not 64
    ASCII characters is False, never an error (hmac.compare_digest raises TypeError on a
    non-ASCII str)."""
    if not isinstance(given, str) or len(given) != MAC_HEX or not given.isascii():
        return False
    return hmac.compare_digest(given.encode("ascii"), mac(key, kind, body).encode("ascii"))


def seal(key: bytes, kind: str, body: bytes) -> bytes:
    """An envelope: {"kind": ..., "mac": ..., "body": BODY as text}."""
    return json.dumps({"kind": kind, "mac": mac(key, kind, body),
                       "body": body.decode()}).encode()


def _envelope(data: bytes) -> tuple[str, object, bytes] | None:
    """(kind, mac, body) of an envelope; None when `data` is not one."""
    try:
        env = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(env, dict):
        return None
    kind, body = env.get("kind"), env.get("body")
    if not isinstance(kind, str) or not isinstance(body, str):
        return None
    return kind, env.get("mac"), body.encode()


def open_sealed(key: bytes, kind: str, data: bytes) -> bytes:
    """The body of an envelope made by `seal` with `key` for `kind`; Unsigned otherwise."""
    env = _envelope(data)
    if env is None:
        raise Unsigned(f"{kind}: not sealed by the cluster's controller (no MAC)")
    env_kind, given, body = env
    if env_kind != kind or not verify(key, kind, body, given):
        raise Unsigned(f"{kind}: its MAC does not verify (written by something other than "
                       "the cluster's controller)")
    return body


def unchecked_body(data: bytes) -> bytes:
    """What an envelope carries, NOT verified (a machine without the records key shows it,
    never acts on it); `data` itself when it is not an envelope."""
    env = _envelope(data)
    return env[2] if env is not None else data


def cluster_kind(name: str) -> str:
    """What the MAC of CLUSTER/cluster.json covers besides its body."""
    return f"cluster.json {name}"


def spec_kind(cluster: str, job_id: str) -> str:
    return f"spec {cluster}/{job_id}"


def heartbeat_kind(cluster: str, job_id: str) -> str:
    return f"heartbeat {cluster}/{job_id}"


def cancel_kind(cluster: str, job_id: str) -> str:
    return f"cancel {cluster}/{job_id}"


def local_key(keys_dir: Path) -> bytes | None:
    """The records key of a cluster on this machine, if it has one (never made here)."""
    path = keys_dir / KEY_FILE
    return path.read_bytes() if path.is_file() else None
