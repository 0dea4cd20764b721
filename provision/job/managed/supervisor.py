"""The controller's side of a managed run: the same lifecycle as an attached run, unattended.

    python3 -m provision.job.managed.supervisor --cluster NAME --job ID --store URL [--teardown]

runs ON the cluster's controller (docs/ARCHITECTURE.md, managed runs) with MGPU_CLOUD_HOME set to the
controller's own state folder (the inventory and the cluster key, uploaded by handoff.py).
`supervise` is the attached supervision's `supervise` (provision/job/attached.py) with everything it
needs given as arguments (JobRun): the inventory and its store, the provider, the durable
store's sinks (checkpoints through StoreKeeper, records and output through JobLog, a cancel
asked through the store), the webhook. The controller reaches the nodes at their
private addresses (it sits in the cluster's network), so node records are seen from there.

Per run, in the store (docs/ARCHITECTURE.md, "The store"; remote/storekeys.py):
    CLUSTER/data/jobs/ID/checkpoints/   this run's checkpoints only: before the first start every
                                   node's $MGPU_CHECKPOINT_DIR is made equal to it (empty for a
                                   new run), so a re-run never restores an earlier run's files;
                                   `--env MGPU_RESUME_FROM=ID` seeds it from run ID on purpose
    CLUSTER/cluster.json           the inventory this controller holds, as the user's machine
                                   sees the nodes (no key paths, nothing secret), written at
                                   the start and after every replacement, sealed with the
                                   records key (client.adopt_from_store verifies it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, cast

from provision.cluster.providers.contract import AnyProvider, KeepsSpares, Recoverable, Supervising
from provision.cluster.providers.spares import Estimate
from provision.job.managed.keeper import Creds, StoreKeeper, push_outputs
from provision.job.managed.nodecreds import ROLE_VAR, for_job
from provision.job.managed.records import CLUSTER_FILE, RESUME_VAR, JobLog, Record
from provision.job.managed.signing import cluster_kind, local_key, seal
from provision.job.managed.takeback import NODE_JOB_EVENTS, TakeBack, resumed_ledger
from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.logsink import Log
from provision.model.spec import ClusterSpec, JobSpec
from remote.store import Store, StoreURL, open_store, parse_url
from remote.storekeys import job_data

CANCEL_POLL_S = 2.0


def checkpoints_url(url: StoreURL, cluster: str, job_id: str) -> StoreURL:
    """Where run `job_id`'s checkpoints live in the store: per run, never per cluster."""
    return url.child(job_data(cluster, job_id), "checkpoints")


def outputs_url(url: StoreURL, cluster: str, job_id: str) -> StoreURL:
    """Where node 0 pushes run `job_id`'s $MGPU_OUTPUT_DIR at its end."""
    return url.child(job_data(cluster, job_id), "outputs")



def publish_inventory(store: Store, inv: Inventory, outside: dict[int, NodeRecord],
                      key: bytes) -> None:
    """CLUSTER/cluster.json: `inv` with its nodes as seen from outside the cluster (`outside`,
    by rank) and no paths of this machine. Host keys are public; nothing secret is in it."""
    view = inv.model_copy(update={"nodes": [outside.get(n.rank, n) for n in inv.nodes],
                                  "spares": [outside.get(n.rank, n) for n in inv.spares],
                                  "key_path": None, "known_hosts_path": None})
    store.put_bytes(f"{inv.name}/{CLUSTER_FILE}",
                    seal(key, cluster_kind(inv.name), view.model_dump_json().encode()))


def inside_view(node: NodeRecord) -> NodeRecord:
    """`node` as the controller reaches it: its private address, port 22, no jump host."""
    return node.model_copy(update={"address": node.private_address, "port": 22,
                                   "proxy_jump": None})


def localize(inv: Inventory, store: InventoryStore) -> None:
    """Make an inventory uploaded from the user's machine usable here: key paths under this
    home, nodes seen from inside the cluster's network, known_hosts rewritten for that."""
    from provision.nodes.sshconn import write_cluster_known_hosts

    keys = store.keys_dir(inv.name)
    inv.key_path = str(keys / Path(inv.key_path or "id_ed25519").name)
    inv.known_hosts_path = str(keys / "known_hosts")
    inv.nodes = [inside_view(n) for n in inv.nodes]
    inv.spares = [inside_view(n) for n in inv.spares]
    store.save(inv)
    write_cluster_known_hosts(inv, store)


