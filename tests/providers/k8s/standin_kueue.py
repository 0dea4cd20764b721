"""Kueue's controllers as a stand-in (kueue v0.19; its JobSet webhook is in
standin_admission.py): a JobSet labelled kueue.x-k8s.io/queue-name gets a Workload
(v1beta2, label kueue.x-k8s.io/job-uid), held suspended while its ClusterQueue's quota is
short, admitted by a PATCH of the JobSet through the real client (Kueue's own identity), and
evicted (suspended again) on request.

    quota       `quota_pods` (the pods resource) and `quota` (resource -> amount, e.g.
                {"nvidia.com/gpu": 16}) of the one ClusterQueue behind every LocalQueue; a
                resource the pods request that `covered` leaves out is "unavailable in
                ClusterQueue" (pkg/scheduler/flavorassigner/flavorassigner.go); short quota
                says "insufficient unused quota for R in flavor default, N more needed"
                (reason WaitingForQuota, pkg/scheduler/scheduler.go; `Pending` is deprecated
                in v1beta2)
    conditions  kept as apimeta.SetStatusCondition keeps them (pkg/workload/workload.go):
                a condition changes IN PLACE, its lastTransitionTime only when its status
                changes, so the list's last item is not the newest
"""

from __future__ import annotations

import threading
from typing import Any

from standin_admission import quantity
from standin_store import ApiError, now

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def set_condition(conds: list[dict[str, Any]], cond: dict[str, Any]) -> bool:
    """apimeta.SetStatusCondition (k8s.io/apimachinery pkg/api/meta/conditions.go): in place;
    lastTransitionTime moves only with the status. Whether anything changed."""
    for old in conds:
        if old["type"] == cond["type"]:
            changed = any(old.get(k) != cond[k] for k in ("status", "reason", "message"))
            if old["status"] != cond["status"]:
                old["lastTransitionTime"] = cond.get("lastTransitionTime") or now()
            old.update(status=cond["status"], reason=cond["reason"], message=cond["message"])
            return changed
    conds.append({"lastTransitionTime": now(), **cond})
    return True


