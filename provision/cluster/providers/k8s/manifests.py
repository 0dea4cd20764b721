"""The manifests a k8s cluster is made of, rendered from its typed request (pure: no API).

    Secret   NAME-login: each pod's SSH host key (host-key-R) and the authorized key
    JobSet   NAME (jobset.x-k8s.io/v1alpha2): one replicated job `node`, an Indexed Job of N
             pods; its headless Service NAME names the pods NAME-node-0-R.NAME
      or
    Service  NAME (headless) + Pods NAME-node-0-R (hostname NAME-node-0-R, subdomain NAME)

    ResourceClaimTemplate NAME-efa (resource.k8s.io/v1): with k8s.efa_dra, the pods' EFA claim

Every object carries the cluster label (mgpu-cloud-cluster=NAME): `down` and `gc` select by
it. The pod runs sshd only (its start line copies its host key in first); the job lifecycle
reaches it over SSH through the API server's port-forward (transport.py). The pods get no
service account token and no service links.
"""

from __future__ import annotations

import copy
from typing import Any

from provision.cluster.providers.k8s.fabric import apply_fabric, fabric_manifests, node_setup
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
# signals the ranks to save and the run takes the preemption path (job/watcher.py); the
# shell then waits while the job runs (the run stops it once the save is kept; the kubelet
# kills at the end of the grace period, PREEMPT_GRACE_S) and ends with 143 (START).
NOTICE_DIR = "/run/mgpu-notice"
PREEMPT_GRACE_S = 120  # a save (watcher.PREEMPT_SAVE_DEADLINE_S: 90 s), its copy, the stop
JOB_PIDFILE = "${HOME:-/root}/" + RemoteLayout(Inventory.model_fields["remote_root"].default
                                               ).pidfile  # "PGID PID" while a job runs
ON_TERM = (
    "on_term() { "
    "printf '{\"action\": \"terminate\", \"time\": \"%s\"}' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
    f"> {NOTICE_DIR}/instance-action; "
    f'while [ -s "{JOB_PIDFILE}" ] && kill -0 "$(cut -d" " -f2 "{JOB_PIDFILE}")" 2>/dev/null; '
    "do sleep 1; done; kill $pid; exit 143; }; "
)
# The rank: JOB_COMPLETION_INDEX in a JobSet's pods (the Job controller sets it), MGPU_RANK in
# plain pods. Copies that pod's host key in, then runs sshd; the shell stays PID 1, and how it
# ends is the pod's final phase (since Kubernetes 1.27 the kubelet gives a deleted pod its
# phase from its exit code, and the Job controller counts a Succeeded pod's index complete):
#   TERM (the pod deleted, evicted, preempted, drained)  exit 143: Failed, the Job makes a new
#                                                        pod at its index
#   USR1 (ProviderInfo.self_stop after a detached run)   exit 0: Succeeded, index complete
#   sshd dying on its own                                its status: Failed (a lost node)
#   the cluster's end (MGPU_END_UNIX: created + max_hours) reached, or already past when the
#   pod starts (a replacement, a pod made again after a Kueue resume)  exit 0: Succeeded, so
#   no pod of the cluster outlives --max-hours, whatever activeDeadlineSeconds restarted
START = (
    "set -e; r=${JOB_COMPLETION_INDEX:-$MGPU_RANK}; umask 077; "
    'if [ -n "${MGPU_END_UNIX:-}" ] && [ "$(date +%%s)" -ge "$MGPU_END_UNIX" ]; then '
    "echo 'mgpu-cloud: the cluster is past its --max-hours: not starting'; exit 0; fi; "
    f"mkdir -p /root/.ssh /run/sshd {NOTICE_DIR}; "
    f"cat {LOGIN_MOUNT}/host-key-$r > /etc/ssh/ssh_host_ed25519_key; "
    f"cat {LOGIN_MOUNT}/authorized-keys > /root/.ssh/authorized_keys; "
    "%(setup)s"
    "/usr/sbin/sshd -D -e & pid=$!; "
    + ON_TERM.replace("%", "%%") + "trap on_term TERM; trap 'kill $pid; exit 0' USR1; "
    'if [ -n "${MGPU_END_UNIX:-}" ]; then '
    '(sleep $((MGPU_END_UNIX - $(date +%%s))); kill -USR1 $$) & fi; '
    "wait $pid"
)
SELF_STOP_SIGNAL = "USR1"
END_ENV = "MGPU_END_UNIX"


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


def start_line(req: K8sRequest) -> str:
    """The container's shell: START with the fabric's set-up step (fabric.node_setup)."""
    return START % {"setup": node_setup(req)}


def resources(req: K8sRequest) -> dict[str, Any]:
    """CPU/memory requests always (a pod without them is BestEffort and refused by a
    namespace's compute ResourceQuota); limits too when Guaranteed; the GPUs."""
    requests = {"cpu": req.cpu, "memory": req.memory}
    limits: dict[str, str] = dict(requests) if req.guaranteed else {}
    if req.gpus:
        limits[GPU_RESOURCE] = str(req.gpus)
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def pod_spec(req: K8sRequest, deadline_s: int | None = None) -> dict[str, Any]:
    """The one pod spec of every node (a JobSet's template, or each plain pod)."""
    env = []
    if req.deadline_s is not None:
        env.append({"name": END_ENV, "value": str(req.end_unix) if req.end_unix is not None
                    else "<set by up: the cluster's creation + max_hours, unix seconds>"})
    container: dict[str, Any] = {
        "name": "node",
        "image": req.image or "<unresolved: --pod-image IMAGE>",
        "command": ["/bin/sh", "-c", start_line(req)],
        "ports": [{"containerPort": 22, "name": "ssh", "protocol": "TCP"}],
        "resources": resources(req),
        "volumeMounts": [{"name": "login", "mountPath": LOGIN_MOUNT, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],  # noqa: S108 - in the pod
    }
    if env:
        container["env"] = env
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
    deadline = deadline_s if deadline_s is not None else req.deadline_s
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return spec


def pod_template(req: K8sRequest, deadline_s: int | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"labels": labels(req)},
                                "spec": pod_spec(req, deadline_s)}
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


def plain_pod(req: K8sRequest, rank: int, deadline_s: int | None = None) -> dict[str, Any]:
    """A plain pod; `deadline_s`: its activeDeadlineSeconds when not the whole max_hours (a
    replacement gets only what is left)."""
    template = pod_template(req, deadline_s)
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
    out = [login_secret(req, host_keys, authorized_key), *fabric_manifests(req)]
    if req.mode == "jobset":
        return [*out, jobset(req)]
    return [*out, headless_service(req), *(plain_pod(req, r) for r in range(req.nodes))]


def placeholder_manifests(req: K8sRequest) -> list[dict[str, Any]]:
    """What the plan shows: the keys are made by `create`, never printed."""
    keys = [f"<host key of node {r}: generated by up>" for r in range(req.nodes)]
    return cluster_manifests(req, keys, "<the cluster key's public half>")
