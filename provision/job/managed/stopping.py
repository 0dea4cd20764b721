"""`down` of any cluster: the jobs' logs kept, then everything its inventory recorded deleted;
a cluster whose controller may be supervising a job (issue 18) first has that job ended
through the store, so the controller makes no node while the cluster is removed.

    down(name)                 `mgpu-cloud down` and the dashboard's Remove
    stop_before_down(inv)      the managed part: cancel through the store, wait for the end
"""

from __future__ import annotations

import time

from provision.job.lifecycle import keep_job_logs
from provision.job.managed.handoff import (
    controller_inventory,
    controller_layout,
    supervisor_ended,
)
from provision.job.managed.records import FINAL_STATES, JobView, job_ids
from provision.job.managed.signing import local_key
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log, stderr_line
from provision.nodes import NodeGroup
from remote.store import open_store

STOP_DEADLINE_S = 180.0  # down: how long a controller may take to end a job (mid-recovery)
EXIT_DEADLINE_S = 30.0  # down: then for its supervisor to write the last log and exit


def down(name: str, *, store: InventoryStore | None = None, log: Log = stderr_line) -> None:
    """`mgpu-cloud down`: the jobs' logs kept, then everything the inventory recorded deleted.
    A managed cluster's controller first takes back what it replaced and ends its job (issue
    18: it must not make a node while the cluster is removed)."""
    from provision.cluster.pipeline import down as destroy_by_name
    from provision.job.managed.client import adopt_from_store

    store = store or InventoryStore()
    if store.exists(name):
        adopt_from_store(name, store, warn=log)
        stop_before_down(store.load(name), store, log)
    destroy_by_name(name, store=store, log=log, before=keep_job_logs(log))


def stop_before_down(inv: Inventory, store: InventoryStore, log: Log,
                     deadline_s: float = STOP_DEADLINE_S) -> None:
    """`down` of a cluster whose controller may be supervising a job: cancel the job through
    the store, wait for its final record (a controller in the middle of a replacement finishes
    it first), then for its supervisor to exit. Never raises: a store or controller that does
    not answer leaves it to the provider's destroy, which removes the controller first."""
    if inv.controller is None or inv.spec is None or not inv.spec.store:
        return
    try:
        objects = open_store(inv.spec.store)
        key = local_key(store.keys_dir(inv.name))
        ids = job_ids(objects, inv.name, key)
        view = JobView(objects, inv.name, ids[-1], key) if ids else None
        records = view.records() if view is not None else []
    except Exception as exc:  # noqa: BLE001 - the store blinked: down goes on
        log(f"could not read the store of {inv.name!r} ({exc}); removing its controller first")
        return
    if view is None or not records or records[-1].state in FINAL_STATES:
        return
    log(f"managed job {view.job_id} is {records[-1].state}: its controller stops it "
        "before the cluster is removed ...")
    end = time.monotonic() + deadline_s
    try:
        view.request_cancel()
        while not any(r.state in FINAL_STATES for r in view.records(after=records[-1].seq)):
            if time.monotonic() > end:
                log(f"the controller did not end job {view.job_id} within {deadline_s:.0f} s;"
                    " removing it first")
                return
            time.sleep(1.0)
    except Exception as exc:  # noqa: BLE001 - as above
        log(f"could not cancel job {view.job_id} through the store ({exc}); removing the "
            "controller first")
        return
    layout, end = controller_layout(inv), time.monotonic() + EXIT_DEADLINE_S
    try:
        with NodeGroup(controller_inventory(inv, store)) as group:
            while (supervisor_ended(group, layout, view.job_id) is False
                   and time.monotonic() < end):
                time.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - its end is recorded; the destroy goes on
        log(f"could not ask the controller whether it exited ({exc})")
    log(f"managed job {view.job_id} cancelled")
