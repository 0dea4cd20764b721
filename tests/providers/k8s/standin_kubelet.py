"""Kubelet stand-ins: they take each pod the API admits (no scheduling gate), run it, and
report its phase through the store, as a kubelet does through the API.

    NoopKubelet    pods are Running at once with an invented IP; nothing runs (unit tests)
    DockerKubelet  each pod is a container of its image on this machine's engine, on one
                   bridge network whose DNS aliases stand in for the headless Service's
                   records (HOST.SUBDOMAIN[.NS.svc.cluster.local]); secret volumes are copied
                   in before start, a Memory emptyDir at /dev/shm is the container's shm; a
                   container that exits or disappears makes its pod Failed (Succeeded on 0);
                   activeDeadlineSeconds is enforced; pods/log is `docker logs`.
"""

from __future__ import annotations

import base64
import io
import itertools
import tarfile
import threading
import time
from typing import Any

from engine import LABEL_KEY, RUN
from standin_store import ApiError, now

NODE = "standin-node"
STANDIN_LABEL = "mgpu-k8s-standin"


class Kubelet:
    def __init__(self, api: Any) -> None:
        self.api, self.store = api, api.store
        api.kubelet = self
        self._events = self.store.subscribe()
        self._terminating: set[str] = set()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            kind, res, pod = self._events.get()
            if res != "pods" or kind == "DELETED":
                continue
            meta, spec = pod["metadata"], pod["spec"]
            if meta.get("deletionTimestamp"):
                if meta["uid"] not in self._terminating:
                    self._terminating.add(meta["uid"])
                    threading.Thread(target=self._terminate, args=(pod,), daemon=True).start()
            elif kind == "ADDED" and not spec.get("nodeName") and not spec.get("schedulingGates"):
                self._set(pod, lambda o: o["spec"].update(nodeName=NODE) or o.update(
                    status={"phase": "Pending", "startTime": now()}))
                threading.Thread(target=self._run, args=(pod,), daemon=True).start()

    def _set(self, pod: dict[str, Any], change: Any) -> None:
        try:
            self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                              change)
        except ApiError:
            pass  # deleted meanwhile

    def running(self, pod: dict[str, Any], ip: str) -> None:
        c = pod["spec"]["containers"][0]
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                  "hostIP": "127.0.0.1", "startTime": now(),
                  "conditions": [{"type": "Ready", "status": "True"}],
                  "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                                         "ready": True, "restartCount": 0,
                                         "state": {"running": {"startedAt": now()}}}]}
        self._set(pod, lambda o: o.update(status=status))

    def ended(self, pod: dict[str, Any], code: int, reason: str) -> None:
        c = pod["spec"]["containers"][0]

        def change(o: dict[str, Any]) -> None:
            if o.get("status", {}).get("phase") in ("Failed", "Succeeded"):
                return
            o["status"] = {**o.get("status", {}), "phase": "Succeeded" if code == 0 else "Failed",
                           "reason": reason,
                           "containerStatuses": [{"name": c["name"], "image": c["image"],
                                                  "imageID": "", "ready": False,
                                                  "restartCount": 0, "state": {"terminated": {
                                                      "exitCode": code, "reason": reason}}}]}

        self._set(pod, change)

    def waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        c = pod["spec"]["containers"][0]
        status = {"phase": "Pending", "containerStatuses": [
            {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
             "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}
        self._set(pod, lambda o: o.update(status=status))

    def _terminate(self, pod: dict[str, Any]) -> None:
        self.stop_pod(pod)
        self.store.remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    # what a kind of kubelet fills in
    def _run(self, pod: dict[str, Any]) -> None:
        raise NotImplementedError

    def stop_pod(self, pod: dict[str, Any]) -> None:
        return None

    def logs(self, ns: str, name: str, query: dict[str, str]) -> str:
        return ""

    def address(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        return None

    def close(self) -> None:
        self._stop.set()


class NoopKubelet(Kubelet):
    _ips = itertools.count(10)

    def _run(self, pod: dict[str, Any]) -> None:
        self.running(pod, f"10.244.0.{next(self._ips) % 250}")


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

    def _run(self, pod: dict[str, Any]) -> None:
        import docker.errors

        meta, spec = pod["metadata"], pod["spec"]
        try:
            cid = self._create(pod)
        except docker.errors.ImageNotFound as exc:
            return self.waiting(pod, "ErrImagePull", str(exc.explanation or exc))
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                self._copy_secret(cid, pod, vol)
        self.docker.start(cid)
        self.pods[meta["uid"]] = pod
        self.containers[meta["uid"]] = cid  # watched from now on (not before it started)
        info = self.docker.inspect_container(cid)
        self.running(pod, info["NetworkSettings"]["Networks"][self.network]["IPAddress"])

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
        return str(self.docker.create_container(
            c["image"], command=[*c.get("command", []), *c.get("args", [])],
            name=f"k8s-{ns}-{meta['name']}", hostname=host,
            environment={e["name"]: e.get("value", "") for e in c.get("env", [])},
            labels={STANDIN_LABEL: self.sid, "mgpu-k8s-pod": f"{ns}.{meta['name']}",
                    LABEL_KEY: RUN},  # the test run (tests/engine.py)
            host_config=hc, networking_config=net, detach=True)["Id"])

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
                deadline = pod["spec"].get("activeDeadlineSeconds")
                try:
                    state = self.docker.inspect_container(cid)["State"]
                except docker.errors.NotFound:
                    self.containers.pop(uid, None)
                    self.ended(pod, 137, "ContainerGone")
                    continue
                if not state["Running"]:
                    self.containers.pop(uid, None)
                    self.ended(pod, int(state["ExitCode"]), "Error" if state["ExitCode"] else
                               "Completed")
                elif deadline and time.time() - self._started(state) > deadline:
                    self.docker.kill(cid)
                    self.containers.pop(uid, None)
                    self.ended(pod, 137, "DeadlineExceeded")

    @staticmethod
    def _started(state: dict[str, Any]) -> float:
        import datetime as dt

        return dt.datetime.fromisoformat(state["StartedAt"][:26].rstrip("Z")).replace(
            tzinfo=dt.UTC).timestamp()

    def stop_pod(self, pod: dict[str, Any]) -> None:
        import docker.errors

        uid = pod["metadata"]["uid"]
        self.containers.pop(uid, None)
        try:
            self.docker.remove_container(f"k8s-{pod['metadata']['namespace']}-"
                                         f"{pod['metadata']['name']}", force=True)
        except docker.errors.NotFound:
            pass

    def address(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        ip = (pod.get("status") or {}).get("podIP")
        return (ip, 0) if ip else None

    def logs(self, ns: str, name: str, query: dict[str, str]) -> str:
        import docker.errors

        tail = int(query["tailLines"]) if query.get("tailLines") else "all"
        try:
            return str(self.docker.logs(f"k8s-{ns}-{name}", tail=tail).decode(errors="replace"))
        except docker.errors.NotFound:
            return ""

    def close(self) -> None:
        """Every container and the network this kubelet made (a test's teardown)."""
        super().close()
        for c in self.docker.containers(all=True, filters={"label": f"{STANDIN_LABEL}={self.sid}"}):
            self.docker.remove_container(c["Id"], force=True)
        self.docker.remove_network(self.network)