class KueueStandin:
    def __init__(self, api: Any, quota_pods: int = 1 << 30) -> None:
        self.api, self.store = api, api.store
        self.quota_pods = quota_pods
        self.quota: dict[str, float] = {}  # resource -> nominal quota (besides pods)
        self.covered: set[str] | None = None  # None: every resource asked is covered
        self._events = self.store.subscribe()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("STOP", "", {}))

    def set_quota(self, pods: int) -> None:
        self.quota_pods = pods
        threading.Thread(target=self._pass, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            kind, res, obj = self._events.get()
            if res == JOBSETS and kind != "DELETED":
                self._pass()

    def _pass(self) -> None:
        with self._lock:
            for js in self.store.list(JOBSETS, None, QUEUE_LABEL):
                try:
                    self._workload(js)
                    if js["spec"].get("suspend") and not self._admitted(js):
                        self._consider(js)
                except ApiError:
                    pass  # gone meanwhile

    @staticmethod
    def _wl_name(js: dict[str, Any]) -> str:
        return f"jobset-{js['metadata']['name']}-{js['metadata']['uid'][:5]}"

    def _workload(self, js: dict[str, Any]) -> dict[str, Any]:
        ns, name, uid = js["metadata"]["namespace"], js["metadata"]["name"], js["metadata"]["uid"]
        try:
            return self.store.get(WORKLOADS, ns, self._wl_name(js))
        except ApiError:
            rj = js["spec"]["replicatedJobs"][0]
            return self.store.create(WORKLOADS, ns, {"metadata": {
                "name": self._wl_name(js), "labels": {JOB_UID_LABEL: uid},
                "ownerReferences": [{"apiVersion": js["apiVersion"], "kind": "JobSet",
                                     "name": name, "uid": uid, "controller": True}]},
                "spec": {"queueName": js["metadata"]["labels"][QUEUE_LABEL], "podSets": [
                    {"name": rj["name"], "count": _pods(js),
                     "template": rj["template"]["spec"]["template"]}]},
                "status": {"conditions": []}})

    def _admitted(self, js: dict[str, Any]) -> bool:
        wl = self.store.get(WORKLOADS, js["metadata"]["namespace"], self._wl_name(js))
        return any(c["type"] == "Admitted" and c["status"] == "True"
                   for c in wl["status"]["conditions"])

    def _in_use(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for js in self.store.list(JOBSETS, None, QUEUE_LABEL):
            if not js["spec"].get("suspend"):
                for k, v in _wants(js).items():
                    used[k] = used.get(k, 0) + v
        return used

    def _consider(self, js: dict[str, Any]) -> None:
        want, used = _wants(js), self._in_use()
        limits = {"pods": float(self.quota_pods), **self.quota}
        problem = next((f"resource {r} unavailable in ClusterQueue" for r in sorted(want)
                        if self.covered is not None and r != "pods" and r not in self.covered),
                       None)
        reason = "NoMatchingFlavor" if problem else "WaitingForQuota"
        for r in sorted(want):
            if problem is None and r in limits and used.get(r, 0) + want[r] > limits[r]:
                more = used.get(r, 0) + want[r] - limits[r]
                problem = (f"insufficient unused quota for {r} in flavor default, "
                           f"{more:g} more needed")
        if problem is not None:
            self._conditions(js, {"type": "QuotaReserved", "status": "False", "reason": reason,
                                  "message": f"couldn't assign flavors to pod set "
                                             f"{js['spec']['replicatedJobs'][0]['name']}: "
                                             f"{problem}"})
            return
        self._conditions(js, {"type": "QuotaReserved", "status": "True",
                              "reason": "QuotaReserved",
                              "message": "Quota reserved in ClusterQueue cq"},
                         {"type": "Admitted", "status": "True", "reason": "Admitted",
                          "message": "The workload is admitted"})
        self._patch_suspend(js, False)

    def _conditions(self, js: dict[str, Any], *conds: dict[str, Any]) -> None:
        wl = self.store.get(WORKLOADS, js["metadata"]["namespace"], self._wl_name(js))
        probe = [dict(c) for c in wl["status"]["conditions"]]
        if any([set_condition(probe, dict(c)) for c in conds]):
            def change(o: dict[str, Any]) -> None:
                for c in conds:
                    set_condition(o["status"]["conditions"], dict(c))

            self.store.update(WORKLOADS, js["metadata"]["namespace"], self._wl_name(js), change)

    def evict(self, ns: str, name: str, reason: str = "Preempted",
              message: str = "Preempted to accommodate a workload (UID: x) due to "
                             "prioritization in the ClusterQueue") -> None:
        """Kueue takes the quota back: Evicted, QuotaReserved/Admitted False, the JobSet
        suspended again (pkg/controller/jobframework/reconciler.go, on eviction)."""
        js = self.store.get(JOBSETS, ns, name)
        with self._lock:
            self._conditions(js, {"type": "Evicted", "status": "True", "reason": reason,
                                  "message": message},
                             {"type": "QuotaReserved", "status": "False", "reason": "Pending",
                              "message": message},
                             {"type": "Admitted", "status": "False", "reason": "NoReservation",
                              "message": "The workload has no reservation"})
            self._patch_suspend(js, True)

    def _patch_suspend(self, js: dict[str, Any], suspend: bool) -> None:
        """Through the real client, as Kueue's controller patches the JobSet."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.api.url
        cfg.api_key = {"authorization": "Bearer kueue-controller"}  # its own identity
        with client.ApiClient(cfg) as api:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", js["metadata"]["namespace"], "jobsets",
                js["metadata"]["name"], {"spec": {"suspend": suspend}})


def _pods(js: dict[str, Any]) -> int:
    return sum(int(rj["template"]["spec"].get("parallelism", 1)) * rj.get("replicas", 1)
               for rj in js["spec"]["replicatedJobs"])


def _wants(js: dict[str, Any]) -> dict[str, float]:
    """What the JobSet's pods request together (a container's limits stand for its requests
    where it gives none, as the API defaults them: pkg/workload/resources.go counts the
    defaulted requests), and `pods`."""
    n = _pods(js)
    out: dict[str, float] = {"pods": float(n)}
    spec = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for c in spec.get("containers", []):
        res = c.get("resources") or {}
        for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[name] = out.get(name, 0) + quantity(value) * n
    return out
