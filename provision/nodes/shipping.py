"""The one rule for what a job's folder may carry off this machine (issue 42).

A job's local folder travels to the nodes (bootstrap, the attached sync, a replacement's or
a grown-back node's bootstrap: `bootstrap.payload`, also on the controller of a managed run,
and through the k8s provider's transport) and to the cluster's controller
(`handoff.controller_payload`, which the controller then sends on). Every one of them builds
the folder's archive with `workdir_archive`, which leaves out what this machine keeps to
itself wherever it lies under the folder (a script in ~ with the default home,
MGPU_CLOUD_HOME inside the project, a key beside the script):

    the tool's state folder ($MGPU_CLOUD_HOME: every cluster's inventory and keys:
    records.key, controller_ed25519, id_ed25519, known_hosts ...)
    every file of its keys/ folder, and every key file an inventory of this machine names,
    of any cluster: its cluster key and the .pub beside it, its known_hosts, a node's
    identity file (the ssh provider's ~/.ssh/...)

A file or folder is matched by what it IS (device and inode, after links), not by its name or
path: a hard link to a key, a link to the state folder or another spelling of it is left out
too. What was left out is said in one line.
"""

from __future__ import annotations

import fnmatch
import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

from provision.model.errors import MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, state_home
from provision.model.logsink import Log

Identity = tuple[int, int]  # (st_dev, st_ino)


def _key_files(inv: Inventory) -> list[Path]:
    paths: list[Path] = []
    if inv.key_path:
        key = Path(inv.key_path).expanduser()
        paths += [key, key.with_suffix(".pub")]
    others = [inv.known_hosts_path, *(n.identity_file for n in inv.nodes)]
    return paths + [Path(p).expanduser() for p in others if p]


def never_shipped(inv: Inventory | None = None) -> list[Path]:
    """What no payload carries off this machine: the state folder, and the key files of `inv`
    and of every inventory here (one that cannot be read names none)."""
    home = state_home()
    keys = home / "keys"  # each one by itself too: a hard link elsewhere is the same file
    paths = [home, *(p for p in keys.rglob("*") if p.is_file())] if keys.is_dir() else [home]
    invs = [inv] if inv is not None else []
    store = InventoryStore()
    for name in store.names():
        try:
            invs.append(store.load(name))
        except MgpuError:
            continue  # unreadable: `status` names it; its keys are in the state folder
    for one in invs:
        paths += _key_files(one)
    return paths


def _identity(path: str | Path) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def workdir_tar(root: Path, excludes: list[str],
                skip: Iterable[Path] = ()) -> tuple[bytes, list[str]]:
    """A gzip tar of `root` without paths whose any component matches an exclude pattern,
    and without the files and folders `skip` names (matched by identity: device and inode
    after links). Returns the archive and the paths (relative to `root`) left out for `skip`."""
    skipped = {i for i in map(_identity, skip) if i is not None}
    left_out: list[str] = []

    def excluded(rel: str) -> bool:
        if any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in excludes):
            return True
        if _identity(os.path.join(root, rel)) in skipped:
            left_out.append(rel)
            return True
        return False

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames
                                 if not excluded(os.path.normpath(os.path.join(rel_dir, d))))
            for name in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if not excluded(rel):
                    tar.add(os.path.join(dirpath, name), arcname=rel, recursive=False)
    return buf.getvalue(), left_out


def workdir_archive(root: Path, excludes: list[str], inv: Inventory | None,
                    log: Log | None) -> bytes:
    """`root` as a payload's gzip tar: `excludes` left out, and what never leaves this
    machine (`never_shipped`), said in one line through `log` when it was there."""
    skip = never_shipped(inv)
    inside = {_identity(p) for p in skip} - {None}
    if any(_identity(p) in inside for p in (root, *root.parents)):
        raise UserInputError(f"the job's folder {root} lies in the tool's state folder or is "
                             "a key: it never leaves this machine",
                             hint="put the script in a folder of its own")
    data, left_out = workdir_tar(root, excludes, skip)
    if left_out and log is not None:
        log(f"left out of {root} (the tool's state and key files never leave this machine): "
            + ", ".join(left_out))
    return data
