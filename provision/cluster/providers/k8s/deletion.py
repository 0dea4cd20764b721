"""Freeing a lost node's pod, so that its index (JobSet) or its name (plain pods) can be made
again, on a cluster that behaves as Kubernetes does:

- graceful first (DELETE with the pod's grace period): its kubelet TERMs the start shell,
  which exits 143, so the pod ends Failed (since 1.27 the kubelet gives a deleted pod its
  phase from its exit code) and the Job controller makes a new pod at its index;
- forced where that cannot complete: the pod's node no longer reports (its Ready condition
  False: the node lifecycle controller's MarkPodsNotReady), or the graceful deletion is not
  done `FORCE_AFTER_S` past its grace period. Graceful deletion on such a node never ends
  (only the Node's deletion or the out-of-service taint let PodGC free it), and with
  podReplacementPolicy Failed a terminating pod blocks its index for good. Forced as PodGC
  forces a pod (pkg/controller/podgc/gc_controller.go markFailedAndDeletePodWithCondition):
  its status patched Failed with a DisruptionTarget condition (the JobSet's podFailurePolicy
  ignores it: no count against backoffLimit; the Job's tracking finalizer goes once the pod is
  Failed), then DELETE with grace 0. The old process may live on where the node is cut off;
  its rank has been replaced by then.
Every DELETE carries the uid read as its precondition (the API answers 409 Conflict when the
name now holds another pod: a plain pod made again under it is left alone).
"""

from __future__ import annotations

import time
from typing import Any

from provision.cluster.providers.k8s.client import Kube, is_not_found, status_of
from provision.cluster.providers.k8s.pods import POLL_S, condition
from provision.model.inventory import CLUSTER_TAG
from provision.model.logsink import Log

FORCE_AFTER_S = 30.0
TERMINAL = ("Succeeded", "Failed")


def read_pod(k: Kube, name: str) -> Any | None:
    try:
        return k.core.read_namespaced_pod(name, k.namespace)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def free_pod(k: Kube, name: str, cluster: str, log: Log,
             force_after_s: float = FORCE_AFTER_S) -> None:
    """Delete the pod `name` of `cluster` (checked by its label now) until it is terminal or
    gone: gracefully, forced when its node does not answer (see the module)."""
    pod = read_pod(k, name)
    if pod is None or (pod.metadata.labels or {}).get(CLUSTER_TAG) != cluster:
        return
    uid = pod.metadata.uid
    if pod.status is not None and pod.status.phase in TERMINAL:
        _delete(k, name, None, uid)
        return
    if condition(pod, "Ready") != "False":
        _delete(k, name, None, uid)
        grace = float(pod.spec.termination_grace_period_seconds or 30)
        deadline = time.monotonic() + grace + force_after_s
        while time.monotonic() < deadline:
            pod = read_pod(k, name)
            if pod is None or pod.metadata.uid != uid or (
                    pod.status is not None and pod.status.phase in TERMINAL):
                return
            time.sleep(POLL_S / 4)
        log(f"k8s: pod {name} is still running {grace + force_after_s:.0f} s after its "
            "deletion (its node does not answer): forcing it")
    else:
        log(f"k8s: pod {name}'s node is not ready (it does not report): forcing its deletion")
    _force(k, pod)


def _force(k: Kube, pod: Any) -> None:
    name = pod.metadata.name
    conds = [k.api.sanitize_for_serialization(c) for c in (pod.status.conditions or [])
             if c.type != "DisruptionTarget"]
    conds.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByMgpuCloud",
                  "message": "mgpu-cloud: the pod's node does not answer; its rank is "
                             "replaced", "lastTransitionTime": _now()})
    try:
        k.core.patch_namespaced_pod_status(name, k.namespace,
                                           {"status": {"phase": "Failed", "conditions": conds}})
    except Exception as exc:
        if is_not_found(exc):
            return
        raise
    _delete(k, name, 0, pod.metadata.uid)


def _delete(k: Kube, name: str, grace: int | None, uid: str) -> None:
    """DELETE pod `name` only while it is the pod of `uid` (gone or another one: done)."""
    from kubernetes import client

    body = client.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background",
                                  preconditions=client.V1Preconditions(uid=uid))
    try:
        k.core.delete_namespaced_pod(name, k.namespace, body=body, grace_period_seconds=grace)
    except Exception as exc:
        if not is_not_found(exc) and status_of(exc)[0] != 409:
            raise


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
