"""Slurm provider: the cluster is one Slurm allocation, reached through the site's login node.

    plan     read-only (plan.py): host keys from known_hosts, then ONE probe on the login node:
             partition limits, idle/allocated nodes, GPUs, `sbatch --test-only` of the exact
             request (Slurm's own refusal is the error), the user's associations.
    create   sbatch a held job (--exclusive, --no-requeue, --time ALWAYS set) and record its id
             at once; wait for it, logging why it pends; then one job step over all nodes
             makes the per-node folder (nodeprep.py), reads host keys, checks python3.
             Raises without cleaning up (the pipeline calls destroy).
    destroy  one job step stops our job and removes our files on the nodes (while the
             allocation runs), scancel, then our link in the login node's home. Nothing else
             is ever touched there. Idempotent; TeardownError when the login node cannot be
             reached (the allocation may still be held).
    orphans  jobs named mgpu-cloud-* of the user that no inventory here knows (`gc --login`).

Everything the site must have: sbatch/srun/squeue/scancel on the login node, SSH to it, and
python3 on the nodes. Nothing is installed, no file outside ~/.mgpu-cloud/slurm/NAME (and its
node-local target) is written.
"""

from __future__ import annotations

import logging
import shlex

from provision.cluster.providers.contract import KeepsSpares
from provision.cluster.providers.slurm.allocation import (
    cancel,
    nodes_of,
    state_of,
    submit,
    wait_running,
)
from provision.cluster.providers.slurm.login import LoginError, LoginSession, LoginTarget
from provision.cluster.providers.slurm.nodeprep import cleanup_nodes, prepare, remote_root
from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.plan import SlurmPlan, resolve_target
from provision.cluster.providers.slurm.plan import plan as make_plan
from provision.cluster.providers.slurm.slurmcmd import JOB_NAME_PREFIX, format_time, shell
from provision.cluster.providers.slurm.transport import JOB_KIND, LOGIN_KIND
from provision.cluster.providers.spares import Estimate
from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.spec import ClusterSpec
from provision.model.timeline import reached

log = logging.getLogger("mgpu_cloud")

PINNED_KEY_KIND = "pinned-host-key"  # read by provision.nodes.sshconn (known_hosts of the cluster)
DIR_KIND = "remote-dir"
SSH_CHECK_S = 20.0


