"""What the controller writes to the store and the user's machine acts on carries a MAC.

The store is shared with the nodes' credentials in places (a file:// store every node mounts
in part, an S3-compatible endpoint without policies, a GCS emulator without any auth), and the
nodes run the user's code: the cluster state (CLUSTER/cluster.json) and the job records that
steer the user's machine (adopting nodes, addresses and host keys; `down` on a `torn_down`
record) are HMAC-SHA256'd with the cluster's records key (provision.model.keys.
ensure_records_key: made by the user's machine, uploaded to the controller, never to a node).
A copy whose MAC does not verify is refused and named; nothing of it is used.

The MAC covers a kind and the cluster (and job, sequence) it belongs to, so an object signed
for one place cannot be replayed in another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from provision.model.errors import MgpuError

KEY_FILE = "records.key"  # in the cluster's keys folder (both machines)


class Unsigned(MgpuError):
    """A store object that should carry the controller's MAC does not (or a wrong one)."""


def mac(key: bytes, kind: str, body: bytes) -> str:
    return hmac.new(key, kind.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def seal(key: bytes, kind: str, body: bytes) -> bytes:
    """An envelope: {"kind": ..., "mac": ..., "body": BODY as text}."""
    return json.dumps({"kind": kind, "mac": mac(key, kind, body),
                       "body": body.decode()}).encode()


def open_sealed(key: bytes, kind: str, data: bytes) -> bytes:
    """The body of an envelope made by `seal` with `key` for `kind`; Unsigned otherwise."""
    try:
        env = json.loads(data)
        body = str(env["body"]).encode()
        given = str(env["mac"])
        env_kind = str(env["kind"])
    except (ValueError, KeyError, TypeError):
        raise Unsigned(f"{kind}: not sealed by the cluster's controller (no MAC)") from None
    if env_kind != kind or not hmac.compare_digest(given, mac(key, kind, body)):
        raise Unsigned(f"{kind}: its MAC does not verify (written by something other than "
                       "the cluster's controller)")
    return body


def cluster_kind(name: str) -> str:
    """What the MAC of CLUSTER/cluster.json covers besides its body."""
    return f"cluster.json {name}"


def local_key(keys_dir: Path) -> bytes | None:
    """The records key of a cluster on this machine, if it has one (never made here)."""
    path = keys_dir / KEY_FILE
    return path.read_bytes() if path.is_file() else None