class InsideProvider(Recoverable[Any], KeepsSpares[Any]):
    """A Recoverable provider seen from inside the cluster: its replacements and spares come
    back at their private addresses, `outside` keeps them as the user's machine sees them
    (by rank; a spare by its number until it takes a rank). Everything else is the inner
    provider's (its own error boundary included)."""

    def __init__(self, inner: Recoverable[Any],
                 outside: dict[int, NodeRecord] | None = None) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.outside = outside if outside is not None else {}  # rank -> the record outside
        self.refills = isinstance(inner, KeepsSpares) and inner.refills  # type: ignore[misc]

    def _spares(self) -> KeepsSpares[Any]:
        if not isinstance(self.inner, KeepsSpares):
            raise MgpuError(f"the {self.name} provider keeps no spares")
        return self.inner

    def _replacement_estimate(self, spec: ClusterSpec) -> Estimate | None:
        return self._spares()._replacement_estimate(spec)

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        self._spares().retire(inv, store, node)

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        made = self._spares().make_spare(inv, store, spare)
        self.outside[made.rank] = made
        return inside_view(made)

    def promote(self, inv: Inventory, store: InventoryStore, spare: NodeRecord,
                node: NodeRecord) -> NodeRecord:
        new = super().promote(inv, store, spare, node)
        seen = self.outside.pop(spare.rank, None)
        if seen is not None:
            self.outside[node.rank] = seen.model_copy(update={"name": node.name,
                                                              "rank": node.rank})
        return new

    def plan_class(self) -> type[Any]:
        return self.inner.plan_class()

    def _plan(self, spec: ClusterSpec) -> Any:
        return self.inner.plan(spec)

    def _create(self, spec: ClusterSpec, plan: Any, inv: Inventory,
                store: InventoryStore) -> None:
        self.inner.create(spec, plan, inv, store)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        self.inner.destroy(inv, store)

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return self.inner.orphans(spec, known)

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        self.inner.delete_orphans(spec, resources)

    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        return self.inner.node_alive(inv, node)

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        from provision.nodes.sshconn import write_cluster_known_hosts

        made = self.inner.replace(inv, store, node)
        self.outside[made.rank] = made
        new = inside_view(made)
        inv.nodes = [new if n.rank == new.rank else n for n in inv.nodes]
        store.save(inv)
        write_cluster_known_hosts(inv, store)
        return new


def _throttled(check: Callable[[], bool], every_s: float) -> Callable[[], bool]:
    last = [float("-inf"), False]  # never asked (monotonic's origin: maybe < every_s ago)

    def ask() -> bool:
        if not last[1] and time.monotonic() - float(last[0]) >= every_s:
            last[0] = time.monotonic()
            try:
                last[1] = check()
            except Exception:  # noqa: BLE001 - the store blinked: ask again later
                last[1] = False
        return bool(last[1])

    return ask


class Sinks:
    """The controller's log and records: each line also to this process's output, a store
    that blinks never stops the job."""

    def __init__(self, jlog: JobLog, say: Log) -> None:
        self.jlog, self.say = jlog, say

    def log(self, msg: str) -> None:
        self.say(msg)
        self.jlog.line(f"[controller] {msg}")

    def record(self, event: str, message: str, nodes: list[str] | None = None,
               code: int | None = None, node_job: str | None = None) -> Record | None:
        try:
            return self.jlog.record(event, message, nodes=nodes, exit_code=code,
                                    node_job=node_job)
        except Exception as exc:  # noqa: BLE001 - the store blinked: the job goes on
            self.say(f"could not write the {event} record: {exc}")
            return None


