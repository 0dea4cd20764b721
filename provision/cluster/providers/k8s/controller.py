"""The k8s provider's controller (managed runs, contract.Supervising): a pod of the cluster
with an identity of its own, scoped to the cluster's namespace.

    ServiceAccount  NAME-controller   the controller pod's identity (its token is projected
                                      into that pod only; the node pods mount none)
    Role            NAME-controller   the minimum verbs its work takes (controller_rules):
                                      watch/replace the nodes' pods, delete the cluster's
                                      objects BY NAME, read Kueue's word on its Workload
    RoleBinding     NAME-controller   the Role to the ServiceAccount
    Secret          NAME-controller   its SSH host key and the controller's own login key
                                      (the nodes hold the cluster key, which it refuses)
    Pod             NAME-controller   the pods' image, sshd; the supervisor is started in it
                                      over SSH like on every provider (handoff.py)

All labelled mgpu-cloud-cluster=NAME and mgpu-cloud-role=controller, recorded in the
inventory: `down`, rollback and `gc` remove them. The user's machine reaches the controller
like a node (SSH through the API's port-forward); the controller reaches the nodes at their
pod IPs (the pod network: transport.connector) and the API server as its service account
(client.in_cluster). From inside, it deletes what it may delete BY NAME with the recorded
uid as a precondition (DeleteOptions.preconditions: the API refuses with 409 when the name
now holds another object), so its Role needs no `get` or `list` on Secrets (a list would
read every Secret of the namespace). It deletes its own pod last; its ServiceAccount, Role
and RoleBinding stay (an identity removing itself loses the right to finish; with its pod
gone no token of it is valid: tokens are bound to the pod) until the user's next `jobs` or
`down`, as a cloud controller's role does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from provision.cluster.providers.k8s import pods as pod_waits
from provision.cluster.providers.k8s.cleanup import core_call
from provision.cluster.providers.k8s.client import (
    CUSTOM,
    JOBSET_GROUP,
    KUEUE_GROUP,
    Kube,
    is_not_found,
    status_of,
)
from provision.cluster.providers.k8s.fabric import fabric_manifests
from provision.cluster.providers.k8s.manifests import hostname, secret_name
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, NodeRecord

ROLE_LABEL = "mgpu-cloud-role"
LOGIN_MOUNT = "/etc/mgpu-login"
CONTROLLER_GRACE_S = 30  # the supervisor's last records and the store's last writes
# sshd does not pass a container's environment to its sessions: the kubelet's service
# variables (what in-cluster clients read) are handed to the supervisor's session with
# sshd's SetEnv (OpenSSH >= 7.8), the shell staying PID 1 as on the nodes
START = (
    "set -e; umask 077; mkdir -p /root/.ssh /run/sshd; "
    f"cat {LOGIN_MOUNT}/host-key > /etc/ssh/ssh_host_ed25519_key; "
    f"cat {LOGIN_MOUNT}/authorized-keys > /root/.ssh/authorized_keys; "
    '/usr/sbin/sshd -D -e -o "SetEnv=KUBERNETES_SERVICE_HOST=$KUBERNETES_SERVICE_HOST '
    'KUBERNETES_SERVICE_PORT=$KUBERNETES_SERVICE_PORT" & pid=$!; '
    "trap 'kill $pid; exit 143' TERM; wait $pid"
)


def controller_name(cluster: str) -> str:
    return f"{cluster}-controller"


def selector(cluster: str) -> str:
    """The cluster's controller objects."""
    return f"{CLUSTER_TAG}={cluster},{ROLE_LABEL}=controller"


def node_pods(cluster: str) -> str:
    """The cluster's pods but its controller (label selector)."""
    return f"{CLUSTER_TAG}={cluster},{ROLE_LABEL}!=controller"


