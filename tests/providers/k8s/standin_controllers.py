"""The JobSet and Kueue controllers, as stand-ins reacting to the store's events.

JobSetController: for an unsuspended JobSet, its headless Service (named by
network.subdomain) and, for each completion index of its one replicated job, a pod made from
the Job's template with what the Job controller adds (the index label and
JOB_COMPLETION_INDEX, hostname JOBSET-JOB-0-INDEX, the subdomain). The Job level itself is
left out (the provider never reads Jobs). With podReplacementPolicy Failed, an index gets a
new pod once its pod has failed or is gone; a pod being deleted still holds its index, a
Succeeded pod completes it.
Deleting the JobSet deletes what it owns.

KueueStandin: a JobSet labelled kueue.x-k8s.io/queue-name is held suspended while the queue's
quota (`quota_pods`, pods) is short, with a Workload whose condition says why; once it fits,
the Workload is admitted and the JobSet unsuspended by a PATCH through the real client, as
Kueue's controller does.
"""

from __future__ import annotations

import copy
import threading
import uuid
from typing import Any

from standin_store import ApiError, now

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
WORKLOADS = "kueue.x-k8s.io/v1beta1/workloads"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class JobSetController:
    def __init__(self, api: Any) -> None:
        self.store = api.store
        self._events = self.store.subscribe()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            kind, res, obj = self._events.get()
            if res == JOBSETS and kind != "DELETED":
                self.reconcile(obj["metadata"]["namespace"], obj["metadata"]["name"])
            elif res == "pods" and (obj["metadata"].get("labels") or {}).get(JOBSET_LABEL):
                self.reconcile(obj["metadata"]["namespace"],
                               obj["metadata"]["labels"][JOBSET_LABEL])

    def reconcile(self, ns: str, name: str) -> None:
        with self._lock:
            try:
                js = self.store.get(JOBSETS, ns, name)
            except ApiError:
                return
            if js["spec"].get("suspend"):
                return
            owner = {"apiVersion": js["apiVersion"], "kind": "JobSet", "name": name,
                     "uid": js["metadata"]["uid"], "controller": True}
            sub = js["spec"].get("network", {}).get("subdomain") or name
            try:
                self.store.create("services", ns, {"metadata": {
                    "name": sub, "labels": {JOBSET_LABEL: name}, "ownerReferences": [owner]},
                    "spec": {"clusterIP": "None", "selector": {JOBSET_LABEL: name},
                             "publishNotReadyAddresses": True}})
            except ApiError:
                pass  # made already
            pods = self.store.list("pods", ns, f"{JOBSET_LABEL}={name}")
            for rj in js["spec"]["replicatedJobs"]:
                job = rj["template"]["spec"]
                for index in range(int(job.get("completions", 1))):
                    # a Succeeded pod completes its index: no new pod for it
                    holding = [p for p in pods if p["metadata"]["labels"].get(INDEX_LABEL)
                               == str(index) and p.get("status", {}).get("phase") != "Failed"]
                    if not holding:
                        self._make_pod(ns, name, sub, rj["name"], index, job, owner)

    def _make_pod(self, ns: str, js: str, sub: str, job_name: str, index: int,
                  job: dict[str, Any], owner: dict[str, Any]) -> None:
        template = copy.deepcopy(job["template"])
        host = f"{js}-{job_name}-0-{index}"
        meta = template.get("metadata", {})
        meta["labels"] = {**meta.get("labels", {}), JOBSET_LABEL: js, INDEX_LABEL: str(index),
                          "jobset.sigs.k8s.io/replicatedjob-name": job_name}
        meta.update(name=f"{host}-{uuid.uuid4().hex[:5]}", ownerReferences=[owner])
        spec = template["spec"]
        spec.update(hostname=host, subdomain=sub)
        if job.get("activeDeadlineSeconds") and "activeDeadlineSeconds" not in spec:
            spec["activeDeadlineSeconds"] = job["activeDeadlineSeconds"]
        for c in spec["containers"]:
            c["env"] = [*c.get("env", []), {"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
        self.store.create("pods", ns, {"metadata": meta, "spec": spec})


class KueueStandin:
    def __init__(self, api: Any, quota_pods: int = 1 << 30) -> None:
        self.api, self.store = api, api.store
        self.quota_pods = quota_pods
        self._events = self.store.subscribe()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True).start()

    def set_quota(self, pods: int) -> None:
        self.quota_pods = pods
        threading.Thread(target=self._pass, daemon=True).start()

    def _loop(self) -> None:
        while True:
            kind, res, obj = self._events.get()
            if res == JOBSETS:
                self._pass()

    def _pass(self) -> None:
        with self._lock:
            for js in self.store.list(JOBSETS, None, QUEUE_LABEL):
                if js["spec"].get("suspend"):
                    self._consider(js)

    def _in_use(self) -> int:
        used = 0
        for js in self.store.list(JOBSETS, None, QUEUE_LABEL):
            if not js["spec"].get("suspend"):
                used += sum(int(rj["template"]["spec"].get("parallelism", 1)) * rj.get("replicas", 1)
                            for rj in js["spec"]["replicatedJobs"])
        return used

    def _consider(self, js: dict[str, Any]) -> None:
        ns, name, uid = js["metadata"]["namespace"], js["metadata"]["name"], js["metadata"]["uid"]
        want = sum(int(rj["template"]["spec"].get("parallelism", 1)) * rj.get("replicas", 1)
                   for rj in js["spec"]["replicatedJobs"])
        free = self.quota_pods - self._in_use()
        wl_name = f"jobset-{name}-{uid[:5]}"
        fits = want <= free
        cond = {"type": "Admitted" if fits else "QuotaReserved",
                "status": "True" if fits else "False",
                "reason": "Admitted" if fits else "Pending",
                "message": "The workload is admitted" if fits else
                f"couldn't assign flavors to pod set node: insufficient unused quota for pods "
                f"in flavor default, {want - free} more needed",
                "lastTransitionTime": now()}
        try:
            old = self.store.get(WORKLOADS, ns, wl_name)["status"]["conditions"][-1]
            if (old["type"], old["message"]) != (cond["type"], cond["message"]):
                self.store.update(WORKLOADS, ns, wl_name,
                                  lambda o: o.update(status={"conditions": [cond]}))
        except ApiError:
            self.store.create(WORKLOADS, ns, {"metadata": {
                "name": wl_name, "labels": {"kueue.x-k8s.io/job-uid": uid},
                "ownerReferences": [{"apiVersion": js["apiVersion"], "kind": "JobSet",
                                     "name": name, "uid": uid, "controller": True}]},
                "spec": {"queueName": js["metadata"]["labels"][QUEUE_LABEL]},
                "status": {"conditions": [cond]}})
        if fits:
            self._unsuspend(ns, name)

    def _unsuspend(self, ns: str, name: str) -> None:
        """Through the real client, as Kueue's controller patches the JobSet."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.api.url
        cfg.api_key = {"authorization": "Bearer kueue-controller"}  # its own identity
        with client.ApiClient(cfg) as api:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name, {"spec": {"suspend": False}})