def supervise(provider: AnyProvider, inv: Inventory, istore: InventoryStore, job: JobSpec,
              *, url: StoreURL, job_id: str, creds: Creds, teardown: bool,
              say: Log = print, outside: dict[int, NodeRecord] | None = None,
              take_back: TakeBack | None = None) -> int:
    """Run `job` under recovery with its state in the store; returns the job's exit code.
    With `teardown`, the whole cluster (this controller last) is removed at the end.
    `outside`: the nodes as the user's machine reaches them, by rank (for cluster.json).
    `take_back`: the job runs on the nodes already, its controller was lost (issue 36):
    followed again from where the store says it is, not started."""
    from provision.job.attached import JobRun
    from provision.job.attached import supervise as job_life
    from provision.job.managed.notify import Notifier
    from provision.model.jobstore import JobStore
    from provision.nodes import NodeGroup

    store = open_store(url)
    key = local_key(istore.keys_dir(inv.name))
    if key is None:
        raise MgpuError(f"the controller of {inv.name!r} has no records key: hand the job "
                        "over again")
    notifier = Notifier(job.notify, say) if job.notify else None
    jlog = JobLog(store, inv.name, job_id, on_record=notifier.send if notifier else None,
                  key=key)
    jlog.start()
    sinks = Sinks(jlog, say)
    if take_back is None:
        sinks.record("submitted", f"controller supervises job {job_id} (max "
                                  f"{job.max_restarts} restart(s), store {url})")
    else:
        jlog.restarts = take_back.restarts
    keeper = StoreKeeper(inv, checkpoints_url(url, inv.name, job_id), creds, log=sinks.log)
    outside = dict(outside or {})
    inside: AnyProvider = (InsideProvider(provider, outside)
                           if isinstance(provider, Recoverable) else provider)
    records = JobStore(istore.home)

    def publish() -> None:
        try:
            publish_inventory(store, inv, outside, key)
        except Exception as exc:  # noqa: BLE001 - the user's copy is only older: go on
            say(f"could not write {CLUSTER_FILE} to the store: {exc}")

    def on_event(event: str, message: str, nodes: list[str]) -> None:
        if event == "resumed":
            jlog.restarts += 1
        if event == "replaced":  # recovery has recorded the replacement in `inv`
            publish()
        latest = records.latest(inv.name) if event in NODE_JOB_EVENTS else None
        sinks.record(event, message, nodes, node_job=latest.id if latest else None)

    publish()
    run = JobRun(inv, inside, istore, job, sinks.log, records=records, keeper=keeper,
                 out=cast(TextIO, jlog), on_event=on_event,
                 stop=_throttled(jlog.cancel_requested, CANCEL_POLL_S), survive=True,
                 take_back=take_back.node_job if take_back else None,
                 restarts=take_back.restarts if take_back else 0,
                 ledger=resumed_ledger(take_back, say))
    jlog.ledger = lambda: run.ledger.state() if run.ledger is not None else None
    try:
        with NodeGroup(inv) as group:
            if take_back is None:
                first_checkpoints(keeper, group, inv, job, url, creds, sinks.log)
            code = job_life(run, group)
        why = ""
    except MgpuError as exc:
        code, why = 1, exc.message
    except Exception as exc:  # noqa: BLE001 - recorded: nobody else would see it
        code, why = 1, f"{type(exc).__name__}: {exc}"
    _conclude(inv, url, job_id, creds, jlog, sinks.record, sinks.log, say, code, why)
    if teardown:
        _tear_down(provider, inv, istore, sinks.record, sinks.log,
                   fresh_store=lambda: setattr(jlog, "store", open_store(url)))
    if notifier is not None:
        notifier.close()
    jlog.close()
    if teardown and isinstance(provider, Supervising):
        provider.remove_controller_from_inside(inv)
    return code


def _conclude(inv: Inventory, url: StoreURL, job_id: str, creds: Creds, jlog: JobLog,
              record: Callable[..., Record | None], log: Log,
              say: Log, code: int, why: str) -> None:
    """After the job: node-0's outputs pushed to the store, the final record written, and
    the log flushed so that whoever follows it sees the end before they stop reading."""
    from provision.job.recovery import CANCELLED
    from provision.nodes import NodeGroup

    with NodeGroup(inv) as group:
        failed = push_outputs(group, inv.master, outputs_url(url, inv.name, job_id), creds)
    if failed:
        log(f"could not push node-0's outputs to the store: {failed}")
    jlog.flush()
    if code == 0:
        record("finished", "job finished on every node", code=0)
    elif code == CANCELLED:
        record("cancelled", "cancelled on request", code=code)
    else:
        record("failed", why or f"job failed (exit code {code})", code=code)
    try:
        jlog.flush()  # the end is in the log before anyone following it stops reading
    except Exception as exc:  # noqa: BLE001 - the close below retries
        say(f"could not write the log: {exc}")


