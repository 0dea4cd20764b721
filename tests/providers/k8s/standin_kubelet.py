"""Kubelet stand-ins: they take each pod the API admits (no scheduling gate), put it on a node
of its own, run it, and report its phase through the store, as a kubelet does through the API.

    NoopKubelet    pods are Running at once with an invented IP; nothing runs (unit tests);
                   on TERM the "process" exits `term_exit_code` (143: no handler)
    DockerKubelet  (standin_docker.py) each pod a container of its image on this machine

What every kubelet here does as a real one (each with its upstream source):
- graceful deletion: TERM, the grace period, then the pod's FINAL PHASE FROM ITS EXIT CODES
  (Succeeded when every container exited 0, else Failed), then a DELETE with grace 0
  (website content/en/docs/concepts/workloads/pods/pod-lifecycle.md, "Pod termination":
  "The kubelet transitions the Pod into a terminal phase (Failed or Succeeded depending on the
  end state of its containers). This step is guaranteed since version 1.27"; kept on purpose,
  kubernetes#118310 and #120182). A process that exits 0 on TERM ends its pod Succeeded.
- a lost node (`lose_node`): its kubelet reports nothing and ends nothing; a deletion there
  never completes (the node lifecycle and PodGC, standin_nodes.py, are what can free it)
- image pulls (pkg/kubelet/images/image_manager.go EnsureImageExists): an unparsable name is
  InvalidImageName at once and for good; a failed pull is ErrImagePull, then
  ImagePullBackOff ("Back-off pulling image ...") while the back-off runs (10 s doubling to
  300 s: pkg/kubelet/kubelet.go backOffPeriod / MaxContainerBackOff; `pull_backoff_s` here),
  then another try; transient failures (`pull_failures[image]`) succeed on a later try
- activeDeadlineSeconds from the pod's start (pkg/kubelet/active_deadline.go): Failed,
  reason DeadlineExceeded
- a terminal phase is final: a status the kubelet computes later never takes a Succeeded or
  Failed pod back to Pending or Running (pkg/kubelet/kubelet_pods.go generateAPIPodStatus,
  "pods are not allowed to transition out of terminal phases"). Seen without it: a container
  that exited at once was reported Running after its Succeeded, and lived on in the store
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Any

from standin_store import ApiError, now

NODE_PREFIX = "standin-node"
STANDIN_LABEL = "mgpu-k8s-standin"
TERMINAL = ("Succeeded", "Failed")
MIN_GRACE_S = 2  # pkg/kubelet/kuberuntime/kuberuntime_container.go minimumGracePeriodInSeconds
# a reference as the container runtime parses it (distribution/reference, simplified):
# lowercase path components, an optional :tag and @digest
_REFERENCE = re.compile(r"^[a-z0-9]+([._/-][a-z0-9]+)*(:[0-9]+/[a-z0-9._/-]+)?"
                        r"(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


class Kubelet:
    def __init__(self, api: Any) -> None:
        self.api, self.store = api, api.store
        api.kubelet = self
        self._events = self.store.subscribe()
        self._terminating: set[str] = set()
        self._stop = threading.Event()
        self._nodes = itertools.count()
        self.lost: set[str] = set()  # nodes whose kubelet is gone (lose_node)
        self.pull_failures: dict[str, int] = {}  # image -> transient failures left
        self.missing_images: set[str] = set()  # images no registry has
        self.pull_backoff_s = 10.0
        self.pulls: list[str] = []  # every pull tried, in order
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            kind, res, pod = self._events.get()
            if res != "pods":
                continue
            meta, spec = pod["metadata"], pod["spec"]
            if spec.get("nodeName") in self.lost:
                continue
            if kind == "DELETED":  # housekeeping: what is left of a pod removed at once
                if meta["uid"] not in self._terminating:
                    threading.Thread(target=self.stop_pod, args=(pod, MIN_GRACE_S),
                                     daemon=True).start()
                continue
            if meta.get("deletionTimestamp"):
                if meta["uid"] not in self._terminating:
                    self._terminating.add(meta["uid"])
                    threading.Thread(target=self._terminate, args=(pod,), daemon=True).start()
            elif kind == "ADDED" and not spec.get("nodeName") and not spec.get("schedulingGates"):
                node = self._register_node()
                self._set(pod, lambda o, n=node: o["spec"].update(nodeName=n) or o.update(
                    status={"phase": "Pending", "startTime": now()}))
                threading.Thread(target=self._start, args=(pod,), daemon=True).start()

    def _register_node(self) -> str:
        """One node per pod (a GPU pod takes its machine), Ready as its kubelet reports."""
        name = f"{NODE_PREFIX}-{next(self._nodes)}"
        self.store.create("nodes", "", {"metadata": {"name": name}, "spec": {},
                                        "status": {"conditions": [
                                            {"type": "Ready", "status": "True",
                                             "reason": "KubeletReady"}]}})
        return name

    def node_of(self, pod_name: str, ns: str = "default") -> str:
        return str(self.store.get("pods", ns, pod_name)["spec"]["nodeName"])

    def lose_node(self, pod_name: str, ns: str = "default") -> str:
        """The node of that pod goes silent (power, network): its kubelet reports and ends
        nothing from now on; the pod's processes freeze. Its name."""
        pod = self.store.get("pods", ns, pod_name)
        node = str(pod["spec"]["nodeName"])
        self.lost.add(node)
        self.freeze(pod)
        return node

    def _set(self, pod: dict[str, Any], change: Any) -> None:
        try:
            self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                              change)
        except ApiError:
            pass  # deleted meanwhile

    def _container_status(self, pod: dict[str, Any], state: dict[str, Any],
                          ready: bool = False) -> list[dict[str, Any]]:
        c = pod["spec"]["containers"][0]
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                 "restartCount": 0, "state": state}]

    def _set_live(self, pod: dict[str, Any], status: dict[str, Any], merge: bool) -> None:
        """A Pending or Running status (over the stored one: `merge`), unless the pod is
        terminal by now (the module's last rule)."""
        def change(o: dict[str, Any]) -> None:
            if o.get("status", {}).get("phase") not in TERMINAL:
                o["status"] = {**o.get("status", {}), **status} if merge else status

        self._set(pod, change)

    def running(self, pod: dict[str, Any], ip: str) -> None:
        self._set_live(pod, {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                             "hostIP": "127.0.0.1", "startTime": now(),
                             "conditions": [{"type": "Ready", "status": "True"}],
                             "containerStatuses": self._container_status(
                                 pod, {"running": {"startedAt": now()}}, ready=True)},
                       merge=False)

    def ended(self, pod: dict[str, Any], code: int, reason: str, message: str = "") -> None:
        """The pod's final phase, from its container's exit code (restartPolicy Never)."""
        statuses = self._container_status(
            pod, {"terminated": {"exitCode": code, "reason": reason}})

        def change(o: dict[str, Any]) -> None:
            if o.get("status", {}).get("phase") in TERMINAL:
                return
            o["status"] = {**o.get("status", {}), "phase": "Succeeded" if code == 0 else "Failed",
                           "reason": reason, "containerStatuses": statuses}
            if message:
                o["status"]["message"] = message
            for cond in o["status"].get("conditions", []):
                if cond["type"] == "Ready":
                    cond["status"] = "False"

        self._set(pod, change)

    def waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        status = {"phase": "Pending", "containerStatuses": self._container_status(
            pod, {"waiting": {"reason": reason, "message": message}})}
        self._set_live(pod, status, merge=True)

    def _terminate(self, pod: dict[str, Any]) -> None:
        """TERM, the grace period, the final phase from the exit code, DELETE grace 0."""
        meta = pod["metadata"]
        grace = max(MIN_GRACE_S, int(meta.get("deletionGracePeriodSeconds") or 0))
        code = self.stop_pod(pod, grace)
        if code is not None:
            self.ended(pod, code, "Completed" if code == 0 else "Error")
        try:
            self.api.delete("pods", meta["namespace"], meta["name"], 0)
        except ApiError:
            pass  # gone already

    def _pull(self, pod: dict[str, Any]) -> bool:
        """The image is there (True), or the pod waits with the kubelet's reason; retried
        after the back-off until it is pulled, the pod is deleted, or the kubelet stops."""
        image = pod["spec"]["containers"][0]["image"]
        if not _REFERENCE.match(image):
            self.waiting(pod, "InvalidImageName", f'Failed to apply default image tag '
                                                  f'"{image}": couldn\'t parse image name '
                                                  f'"{image}": invalid reference format')
            return False
        backoff = self.pull_backoff_s
        while not self._stop.is_set() and self._exists(pod):
            self.pulls.append(image)
            left = self.pull_failures.get(image, 0)
            if left <= 0 and image not in self.missing_images and self.has_image(image):
                return True
            if left > 0:
                self.pull_failures[image] = left - 1
                why = (f'failed to pull and unpack image "{image}": failed to copy: '
                       "read tcp: i/o timeout")
            else:
                why = (f'failed to pull and unpack image "{image}": failed to resolve '
                       f"reference \"{image}\": {image}: not found")
            self.waiting(pod, "ErrImagePull", f"rpc error: code = Unknown desc = {why}")
            time.sleep(min(backoff, 0.05))
            self.waiting(pod, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            time.sleep(backoff)
            backoff = min(backoff * 2, 30 * self.pull_backoff_s)
        return False

    def _exists(self, pod: dict[str, Any]) -> bool:
        try:
            found = self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            return False
        return found["metadata"]["uid"] == pod["metadata"]["uid"] and \
            not found["metadata"].get("deletionTimestamp")

    def _start(self, pod: dict[str, Any]) -> None:
        if self._pull(pod):
            self._run(pod)

    # what a kind of kubelet fills in
    def has_image(self, image: str) -> bool:
        return True

    def _run(self, pod: dict[str, Any]) -> None:
        raise NotImplementedError

    def stop_pod(self, pod: dict[str, Any], grace: int) -> int | None:
        """TERM, then KILL after `grace` s; the exit code (None: nothing was running)."""
        return None

    def freeze(self, pod: dict[str, Any]) -> None:
        return None

    def logs(self, ns: str, name: str, query: dict[str, str]) -> str:
        return ""

    def address(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        return None

    def close(self) -> None:
        self._stop.set()
        self._events.put(("STOP", "", {}))


class NoopKubelet(Kubelet):
    _ips = itertools.count(10)
    term_exit_code = 143  # what the pod's process does on TERM: no handler, 128 + 15

    def _run(self, pod: dict[str, Any]) -> None:
        self.running(pod, f"10.244.0.{next(self._ips) % 250}")

    def stop_pod(self, pod: dict[str, Any], grace: int) -> int | None:
        try:
            phase = self.store.get("pods", pod["metadata"]["namespace"],
                                   pod["metadata"]["name"]).get("status", {}).get("phase")
        except ApiError:
            return None
        return self.term_exit_code if phase == "Running" else None
