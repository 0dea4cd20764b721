"""Waiting on Kueue: a JobSet Kueue holds suspended, until it is admitted; and its priority.

Kueue suspends a JobSet that names a queue (`--queue`), and also one that names none, when
the namespace has a LocalQueue `default` (its JobSet webhook labels it with that queue) or
Kueue manages jobs without a queue name (`manageJobsWithoutQueueName`): `create` waits
whenever the API's answer is suspended, saying why. Kueue's word is its Workload's NEWEST
condition: Kueue keeps conditions in place (apimeta.SetStatusCondition), so the list's last
item is not the latest news; ties (one-second timestamps) go to QuotaReserved=False, the
scheduler's reason for waiting.

Priority and preemption (kubernetes-sigs/kueue v0.19): the JobSet's label
kueue.x-k8s.io/priority-class names a WorkloadPriorityClass (pkg/controller/constants
WorkloadPriorityClassLabel; cluster-scoped: check_priority); a class that does not exist
leaves the job without a Workload, so it is never admitted. A preemption sets the Workload's
Evicted (reason Preempted) and Preempted conditions and suspends the JobSet (jobframework
reconciler.go, on eviction: StopJob); its Jobs delete every pod gracefully (each pod's TERM is
its notice: manifests.START). A replacement then waits until Kueue admits the JobSet again
(wait_readmitted), its wait the recovery's "queued" phase.
"""

from __future__ import annotations

import time
from typing import Any

from provision.cluster.providers.k8s import pods
from provision.cluster.providers.k8s.client import (
    KUEUE_GROUP,
    Kube,
    jobsets,
    kueue_version,
    status_of,
)
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model import timeline
from provision.model.errors import CapacityError, UserInputError
from provision.model.logsink import Log

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EVICTION = ("Evicted", "Preempted")  # Workload conditions, as Kueue sets them on eviction


def newest(conds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The condition with the latest lastTransitionTime (RFC 3339 in UTC: compared as text);
    on a tie QuotaReserved=False, then the later one in the list."""
    if not conds:
        return None
    rank = [(c.get("lastTransitionTime") or "",
             c.get("type") == "QuotaReserved" and c.get("status") == "False", i)
            for i, c in enumerate(conds)]
    return conds[max(rank)[2]]


def queue_reason(k: Kube, uid: str) -> str:
    """Kueue's word on the JobSet's Workload (its newest condition), or ''."""
    found = k.custom.list_namespaced_custom_object(
        KUEUE_GROUP, kueue_version(k), k.namespace, "workloads",
        label_selector=f"{JOB_UID_LABEL}={uid}")
    for wl in found.get("items", []):
        cond = newest((wl.get("status") or {}).get("conditions") or [])
        if cond:
            return f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return ""


def held_by(jobset: dict[str, Any]) -> str:
    """How the user is told which queue holds a JobSet the API answered suspended."""
    queue = (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    if not queue:
        return "Kueue (manageJobsWithoutQueueName: no queue named)"
    return f"queue {queue}"


def wait_admitted(k: Kube, name: str, queue: str, timeout_s: float, log: Log) -> float:
    """Until Kueue unsuspends the JobSet; the seconds it waited. CapacityError at the
    deadline (the queue is full: nothing is wrong with the request)."""
    start = time.monotonic()
    said = ""
    while True:
        js = k.custom.get_namespaced_custom_object(*jobsets(k), name)
        if not (js.get("spec") or {}).get("suspend"):
            waited = time.monotonic() - start
            log(f"k8s: admitted by {queue} after {waited:.1f} s")
            return waited
        reason = queue_reason(k, js["metadata"]["uid"]) or "no Workload yet"
        if reason != said:
            log(f"k8s: waiting in {queue} ({reason})")
            said = reason
        if time.monotonic() - start > timeout_s:
            raise CapacityError(
                f"{queue} did not admit cluster {name!r} within {timeout_s:.0f} s ({reason})",
                hint="try later, ask for fewer nodes/GPUs, or raise k8s.queue_timeout_s"
                     + ("; name a LocalQueue with --queue" if "no queue named" in queue
                        else ""))
        time.sleep(pods.POLL_S)  # the module's: tests set it


def check_queue(k: Kube, queue: str) -> None:
    """The LocalQueue exists in the namespace (plan: before anything is made)."""
    from provision.cluster.providers.k8s.client import is_not_found

    try:
        k.custom.get_namespaced_custom_object(KUEUE_GROUP, kueue_version(k), k.namespace,
                                              "localqueues", queue)
    except Exception as exc:
        if is_not_found(exc):
            raise UserInputError(f"namespace {k.namespace} has no Kueue LocalQueue {queue!r}",
                                 hint=f"kubectl get localqueues -n {k.namespace}") from None
        raise


def check_priority(k: Kube, name: str) -> str | None:
    """None when WorkloadPriorityClass `name` exists; a note for the plan when this identity
    may not read it (403: cluster-scoped, no namespace's Role grants it); UserInputError when
    it does not exist."""
    try:
        k.custom.get_cluster_custom_object(KUEUE_GROUP, kueue_version(k),
                                           "workloadpriorityclasses", name)
    except Exception as exc:
        status = status_of(exc)[0]
        if status == 404:
            raise UserInputError(
                f"--priority {name}: the cluster has no Kueue WorkloadPriorityClass {name!r} "
                "(Kueue would make no Workload for the JobSet: it would never be admitted)",
                hint="kubectl get workloadpriorityclasses") from None
        if status == 403:
            return (f"--priority {name}: not checked (WorkloadPriorityClasses are "
                    "cluster-scoped and this Role cannot read them; the optional ClusterRole "
                    "of docs/kubernetes.md can): if it does not exist, Kueue never admits "
                    "the cluster and `up` waits until k8s.queue_timeout_s")
        raise
    return None


def eviction(k: Kube, uid: str) -> str:
    """Kueue's word on why it took the JobSet's admission back ('' when it did not): its
    Workload's Evicted and Preempted conditions that are True."""
    found = k.custom.list_namespaced_custom_object(
        KUEUE_GROUP, kueue_version(k), k.namespace, "workloads",
        label_selector=f"{JOB_UID_LABEL}={uid}")
    said = []
    for wl in found.get("items", []):
        for c in (wl.get("status") or {}).get("conditions") or []:
            if c.get("type") in EVICTION and c.get("status") == "True":
                said.append(f"{c['type']} ({c.get('reason', '')}: {c.get('message', '')})")
    return "; ".join(said)


def wait_readmitted(k: Kube, inv: Any, req: K8sRequest, timeout_s: float, log: Log) -> float:
    """A replacement of a JobSet Kueue holds suspended (it preempted or evicted it): until
    Kueue admits it again (CapacityError at the deadline), saying why it was taken back; the
    wait is the replacement's "queued" phase. Its seconds (0.0 when the JobSet runs)."""
    js = k.custom.get_namespaced_custom_object(*jobsets(k), req.cluster)
    if not (js.get("spec") or {}).get("suspend"):
        return 0.0
    why = eviction(k, js["metadata"]["uid"])
    log(f"k8s: Kueue took the admission of {req.cluster!r} back"
        + (f": {why}" if why else " (the JobSet is suspended)")
        + f"; waiting in {held_by(js)} to be admitted again")
    with timeline.timed(inv, "queued", part_of="replacement"):
        return wait_admitted(k, req.cluster, held_by(js), timeout_s, log)