def first_checkpoints(keeper: StoreKeeper, group: Any, inv: Inventory, job: JobSpec,
                      url: StoreURL, creds: Creds, log: Log) -> None:
    """Before the first start, every node's checkpoint folder is this run's store prefix
    (empty for a new run: files an earlier job left on the nodes are not this run's). With
    MGPU_RESUME_FROM=ID, run ID's checkpoints are pulled instead and node 0 pushes them into
    this run's prefix, so a restart restores them too."""
    source = job.env.get(RESUME_VAR)
    if source:
        StoreKeeper(inv, checkpoints_url(url, inv.name, source), creds, log=log).restore(group)
        keeper.push_all(group, inv.master)
        log(f"starting from the checkpoints of job {source} ({RESUME_VAR})")
    else:
        keeper.restore(group)
    keeper.mark_synced(group)


def _tear_down(provider: AnyProvider, inv: Inventory, istore: InventoryStore,
               record: Callable[..., Record | None], log: Log,
               fresh_store: Callable[[], None]) -> None:
    """The cluster removed but this controller. `fresh_store` then replaces the store client:
    the controller may have changed networks, and a pooled connection over the old one would
    hang until its timeout (seen with google-cloud-storage: minutes)."""
    if not isinstance(provider, Supervising):
        log(f"provider {inv.provider!r} cannot remove the cluster from its controller")
        return
    try:
        provider.teardown_from_controller(inv, istore)
        fresh_store()
        record("torn_down", f"cluster {inv.name!r} removed (nodes, network; the controller "
                            "last)")
    except Exception as exc:  # noqa: BLE001 - recorded, so `down` can be run from anywhere
        record("failed", f"removing the cluster failed: {exc}; run `mgpu-cloud down "
                         f"{inv.name}`", code=1)


def mint_identity(inv: Inventory, env: dict[str, str]) -> dict[str, str]:
    """What lets this controller renew the nodes' store credentials itself when it holds
    no user keys: on aws the role its provider recorded it may assume (its own, narrowed by
    each session's policy: aws/controller.py)."""
    if env.get("AWS_ACCESS_KEY_ID") or env.get(ROLE_VAR):
        return {}
    arns = [r.extra["role_arn"] for r in inv.resources if r.extra.get("role_arn")]
    return {ROLE_VAR: arns[0]} if arns else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision.job.managed.supervisor")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--job-file", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--teardown", action="store_true")
    parser.add_argument("--take-back", action="store_true",
                        help="the job runs on the nodes already: follow it again (issue 36)")
    args = parser.parse_args(argv)
    from provision.cluster.providers import get_provider
    from provision.job.managed.checks import controller_env

    given = json.loads(Path(args.env_file).read_text())
    istore = InventoryStore()
    inv = istore.load(args.cluster)
    # this process's own store client: on aws without the user's keys (the controller's
    # instance profile is scoped to this cluster); the nodes': what the hand-off minted,
    # renewed here where this environment can mint
    env = controller_env(inv.provider, given.get("env", {}))
    os.environ.update(env)
    env.update(mint_identity(inv, env))
    outside = {n.rank: n.model_copy() for n in [*inv.nodes, *inv.spares]}  # the user's view
    localize(inv, istore)
    fields = json.loads(Path(args.job_file).read_text())
    fields.update(workdir=args.workdir, deepspeed_config=None if not fields.get(
        "deepspeed_config") else str(Path(args.workdir) / Path(fields["deepspeed_config"]).name))
    job = JobSpec.model_validate(fields)
    url = parse_url(args.store)
    creds = for_job(url, inv.name, args.job, env, resume_from=job.env.get(RESUME_VAR),
                    minted=given.get("nodes"))
    back = TakeBack.read(open_store(url), inv.name, args.job,
                         local_key(istore.keys_dir(inv.name))) if args.take_back else None
    return supervise(get_provider(inv.provider), inv, istore, job, url=url,
                     job_id=args.job, creds=creds, teardown=args.teardown,
                     say=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True),
                     outside=outside, take_back=back)


if __name__ == "__main__":
    sys.exit(main())
