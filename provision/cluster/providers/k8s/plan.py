"""The k8s provider's typed plan: the request, and the manifests it renders, shown by
`--dry-run` (the Secret's keys as placeholders: they are made by `up`, never printed)."""

from __future__ import annotations

from provision.cluster.providers.k8s.client import JOBSET_GROUP, KUEUE_GROUP
from provision.cluster.providers.k8s.fabric import POD_SECURITY
from provision.cluster.providers.k8s.manifests import placeholder_manifests
from provision.cluster.providers.k8s.nodetypes import pod_resources
from provision.cluster.providers.k8s.options import IMAGE_ENV, K8sOptions
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model.errors import UserInputError
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

MODE_WORDS = {
    "jobset": "JobSet (jobset.x-k8s.io/v1alpha2): one Indexed Job of N pods; its headless "
              "Service names them",
    "pods": "plain pods + a headless Service (the cluster serves no jobset.x-k8s.io)",
}


class K8sPlan(Plan):
    request: K8sRequest

    def render(self) -> str:
        import yaml

        docs = yaml.safe_dump_all(placeholder_manifests(self.request), sort_keys=False,
                                  default_flow_style=False)
        body = "\n".join("    " + line for line in docs.rstrip().splitlines())
        # not "local": the pods run on a cluster whose cost is its owner's quota, not a price
        head = super().render().replace(
            "  cost: $0.00 (local)", "  cost: not priced (pods count against the namespace's "
            "quota on your cluster)")
        return f"{head}\n  manifests ({MODE_WORDS[self.request.mode]}):\n{body}"


def choose_mode(opts: K8sOptions, groups: set[str] | None) -> str:
    """jobset | pods from --k8s-api and what the server serves (None: not asked)."""
    if opts.api == "pods":
        if opts.queue:
            raise UserInputError(
                "--queue needs the JobSet API (Kueue admits a JobSet as one unit; plain pods "
                "would need its pod-group integration, which this provider does not make)",
                hint="drop --k8s-api pods, or drop --queue")
        return "pods"
    if groups is None:
        return "jobset"  # not asked (the API is unreachable): what most clusters serve
    if JOBSET_GROUP in groups:
        return "jobset"
    if opts.api == "jobset" or opts.queue:
        raise UserInputError(
            f"this cluster serves no {JOBSET_GROUP} API (JobSet is not installed)"
            + (" and --queue needs it" if opts.queue else ""),
            hint="install JobSet (kubernetes-sigs/jobset), or use --k8s-api pods without --queue")
    return "pods"


IMAGE_UNSET = ("the pods' image is not set: --pod-image IMAGE (or $" + IMAGE_ENV + "), an image "
               "with sshd and python3 >= 3.11 that the cluster can pull, e.g. the docker "
               "provider's node image pushed to your registry")


def build_request(spec: ClusterSpec, mode: str, end_unix: int | None = None) -> K8sRequest:
    """The typed request; `end_unix` (the cluster's absolute end) once it exists. An unset
    image leaves `image` None: the plan lists it as unresolved and `up` refuses it."""
    opts = spec.options_as(K8sOptions)
    if spec.image:
        raise UserInputError(
            f"--image {spec.image}: on k8s each node is a pod, and a pod is already the "
            "container (there is no Docker inside it to run another image)",
            hint="put the training environment into the pods' image: --pod-image IMAGE (with "
                 "sshd and python3 >= 3.11)")
    if opts.priority and not opts.queue:
        raise UserInputError(
            f"--priority {opts.priority} is Kueue's workload priority: it needs --queue",
            hint="add --queue LOCALQUEUE (a namespace's `default` LocalQueue too: --queue "
                 "default), or drop --priority")
    if opts.topology and not opts.queue:
        raise UserInputError("--topology is Kueue's Topology-Aware Scheduling: it needs --queue",
                             hint="add --queue LOCALQUEUE, or use k8s.placement KEY=VALUE")
    if opts.efa_dra and opts.fabric != "efa":
        raise UserInputError("k8s.efa_dra is how the efa fabric gets its devices",
                             hint="add --fabric efa, or drop k8s.efa_dra")
    slots = spec.gpus_per_node or opts.cpu_slots
    cpu, memory, guaranteed = pod_resources(opts.node_type, spec.gpus_per_node or 0, slots,
                                            opts.cpu, opts.memory)
    return K8sRequest(
        cluster=spec.name, namespace=opts.namespace, context=opts.context,
        mode=mode, nodes=spec.nodes, gpus=spec.gpus_per_node or 0, slots=slots,
        image=opts.image or None, cpu=cpu, memory=memory, guaranteed=guaranteed,
        queue=opts.queue, priority=opts.priority,
        deadline_s=int(spec.max_hours * 3600) if spec.max_hours else None, end_unix=end_unix,
        fabric=opts.fabric, efa_devices=opts.efa_devices, efa_dra=opts.efa_dra,
        node_type=opts.node_type, topology=opts.topology, placement=list(opts.placement))