def controller_rules(req: K8sRequest) -> list[dict[str, Any]]:
    """The controller's Role: what replacing a node and removing the cluster take, no more.
    Named objects by resourceNames (RBAC cannot select by label); pods cannot be (a JobSet's
    are named by its Job controller), so pods are the namespace's. `create` on pods only for
    plain pods (a JobSet's replacement pod is made by the Job controller): a pod can run as
    any ServiceAccount and mount any Secret of its namespace (Kubernetes' RBAC good
    practices, "Workload creation"), so a JobSet cluster's controller cannot make one."""
    name = req.cluster
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"],
         "verbs": ["get", "list", "watch", "delete", *(["create"] if req.mode == "pods"
                                                       else [])]},
        # a pod whose node does not answer is forced as PodGC does (deletion.py)
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"],
         "resourceNames": [secret_name(name), controller_name(name)]},
    ]
    if req.mode == "jobset":
        rules.append({"apiGroups": [JOBSET_GROUP], "resources": ["jobsets"],
                      "verbs": ["get", "delete"], "resourceNames": [name]})
        # the Job controller's FailedCreate events say why a replacement pod is not made
        rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["list"]})
    else:
        rules.append({"apiGroups": [""], "resources": ["services"], "verbs": ["delete"],
                      "resourceNames": [name]})
    if req.queue:
        rules.append({"apiGroups": [KUEUE_GROUP], "resources": ["workloads"],
                      "verbs": ["list"]})
    for m in fabric_manifests(req):  # the EFA DRA preset's ResourceClaimTemplate
        group = m["apiVersion"].split("/")[0]
        rules.append({"apiGroups": [group], "resources": [m["kind"].lower() + "s"],
                      "verbs": ["delete"], "resourceNames": [m["metadata"]["name"]]})
    return rules


def _meta(req: K8sRequest) -> dict[str, Any]:
    return {"name": controller_name(req.cluster), "namespace": req.namespace,
            "labels": {CLUSTER_TAG: req.cluster, ROLE_LABEL: "controller"}}


