"""The durable store's layout by writer, and the one rule every key obeys.

    PREFIX/CLUSTER/cluster.json             the controller's inventory, MAC'd (records.key)
    PREFIX/CLUSTER/jobs/ID/events/SEQ.json  a job's records (the controller; MAC'd)
    PREFIX/CLUSTER/jobs/ID/log/SEQ.log      its output as the controller saw it
    PREFIX/CLUSTER/jobs/ID/spec.json        the job as handed over (the user's machine)
    PREFIX/CLUSTER/jobs/ID/control/cancel   `cancel` (the user's machine)
    PREFIX/CLUSTER/data/                    the ONLY part nodes write, and all they can reach:
        jobs/ID/checkpoints/                a managed run's checkpoints
        jobs/ID/outputs/                    rank 0's $MGPU_OUTPUT_DIR at the end
        checkpoints/                        an attached run's checkpoints

Nodes run the user's code: whatever is under data/ may be hostile. Their credentials reach
data/ only (a file:// store: only data/ is mounted into node containers; s3://: STS
credentials whose session policy names the run's data/ prefix), so the records and
cluster.json above stay the controller's; and what a node wrote is used only as data:

- a key is "/"-separated segments, none empty, "." or "..", no backslash, no control
  character, not absolute (`checked_key`): S3 and GCS accept `../../x` and `/abs/x` as object
  names, and joined to a folder they would write where they point;
- a job id or a node name that becomes a path segment is a plain name (`checked_name`).

Standard library only: this module runs on the nodes (remote.pyz) and in provision/.
"""

from __future__ import annotations

import os
import re

DATA = "data"  # under CLUSTER/: what nodes write
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a job id, a node name, a cluster name
MAX_KEY = 1024  # S3's and GCS's limit on an object name, in UTF-8 bytes


class UnsafeKey(ValueError):
    """A store key or a name that would leave its folder; the message names it."""


def checked_key(key: str) -> str:
    """`key` when it is a plain relative key inside its folder; UnsafeKey otherwise."""
    if not key or len(key.encode()) > MAX_KEY:
        raise UnsafeKey(f"store key {key[:80]!r}: empty or longer than {MAX_KEY} bytes")
    if key.startswith("/") or "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UnsafeKey(f"store key {key[:80]!r}: absolute, or a backslash or control "
                        "character in it")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise UnsafeKey(f"store key {key[:80]!r}: an empty, '.' or '..' segment leaves "
                        "its folder")
    return key


def checked_name(name: str, what: str = "name") -> str:
    """`name` when it can be one path segment (letters, digits, '.', '_', '-'; not starting
    with '.' or '-'); UnsafeKey otherwise."""
    if not NAME.fullmatch(name):
        raise UnsafeKey(f"{what} {name[:80]!r} is not a plain name (letters, digits, '.', "
                        "'_', '-', at most 63, starting with a letter or digit)")
    return name


def inside(root: str, rel: str) -> str:
    """root/rel when it is inside `root` once symbolic links are followed; UnsafeKey
    otherwise (a link a node planted must not carry a write or a read elsewhere)."""
    checked_key(rel)
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, rel))
    if target != base and not target.startswith(base + os.sep):
        raise UnsafeKey(f"store key {rel[:80]!r} leads outside {root} (a symbolic link)")
    return os.path.join(root, rel)


def data_prefix(cluster: str) -> str:
    """CLUSTER/data: the part of a cluster's store its nodes may write."""
    return f"{checked_name(cluster, 'cluster')}/{DATA}"


def job_data(cluster: str, job_id: str) -> str:
    """CLUSTER/data/jobs/ID: a managed run's checkpoints/ and outputs/."""
    return f"{data_prefix(cluster)}/jobs/{checked_name(job_id, 'job id')}"


def job_records(cluster: str, job_id: str) -> str:
    """CLUSTER/jobs/ID: a managed run's records, log, spec and cancel (no node writes)."""
    return f"{checked_name(cluster, 'cluster')}/jobs/{checked_name(job_id, 'job id')}"