class SlurmProvider(KeepsSpares[SlurmPlan]):
    """A held allocation on a Slurm site: an allocation cannot swap one node, so a lost node
    can only be waited for (`--on-node-loss restart`) or end the run, unless the allocation
    holds warm spares (issue 44: `--spares K` asks Slurm for N + K nodes): a lost node's rank
    then moves to one of them. A used spare is not made again (an allocation cannot grow),
    and the lost node stays in the allocation until it ends."""

    name = "slurm"
    refills = False

    def _replacement_estimate(self, spec: ClusterSpec) -> Estimate | None:
        return None  # no replacement at all: without a spare a lost node ends the run

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        log.info("slurm: %s stays in allocation %s until it ends (a running job's allocation "
                 "is not shrunk here); nothing runs on it", node.name, node.resource_id)

    def promote(self, inv: Inventory, store: InventoryStore, spare: NodeRecord,
                node: NodeRecord) -> NodeRecord:
        """The spare takes `node`'s rank and keeps its own name: a node is named by its
        Slurm host name, which `srun --nodelist` and the hostfile use."""
        new = spare.model_copy(update={"rank": node.rank})
        inv.spares = [s for s in inv.spares if s.name != spare.name]
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        store.save(inv)
        return new

    def plan_class(self) -> type[SlurmPlan]:
        return SlurmPlan

    def _plan(self, spec: ClusterSpec) -> SlurmPlan:
        return make_plan(spec)

    # -------------------------------------------------------------------------------- create
    def _create(self, spec: ClusterSpec, plan: SlurmPlan, inv: Inventory,
                store: InventoryStore) -> None:
        p = plan
        opts = spec.options_as(SlurmOptions)
        target = p.target
        store.record(inv, ResourceRecord(kind=LOGIN_KIND, id=target.login.known_hosts_name,
                                         name=target.login.address,
                                         extra={"target": target.model_dump_json()}))
        for hop in (target.jump, target.login):
            if hop is not None:
                store.record(inv, ResourceRecord(kind=PINNED_KEY_KIND, id=hop.known_hosts_name,
                                                 name=hop.address, extra={
                                                     "port": str(hop.port), "key": hop.host_key}))
        session = LoginSession(target)
        try:
            job_id = submit(session, p.request)
            store.record(inv, ResourceRecord(
                kind=JOB_KIND, id=job_id, name=p.request.job_name,
                extra={"partition": p.site.partition, "nodes": str(p.request.nodes),
                       "time": format_time(p.request.time_minutes)}))
            log.info("slurm: submitted allocation %s (%d node(s), partition %s, --time %s)",
                     job_id, p.request.nodes, p.site.partition,
                     format_time(p.request.time_minutes))
            state = wait_running(session, job_id, log=lambda m: log.info("slurm: %s", m),
                                 timeout_s=(opts.queue_timeout_minutes * 60
                                            if opts.queue_timeout_minutes else None))
            reached(inv, "nodes running", part_of="create call",
                    detail=f"allocation {job_id} on {state.nodelist}")
            allocated, missing = nodes_of(session, state.nodelist)
            root = remote_root(spec.name)
            dir_record = ResourceRecord(kind=DIR_KIND, id=f"{job_id}:{root}", extra={
                "path": root, "parents": ",".join(missing)})
            store.record(inv, dir_record)
            prepared = prepare(session, job_id, spec.name, [n.name for n in allocated],
                               opts.node_dir, opts.setup)
            dir_record.extra["node_dirs"] = ",".join(sorted({n.node_dir for n in prepared}))
            store.save(inv)
        finally:
            session.close()
        inv.remote_root = root
        inv.key_path = target.identity_file
        inv.inter_node_ssh = False  # the site's SSH set-up is the user's: ~/.ssh is never written
        inv.manage_etc_hosts = False
        inv.nodes = [
            NodeRecord(name=a.name, rank=rank, address=a.address, private_address=a.address,
                       user=target.login.user, slots=p.slots_per_node, host_key=pn.host_key,
                       identity_file=target.identity_file, proxy_jump=target.login.text,
                       resource_id=job_id)
            for rank, (a, pn) in enumerate(zip(allocated, prepared, strict=True))
        ]
        gpus = all(pn.gpus for pn in prepared)
        if not gpus:
            # CPU nodes: without this, accelerate starts every process alone (world size 1).
            inv.nccl_env = {"ACCELERATE_USE_CPU": "1"}
            log.info("slurm: no GPUs visible in the allocation (nvidia-smi): CPU jobs (gloo)")
        runtimes = {pn.runtime for pn in prepared}  # one that every node has, for --image
        inv.container_runtime = "none"
        if runtimes == {"apptainer"} or runtimes == {"singularity"}:
            inv.container_runtime = "apptainer" if runtimes == {"apptainer"} else "singularity"
            inv.container_args = ["--nv"] if gpus else []
        store.save(inv)
        log.info("slurm: allocation %s runs on %s", job_id, ", ".join(n.name for n in inv.nodes))
        node_ssh = prepared[0].node_ssh
        if node_ssh is False:
            log.info("slurm: the nodes cannot SSH to each other: run DeepSpeed with "
                     "--deepspeed-launcher no_ssh")
        if opts.node_access == "ssh":
            self._check_ssh(inv, store)

    def _check_ssh(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.nodes import NodeGroup, ssh_connector
        from provision.nodes.sshconn import write_cluster_known_hosts

        hint = "this site does not let you SSH to its compute nodes this way; use " \
               "--node-access srun (the default)"
        keyless = [n.name for n in inv.nodes if not n.host_key]
        if keyless:
            raise ProvisionError(f"no SSH host key readable on {', '.join(keyless)} "
                                 "(/etc/ssh/ssh_host_*_key.pub): it cannot be pinned", hint=hint)
        write_cluster_known_hosts(inv, store)
        with NodeGroup(inv, connector=ssh_connector) as group:
            result = group.wait_until_reachable(deadline_s=SSH_CHECK_S)
        result.raise_for("SSH to the allocated nodes (--node-access ssh)", ProvisionError,
                         hint=hint)

    # ------------------------------------------------------------------------------- destroy
    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        logins = inv.resources_of(LOGIN_KIND)
        if not logins:  # nothing was submitted (the login record comes first)
            self._forget(inv, store, (PINNED_KEY_KIND, DIR_KIND, JOB_KIND))
            return
        target = LoginTarget.model_validate_json(logins[0].extra["target"])
        opts = inv.spec.options_as(SlurmOptions) if inv.spec is not None else SlurmOptions()
        session = LoginSession(target)
        try:
            self._cancel_and_clean(inv, store, session, opts)
        except LoginError as exc:
            jobs = ", ".join(r.id for r in inv.resources_of(JOB_KIND)) or "none"
            raise TeardownError(
                f"cannot reach the Slurm login node to cancel allocation(s) {jobs}: "
                f"{exc.message}",
                hint=f"`mgpu-cloud down {inv.name}` again once it answers (or `scancel "
                     f"{jobs}` there yourself)") from exc
        finally:
            session.close()
        self._forget(inv, store, (LOGIN_KIND, PINNED_KEY_KIND))

    def _cancel_and_clean(self, inv: Inventory, store: InventoryStore, session: LoginSession,
                          opts: SlurmOptions) -> None:
        dirs = inv.resources_of(DIR_KIND)
        for job in inv.resources_of(JOB_KIND):
            state = state_of(session, job.id)
            mine = [d for d in dirs if d.id.split(":", 1)[0] == job.id]
            count = int(job.extra.get("nodes", "0")) or len(inv.nodes)
            if mine and state is not None and state.running and count:
                d = mine[0]
                node_dirs = [x for x in d.extra.get("node_dirs", "").split(",") if x]
                parents = [x for x in d.extra.get("parents", "").split(",") if x]
                ok, why = cleanup_nodes(session, job.id, inv.name, count, node_dirs, parents,
                                        opts.setup)
                if not ok:
                    log.warning("slurm: cleaning the nodes of allocation %s failed (%s); the "
                                "allocation is cancelled anyway", job.id, why)
            elif mine and mine[0].extra.get("node_dirs"):
                log.warning("slurm: allocation %s is no longer running: left on its nodes "
                            "(node-local, often removed by the site at job end): %s", job.id,
                            mine[0].extra["node_dirs"])
            if state is not None and not (state.running or state.waiting):
                log.info("slurm: allocation %s had ended already (%s)", job.id, state.state)
            final = cancel(session, job.id)
            if final is not None and (final.running or final.waiting):
                raise TeardownError(f"allocation {job.id} is still {final.state} after scancel",
                                    hint=f"`mgpu-cloud down {inv.name}` again, or ask the site")
            if state is None or state.running or state.waiting:
                log.info("slurm: allocation %s cancelled", job.id)
            store.forget(inv, JOB_KIND, job.id)
        for d in dirs:
            root = d.extra.get("path", "")
            parents = [x for x in d.extra.get("parents", "").split(",") if x]
            q = shlex.quote
            script = ['cd "$HOME" || exit 1', f"if [ -L {q(root)} ]; then rm -f -- {q(root)}; fi"]
            script += [f"rmdir -- {q(p)} 2>/dev/null || true"
                       for p in sorted(parents, key=len, reverse=True)]
            res = session.run(shell("\n".join(script) + "\nexit 0\n"), timeout=60)
            if not res.ok:
                log.warning("slurm: could not remove ~/%s on the login node: %s", root,
                            res.tail())
            store.forget(inv, d.kind, d.id)

    @staticmethod
    def _forget(inv: Inventory, store: InventoryStore, kinds: tuple[str, ...]) -> None:
        for r in list(inv.resources):
            if r.kind in kinds:
                store.forget(inv, r.kind, r.id)

    # ---------------------------------------------------------------------------------- gc
    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        target, _ = resolve_target(spec.options_as(SlurmOptions))
        session = LoginSession(target)
        try:
            res = session.run(shell("squeue -h -u \"$(id -un)\" -o '%i|%j|%T'"), timeout=60)
        finally:
            session.close()
        if not res.ok:
            raise ProvisionError(f"squeue failed on the login node: {res.tail()}")
        found = []
        for line in res.stdout.splitlines():
            job_id, _, rest = line.strip().partition("|")
            name, _, state = rest.partition("|")
            cluster = name[len(JOB_NAME_PREFIX):] if name.startswith(JOB_NAME_PREFIX) else None
            if cluster and cluster not in known:
                found.append(ResourceRecord(kind=JOB_KIND, id=job_id, name=name,
                                            extra={"state": state}))
        return found

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        target, _ = resolve_target(spec.options_as(SlurmOptions))
        session = LoginSession(target)
        try:
            for r in resources:
                cancel(session, r.id, wait_s=0)
        finally:
            session.close()
