"""DockerKubelet: each pod a container of its image on this machine's engine, on one bridge
network whose DNS aliases stand in for the headless Service's records
(HOST.SUBDOMAIN[.NS.svc.cluster.local]); secret volumes and a ServiceAccount token
(standin_incluster.py) are copied in before start, KUBERNETES_SERVICE_HOST/PORT set; a Memory
emptyDir at /dev/shm is the container's shm; pods/log is `docker logs`.

Containers are named `k8s-SID-NS-POD` (SID: the stand-in's own id), so two stand-ins on one
engine never meet. The kubelet's rules (graceful deletion's final phase, lost nodes, pulls,
deadlines) are standin_kubelet.Kubelet's; here: a container that exits or disappears ends its
pod with its exit code; `stop_pod` is `docker stop -t GRACE` (TERM, then KILL); a lost node's
containers are paused (frozen: connections hang, as on a dead machine).
"""

from __future__ import annotations

import base64
import contextlib
import io
import tarfile
import threading
import time
from typing import Any

from engine import LABEL_KEY, RUN
from standin_kubelet import STANDIN_LABEL, Kubelet
from standin_store import ApiError


class DockerKubelet(Kubelet):
    def __init__(self, api: Any, network: str, sid: str) -> None:
        import docker

        self.docker = docker.from_env(timeout=120).api
        self.network, self.sid = network, sid
        self.containers: dict[str, str] = {}  # pod uid -> container id
        self.pods: dict[str, dict[str, Any]] = {}
        self.docker.create_network(network, driver="bridge",
                                   labels={STANDIN_LABEL: sid, LABEL_KEY: RUN})
        super().__init__(api)
        threading.Thread(target=self._monitor, daemon=True).start()

    def container_name(self, ns: str, pod: str) -> str:
        return f"k8s-{self.sid}-{ns}-{pod}"

    def has_image(self, image: str) -> bool:
        import docker.errors

        try:
            self.docker.inspect_image(image)
        except docker.errors.ImageNotFound:
            return False  # no registry is reachable here: what the engine lacks is missing
        return True

    def _run(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        cid = self._create(pod)
        try:
            for vol in spec.get("volumes", []):
                if "secret" in vol:
                    self._copy_secret(cid, pod, vol)
            self.api.incluster.project(self.docker, cid, pod)  # its ServiceAccount's token
        except ApiError:  # its Secret deleted meanwhile (the cluster taken down): a kubelet's
            self.docker.remove_container(cid, force=True)  # mount fails, nothing starts
            return
        if not self._start_container(cid, pod):
            return
        self.pods[meta["uid"]] = pod
        self.containers[meta["uid"]] = cid  # watched from now on (not before it started)
        info = self.docker.inspect_container(cid)
        self.running(pod, info["NetworkSettings"]["Networks"][self.network]["IPAddress"])

    def _start_container(self, cid: str, pod: dict[str, Any]) -> bool:
        """Start the pod's container; False when the pod was deleted while it was made (its
        container then removed, or marked for removal by a pod remade under its name:
        `_drop_earlier`, 409 "marked for removal"). A kubelet starts no container for a pod
        that is terminating (pkg/kubelet/pod_workers.go: a pod whose worker is terminating
        is never started again); a start that fails for a pod still there is an error.
        A start that succeeds for a pod deleted before its container existed (the deletion's
        `stop_pod` found nothing to stop: run 92, two suites at once, left one running) is
        undone: a kubelet's housekeeping kills the containers of pods it no longer knows
        (pkg/kubelet/kubelet_pods.go HandlePodCleanups)."""
        import docker.errors

        try:
            self.docker.start(cid)
        except docker.errors.APIError:
            if self._exists(pod):
                raise
            with contextlib.suppress(docker.errors.APIError):
                self.docker.remove_container(cid, force=True)
            return False
        if not self._exists(pod):  # deleted before the start: a stop_pod after it finds it
            with contextlib.suppress(docker.errors.APIError):
                self.docker.remove_container(cid, force=True)
            return False
        return True

    def _create(self, pod: dict[str, Any]) -> str:
        meta, spec = pod["metadata"], pod["spec"]
        c, ns = spec["containers"][0], meta["namespace"]
        host = spec.get("hostname") or meta["name"]
        aliases = [host]
        if spec.get("subdomain"):
            aliases += [f"{host}.{spec['subdomain']}",
                        f"{host}.{spec['subdomain']}.{ns}.svc.cluster.local"]
        shm = any(v.get("emptyDir", {}).get("medium") == "Memory" for v in spec.get("volumes", []))
        hc = self.docker.create_host_config(network_mode=self.network,
                                            shm_size="1g" if shm else None)
        net = self.docker.create_networking_config(
            {self.network: self.docker.create_endpoint_config(aliases=aliases)})
        name = self.container_name(ns, meta["name"])
        self._drop_earlier(name, meta["uid"])
        return str(self.docker.create_container(
            c["image"], command=[*c.get("command", []), *c.get("args", [])],
            name=name, hostname=host,
            environment={**self.api.incluster.env(),
                         **{e["name"]: e.get("value", "") for e in c.get("env", [])}},
            labels={STANDIN_LABEL: self.sid, "mgpu-k8s-pod": f"{ns}.{meta['name']}",
                    "mgpu-k8s-uid": meta["uid"],
                    LABEL_KEY: RUN},  # the test run (tests/engine.py)
            host_config=hc, networking_config=net, detach=True)["Id"])

    def _drop_earlier(self, name: str, uid: str) -> None:
        """The container an earlier pod of the same name left (killed: its node gone, and
        not removed yet). A real kubelet names a pod's containers with the pod's UID
        (`k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`, kubelet/dockershim naming;
        CRI sandboxes are keyed by UID), so a pod made again under that name never meets
        them; here names are per pod name, so the earlier one goes first (seen: a remade
        controller pod never started, its create refused 409 Conflict)."""
        import docker.errors

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the name is free (or already this pod's)
            try:
                labels = self.docker.inspect_container(name)["Config"]["Labels"] or {}
            except docker.errors.NotFound:
                return
            if labels.get("mgpu-k8s-uid") == uid:
                return
            # NotFound, or 409 "removal ... already in progress" (its housekeeping, meanwhile)
            with contextlib.suppress(docker.errors.APIError):
                self.docker.remove_container(name, force=True)
            time.sleep(0.2)

    def _copy_secret(self, cid: str, pod: dict[str, Any], vol: dict[str, Any]) -> None:
        mount = next(m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]
                     if m["name"] == vol["name"])
        secret = self.store.get("secrets", pod["metadata"]["namespace"],
                                vol["secret"]["secretName"])
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for key, value in secret.get("data", {}).items():
                data = base64.b64decode(value)
                info = tarfile.TarInfo(f"{mount.strip('/')}/{key}")
                info.size, info.mode = len(data), vol["secret"].get("defaultMode", 0o644)
                tar.addfile(info, io.BytesIO(data))
        self.docker.put_archive(cid, "/", buf.getvalue())

    def _monitor(self) -> None:
        import docker.errors

        while not self._stop.is_set():
            time.sleep(0.3)
            for uid, cid in list(self.containers.items()):
                pod = self.pods[uid]
                if pod["spec"].get("nodeName") in self.lost or uid in self._terminating:
                    continue
                try:
                    state = self.docker.inspect_container(cid)["State"]
                except docker.errors.NotFound:
                    self.containers.pop(uid, None)
                    self.ended(pod, 137, "ContainerGone")
                    continue
                deadline = self._deadline(pod)
                if not state["Running"]:
                    self.containers.pop(uid, None)
                    self.ended(pod, int(state["ExitCode"]), "Error" if state["ExitCode"] else
                               "Completed")
                elif deadline and time.time() - self._started(state) > deadline:
                    self.docker.kill(cid)
                    self.containers.pop(uid, None)
                    self.ended(pod, 137, "DeadlineExceeded",
                               f"Pod was active on the node longer than the specified "
                               f"deadline ({deadline} s)")

    def _deadline(self, pod: dict[str, Any]) -> int | None:
        """activeDeadlineSeconds as the API has it now (it can be lowered after creation)."""
        try:
            now = self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            return None
        found = now["spec"].get("activeDeadlineSeconds")
        return int(found) if found else None

    @staticmethod
    def _started(state: dict[str, Any]) -> float:
        import datetime as dt

        return dt.datetime.fromisoformat(state["StartedAt"][:26].rstrip("Z")).replace(
            tzinfo=dt.UTC).timestamp()

    def stop_pod(self, pod: dict[str, Any], grace: int) -> int | None:
        import docker.errors

        uid = pod["metadata"]["uid"]
        self.containers.pop(uid, None)
        name = self.container_name(pod["metadata"]["namespace"], pod["metadata"]["name"])
        try:
            info = self.docker.inspect_container(name)
            if info["Config"]["Labels"].get("mgpu-k8s-uid") not in (None, uid):
                return None  # a later pod's, made again under this name (_drop_earlier)
            cid = info["Id"]  # by id from here: the name may be a later pod's any moment
            if info["State"]["Running"]:
                self.docker.stop(cid, timeout=grace)
            code = int(self.docker.inspect_container(cid)["State"]["ExitCode"])
            with contextlib.suppress(docker.errors.APIError):  # 409: its removal under way
                self.docker.remove_container(cid, force=True)
        except docker.errors.NotFound:
            return None
        return code

    def freeze(self, pod: dict[str, Any]) -> None:
        import docker.errors

        try:
            self.docker.pause(self.container_name(pod["metadata"]["namespace"],
                                                  pod["metadata"]["name"]))
        except docker.errors.APIError:
            pass  # not running (any more)

    def address(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        ip = (pod.get("status") or {}).get("podIP")
        return (ip, 0) if ip else None

    def logs(self, ns: str, name: str, query: dict[str, str]) -> str:
        import docker.errors

        tail = int(query["tailLines"]) if query.get("tailLines") else "all"
        try:
            return str(self.docker.logs(self.container_name(ns, name), tail=tail).decode(
                errors="replace"))
        except docker.errors.NotFound:
            return ""

    def close(self) -> None:
        """Every container and the network this kubelet made (a test's teardown)."""
        super().close()
        for c in self.docker.containers(all=True, filters={"label": f"{STANDIN_LABEL}={self.sid}"}):
            self.docker.remove_container(c["Id"], force=True)
        self.docker.remove_network(self.network)
