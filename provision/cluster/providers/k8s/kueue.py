"""Kueue as this provider meets it after admission: a workload's priority, and its eviction.

    check_priority   plan time: the WorkloadPriorityClass of --priority exists (cluster-scoped:
                     a namespace's Role cannot read it; then the plan says it was not checked)
    wait_readmitted  a replacement while Kueue holds the JobSet suspended (it preempted or
                     evicted the workload: every pod was deleted): until it is admitted again,
                     saying why it waits; the seconds are the run's "queued" time

Kueue's side (kubernetes-sigs/kueue v0.19): the JobSet's label kueue.x-k8s.io/priority-class
names the class (pkg/controller/constants WorkloadPriorityClassLabel); a class that does not
exist leaves the job without a Workload (jobframework's reconciler cannot build one), so it
waits unadmitted. A preemption sets the Workload's Evicted (reason Preempted) and Preempted
conditions and suspends the JobSet (jobframework reconciler.go, on eviction: StopJob); the
JobSet suspends its Jobs, whose controller deletes the pods (graceful: each pod's TERM is
its notice, manifests.START). Once quota frees, Kueue admits it again and unsuspends it; the
Jobs make a pod for every index anew.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.k8s.client import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    Kube,
    jobsets,
    status_of,
)
from provision.cluster.providers.k8s.pods import JOB_UID_LABEL, wait_admitted
from provision.cluster.providers.k8s.request import K8sRequest
from provision.model import timeline
from provision.model.errors import UserInputError
from provision.model.logsink import Log

PRIORITY_CLASSES = "workloadpriorityclasses"
EVICTION = ("Evicted", "Preempted")  # Workload conditions, as Kueue sets them on eviction


def check_priority(k: Kube, name: str) -> str | None:
    """None when WorkloadPriorityClass `name` exists; a note for the plan when this identity
    may not read it (403); UserInputError when it does not exist."""
    try:
        k.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, PRIORITY_CLASSES, name)
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
        KUEUE_GROUP, KUEUE_VERSION, k.namespace, "workloads",
        label_selector=f"{JOB_UID_LABEL}={uid}")
    said = []
    for wl in found.get("items", []):
        for c in (wl.get("status") or {}).get("conditions") or []:
            if c.get("type") in EVICTION and c.get("status") == "True":
                said.append(f"{c['type']} ({c.get('reason', '')}: {c.get('message', '')})")
    return "; ".join(said)


def wait_readmitted(k: Kube, inv: Any, req: K8sRequest, timeout_s: float, log: Log) -> float:
    """A replacement of a JobSet that Kueue holds suspended (it preempted or evicted it):
    until Kueue admits it again (pods.wait_admitted: CapacityError at the deadline), saying
    why it was taken back; the wait is the replacement's "queued" phase. Its seconds (0.0
    when the JobSet runs)."""
    js = k.custom.get_namespaced_custom_object(*jobsets(k), req.cluster)
    if not (js.get("spec") or {}).get("suspend"):
        return 0.0
    why = eviction(k, js["metadata"]["uid"])
    log(f"k8s: Kueue took the admission of {req.cluster!r} back"
        + (f": {why}" if why else " (the JobSet is suspended)")
        + f"; waiting in queue {req.queue} to be admitted again")
    with timeline.timed(inv, "queued", part_of="replacement"):
        return wait_admitted(k, req.cluster, req.queue or "", timeout_s, log)
