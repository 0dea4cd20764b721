"""The control plane's side of a lost node, as a stand-in: what happens to a pod whose node
stopped reporting (standin_kubelet.Kubelet.lose_node), on the clock of the real defaults.

    node lifecycle  after node-monitor-grace-period (40 s; `monitor_grace_s`) without a
                    heartbeat: the Node's Ready condition Unknown, the taint
                    node.kubernetes.io/unreachable:NoExecute, and every pod there Ready=False
                    (pkg/controller/nodelifecycle/node_lifecycle_controller.go;
                    MarkPodsNotReady in pkg/controller/util/node/controller_utils.go). The
                    pods' phase stays Running: nothing on the node can report otherwise.
    taint manager   a pod tolerating the taint for N s (300 by default, admission's
                    DefaultTolerationSeconds) is deleted after N s, with the condition
                    DisruptionTarget (reason DeletionByTaintManager; pkg/controller/
                    tainteviction/taint_eviction.go). The deletion is graceful: on a lost
                    node it never completes.
    PodGC           (pkg/controller/podgc/gc_controller.go) a pod on a Node that no longer
                    exists (gcOrphaned: DisruptionTarget, reason DeletionByPodGC), or a
                    terminating pod on a NotReady Node tainted
                    node.kubernetes.io/out-of-service (gcTerminating): marked Failed, then
                    deleted with grace 0.

`time_scale` shrinks the tolerations' seconds for tests (1.0: as written in the pod).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from standin_store import ApiError, now

UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


class NodeLifecycle:
    def __init__(self, api: Any, kubelet: Any, monitor_grace_s: float = 40.0,
                 time_scale: float = 1.0) -> None:
        self.api, self.store, self.kubelet = api, api.store, kubelet
        self.monitor_grace_s, self.time_scale = monitor_grace_s, time_scale
        self._silent_since: dict[str, float] = {}
        self._tainted_at: dict[str, float] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.tick()
            except ApiError:
                pass  # an object went meanwhile: the next tick sees the new state

    def tick(self) -> None:
        clock = time.monotonic()
        for node in list(self.kubelet.lost):
            since = self._silent_since.setdefault(node, clock)
            if node not in self._tainted_at and clock - since >= self.monitor_grace_s:
                self._not_ready(node)
                self._tainted_at[node] = clock
        self._evict(clock)
        self._gc()

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.store.list("pods", None) if p["spec"].get("nodeName") == node]

    def _not_ready(self, node: str) -> None:
        def taint(o: dict[str, Any]) -> None:
            o["status"]["conditions"] = [{"type": "Ready", "status": "Unknown",
                                          "reason": "NodeStatusUnknown",
                                          "message": "Kubelet stopped posting node status."}]
            o["spec"].setdefault("taints", []).append(
                {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now()})

        self.store.update("nodes", "", node, taint)
        for pod in self._pods_on(node):
            self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                              _not_ready_pod)

    def _evict(self, clock: float) -> None:
        for node, tainted in self._tainted_at.items():
            for pod in self._pods_on(node):
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                seconds = next((t.get("tolerationSeconds") for t in pod["spec"].get(
                    "tolerations", []) if t.get("key") == UNREACHABLE), 0)
                if seconds is None or clock - tainted < seconds * self.time_scale:
                    continue  # tolerated (for ever, or not yet over)
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self.store.update("pods", ns, name, lambda o: _condition(
                    o, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute "
                    f"taint key: {UNREACHABLE}"))
                self.api.delete("pods", ns, name)

    def _gc(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.store.list("nodes", None)}
        for pod in self.store.list("pods", None):
            node = nodes.get(pod["spec"].get("nodeName", ""))
            orphaned = pod["spec"].get("nodeName") and node is None
            out_of_service = node is not None and pod["metadata"].get("deletionTimestamp") \
                and any(t["key"] == OUT_OF_SERVICE for t in node["spec"].get("taints", [])) \
                and node["status"]["conditions"][0]["status"] != "True"
            if not (orphaned or out_of_service) or (
                    pod["metadata"].get("deletionGracePeriodSeconds") == 0
                    and pod.get("status", {}).get("phase") in ("Succeeded", "Failed")):
                continue  # not PodGC's, or done already (a finalizer still holds it)
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]

            def failed(o: dict[str, Any], orphan: bool = bool(orphaned)) -> None:
                if o.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                    o["status"]["phase"] = "Failed"
                    if orphan:
                        _condition(o, "DeletionByPodGC", "PodGC: node no longer exists")

            self.store.update("pods", ns, name, failed)
            self.api.delete("pods", ns, name, 0)


def _not_ready_pod(o: dict[str, Any]) -> None:
    for cond in o.get("status", {}).setdefault("conditions", []):
        if cond["type"] == "Ready":
            cond["status"] = "False"
            return
    o["status"]["conditions"].append({"type": "Ready", "status": "False"})


def _condition(o: dict[str, Any], reason: str, message: str) -> None:
    conds = o.setdefault("status", {}).setdefault("conditions", [])
    conds[:] = [c for c in conds if c["type"] != "DisruptionTarget"]
    conds.append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                  "message": message, "lastTransitionTime": now()})
