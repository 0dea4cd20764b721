"""Keep the job's checkpoint folder safe off the nodes, and put it back before a restart.

Every rank sees $MGPU_CHECKPOINT_DIR (nodes.RemoteLayout.checkpoints). While a job runs, a
CheckpointKeeper polls that folder on every node (`remote.pyz ckpt-manifest`, on connections of
its own) and copies the files that changed and then stayed still for `settle` seconds (a save
is complete when its files stop changing; judged on the node's clock) to this machine, merged
across nodes (rank 0's files and, for sharded checkpoints such as DeepSpeed's, every node's
shards) into ./mgpu-outputs/NAME/checkpoints/. Before a restart `restore` puts the whole
folder back on every node (a replaced node-0 included), so every rank can load the latest.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from provision.model.errors import BootstrapError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.model.nodejson import (
    MAX_MANIFEST,
    CheckpointManifest,
    Unreadable,
    last_line,
    unreadable,
)
from provision.model.nodetext import shown
from provision.nodes import Connector, NodeGroup, NodeStepError, fetch_tree
from remote.ckpt import step_of

Manifest = dict[str, list[float]]
INTERVAL_S = 2.0
SETTLE_S = 1.0


def parse_manifest(data: CheckpointManifest) -> tuple[Manifest, float]:
    """(files, the node's clock) of what `remote.pyz ckpt-manifest` prints (remote/ckpt.py
    report; an attached job's end line carries the same), read as nodejson's model. Files
    the node found cut short (its writer died while saving) are left out: never kept."""
    cut = set(data.incomplete)
    files = {rel: [float(size), mtime] for rel, (size, mtime) in data.files.items()
             if rel not in cut}
    return files, data.now


def local_checkpoint_dir(inv: Inventory) -> Path:
    return (Path("mgpu-outputs") / inv.name / "checkpoints").resolve()


class CheckpointKeeper:
    def __init__(self, inv: Inventory, local: Path, *, log: Log, interval_s: float = INTERVAL_S,
                 settle_s: float = SETTLE_S, connector: Connector | None = None) -> None:
        self.inv, self.local, self.log = inv, local, log
        self.interval_s, self.settle_s = interval_s, settle_s
        self.connector = connector
        self.where = f"{local}/"  # for people: where kept checkpoints go
        self.synced: dict[str, Manifest] = {}  # node name -> manifest last copied
        self.last_change = time.monotonic()  # progress signal for hang detection
        self.last_copy = 0.0  # monotonic time of the last copy
        self._seen: dict[str, Manifest] = {}
        self._cut: set[str] = set()  # files a node found cut short, said once
        self.restored_step: int | None = None  # the newest step the last restore put back
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._group: NodeGroup | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._group = NodeGroup(self.inv, connector=self.connector)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self, known: dict[str, tuple[Manifest, float]] | None = None,
             gone: frozenset[str] = frozenset()) -> None:
        """Stop polling, after one last copy of what the reachable nodes hold. `known`: the
        manifests some nodes already gave as the job ended there (job/ends.py): only the
        others are asked, but not those `gone` (the provider says so: a login would wait for
        its timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        try:  # best effort, like every pass: a node may go between its manifest and its copy
            self.sync(settle_s=0.0, known=known, gone=gone)
        except Exception as exc:  # noqa: BLE001 - said; what was kept before stays
            self.log(f"the last checkpoint copy failed ({exc}); the copies kept before stay")
        if self._group is not None:
            self._group.close()
            self._group = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - never let a copy failure kill the job
                self.log(f"checkpoint copy failed ({exc}); trying again")

    # --- copying -------------------------------------------------------------------------------
    def _manifests(self, group: NodeGroup, known: dict[str, tuple[Manifest, float]] | None = None,
                   gone: frozenset[str] = frozenset()) -> dict[str, tuple[Manifest, float]]:
        """node name -> (manifest, the node's clock) for every node that answered (or whose
        manifest is `known`)."""
        layout, known = group.layout, known or {}
        out = {n.name: known[n.name] for n in group.nodes if n.name in known}
        ask = [n for n in group.nodes if n.name not in out and n.name not in gone]
        if not ask:
            return out
        res = group.run(layout.remote_command("ckpt-manifest", layout.checkpoints), nodes=ask)
        for name, r in res.items():
            if not r.ok or r.value is None:
                continue
            try:
                data = last_line(CheckpointManifest, r.value.stdout, limit=MAX_MANIFEST)
            except Unreadable as exc:  # said; that node's files are asked again next time
                self.log(unreadable(name, "checkpoint manifest", exc))
                continue
            out[name] = parse_manifest(data)
            self._say_cut(name, data.incomplete)
        return out

    def _say_cut(self, node: str, cut: list[str]) -> None:
        for rel in sorted(set(cut) - self._cut):
            self.log(f"{node}: {shown(rel)} is cut short (its writer died while saving?): "
                     "not kept")
        self._cut |= set(cut)

    def sync(self, settle_s: float | None = None,
             known: dict[str, tuple[Manifest, float]] | None = None,
             gone: frozenset[str] = frozenset()) -> int:
        """One pass: copy every node's complete, changed files. Returns files copied."""
        settle = self.settle_s if settle_s is None else settle_s
        with self._lock:
            group = self._group or NodeGroup(self.inv, connector=self.connector)
            failed: list[Exception] = []  # one node's failure does not stop the others'
            try:
                copied = 0
                for name, (files, now) in self._manifests(group, known, gone).items():
                    # a node's first look is its baseline (no file yet, or an earlier job's),
                    # not progress: CI's false hang of a slow start (tests/test_hang_rule.py)
                    if name in self._seen and files != self._seen[name]:
                        self.last_change = time.monotonic()
                    self._seen[name] = files
                    synced = self.synced.setdefault(name, {})
                    changed = sorted(rel for rel, (size, mtime) in files.items()
                                     if synced.get(rel) != [size, mtime] and now - mtime >= settle)
                    if not changed:
                        continue
                    node = next(n for n in self.inv.nodes if n.name == name)
                    try:
                        self._copy(group, node, changed)
                    except Exception as exc:  # noqa: BLE001 - raised once the others are copied
                        failed.append(exc)
                        continue
                    synced.update({rel: files[rel] for rel in changed})
                    copied += len(changed)
                    self.last_copy = time.monotonic()
                    shown = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
                    self.log(f"kept checkpoint from {name}: {len(changed)} file(s) ({shown}) "
                             f"-> {self.where}")
                if failed:
                    raise failed[0]
                return copied
            finally:
                if group is not self._group:
                    group.close()

    def _copy(self, group: NodeGroup, node: NodeRecord, files: list[str]) -> None:
        layout = group.layout
        try:
            fetch_tree(group.connection(node), layout.checkpoints, self.local, files,
                       node=node.name)
        except NodeStepError as exc:
            raise BootstrapError(f"copying checkpoints from {node.name} failed: {exc}") from exc

    def clocks(self) -> dict[str, float]:
        """Every answering node's own clock now (from a fresh manifest)."""
        with self._lock:
            group = self._group or NodeGroup(self.inv, connector=self.connector)
            try:
                return {name: now for name, (_, now) in self._manifests(group).items()}
            finally:
                if group is not self._group:
                    group.close()

    def wait_for_save(self, since: dict[str, float], deadline_s: float,
                      hopeless: Callable[[], bool] | None = None) -> bool:
        """Until a file a node wrote at or after `since[node]` (that node's clock: e.g. when
        its ranks were asked to save) is kept here, syncing at once instead of every
        interval. A copy of an older save that comes late does not count (the copy of a
        step saved before a preemption notice, made just after it, is not the notice's
        save). False at the deadline, or once `hopeless()` says no save can come any more
        (the watcher: the noticed nodes are gone); either way after one last sync."""
        end = time.monotonic() + deadline_s
        while True:
            last = time.monotonic() >= end or (hopeless is not None and hopeless())
            self.sync()
            with self._lock:
                if any(mtime >= since[name] for name, files in self.synced.items()
                       if name in since for _, mtime in files.values()):
                    return True
            if last:
                return False
            time.sleep(0.5)

    # --- restoring ---------------------------------------------------------------------------
    def restore(self, group: NodeGroup) -> int:
        """Put the kept folder on every node of `group` (replacing theirs). Returns files."""
        files = sorted(p for p in self.local.rglob("*") if p.is_file()) if self.local.is_dir() else []
        layout = group.layout
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            for path in files:
                tar.add(path, arcname=f"{layout.checkpoints}/{path.relative_to(self.local)}")
        q = shlex.quote
        group.upload(buf.getvalue(), [f"rm -rf {q(layout.checkpoints)}",
                                      f"mkdir -p {q(layout.checkpoints)}",
                                      "tar -xzf - -C ~ --no-same-owner"]).raise_for(
            "restoring the checkpoint", BootstrapError)
        self.mark_synced(group)
        steps = [s for s in (step_of(str(p.relative_to(self.local))) for p in files)
                 if s is not None]
        self.restored_step = max(steps, default=None)
        return len(files)

    def mark_synced(self, group: NodeGroup) -> None:
        """What the nodes hold now is what is kept (after a restore): nothing to copy back."""
        with self._lock:
            for name, (manifest, _) in self._manifests(group).items():
                self.synced[name] = self._seen[name] = manifest
