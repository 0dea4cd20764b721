"""A managed job whose controller was lost, taken back by a new one (issue 36).

The job itself does not depend on its controller: each node runs its part under the node's
job supervisor with --survive-eof (remote/jobs.py), so the controller's loss closes the
channels it followed the job on and nothing else; the job keeps training and saving. What
stops is the supervision (keeping checkpoints off the nodes, replacing a lost node), until a
controller takes the job back:

    the controller writes CLUSTER/jobs/ID/control/heartbeat every HEARTBEAT_S (records.py;
    silent for LOST_AFTER_S, or $MGPU_CONTROLLER_LOST_S, it may be lost)
    `jobs`, `logs`, `attach`, `status` (this machine's CLI, the one that holds the cluster's
    inventory and credentials) find the newest job not ended with a heartbeat older than
    LOST_AFTER_S and a controller whose supervisor has ended or that does not answer:
      - the controller answers: its supervisor is started again (--take-back);
      - it does not: the provider removes it and makes a new one (remake_controller), which
        gets the same hand-off (code, inventory, keys, job) and starts with --take-back
    the new supervisor reads the store (TakeBack.read: restarts so far, the attempt running
    on the nodes), writes `taken_back`, and FOLLOWS that attempt (`job follow --end-line`)
    instead of starting one; a node lost meanwhile fails the follow and is recovered as any
    lost node is (replace, restore, start again); a job that ended meanwhile is concluded.

Decided (docs/ARCHITECTURE.md): the next command of the user's CLI takes a job back, not a
watchdog on the nodes (they are untrusted and hold no credentials that can make a machine)
nor a second controller (a single point again unless elected, and a lease in every store).
Until someone asks, the job goes on unsupervised; its nodes still stop at --max-hours.
Providers that cannot remove a lost controller from here say so (contract.Supervising).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from provision.job.managed.records import FINAL_STATES, LOST_AFTER_S, JobView, job_ids
from provision.model.errors import LaunchError, MgpuError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from remote.store import Store, open_store

if TYPE_CHECKING:
    from provision.cluster.providers.contract import AnyProvider

NODE_JOB_EVENTS = ("started", "resumed", "taken_back")
REACH_S = 20.0  # take_back: a controller that does not answer within this is lost


@dataclass(frozen=True)
class TakeBack:
    node_job: str  # the attempt running on the nodes (its id there)
    restarts: int  # restarts used so far

    @classmethod
    def read(cls, store: Store, cluster: str, job_id: str, key: bytes | None) -> TakeBack:
        recs = JobView(store, cluster, job_id, key).records()
        running = [r for r in recs if r.event in NODE_JOB_EVENTS and r.node_job]
        if not running:
            raise MgpuError(f"job {job_id} of {cluster!r}: the store names no attempt "
                            "running on the nodes to take back")
        return cls(str(running[-1].node_job), max((r.restarts for r in recs), default=0))


def lost_job(inv: Inventory, key: bytes | None) -> tuple[str, float] | None:
    """(job id, seconds since its controller's last heartbeat) when the newest job of a
    managed cluster has not ended and its controller has been silent for LOST_AFTER_S."""
    if inv.controller is None or inv.spec is None or not inv.spec.store:
        return None
    store = open_store(inv.spec.store)
    ids = job_ids(store, inv.name, key)
    if not ids:
        return None
    view = JobView(store, inv.name, ids[-1], key)
    age = view.heartbeat_age()  # one small object: a controller that beats costs only it
    if age is None or age <= float(os.environ.get("MGPU_CONTROLLER_LOST_S", LOST_AFTER_S)):
        return None
    recs = view.records()
    if not recs or any(r.state in FINAL_STATES for r in recs):
        return None
    return ids[-1], age


def take_back_if_lost(name: str, log: Log, istore: InventoryStore | None = None) -> str | None:
    """The newest job of cluster `name`, taken back when its controller is lost (the module
    doc); its id, or None when nothing had to be done. Never raises for a store that
    cannot be read (the command that asked goes on)."""
    from provision.cluster.providers import get_provider
    from provision.job.managed.signing import local_key

    istore = istore or InventoryStore()
    if not istore.exists(name):
        return None
    inv = istore.load(name)
    key = local_key(istore.keys_dir(name))
    try:
        found = lost_job(inv, key)
    except Exception:  # noqa: BLE001 - the store cannot be read now: ask again next time
        return None
    if found is None:
        return None
    job_id, age = found
    log(f"the controller of {name!r} has written nothing for {age:.0f} s while job {job_id} "
        "runs: taking the job back ...")
    with istore.lock(name):
        inv = istore.load(name)
        take_back(get_provider(inv.provider), inv, istore, job_id, log=log)
    return job_id


def take_back(provider: AnyProvider, inv: Inventory, store: InventoryStore, job_id: str, *,
              log: Log) -> None:
    """A new supervisor for job `job_id`, which runs on the nodes while its controller is
    lost (takeback.py): on the same controller when it answers, else on a new one."""
    from pydantic import ValidationError

    from provision.cluster.providers.contract import Supervising
    from provision.job.managed.checks import store_env
    from provision.job.managed.handoff import TEARDOWN_KEY, controller_state, deliver, store_url
    from provision.job.managed.signing import local_key
    from provision.model.spec import JobSpec

    url = store_url(inv)
    key = local_key(store.keys_dir(inv.name))
    data = JobView(open_store(url), inv.name, job_id, key).spec() if key else None
    if data is None:
        raise LaunchError(f"job {job_id} of {inv.name!r}: its spec.json is not sealed for it "
                          "with the cluster's records key (written or copied there by "
                          "something else): not taken back",
                          hint=f"`mgpu-cloud down {inv.name}` removes the cluster")
    teardown = data.pop(TEARDOWN_KEY, False) is True
    try:
        job = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise LaunchError(f"job {job_id}: its spec.json is not a job: {exc}") from None
    if not job.local_workdir.is_dir():
        raise LaunchError(f"job {job_id}: its folder {job.local_workdir} is not here any more "
                          "(a new controller needs it to set up replaced nodes)")
    answers, ended = _controller_answers(provider, inv, store, job_id)
    if ended is False:
        log(f"the supervisor of job {job_id} still runs on its controller: nothing to do")
        return
    if not answers:
        if not isinstance(provider, Supervising):
            raise LaunchError(f"provider {inv.provider!r} makes no controller")
        log(f"its controller does not answer: making a new one for {inv.name!r} ...")
        provider.remake_controller(inv, store)
    state = controller_state(inv, url, job_id, job, store_env(), log)
    deliver(inv, store, job, job_id, state, teardown=teardown, log=log, take_back=True)


def _controller_answers(provider: AnyProvider, inv: Inventory, store: InventoryStore,
                        job_id: str) -> tuple[bool, bool | None]:
    """(whether the controller answers, whether its supervisor of `job_id` has ended)."""
    from provision.cluster.providers.contract import Recoverable
    from provision.job.managed.handoff import (
        controller_inventory,
        controller_layout,
        supervisor_ended,
    )
    from provision.nodes import NodeGroup

    ctl = inv.controller
    if ctl is None or (isinstance(provider, Recoverable) and not provider.node_alive(inv, ctl)):
        return False, None  # the provider is sure: no need to wait for a login
    with NodeGroup(controller_inventory(inv, store)) as group:
        if not group.wait_until_reachable(REACH_S)[ctl.name].ok:
            return False, None
        return True, supervisor_ended(group, controller_layout(inv), job_id)
