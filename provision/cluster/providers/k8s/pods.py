"""Waiting on the API for each rank's pod to run.

Reads the API only (a watch on the cluster's pods; the Job's events polled), says what it
waits for when that changes, and ends with a clear error:
- a pod that failed: named with the tail of its log (pods/log);
- an image: InvalidImageName at once (the kubelet never retries it); a failed pull
  (ErrImagePull, then ImagePullBackOff while the kubelet backs off) is waited out with the
  kubelet's reason said, and given up after `pull_attempts` failed pulls: a registry hiccup
  passes, a missing image or a refused pull does not;
- JobSet mode: a pod the Job controller could not create leaves only a FailedCreate event on
  the Job (the pods never appear): a refusal by admission (ResourceQuota, Pod Security) is
  raised as client.forbidden names it, another reason is said;
- the deadline (k8s.ready_timeout_s): what is still missing, with kubectl's commands.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from provision.cluster.providers.k8s.client import Kube, forbidden
from provision.cluster.providers.k8s.manifests import INDEX_LABEL, JOB_NAME, RANK_LABEL
from provision.model.errors import ProvisionError
from provision.model.inventory import CLUSTER_TAG
from provision.model.logsink import Log
from provision.model.nodetext import lines as nodelines
from provision.model.nodetext import shown

POLL_S = float(os.environ.get("MGPU_CLOUD_K8S_POLL_S", "1"))
EVENTS_EVERY = 5  # polls between two reads of the Job's events
# waiting reasons that will not fix themselves (the kubelet does not retry them)
STUCK = {"InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
PULLING = {"ErrImagePull", "ImagePullBackOff"}


def selector(cluster: str) -> str:
    return f"{CLUSTER_TAG}={cluster}"


def rank_of(pod: Any) -> int | None:
    found = (pod.metadata.labels or {}).get(INDEX_LABEL)
    if found is None:
        found = (pod.metadata.labels or {}).get(RANK_LABEL)
    return int(found) if found is not None and str(found).isdigit() else None


def condition(pod: Any, kind: str) -> str | None:
    """The status of the pod's condition `kind` (True/False/Unknown), or None."""
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == kind:
            return str(cond.status)
    return None


def running(pod: Any) -> bool:
    return (pod.status is not None and pod.status.phase == "Running"
            and bool(pod.status.pod_ip) and pod.metadata.deletion_timestamp is None
            and condition(pod, "Ready") != "False")


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


@dataclass
class Watching:
    """What wait_running has seen and said, per rank."""

    cluster: str
    pull_attempts: int
    said: dict[int, str] = field(default_factory=dict)
    pulls: dict[str, int] = field(default_factory=dict)  # pod uid -> failed pulls seen
    last_reason: dict[str, str] = field(default_factory=dict)  # pod uid -> waiting reason
    events_at: float = float("-inf")  # never read (monotonic: its origin unspecified)
    events_seen: set[str] = field(default_factory=set)

    def say(self, rank: int, text: str, log: Log) -> None:
        if text and text != self.said.get(rank):
            log(f"k8s: node-{rank} {text}")
            self.said[rank] = text

    def stuck(self, k: Kube, pod: Any) -> str | None:
        """Why a pod will never run, or None (counting its failed pulls)."""
        name = pod.metadata.name
        if pod.status is not None and pod.status.phase in ("Failed", "Succeeded"):
            return f"pod {name} {pod.status.phase.lower()}{tail_of(k, pod)}"
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is None:
                continue
            if waiting.reason in STUCK:
                return f"pod {name}: {waiting.reason}: {waiting.message or ''}"
            uid, before = pod.metadata.uid, self.last_reason.get(pod.metadata.uid)
            self.last_reason[uid] = waiting.reason or ""
            # one failed pull: ErrImagePull, then ImagePullBackOff; a watch may see only one
            if waiting.reason in PULLING and before != waiting.reason and not (
                    before == "ErrImagePull" and waiting.reason == "ImagePullBackOff"):
                self.pulls[uid] = self.pulls.get(uid, 0) + 1
                if self.pulls[uid] >= self.pull_attempts:
                    return (f"pod {name}: the image could not be pulled in "
                            f"{self.pulls[uid]} tries: {waiting.message or ''}")
        return None

    def waiting_reason(self, pod: Any) -> str:
        """What the rank waits for now, in words: the scheduler, or the kubelet's pull."""
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in PULLING:
                tries = self.pulls.get(pod.metadata.uid, 0)
                return (f"waits for its image ({waiting.reason}, failed pulls "
                        f"{tries}/{self.pull_attempts}; the kubelet retries): "
                        f"{waiting.message or ''}")
        reason = pending_reason(pod)
        return f"waits to be scheduled ({reason})" if reason else ""

    def job_events(self, k: Kube, log: Log) -> None:
        """JobSet mode: the Job controller's FailedCreate events (every EVENTS_EVERY polls)."""
        if time.monotonic() - self.events_at < EVENTS_EVERY * POLL_S:
            return
        self.events_at = time.monotonic()
        job = f"{self.cluster}-{JOB_NAME}-0"
        found = k.core.list_namespaced_event(
            k.namespace, field_selector=f"involvedObject.name={job},reason=FailedCreate").items
        for ev in found:
            if ev.metadata.name in self.events_seen:
                continue
            self.events_seen.add(ev.metadata.name)
            text = str(ev.message or "")
            if " is forbidden: " in text:  # admission refused the pods: they never come
                raise forbidden(f"cluster {self.cluster!r}: the Job controller creating its "
                                "pods", text.removeprefix("Error creating: "))
            log(f"k8s: the Job controller could not create a pod: {text}")


def wait_running(k: Kube, cluster: str, ranks: set[int], timeout_s: float, log: Log,
                 exclude: frozenset[str] = frozenset(), pull_attempts: int = 5,
                 job_events: bool = False) -> dict[int, Any]:
    """rank -> its Running pod (with an IP), for every rank in `ranks`; pods whose uid is in
    `exclude` (the one being replaced) do not count. ProvisionError for a pod that failed or
    cannot start, or at the deadline; admission's refusal (job_events) as forbidden()."""
    from kubernetes import watch

    found: dict[int, Any] = {}
    seen = Watching(cluster, pull_attempts)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        remaining = max(1, int(min(deadline - time.monotonic(), EVENTS_EVERY * POLL_S)))
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
                why = seen.stuck(k, pod) if event["type"] != "DELETED" else None
                if why:
                    w.stop()
                    raise ProvisionError(f"cluster {cluster!r}: {why}")
                seen.say(rank, seen.waiting_reason(pod), log)
                continue
            found[rank] = pod
            if set(found) == ranks:
                w.stop()
                return found
        if job_events:
            seen.job_events(k, log)
    missing = sorted(ranks - set(found))
    raise ProvisionError(
        f"cluster {cluster!r}: pod(s) of node(s) {missing} not running after {timeout_s:.0f} s",
        hint=f"kubectl get pods -n {k.namespace} -l {selector(cluster)}; "
             "kubectl describe pod NAME says why (quota, image, node capacity)")
