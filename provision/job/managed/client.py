"""A managed run's store from the user's side: its records read (and a cancel written) for
`jobs`, `logs`, `cancel`, `attach` and the dashboard, which ask them through the one
job-record interface (storerecords.StoreRecords); the controller's copy of the inventory
adopted (`adopt_from_store`); a cluster its controller removed finished here.

They need only the store URL and credentials, never the cluster's inventory: from the machine
that started the run, the URL comes from the inventory or from `$MGPU_CLOUD_HOME/attached/NAME`
(written by `run --detach` and by `attach --store URL NAME`); from another machine, from
`--store URL`.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, TextIO

from provision.job.managed.records import CLUSTER_FILE, FINAL_STATES, JobView, Record, job_ids
from provision.job.managed.signing import Unsigned, cluster_kind, local_key, open_sealed
from provision.model.errors import InventoryUnreadableError, MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, checked_name, state_home
from provision.model.logsink import Log
from provision.model.nodetext import lines, shown
from remote.store import Store, open_store

POLL_S = 1.0
GOODPUT = re.compile(r"\btraining [\d.]+ \((\d+)%\)")  # in a ledger record (ledger.render)


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


def adopt_from_store(name: str, istore: InventoryStore | None = None,
                     warn: Log | None = None) -> bool:
    """When the controller of cluster `name` replaced nodes since this machine's inventory was
    written, take its copy (CLUSTER/cluster.json: new container/instance ids, addresses,
    ports, pinned host keys) and rewrite the known_hosts. Only a copy sealed with the
    cluster's records key (the controller's; no node holds it) whose every field passes the
    inventory's checks is taken; another one is refused and `warn` says why. Quietly nothing
    when the cluster is not managed, the store cannot be read, or another command holds the
    cluster. True if the inventory changed."""
    from provision.model.errors import ClusterBusyError
    from provision.nodes.sshconn import write_cluster_known_hosts

    istore = istore or InventoryStore()
    if not istore.exists(name):
        return False
    inv = istore.load(name)
    if inv.controller is None or inv.spec is None or not inv.spec.store:
        return False
    try:
        data = open_store(inv.spec.store).get_bytes(f"{name}/{CLUSTER_FILE}")
    except Exception:  # noqa: BLE001 - an unreadable copy: this machine's stays in use
        return False
    theirs = _verified(name, data, local_key(istore.keys_dir(name)), warn) if data else None
    if theirs is not None and not _same_logins(inv, theirs, warn):
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


def _verified(name: str, data: bytes, key: bytes | None,
              warn: Log | None) -> Inventory | None:
    """The controller's copy of the inventory if its MAC and its fields check out."""
    from pydantic import ValidationError

    try:
        if key is None:
            raise Unsigned(f"{CLUSTER_FILE}: this machine has no records key of {name!r}")
        theirs = Inventory.model_validate_json(open_sealed(key, cluster_kind(name), data))
    except (Unsigned, ValidationError, ValueError) as exc:
        if warn is not None:
            why = exc.message if isinstance(exc, Unsigned) else f"invalid: {exc}"
            warn(f"the store's {CLUSTER_FILE} of {name!r} is not adopted: {why}")
        return None
    return theirs


def _same_logins(ours: Inventory, theirs: Inventory,
                 warn: Log | None) -> bool:
    """A replacement changes a node's address, port and host key, never how it is logged in
    to: the provider, each rank's user and jump host stay this machine's."""
    mine = {n.rank: (n.user, n.proxy_jump) for n in ours.nodes}
    odd = [n.name for n in theirs.nodes if mine.get(n.rank) != (n.user, n.proxy_jump)]
    if theirs.provider == ours.provider and not odd and len(theirs.nodes) == len(ours.nodes):
        return True
    if warn is not None:
        warn(f"the store's {CLUSTER_FILE} of {ours.name!r} is not adopted: it changes the "
             f"provider, the node set or the login of {', '.join(odd) or 'the cluster'}")
    return False


def records_key(cluster: str) -> bytes | None:
    """The cluster's records key on this machine (None: made elsewhere; records are then
    read as the store gives them)."""
    with contextlib.suppress(UserInputError):
        return local_key(InventoryStore().home / "keys" / checked_name(cluster))
    return None


def summary(store: Store, cluster: str, job_id: str) -> dict[str, Any]:
    view = JobView(store, cluster, job_id, records_key(cluster))
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
        "goodput": next((int(m.group(1)) / 100 for r in recs if r.event == "ledger"
                         for m in [GOODPUT.search(r.message)] if m), None),
    }


def all_jobs(url: str, cluster: str) -> list[dict[str, Any]]:
    """Every job of `cluster` (with its records key: only those sealed as jobs)."""
    store = open_store(url)
    return [summary(store, cluster, i) for i in job_ids(store, cluster, records_key(cluster))]


def latest_id(url: str, cluster: str, job_id: str | None) -> str:
    ids = job_ids(open_store(url), cluster, records_key(cluster))
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
    if records_key(name) is None:
        return False  # its records could not be checked: `down` says what is left
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
    view = JobView(open_store(url), cluster, job_id, records_key(cluster))
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
            for line in lines(text):
                if prefix is None or line.startswith(prefix):
                    out.write(shown(line) + "\n")
        out.flush()
        if not follow or final is not None:
            if final is not None and follow:  # the last flush may land just after it
                time.sleep(POLL_S)
                for _, text in view.log_chunks(after=seen_log):
                    for line in lines(text):
                        if prefix is None or line.startswith(prefix):
                            out.write(shown(line) + "\n")
            return final
        time.sleep(POLL_S)


def cancel(url: str, cluster: str, job_id: str) -> None:
    """A cancel sealed with the cluster's records key: the controller acts on no other."""
    key = records_key(cluster)
    if key is None:
        raise UserInputError(
            f"cancelling job {job_id} of {cluster!r} needs the cluster's records key, which "
            "this machine does not hold (the controller acts only on a sealed cancel)",
            hint=f"run it on the machine that made the cluster, or copy its "
                 f"keys/{cluster}/records.key into $MGPU_CLOUD_HOME/keys/{cluster}/ (0600)")
    JobView(open_store(url), cluster, job_id, key).request_cancel()
