"""The manifests a k8s cluster is made of, rendered from its typed request (pure: no API).

    Secret   NAME-login: each pod's SSH host key (host-key-R) and the authorized key
    JobSet   NAME (jobset.x-k8s.io/v1alpha2): one replicated job `node`, an Indexed Job of N
             pods; its headless Service NAME names the pods NAME-node-0-R.NAME
      or
    Service  NAME (headless) + Pods NAME-node-0-R (hostname NAME-node-0-R, subdomain NAME)

Every object carries the cluster label (mgpu-cloud-cluster=NAME): `down` and `gc` select by
it. The pod runs sshd only (its start line copies its host key in first); the job lifecycle
reaches it over SSH through the API server's port-forward (transport.py). The pods get no
service account token and no service links.
"""

from __future__ import annotations

import copy
from typing import Any

from provision.cluster.providers.k8s.fabric import apply_fabric
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model.inventory import CLUSTER_TAG, Inventory
from provision.nodes.layout import RemoteLayout

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # kueue pkg/controller/constants
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # set by the Job controller
RANK_LABEL = "mgpu-cloud-node"  # plain pods: their rank
JOB_NAME = "node"  # the JobSet's one replicated job
LOGIN_MOUNT = "/etc/mgpu-login"
GPU_RESOURCE = "nvidia.com/gpu"
# A pod's TERM is its notice (the kubelet deleting it: Kueue's eviction or preemption, a
# drain, the scheduler's preemption): the start shell writes it where the node's job
# supervisor looks for notices (remote/preempt.py "file": instance-action, AWS's JSON), so it
# signals the ranks to save and the run takes the preemption path (job/recovery.py); the
# shell then waits while the job runs (the run stops it once the save is kept; the kubelet
# kills at the end of the grace period, PREEMPT_GRACE_S) and ends.
NOTICE_DIR = "/run/mgpu-notice"
PREEMPT_GRACE_S = 120  # a save (recovery.PREEMPT_SAVE_DEADLINE_S: 90 s), its copy, the stop
JOB_PIDFILE = "${HOME:-/root}/" + RemoteLayout(Inventory.model_fields["remote_root"].default
                                               ).pidfile  # "PGID PID" while a job runs
ON_TERM = (
    "on_term() { "
    "printf '{\"action\": \"terminate\", \"time\": \"%s\"}' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
    f"> {NOTICE_DIR}/instance-action; "
    f'while [ -s "{JOB_PIDFILE}" ] && kill -0 "$(cut -d" " -f2 "{JOB_PIDFILE}")" 2>/dev/null; '
    "do sleep 1; done; kill $pid; exit 0; }; "
)
# The rank: JOB_COMPLETION_INDEX in a JobSet's pods (the Job controller sets it), MGPU_RANK in
# plain pods. Copies that pod's host key in, then runs sshd. The shell stays PID 1: TERM (the
# node's own stop after a detached run, ProviderInfo.self_stop; or the kubelet deleting the
# pod) ends the pod with 0, Succeeded, so its Job index is complete and not made again; sshd
# dying on its own ends it with sshd's status, Failed (a lost node).
START = (
    "set -e; r=${JOB_COMPLETION_INDEX:-$MGPU_RANK}; umask 077; "
    f"mkdir -p /root/.ssh /run/sshd {NOTICE_DIR}; "
    f"cat {LOGIN_MOUNT}/host-key-$r > /etc/ssh/ssh_host_ed25519_key; "
    f"cat {LOGIN_MOUNT}/authorized-keys > /root/.ssh/authorized_keys; "
    f"/usr/sbin/sshd -D -e & pid=$!; {ON_TERM}trap on_term TERM; wait $pid"
)


def hostname(cluster: str, rank: int) -> str:
    """The pod's hostname: JobSet's `<jobset>-<replicated job>-<job index>-<pod index>`."""
    return f"{cluster}-{JOB_NAME}-0-{rank}"


def secret_name(cluster: str) -> str:
    return f"{cluster}-login"


def labels(req: K8sRequest) -> dict[str, str]:
    return {CLUSTER_TAG: req.cluster}


def _meta(req: K8sRequest, name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": req.namespace, "labels": {**labels(req), **(extra or {})}}


def login_secret(req: K8sRequest, host_keys: list[str], authorized_key: str) -> dict[str, Any]:
    """The pods' login files (stringData: the API stores them base64). Plan shows it with
    placeholders; create fills in the keys it generates."""
    data = {f"host-key-{r}": key.strip() + "\n" for r, key in enumerate(host_keys)}
    data["authorized-keys"] = authorized_key.strip() + "\n"
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(req, secret_name(req.cluster)), "stringData": data}


