"""Waiting on the API: Kueue's admission of a suspended JobSet, and each rank's pod running.

Both read the API only (a watch on the cluster's pods; the JobSet and Kueue's Workload polled),
say what they wait for when it changes, and end with a clear error at their deadline: a pod
that failed is named with the tail of its log (the API's pods/log), an image that cannot be
pulled with the kubelet's reason.
"""

from __future__ import annotations

import os
import time
from typing import Any

from provision.cluster.providers.k8s.client import KUEUE_GROUP, KUEUE_VERSION, Kube, jobsets
from provision.cluster.providers.k8s.manifests import INDEX_LABEL, RANK_LABEL
from provision.model.errors import CapacityError, ProvisionError
from provision.model.inventory import CLUSTER_TAG
from provision.model.logsink import Log
from provision.model.nodetext import lines as nodelines
from provision.model.nodetext import shown

POLL_S = float(os.environ.get("MGPU_CLOUD_K8S_POLL_S", "1"))
# waiting reasons that will not fix themselves
STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError"}
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def selector(cluster: str) -> str:
    return f"{CLUSTER_TAG}={cluster}"


def rank_of(pod: Any) -> int | None:
    found = (pod.metadata.labels or {}).get(INDEX_LABEL)
    if found is None:
        found = (pod.metadata.labels or {}).get(RANK_LABEL)
    return int(found) if found is not None and str(found).isdigit() else None


def running(pod: Any) -> bool:
    return (pod.status is not None and pod.status.phase == "Running"
            and bool(pod.status.pod_ip) and pod.metadata.deletion_timestamp is None)


def queue_reason(k: Kube, uid: str) -> str:
    """Kueue's word on the JobSet's Workload (its last condition's message), or ''."""
    found = k.custom.list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, k.namespace, "workloads",
        label_selector=f"{JOB_UID_LABEL}={uid}")
    for wl in found.get("items", []):
        conds = (wl.get("status") or {}).get("conditions") or []
        if conds:
            last = conds[-1]
            return f"{last.get('reason', '')}: {last.get('message', '')}".strip(": ")
    return ""


def wait_admitted(k: Kube, name: str, queue: str, timeout_s: float, log: Log) -> float:
    """Until Kueue unsuspends the JobSet; the seconds it waited. CapacityError at the
    deadline (the queue is full: nothing is wrong with the request)."""
    start = time.monotonic()
    said = ""
    while True:
        js = k.custom.get_namespaced_custom_object(*jobsets(k), name)
        if not (js.get("spec") or {}).get("suspend"):
            waited = time.monotonic() - start
            log(f"k8s: admitted by queue {queue} after {waited:.1f} s")
            return waited
        reason = queue_reason(k, js["metadata"]["uid"]) or "no Workload yet"
        if reason != said:
            log(f"k8s: waiting in queue {queue} ({reason})")
            said = reason
        if time.monotonic() - start > timeout_s:
            raise CapacityError(
                f"queue {queue} did not admit cluster {name!r} within {timeout_s:.0f} s "
                f"({reason})",
                hint="try later, ask for fewer nodes/GPUs, or raise k8s.queue_timeout_s")
        time.sleep(POLL_S)


def _stuck(k: Kube, pod: Any) -> str | None:
    """Why a pod will never run, or None."""
    if pod.status is not None and pod.status.phase in ("Failed", "Succeeded"):
        return f"pod {pod.metadata.name} {pod.status.phase.lower()}{tail_of(k, pod)}"
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in STUCK:
            return f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}"
    return None


def tail_of(k: Kube, pod: Any, lines: int = 10) -> str:
    """': ' + the last lines of the pod's log (pods/log), or '' when it has none."""
    try:
        text = k.core.read_namespaced_pod_log(pod.metadata.name, k.namespace,
                                             tail_lines=lines)
    except Exception:  # noqa: BLE001 - a log is a courtesy in an error message
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = " | ".join(shown(line) for line in nodelines(str(text).strip())[-lines:])
    return f": {text}" if text else ""


def pending_reason(pod: Any) -> str:
    """Why a pod is not scheduled yet (the scheduler's PodScheduled condition), or ''."""
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".strip(": ")
    return ""


def _say_pending(pod: Any, rank: int, before: str, log: Log) -> str:
    """Say the scheduler's reason when it changes (quota, GPUs, taints); what was said."""
    reason = pending_reason(pod)
    if reason and reason != before:
        log(f"k8s: node-{rank} waits to be scheduled ({reason})")
    return reason or before


def wait_running(k: Kube, cluster: str, ranks: set[int], timeout_s: float, log: Log,
                 exclude: frozenset[str] = frozenset()) -> dict[int, Any]:
    """rank -> its Running pod (with an IP), for every rank in `ranks`; pods whose uid is in
    `exclude` (the one being replaced) do not count. ProvisionError for a pod that failed or
    cannot start, or at the deadline."""
    from kubernetes import watch

    found: dict[int, Any] = {}
    said: dict[int, str] = {}  # rank -> the last reason said for its pod waiting
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        remaining = max(1, int(deadline - time.monotonic()))
        w = watch.Watch()
        for event in w.stream(k.core.list_namespaced_pod, k.namespace,
                              label_selector=selector(cluster), timeout_seconds=remaining):
            if event["type"] == "ERROR":  # e.g. 410 Gone: list and watch again
                w.stop()
                time.sleep(POLL_S)
                break
            pod = event["object"]
            rank = rank_of(pod)
            if rank not in ranks or pod.metadata.uid in exclude:
                continue
            if event["type"] == "DELETED" or not running(pod):
                found.pop(rank, None)
                why = _stuck(k, pod) if event["type"] != "DELETED" else None
                if why:
                    w.stop()
                    raise ProvisionError(f"cluster {cluster!r}: {why}")
                said[rank] = _say_pending(pod, rank, said.get(rank, ""), log)
                continue
            found[rank] = pod
            if set(found) == ranks:
                w.stop()
                return found
    missing = sorted(ranks - set(found))
    raise ProvisionError(
        f"cluster {cluster!r}: pod(s) of node(s) {missing} not running after {timeout_s:.0f} s",
        hint=f"kubectl get pods -n {k.namespace} -l {selector(cluster)}; "
             "kubectl describe pod NAME says why (quota, image, node capacity)")
