"""The JobSet controller and, under it, the Job controller, as one stand-in reacting to the
store's events (the provider never reads Jobs; the Job's state is kept here, its events and
the JobSet's status are written to the API).

JobSet (kubernetes-sigs/jobset v0.12 pkg/controllers/jobset_controller.go): for an
unsuspended JobSet, its headless Service (network.subdomain) and one Indexed Job per
replicated job, named JOBSET-RJOB-0; a suspended JobSet suspends its Jobs; a Job that fails
fails the JobSet (failurePolicy.maxRestarts 0); every Job complete: the JobSet Completed
(successPolicy All). The pods are owned by the JobSet here (deleting it deletes them).

Job (kubernetes/kubernetes pkg/controller/job/job_controller.go), what the provider meets:
- every pod gets the tracking finalizer batch.kubernetes.io/job-tracking, the index
  annotation and label, JOB_COMPLETION_INDEX, hostname JOB-INDEX (manageJob);
- a pod is counted once it is terminal, then its finalizer removed
  (trackJobStatusAndRemoveFinalizers): a SUCCEEDED pod COMPLETES ITS INDEX for good (no new
  pod for it, whatever ended it: a deleted pod whose process exits 0 on TERM too); a Failed
  pod counts against backoffLimit unless podFailurePolicy says Ignore (e.g. a DisruptionTarget
  condition); more failures than backoffLimit fail the Job;
- with podReplacementPolicy Failed (or any podFailurePolicy: onlyReplaceFailedPods), a pod
  being deleted but not yet terminal still TERMINATES its slot: no replacement until it is
  Failed (diff = wantActive - terminating - active);
- a pod that cannot be created (ResourceQuota's 403) leaves a Warning Event FailedCreate on
  the Job, "Error creating: ..." (pkg/controller/controller_utils.go RealPodControl), and is
  tried again later;
- suspend deletes the active pods (finalizer removed first: not counted); a resume resets the
  Job's startTime, so activeDeadlineSeconds counts again from the resume;
- activeDeadlineSeconds since startTime: the Job fails (DeadlineExceeded), its pods deleted;
- the Job gone (its JobSet deleted): its pods' finalizers are removed (syncOrphanPod).
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from standin_store import ApiError, now

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
FINALIZER = "batch.kubernetes.io/job-tracking"
TERMINAL = ("Succeeded", "Failed")


@dataclass
class JobState:
    completed: set[int] = field(default_factory=set)
    failed: int = 0
    started: float | None = None  # the Job's status.startTime (monotonic)
    finished: str | None = None  # Complete | Failed
    counted: set[str] = field(default_factory=set)  # pod uids already counted


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][INDEX_LABEL])


def ignored(pod: dict[str, Any], policy: dict[str, Any] | None) -> bool:
    """podFailurePolicy's Ignore rule matching one of the pod's True conditions
    (pkg/controller/job/pod_failure_policy.go matchPodFailurePolicy, onPodConditions)."""
    conds = {(c["type"], c["status"]) for c in pod.get("status", {}).get("conditions", [])}
    return any(rule["action"] == "Ignore" and any(
        (pc["type"], pc.get("status", "True")) in conds for pc in rule.get("onPodConditions", []))
        for rule in (policy or {}).get("rules", []))


class JobSetController:
    def __init__(self, api: Any) -> None:
        self.api, self.store = api, api.store
        self.jobs: dict[str, JobState] = {}  # JobSet uid -> its one Job's state
        self._events = self.store.subscribe()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()
        threading.Thread(target=self._resync, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("STOP", "", {}))

    def _loop(self) -> None:
        while not self._stop.is_set():
            kind, res, obj = self._events.get()
            if res == JOBSETS:
                self.reconcile(obj["metadata"]["namespace"], obj["metadata"]["name"])
            elif res == "pods" and (obj["metadata"].get("labels") or {}).get(JOBSET_LABEL):
                self.reconcile(obj["metadata"]["namespace"],
                               obj["metadata"]["labels"][JOBSET_LABEL])

    def _resync(self) -> None:
        """Deadlines and creations that failed are looked at again (the controller requeues)."""
        while not self._stop.wait(0.2):
            for js in self.store.list(JOBSETS, None):
                self.reconcile(js["metadata"]["namespace"], js["metadata"]["name"])

    def reconcile(self, ns: str, name: str) -> None:
        with self._lock:
            try:
                js = self.store.get(JOBSETS, ns, name)
            except ApiError:
                return self._orphans(ns, name)
            try:
                self._sync(ns, js)
            except ApiError:
                pass  # an object changed meanwhile: the next event or resync sees it

    def _orphans(self, ns: str, name: str) -> None:
        for pod in self.store.list("pods", ns, f"{JOBSET_LABEL}={name}"):
            if FINALIZER in pod["metadata"].get("finalizers", []):
                self._drop_finalizer(pod)

    def _drop_finalizer(self, pod: dict[str, Any]) -> None:
        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                          lambda o: o["metadata"].update(finalizers=[
                              f for f in o["metadata"].get("finalizers", []) if f != FINALIZER]))

    def _sync(self, ns: str, js: dict[str, Any]) -> None:
        name, uid = js["metadata"]["name"], js["metadata"]["uid"]
        state = self.jobs.setdefault(uid, JobState())
        rj = js["spec"]["replicatedJobs"][0]
        job = rj["template"]["spec"]
        pods = [p for p in self.store.list("pods", ns, f"{JOBSET_LABEL}={name}")
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences", []))]
        self._count(state, pods, job)
        active = [p for p in pods if p.get("status", {}).get("phase") not in TERMINAL
                  and not p["metadata"].get("deletionTimestamp")]
        if state.finished:
            return self._delete_pods(ns, active)
        if js["spec"].get("suspend"):
            state.started = None  # a resume starts the deadline again
            self._delete_pods(ns, active)
            return self._condition(ns, name, "Suspended", "True", "SuspendedJobs",
                                   "jobset is suspended")
        if any(c["type"] == "Suspended" for c in js.get("status", {}).get("conditions", [])):
            self._condition(ns, name, "Suspended", "False", "ResumeJobs", "jobset is resumed")
        self._service(ns, js)
        if state.started is None:
            state.started = time.monotonic()
        completions = int(job.get("completions", 1))
        deadline = job.get("activeDeadlineSeconds")
        if state.failed > int(job.get("backoffLimit", 6)):
            self._finish(ns, name, state, "Failed", "BackoffLimitExceeded",
                         "Job has reached the specified backoff limit")
        elif deadline and time.monotonic() - state.started >= int(deadline):
            self._finish(ns, name, state, "Failed", "DeadlineExceeded",
                         "Job was active longer than specified deadline")
        elif len(state.completed) >= completions and not active:
            self._finish(ns, name, state, "Completed", "AllJobsCompleted", "jobset completed")
        if state.finished:
            return self._delete_pods(ns, active)
        terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")
                       and p.get("status", {}).get("phase") not in TERMINAL]
        want = min(completions - len(state.completed), int(job.get("parallelism", 1)))
        diff = want - len(terminating) - len(active)
        taken = state.completed | {index_of(p) for p in active}
        for index in [i for i in range(completions) if i not in taken][:max(diff, 0)]:
            if not self._make_pod(ns, js, rj, index):
                break  # slow start: stop at the first refusal

    def _count(self, state: JobState, pods: list[dict[str, Any]], job: dict[str, Any]) -> None:
        for pod in pods:
            phase = pod.get("status", {}).get("phase")
            if phase not in TERMINAL or FINALIZER not in pod["metadata"].get("finalizers", []):
                continue
            if pod["metadata"]["uid"] not in state.counted:
                state.counted.add(pod["metadata"]["uid"])
                if phase == "Succeeded":
                    state.completed.add(index_of(pod))
                elif not ignored(pod, job.get("podFailurePolicy")):
                    state.failed += 1
            self._drop_finalizer(pod)

    def _delete_pods(self, ns: str, pods: list[dict[str, Any]]) -> None:
        """deleteJobPods: the finalizer first (such a pod is not counted), then DELETE."""
        for pod in pods:
            self._drop_finalizer(pod)
            self.api.delete("pods", ns, pod["metadata"]["name"])

    def _finish(self, ns: str, name: str, state: JobState, kind: str, reason: str,
                message: str) -> None:
        state.finished = kind
        self._condition(ns, name, kind, "True", reason, message)
        self.store.update(JOBSETS, ns, name, lambda o: o.setdefault("status", {}).update(
            terminalState=kind))

    def _condition(self, ns: str, name: str, kind: str, status: str, reason: str,
                   message: str) -> None:
        def change(o: dict[str, Any]) -> None:
            conds = o.setdefault("status", {}).setdefault("conditions", [])
            old = next((c for c in conds if c["type"] == kind), None)
            if old is None:
                conds.append({"type": kind, "status": status, "reason": reason,
                              "message": message, "lastTransitionTime": now()})
            elif old["status"] != status:
                old.update(status=status, reason=reason, message=message,
                           lastTransitionTime=now())

        js = self.store.get(JOBSETS, ns, name)
        if not any(c["type"] == kind and c["status"] == status
                   for c in js.get("status", {}).get("conditions", [])):
            self.store.update(JOBSETS, ns, name, change)

    def _service(self, ns: str, js: dict[str, Any]) -> None:
        name = js["metadata"]["name"]
        sub = js["spec"].get("network", {}).get("subdomain") or name
        try:
            self.store.create("services", ns, {"metadata": {
                "name": sub, "labels": {JOBSET_LABEL: name},
                "ownerReferences": [self._owner(js)]},
                "spec": {"clusterIP": "None", "selector": {JOBSET_LABEL: name},
                         "publishNotReadyAddresses": True}})
        except ApiError:
            pass  # made already

    @staticmethod
    def _owner(js: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": js["apiVersion"], "kind": "JobSet", "name": js["metadata"]["name"],
                "uid": js["metadata"]["uid"], "controller": True}

    def _make_pod(self, ns: str, js: dict[str, Any], rj: dict[str, Any], index: int) -> bool:
        name, job = js["metadata"]["name"], rj["template"]["spec"]
        job_name = f"{name}-{rj['name']}-0"
        template = copy.deepcopy(job["template"])
        host = f"{job_name}-{index}"
        meta = template.get("metadata", {})
        meta["labels"] = {**meta.get("labels", {}), JOBSET_LABEL: name, INDEX_LABEL: str(index),
                          "jobset.sigs.k8s.io/replicatedjob-name": rj["name"]}
        meta["annotations"] = {**meta.get("annotations", {}), INDEX_LABEL: str(index)}
        meta.update(name=f"{host}-{uuid.uuid4().hex[:5]}", ownerReferences=[self._owner(js)],
                    finalizers=[FINALIZER])
        spec = template["spec"]
        spec.update(hostname=host,
                    subdomain=js["spec"].get("network", {}).get("subdomain") or name)
        for c in spec["containers"]:
            c["env"] = [*c.get("env", []), {"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
        try:
            self.api.create("pods", ns, {"metadata": meta, "spec": spec})
        except ApiError as exc:
            self._event(ns, job_name, "FailedCreate", f"Error creating: {exc.message}")
            return False
        return True

    def _event(self, ns: str, job_name: str, reason: str, message: str) -> None:
        """A Warning Event on the Job; the same one again counts up (the event recorder's
        aggregation, client-go tools/record/events_cache.go)."""
        for ev in self.store.list("events", ns):
            if ev["involvedObject"]["name"] == job_name and ev["message"] == message:
                self.store.update("events", ns, ev["metadata"]["name"], lambda o: o.update(
                    count=o["count"] + 1, lastTimestamp=now()))
                return
        self.store.create("events", ns, {
            "metadata": {"name": f"{job_name}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                               "namespace": ns},
            "reason": reason, "type": "Warning", "message": message,
            "source": {"component": "job-controller"},
            "firstTimestamp": now(), "lastTimestamp": now(), "count": 1})