def identity_manifests(req: K8sRequest) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding (in that order: a binding names both)."""
    name = controller_name(req.cluster)
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(req),
         "automountServiceAccountToken": False},  # only the controller pod asks for it
        {"apiVersion": rbac, "kind": "Role", "metadata": _meta(req),
         "rules": controller_rules(req)},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": _meta(req),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name,
                       "namespace": req.namespace}]},
    ]


def login_secret(req: K8sRequest, host_key: str, authorized_key: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(req),
            "stringData": {"host-key": host_key.strip() + "\n",
                           "authorized-keys": authorized_key.strip() + "\n"}}


def pod(req: K8sRequest, deadline_s: int | None) -> dict[str, Any]:
    """The controller pod: the pods' image (the tool's dependencies, as the docker
    provider's controller runs the node image), its own service account's token, a small
    request (the supervisor's python, an SSH fan-out: aws's controller is a t3.small)."""
    name = controller_name(req.cluster)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": name,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": CONTROLLER_GRACE_S,
        "containers": [{
            "name": "controller", "image": req.image,
            "command": ["/bin/sh", "-c", START],
            "ports": [{"containerPort": 22, "name": "ssh", "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                          "limits": {"memory": "2Gi"}},
            "volumeMounts": [{"name": "login", "mountPath": LOGIN_MOUNT, "readOnly": True}],
        }],
        "volumes": [{"name": "login", "secret": {"secretName": name, "defaultMode": 0o400}}],
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(req), "spec": spec}


def create(k: Kube, req: K8sRequest, deadline_s: int | None, host_key: str,
           authorized_key: str, made: Callable[[dict[str, Any]], dict[str, Any]],
           timeout_s: float, log: Callable[[str], None]) -> Any:
    """Every object of the controller (an identity already there from a controller made
    before is kept when labelled as this cluster's), then its pod, once the name is free;
    the pod once Running with an IP. `made(manifest)` creates and records one object."""
    for manifest in identity_manifests(req):
        _create_or_keep(k, req, manifest, made)
    _delete_if_ours(k, req, "k8s-secret")  # a new host key for a new controller
    made(login_secret(req, host_key, authorized_key))
    wait_name_free(k, controller_name(req.cluster), timeout_s)
    made(pod(req, deadline_s))
    return wait_running(k, req.cluster, timeout_s, log)


def _create_or_keep(k: Kube, req: K8sRequest, manifest: dict[str, Any],
                    made: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    try:
        made(manifest)
    except Exception as exc:
        if status_of(exc)[0] != 409:
            raise
        kind = "k8s-" + manifest["kind"].lower()
        labels = _labels(core_call(k, "read", kind)(controller_name(req.cluster), k.namespace))
        if labels.get(CLUSTER_TAG) != req.cluster:
            raise ProvisionError(
                f"{manifest['kind']} {controller_name(req.cluster)} exists in namespace "
                f"{k.namespace} and is not labelled {CLUSTER_TAG}={req.cluster}",
                hint="remove it or pick another --name") from None


def _labels(obj: Any) -> dict[str, str]:
    return dict(obj.metadata.labels or {})


def _delete_if_ours(k: Kube, req: K8sRequest, kind: str) -> None:
    from provision.cluster.providers.k8s.cleanup import delete_if_labelled

    delete_if_labelled(k, kind, controller_name(req.cluster), req.cluster)


def wait_name_free(k: Kube, name: str, timeout_s: float) -> None:
    """Until no pod is named `name` (one made again under its name: a plain pod, the
    controller; the old one may still be terminating). ProvisionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            k.core.read_namespaced_pod(name, k.namespace)
        except Exception as exc:
            if is_not_found(exc):
                return
            raise
        time.sleep(pod_waits.POLL_S / 4)
    raise ProvisionError(f"pod {name} is still terminating after {timeout_s:.0f} s")


def wait_running(k: Kube, cluster: str, timeout_s: float, log: Callable[[str], None]) -> Any:
    """The controller pod, Running with an IP (ProvisionError when it fails or at the
    deadline, naming why)."""
    name = controller_name(cluster)
    deadline = time.monotonic() + timeout_s
    said = ""
    while time.monotonic() < deadline:
        found = k.core.read_namespaced_pod(name, k.namespace)
        if pod_waits.running(found):
            return found
        phase = found.status.phase if found.status is not None else None
        if phase in ("Failed", "Succeeded"):
            raise ProvisionError(f"the controller pod {name} {phase.lower()}"
                                 f"{pod_waits.tail_of(k, found)}")
        for cs in (found.status.container_statuses or []) if found.status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in pod_waits.STUCK:
                raise ProvisionError(f"the controller pod {name}: {waiting.reason}: "
                                     f"{waiting.message or ''}")
        reason = pod_waits.pending_reason(found)
        if reason and reason != said:
            log(f"k8s: the controller waits to be scheduled ({reason})")
            said = reason
        time.sleep(pod_waits.POLL_S)
    raise ProvisionError(f"the controller pod {name} is not running after {timeout_s:.0f} s",
                         hint=f"kubectl describe pod -n {k.namespace} {name}")


def node_record(found: Any, host_key: str) -> NodeRecord:
    """How the user's machine reaches it: SSH through the API's port-forward to the pod."""
    return NodeRecord(name="controller", rank=-1, address=found.metadata.name, port=22,
                      private_address=found.status.pod_ip, user="root", slots=0,
                      host_key=host_key, resource_id=found.metadata.uid)


# --- from inside: the controller's own identity -----------------------------------------------
def delete_named(k: Kube, kind: str, name: str, uid: str) -> bool:
    """Delete `name` only if it is still the object recorded (uid precondition: 409 when the
    name holds another one now). True when deleted or gone; False when refused."""
    from kubernetes import client

    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                      propagation_policy="Foreground" if kind == "k8s-jobset"
                                      else "Background")
    try:
        if kind in CUSTOM:
            group, version, plural = CUSTOM[kind]
            k.custom.delete_namespaced_custom_object(group, version, k.namespace, plural,
                                                     name, body=options)
        else:
            core_call(k, "delete", kind)(name, k.namespace, body=options)
    except Exception as exc:
        if is_not_found(exc):
            return True
        if status_of(exc)[0] == 409:
            return False
        raise
    return True


