"""Waiting on Kueue: a JobSet Kueue holds suspended, until it is admitted.

Kueue suspends a JobSet that names a queue (`--queue`), and also one that names none, when
the namespace has a LocalQueue `default` (its JobSet webhook labels it with that queue) or
Kueue manages jobs without a queue name (`manageJobsWithoutQueueName`): `create` waits
whenever the API's answer is suspended, saying why. Kueue's word is its Workload's NEWEST
condition: Kueue keeps conditions in place (apimeta.SetStatusCondition), so the list's last
item is not the latest news; ties (one-second timestamps) go to QuotaReserved=False, the
scheduler's reason for waiting.
"""

from __future__ import annotations

import time
from typing import Any

from provision.cluster.providers.k8s import pods
from provision.cluster.providers.k8s.client import KUEUE_GROUP, Kube, jobsets, kueue_version
from provision.model.errors import CapacityError, UserInputError
from provision.model.logsink import Log

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


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
