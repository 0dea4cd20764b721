"""Kubernetes provider: the cluster is a JobSet (or plain pods + a headless Service) in the
user's namespace, every object labelled mgpu-cloud-cluster=NAME; the nodes are its pods,
reached over SSH to their sshd through the API server's port-forward (transport.py).

    plan     discovery (is jobset.x-k8s.io / kueue.x-k8s.io served?), the LocalQueue of
             --queue, leftovers of a cluster of that name; the manifests (plan.py)
    create   Secret (host keys), then the JobSet or the Service and pods, each recorded the
             moment the API answers; whenever the API answers the JobSet suspended (--queue,
             or Kueue's webhook: a LocalQueue `default`, manageJobsWithoutQueueName) waits
             for Kueue's admission, saying its reason (queue.py); then for every pod to run
    destroy  every labelled object (cleanup.py), then until no labelled pod is left
    replace  a lost pod alone (deletion.py: graceful, forced where its node does not answer):
             JobSet: the Job controller makes the new pod at that index (after Kueue admits
             the JobSet again when it preempted it); plain pods: the pod made again, with
             what is left of max_hours as its deadline
    controller  managed runs' controller pod with its own ServiceAccount and Role
             (controller.py); it removes the cluster from inside, its own pod last
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from provision.cluster.providers.contract import Recoverable, Supervising
from provision.cluster.providers.k8s import controller as ctl
from provision.cluster.providers.k8s.cleanup import (
    KINDS,
    core_call,
    delete_cluster,
    delete_if_labelled,
    labelled,
)
from provision.cluster.providers.k8s.client import (
    CUSTOM,
    Kube,
    is_not_found,
    kube,
    map_errors,
    served_groups,
)
from provision.cluster.providers.k8s.deletion import free_pod
from provision.cluster.providers.k8s.fabric import GPU_NICS, fabric_env
from provision.cluster.providers.k8s.manifests import (
    NOTICE_DIR,
    cluster_manifests,
    hostname,
    plain_pod,
)
from provision.cluster.providers.k8s.options import K8sOptions
from provision.cluster.providers.k8s.plan import K8sPlan, build_plan
from provision.cluster.providers.k8s.pods import condition, selector, wait_running
from provision.cluster.providers.k8s.queue import (
    check_priority,
    check_queue,
    held_by,
    wait_admitted,
    wait_readmitted,
)
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model.errors import (
    ClusterExistsError,
    MgpuError,
    ProviderUnavailableError,
    TeardownError,
    UserInputError,
)
from provision.model.inventory import (
    CLUSTER_TAG,
    FabricExpectation,
    Inventory,
    InventoryStore,
    NodeRecord,
    PreemptionSource,
    ResourceRecord,
)
from provision.model.spec import ClusterSpec
from provision.model.timeline import reached, timed
from provision.nodes.pool import provider_waits

log = logging.getLogger("mgpu_cloud")


def _say(msg: str) -> None:
    log.info(msg)


class K8sProvider(Recoverable[K8sPlan], Supervising[K8sPlan]):
    name = "k8s"
    # issue 44: what spare pods need first (docs/kubernetes.md, "Not built yet")
    spares_refused = ("replaces a lost pod by its index (the JobSet's completion index, or "
                      "the plain pod's name) with that index's host key, so a spare pod taking "
                      "another index's rank needs the pod's index kept apart from the rank: "
                      "not built yet")

    def plan_class(self) -> type[K8sPlan]:
        return K8sPlan

    def errors(self, action: str, *, planning: bool = False) -> AbstractContextManager[Any]:
        return map_errors(action, planning=planning)

    def _plan(self, spec: ClusterSpec) -> K8sPlan:
        opts = spec.options_as(K8sOptions)
        try:  # no cluster (or no kubeconfig): the plan is still printed (--dry-run)
            k = kube(opts.namespace, opts.context)
            with map_errors("asking the API server which APIs it serves"):
                groups: set[str] | None = served_groups(k)
        except ProviderUnavailableError as exc:
            groups = None
            unresolved = [exc.message]
        else:
            unresolved = []
        plan = build_plan(spec, groups, unresolved)
        if groups is not None:
            _refuse_leftovers(k, spec.name, groups)
            if opts.queue:
                check_queue(k, opts.queue)
            if opts.priority:
                plan.notes += [n for n in [check_priority(k, opts.priority)] if n]
        return plan

    def creatable(self, plan: Any) -> K8sPlan:
        """As every provider's; an unset image is the user's to give (UserInputError), not
        the cluster's to answer."""
        from provision.cluster.providers.k8s.plan import IMAGE_UNSET

        if isinstance(plan, K8sPlan) and plan.request.image is None:
            text, _, hint = IMAGE_UNSET.partition(": ")
            raise UserInputError(text, hint=hint)
        return super().creatable(plan)

    def _create(self, spec: ClusterSpec, plan: K8sPlan, inv: Inventory,
                store: InventoryStore) -> None:
        from provision.model.keys import ensure_cluster_key, generate_ed25519, host_key_only

        req = plan.request.model_copy(update={"end_unix": _end_unix(inv)})
        opts = _opts(spec)
        k = kube(req.namespace, req.context)
        key_path, public_key = ensure_cluster_key(store.keys_dir(spec.name))
        host = [generate_ed25519(f"node-{r}") for r in range(req.nodes)]
        inv.key_path = str(key_path)
        store.save(inv)
        answered: dict[str, Any] = {}
        for manifest in cluster_manifests(req, [h.private_openssh for h in host], public_key):
            created = create_object(k, manifest)
            _record(inv, store, req, created)
            answered[created["kind"]] = created
        provider_waits()  # bootstrap's imports while the queue and the pods start
        jobset = answered.get("JobSet")
        if jobset is not None and (jobset.get("spec") or {}).get("suspend"):
            queue = held_by(jobset)  # --queue, or Kueue's webhook defaulted one
            with timed(inv, "queued", part_of="create call"):  # the ledger's "queued"
                waited = wait_admitted(k, req.cluster, queue, opts.queue_timeout_s, _say)
            reached(inv, "admitted by the queue", part_of="create call",
                    detail=f"{waited:.1f} s in {queue}")
        pods = wait_running(k, req.cluster, set(range(req.nodes)), opts.ready_timeout_s, _say,
                            pull_attempts=opts.pull_attempts, job_events=req.mode == "jobset")
        inv.nodes = [node_record(req, rank, pods[rank], host_key_only(host[rank].public_openssh))
                     for rank in range(req.nodes)]
        inv.manage_etc_hosts = True  # node-R -> its pod IP (bootstrap; refreshed on replace)
        inv.nccl_env, inv.fabric = job_env(req)
        inv.container_runtime = "none"  # the pod is the container: a job's --image is refused
        # a pod's TERM is its notice (manifests.START writes it): the ranks save first
        inv.preemption = PreemptionSource(protocol="file", url=NOTICE_DIR)
        reached(inv, "nodes running", part_of="create call", detail=f"{len(inv.nodes)} pod(s)")
        store.save(inv)

    # --- recovery ---------------------------------------------------------------------------
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when the node's pod is gone, failed, another pod now, or being deleted past
        its grace period. Within it the pod still runs: its TERM was its notice, and it saves
        and announces a preemption itself (manifests.START)."""
        req = _request(inv)
        k = kube(req.namespace, req.context)
        try:
            pod = ctl.pod_of(k, inv.name, node)
        except Exception as exc:
            if is_not_found(exc):
                return False
            raise
        # Ready False: its node stopped reporting (the pod still reads Running: nothing on
        # that node can say otherwise; the taint manager deletes it only after 300 s)
        return bool(pod is not None and pod.metadata.uid == node.resource_id
                    and pod.status is not None and pod.status.phase == "Running"
                    and not ctl.past_grace(pod) and condition(pod, "Ready") != "False")

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """The lost pod alone. JobSet: its Job makes a new pod at that index once the old one
        is Failed or gone; plain pods: the same manifest again, its deadline what is left of
        max_hours. Same host key (the pod at index R reads host-key-R), a new pod IP
        (recovery's refresh_peers rewrites /etc/hosts)."""
        from provision.cluster.providers.lifetime import remaining_seconds

        req = _request(inv)
        opts = _opts(inv.spec)
        k = kube(req.namespace, req.context)
        old = node.resource_id or ""
        timeout, left = opts.ready_timeout_s, None
        if inv.spec is not None and inv.spec.max_hours:
            left = max(1, remaining_seconds(inv, inv.spec.max_hours))
            timeout = min(timeout, left)
        name = ctl.pod_name(k, req, node)
        if name:
            free_pod(k, name, req.cluster, _say)
        if req.mode == "pods":
            ctl.wait_name_free(k, hostname(req.cluster, node.rank), 120.0)
            store.forget(inv, "k8s-pod", old)
            _record(inv, store, req, create_object(k, plain_pod(req, node.rank, left)))
        if req.mode == "jobset" and req.queue:  # Kueue may have preempted the whole JobSet
            wait_readmitted(k, inv, req, opts.queue_timeout_s, _say)
        pod = wait_running(k, req.cluster, {node.rank}, timeout, _say,
                           exclude=frozenset({old}), pull_attempts=opts.pull_attempts,
                           job_events=req.mode == "jobset")[node.rank]
        new = node_record(req, node.rank, pod, node.host_key or "")
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        store.save(inv)
        return new

    # --- the controller (managed runs) -------------------------------------------------------
    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        from provision.cluster.providers.lifetime import remaining_seconds
        from provision.model.keys import ensure_controller_key, generate_ed25519, host_key_only

        req = _request(inv)
        k = kube(req.namespace, req.context)
        host = generate_ed25519("controller")
        _, public_key = ensure_controller_key(store.keys_dir(inv.name))
        deadline = (max(1, int(remaining_seconds(inv, inv.spec.max_hours)))
                    if inv.spec is not None and inv.spec.max_hours else None)

        def made(manifest: dict[str, Any]) -> dict[str, Any]:
            created = create_object(k, manifest)
            _record(inv, store, req, created, role="controller")
            return created

        found = ctl.create(k, req, deadline, host.private_openssh, public_key, made,
                           _opts(inv.spec).ready_timeout_s, _say)
        return ctl.node_record(found, host_key_only(host.public_openssh))

    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        req = _request(inv)
        ctl.teardown_from_inside(kube(req.namespace, req.context), inv,
                                 lambda kind, uid: store.forget(inv, kind, uid))

    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        req = _request(inv)
        ctl.remove_self(kube(req.namespace, req.context), inv)

    def _remove_lost_controller(self, inv: Inventory, store: InventoryStore) -> None:
        """Its pod (and login Secret) deleted, label-checked, and forgotten; its identity
        stays for the next one."""
        req = _request(inv)
        k = kube(req.namespace, req.context)
        for r in list(inv.resources):
            if r.extra.get("role") == "controller" and r.kind in ("k8s-pod", "k8s-secret"):
                delete_if_labelled(k, r.kind, r.name or "", inv.name)
                store.forget(inv, r.kind, r.id)

    # --- teardown ---------------------------------------------------------------------------
    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        if inv.spec is None or not isinstance(getattr(inv.spec, "k8s", None), K8sOptions):
            raise TeardownError(f"cluster {inv.name!r}: its inventory has no k8s options")
        opts = _opts(inv.spec)
        k = kube(opts.namespace, opts.context)
        ctl.remove_first(k, inv.name)
        recorded = [(r.kind, r.name or "") for r in inv.resources if r.kind in KINDS]
        groups = _groups_or_none(k)
        out = delete_cluster(k, inv.name, recorded, groups)
        for r in list(inv.resources):
            if r.kind in KINDS:
                store.forget(inv, r.kind, r.id)
        problems = out.failures + out.refused
        if out.failures:
            raise TeardownError(f"cluster {inv.name!r}: not every object was deleted: "
                                + "; ".join(problems),
                                hint=f"retry: mgpu-cloud down {inv.name}")
        for why in out.refused:
            _say(f"k8s: {why}")

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        opts = _opts(spec)
        k = kube(opts.namespace, opts.context)
        return [ResourceRecord(kind=f.kind, id=f.uid, name=f.name,
                               extra={"cluster": f.cluster, "namespace": opts.namespace})
                for f in labelled(k, CLUSTER_TAG, _groups_or_none(k)) if f.cluster not in known]

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        """Each checked again now: deleted only while the API labels it with the cluster
        `gc` listed it under."""
        opts = _opts(spec)
        k = kube(opts.namespace, opts.context)
        for r in resources:
            delete_if_labelled(k, r.kind, r.name or "", r.extra.get("cluster", ""))


def _opts(spec: ClusterSpec | None) -> K8sOptions:
    if spec is None:
        raise TeardownError("the inventory has no spec")
    return spec.options_as(K8sOptions)


def _request(inv: Inventory) -> K8sRequest:
    """The request the cluster was made from: its spec, and the mode its records name."""
    from provision.cluster.providers.k8s.plan import build_request

    mode = next((r.extra["mode"] for r in inv.resources if r.kind in KINDS
                 and "mode" in r.extra), None)
    if inv.spec is None or mode is None:
        raise MgpuError(f"cluster {inv.name!r}: its inventory holds no k8s spec or records",
                        hint=f"remove it with `mgpu-cloud down {inv.name}`")
    return build_request(inv.spec, mode, _end_unix(inv))


def _end_unix(inv: Inventory) -> int | None:
    """The cluster's absolute end (its inventory's creation + max_hours), unix seconds."""
    from provision.cluster.providers.lifetime import end_of

    if inv.spec is None or not inv.spec.max_hours:
        return None
    return int(end_of(inv, inv.spec.max_hours).timestamp())


def _groups_or_none(k: Kube) -> set[str] | None:
    try:
        return served_groups(k)
    except Exception:  # noqa: BLE001 - then every kind is tried (a 404 skips JobSets)
        return None


def _record(inv: Inventory, store: InventoryStore, req: K8sRequest, created: dict[str, Any],
            role: str | None = None) -> None:
    meta = created["metadata"]
    kind = "k8s-" + created["kind"].lower()
    extra = {"namespace": req.namespace, "mode": req.mode, **({"role": role} if role else {})}
    store.record(inv, ResourceRecord(kind=kind, id=meta["uid"], name=meta["name"], extra=extra))


def create_object(k: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """POST one manifest; the object as the API answered it (a dict: admission's defaults and
    webhooks' changes included, e.g. Kueue suspending a JobSet)."""
    ns, kind = k.namespace, f"k8s-{manifest['kind'].lower()}"
    if kind in CUSTOM:
        group, version, plural = CUSTOM[kind]
        created: Any = k.custom.create_namespaced_custom_object(group, version, ns, plural,
                                                                manifest)
        return dict(created)
    kind_name = manifest["kind"]
    obj = core_call(k, "create", kind)(ns, manifest)
    return {"kind": kind_name, **k.api.sanitize_for_serialization(obj)}


def job_env(req: K8sRequest) -> tuple[dict[str, str], FabricExpectation | None]:
    """What every job gets: CPU pods need ACCELERATE_USE_CPU (accelerate otherwise starts
    each process alone); and what the fabric gate should expect of a preset."""
    env = {} if req.gpus else {"ACCELERATE_USE_CPU": "1"}
    env.update(fabric_env(req))
    if req.fabric == "none":
        return env, None
    nominal = (f"{req.efa_devices} EFA device(s) per pod" if req.fabric == "efa"
               else f"GPUDirect-{req.fabric.upper()} ({GPU_NICS[req.fabric]} GPU NICs)")
    return env, FabricExpectation(transport=req.fabric, nominal=nominal,
                                  source="k8s fabric preset (docs/kubernetes.md)")


def node_record(req: K8sRequest, rank: int, pod: Any, host_key: str) -> NodeRecord:
    return NodeRecord(name=f"node-{rank}", rank=rank, address=pod.metadata.name, port=22,
                      private_address=pod.status.pod_ip, user="root", slots=req.slots,
                      host_key=host_key, resource_id=pod.metadata.uid)


def _refuse_leftovers(k: Kube, name: str, groups: set[str]) -> None:
    found = labelled(k, selector(name), groups)
    if found:
        names = ", ".join(f"{f.kind.removeprefix('k8s-')}/{f.name}" for f in found)
        raise ClusterExistsError(
            f"namespace {k.namespace} already has objects of a cluster named {name!r} that no "
            f"inventory here knows: {names}",
            hint=f"kubectl delete -n {k.namespace} -l {selector(name)} "
                 "jobsets,pods,services,secrets (`mgpu-cloud gc --provider k8s` lists every "
                 "such leftover), or pick another --name")