def teardown_from_inside(k: Kube, inv: Inventory, forget: Callable[[str, str], None]) -> None:
    """The nodes' objects (JobSet or Service and pods, their Secret), each deleted by name
    with its recorded uid, then every node pod left (by label), then until none is left.
    `forget(kind, uid)` drops a deleted object from the inventory. TeardownError naming
    what is left or was refused."""
    me = inv.controller.resource_id if inv.controller is not None else None
    problems: list[str] = []
    for r in list(inv.resources):
        if r.kind not in ("k8s-jobset", "k8s-resourceclaimtemplate", "k8s-service",
                          "k8s-secret", "k8s-pod") \
                or r.extra.get("role") == "controller" or r.id == me:
            continue
        if delete_named(k, r.kind, r.name or "", r.id):
            forget(r.kind, r.id)
        else:
            problems.append(f"{r.kind} {r.name} is another object now: left as it is")
    deadline = time.monotonic() + 180
    while left := k.core.list_namespaced_pod(k.namespace,
                                             label_selector=node_pods(inv.name)).items:
        if time.monotonic() > deadline:
            problems.append("pods still terminating: "
                            + ", ".join(p.metadata.name for p in left))
            break
        for p in left:
            if p.metadata.deletion_timestamp is None:
                delete_named(k, "k8s-pod", p.metadata.name, p.metadata.uid)
        time.sleep(pod_waits.POLL_S / 4)
    if problems:
        raise TeardownError(f"cluster {inv.name!r}: " + "; ".join(problems),
                            hint=f"run `mgpu-cloud down {inv.name}` from the machine that "
                                 "made it")


def remove_self(k: Kube, inv: Inventory) -> None:
    """Its login Secret, then its own pod (the kubelet stops this process during it)."""
    for r in inv.resources:
        if r.kind == "k8s-secret" and r.extra.get("role") == "controller":
            delete_named(k, r.kind, r.name or "", r.id)
    me = inv.controller
    if me is not None and me.resource_id:
        delete_named(k, "k8s-pod", me.address, me.resource_id)


# --- a node's pod, seen from outside or from inside -----------------------------------------
def past_grace(pod: Any) -> bool:
    """Being deleted and its grace period over: the API sets deletionTimestamp to the time
    it should be gone (k8s.io/apiserver pkg/registry/rest/delete.go BeforeDelete: now + the
    grace period), so a pod still there after it cannot end (e.g. its node is dead)."""
    import datetime as dt

    when = pod.metadata.deletion_timestamp
    return when is not None and when <= dt.datetime.now(dt.UTC)


def pod_of(k: Kube, cluster: str, node: NodeRecord) -> Any:
    """The node's pod by its name; seen from inside (the controller's view: its address is
    its pod IP, supervisor.inside_view) among the cluster's pods by uid. None: gone."""
    if node.address != node.private_address:
        return k.core.read_namespaced_pod(node.address, k.namespace)
    found = k.core.list_namespaced_pod(k.namespace,
                                       label_selector=pod_waits.selector(cluster)).items
    return next((p for p in found if p.metadata.uid == node.resource_id), None)


def pod_name(k: Kube, req: K8sRequest, node: NodeRecord) -> str | None:
    """The name of the node's pod (None: gone): its address, or from inside the cluster
    (plain pods are named by rank; a JobSet's pod is looked up by uid)."""
    if node.address != node.private_address:
        return node.address
    if req.mode == "pods":
        return hostname(req.cluster, node.rank)
    found = pod_of(k, req.cluster, node)
    return found.metadata.name if found is not None else None


def remove_first(k: Kube, cluster: str, timeout_s: float = 180.0) -> None:
    """`down`: the controller pod goes before the nodes, so it replaces none of them while
    they go (only what the API labels as the cluster's controller)."""
    from provision.cluster.providers.k8s.cleanup import delete_if_labelled

    found = k.core.list_namespaced_pod(k.namespace, label_selector=selector(cluster)).items
    for p in found:
        delete_if_labelled(k, "k8s-pod", p.metadata.name, cluster)
    for p in found:
        wait_name_free(k, p.metadata.name, timeout_s)
