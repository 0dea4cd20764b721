"""`jobs`, `logs`, `cancel` and `attach` for managed runs: read (and write) the job's store.

They need only the store URL and credentials, never the cluster's inventory: from the machine
that started the run, the URL comes from the inventory or from `$MGPU_CLOUD_HOME/attached/NAME`
(written by `run --detach` and by `attach --store URL NAME`); from another machine, from
`--store URL`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, TextIO

from provision.job.managed.records import CLUSTER_FILE, FINAL_STATES, JobView, Record, job_ids
from provision.model.errors import InventoryUnreadableError, MgpuError, UserInputError
from provision.model.inventory import InventoryStore, checked_name, state_home
from remote.store import Store, open_store

POLL_S = 1.0


def _pointer(name: str) -> Any:
    return state_home() / "attached" / checked_name(name)


def remember(name: str, url: str) -> None:
    path = _pointer(name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(url + "\n")


def store_url_for(name: str, given: str | None) -> str | None:
    """The store of cluster `name`: `--store`, else its inventory's, else the attached one."""
    if given:
        return given
    istore = InventoryStore()
    if istore.exists(name):
        with contextlib.suppress(InventoryUnreadableError):  # the caller says so when it loads
            inv = istore.load(name)
            if inv.spec is not None and inv.spec.store:
                return inv.spec.store
    path = _pointer(name)
    return path.read_text().strip() if path.exists() else None


def adopt_from_store(name: str, istore: InventoryStore | None = None) -> bool:
    """When the controller of cluster `name` replaced nodes since this machine's inventory was
    written, take its copy (CLUSTER/cluster.json: new container/instance ids, addresses,
    ports, pinned host keys) and rewrite the known_hosts. Quietly nothing when the cluster is
    not managed, the store cannot be read, or another command holds the cluster. True if the
    inventory changed."""
    from provision.model.errors import ClusterBusyError
    from provision.model.inventory import Inventory
    from provision.nodes.sshconn import write_cluster_known_hosts

    istore = istore or InventoryStore()
    if not istore.exists(name):
        return False
    inv = istore.load(name)
    if inv.controller is None or inv.spec is None or not inv.spec.store:
        return False
    try:
        data = open_store(inv.spec.store).get_bytes(f"{name}/{CLUSTER_FILE}")
        theirs = Inventory.model_validate_json(data) if data else None
    except Exception:  # noqa: BLE001 - an unreadable copy: this machine's stays in use
        return False
    if theirs is None or len(theirs.replacements) <= len(inv.replacements):
        return False
    try:
        with istore.lock(name):
            inv = istore.load(name)
            if not inv.adopt(theirs):
                return False
            istore.save(inv)
            write_cluster_known_hosts(inv, istore)
    except ClusterBusyError:
        return False
    return True


def summary(store: Store, cluster: str, job_id: str) -> dict[str, Any]:
    view = JobView(store, cluster, job_id)
    recs = view.records()
    spec = view.spec() or {}
    last = recs[-1] if recs else None
    final = next((r for r in recs if r.state in FINAL_STATES), None)
    started = next((r.at for r in recs if r.event == "started"), recs[0].at if recs else None)
    return {
        "id": job_id, "state": final.state if final else (last.state if last else "submitted"),
        "started_at": started, "ended_at": final.at if final else None,
        "restarts": max((r.restarts for r in recs), default=0),
        "exit_code": final.exit_code if final else None,
        "torn_down": any(r.event == "torn_down" for r in recs),
        "command": " ".join([str(spec.get("script", "?")), *map(str, spec.get("args", []))]),
        "events": [r.event for r in recs],
    }


def all_jobs(url: str, cluster: str) -> list[dict[str, Any]]:
    store = open_store(url)
    return [summary(store, cluster, i) for i in job_ids(store, cluster)]


def latest_id(url: str, cluster: str, job_id: str | None) -> str:
    ids = job_ids(open_store(url), cluster)
    if job_id is None:
        if not ids:
            raise UserInputError(f"the store {url} has no job of cluster {cluster!r}")
        return ids[-1]
    if job_id not in ids:
        raise UserInputError(f"the store {url} has no job {job_id!r} of cluster {cluster!r} "
                             f"(jobs: {', '.join(ids) or 'none'})")
    return job_id


def forget_if_torn_down(name: str, jobs: list[dict[str, Any]]) -> bool:
    """The controller removed the cluster: finish with `down` what only this machine's
    credentials can remove (a cloud controller's role / service account: an identity cannot
    delete itself), then drop this machine's inventory of it. True if it did."""
    from provision.cluster.providers import get_provider

    istore = InventoryStore()
    if not jobs or not jobs[-1]["torn_down"] or not istore.exists(name):
        return False
    with istore.lock(name):
        inv = istore.load(name)
        try:
            get_provider(inv.provider).destroy(inv, istore)  # idempotent: gone is done
        except MgpuError:
            return False  # kept: `down` names what is left and can be run again
        istore.delete(name)
    return True


def print_logs(url: str, cluster: str, job_id: str, out: TextIO, *, follow: bool,
               node: int | None = None) -> Record | None:
    """The job's output from its start (`[node-R] `-prefixed, the controller's own lines
    `[controller]`); with `follow` until its final record. Returns the final record."""
    view = JobView(open_store(url), cluster, job_id)
    prefix = f"[node-{node}] " if node is not None else None
    seen_log = seen_rec = 0
    final: Record | None = None
    while True:
        for rec in view.records(after=seen_rec):
            seen_rec = rec.seq
            if rec.state in FINAL_STATES and final is None:
                final = rec  # the job's end (a teardown record may follow)
        for seq, text in view.log_chunks(after=seen_log):
            seen_log = seq
            for line in text.splitlines():
                if prefix is None or line.startswith(prefix):
                    out.write(line + "\n")
        out.flush()
        if not follow or final is not None:
            if final is not None and follow:  # the last flush may land just after it
                time.sleep(POLL_S)
                for _, text in view.log_chunks(after=seen_log):
                    for line in text.splitlines():
                        if prefix is None or line.startswith(prefix):
                            out.write(line + "\n")
            return final
        time.sleep(POLL_S)


def cancel(url: str, cluster: str, job_id: str) -> None:
    JobView(open_store(url), cluster, job_id).request_cancel()