def build_plan(spec: ClusterSpec, groups: set[str] | None, unresolved: list[str]) -> K8sPlan:
    """Pure: the plan from the spec and the API groups the server serves. (Pod hostnames,
    manifests.hostname, are DNS labels for every name the spec accepts: at most 40
    characters of a-z, 0-9 and '-'.)"""
    opts = spec.options_as(K8sOptions)
    request = build_request(spec, choose_mode(opts, groups))
    if request.image is None:
        unresolved = [*unresolved, IMAGE_UNSET]
    if opts.queue and groups is not None and KUEUE_GROUP not in groups:
        raise UserInputError(f"--queue {opts.queue}: this cluster serves no {KUEUE_GROUP} API "
                             "(Kueue is not installed)", hint="drop --queue")
    resources = [PlannedResource(kind=m["kind"], name=m["metadata"]["name"],
                                 details={"namespace": request.namespace})
                 for m in placeholder_manifests(request)]
    return K8sPlan(provider="k8s", cluster=spec.name, nodes=spec.nodes,
                   slots_per_node=request.slots, resources=resources,
                   notes=plan_notes(request), max_hours=spec.max_hours,
                   unresolved=unresolved, request=request)


def plan_notes(request: K8sRequest) -> list[str]:
    qos = "Guaranteed (requests = limits)" if request.guaranteed else \
        "Burstable (requests only: give k8s.node_type, or k8s.cpu and k8s.memory, for limits)"
    notes = [f"API: {MODE_WORDS[request.mode]}",
             "nodes reached over SSH to each pod's sshd through the API server's port-forward",
             f"each pod asks for cpu {request.cpu}, memory {request.memory}: QoS {qos}",
             f"Pod Security: the namespace must admit `{POD_SECURITY[request.fabric]}` pods "
             "(sshd runs as root" + (", the fabric's daemon needs hostPath volumes and "
                                     "NET_ADMIN)" if POD_SECURITY[request.fabric] ==
                                     "privileged" else ")")]
    if request.queue:
        notes.append(f"created suspended in Kueue queue {request.queue}; `up` waits until "
                     "it is admitted")
    if request.priority:
        notes.append(f"Kueue priority {request.priority}: a workload of a higher priority may "
                     "preempt it (every rank saves, the run waits to be admitted again and "
                     "resumes)")
    if request.deadline_s:
        notes.append(f"activeDeadlineSeconds {request.deadline_s}, and each pod ends itself "
                     "at the cluster's end (created + max_hours), whenever it was made")
    if request.fabric == "efa" and request.queue:
        notes.append(f"the queue's ClusterQueue must cover "
                     f"{'DRA devices' if request.efa_dra else 'vpc.amazonaws.com/efa'} and "
                     "hugepages-2Mi, or Kueue never admits the pods")
    return notes