def pod_spec(req: K8sRequest) -> dict[str, Any]:
    """The one pod spec of every node (a JobSet's template, or each plain pod)."""
    resources: dict[str, Any] = {}
    if req.gpus:
        resources = {"limits": {GPU_RESOURCE: str(req.gpus)}}
    container: dict[str, Any] = {
        "name": "node",
        "image": req.image,
        "command": ["/bin/sh", "-c", START],
        "ports": [{"containerPort": 22, "name": "ssh", "protocol": "TCP"}],
        "volumeMounts": [{"name": "login", "mountPath": LOGIN_MOUNT, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],  # noqa: S108 - in the pod
    }
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": req.cluster,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PREEMPT_GRACE_S if req.queue else 5,
        "containers": [container],
        "volumes": [
            {"name": "login", "secret": {"secretName": secret_name(req.cluster),
                                         "defaultMode": 0o400}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},  # torch/NCCL shared memory
        ],
    }
    if req.deadline_s is not None:
        spec["activeDeadlineSeconds"] = req.deadline_s
    return spec


def pod_template(req: K8sRequest) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"labels": labels(req)}, "spec": pod_spec(req)}
    apply_fabric(template, req)
    return template


def jobset(req: K8sRequest) -> dict[str, Any]:
    """One replicated job of N indexed pods. A lost pod is the tool's to handle (recovery
    replaces it alone): the JobSet never restarts as a whole (failurePolicy.maxRestarts 0),
    a disruption (eviction, preemption, a node gone) does not count against the Job's
    backoffLimit, and a pod is replaced only once the old one has failed."""
    extra = {QUEUE_LABEL: req.queue} if req.queue else {}
    if req.priority:
        extra[PRIORITY_LABEL] = req.priority
    job_spec: dict[str, Any] = {
        "parallelism": req.nodes, "completions": req.nodes, "completionMode": "Indexed",
        "backoffLimit": 3 * req.nodes,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
            {"type": "DisruptionTarget", "status": "True"}]}]},
        "template": pod_template(req),
    }
    if req.deadline_s is not None:
        job_spec["activeDeadlineSeconds"] = req.deadline_s
    spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                    "subdomain": req.cluster},
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": [{"name": JOB_NAME, "replicas": 1, "template": {
            "metadata": {"labels": labels(req)}, "spec": job_spec}}],
    }
    if req.queue:
        spec["suspend"] = True  # Kueue unsuspends it once admitted
    return {"apiVersion": JOBSET_API, "kind": "JobSet",
            "metadata": _meta(req, req.cluster, extra), "spec": spec}


def headless_service(req: K8sRequest) -> dict[str, Any]:
    """Plain pods' DNS: NAME-node-0-R.NAME resolves before the pods are ready."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(req, req.cluster),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(req),
                     "ports": [{"name": "ssh", "port": 22, "targetPort": 22}]}}


def plain_pod(req: K8sRequest, rank: int) -> dict[str, Any]:
    template = pod_template(req)
    spec = copy.deepcopy(template["spec"])
    spec["hostname"] = hostname(req.cluster, rank)
    container = spec["containers"][0]
    container["env"] = [*container.get("env", []), {"name": "MGPU_RANK", "value": str(rank)}]
    meta = _meta(req, hostname(req.cluster, rank), {RANK_LABEL: str(rank)})
    if template["metadata"].get("annotations"):
        meta["annotations"] = template["metadata"]["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def cluster_manifests(req: K8sRequest, host_keys: list[str],
                      authorized_key: str) -> list[dict[str, Any]]:
    """Everything `create` sends, in order."""
    out = [login_secret(req, host_keys, authorized_key)]
    if req.mode == "jobset":
        return [*out, jobset(req)]
    return [*out, headless_service(req), *(plain_pod(req, r) for r in range(req.nodes))]


def placeholder_manifests(req: K8sRequest) -> list[dict[str, Any]]:
    """What the plan shows: the keys are made by `create`, never printed."""
    keys = [f"<host key of node {r}: generated by up>" for r in range(req.nodes)]
    return cluster_manifests(req, keys, "<the cluster key's public half>")
