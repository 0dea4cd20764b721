"""The whole stand-in cluster for a test: API server (with admission), kubelet (noop or
docker), the node lifecycle / PodGC, the JobSet + Job controller and Kueue, a kubeconfig, and
the variables a provider process needs."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from standin_api import ApiServer
from standin_jobs import JobSetController
from standin_kubelet import NoopKubelet
from standin_kueue import KueueStandin
from standin_nodes import NodeLifecycle


class Standin:
    def __init__(self, folder: Path, *, docker: bool = False, image: str = "standin/node:1",
                 groups: tuple[str, ...] = ("jobset.x-k8s.io", "kueue.x-k8s.io",
                                            "resource.k8s.io"),
                 kueue_versions: tuple[str, ...] = ("v1beta2", "v1beta1")) -> None:
        self.api = ApiServer(groups, kueue_versions)
        self.sid = uuid.uuid4().hex[:8]
        if docker:  # pods reach the API over HTTPS at this machine's docker0 address
            from standin_docker import DockerKubelet
            from storekit import container_reachable_host

            self.api.serve_pods(container_reachable_host())
            self.kubelet: Any = DockerKubelet(self.api, f"mgpu-k8s-{self.sid}", self.sid)
        else:
            self.kubelet = NoopKubelet(self.api)
        self.nodes = NodeLifecycle(self.api, self.kubelet)
        self.jobsets = JobSetController(self.api)
        self.kueue = KueueStandin(self.api)
        self.api.start()
        self.kubeconfig = self.api.kubeconfig(folder / f"kubeconfig-{self.sid}")
        self.image = image

    @property
    def store(self) -> Any:
        return self.api.store

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), "MGPU_CLOUD_K8S_IMAGE": self.image,
                "MGPU_CLOUD_K8S_POLL_S": "0.1"}

    def add_queue(self, name: str, ns: str = "default") -> None:
        self.store.create("kueue.x-k8s.io/v1beta2/localqueues", ns, {
            "metadata": {"name": name}, "spec": {"clusterQueue": "cq"}})

    def add_quota(self, name: str, hard: dict[str, str], ns: str = "default") -> None:
        """A ResourceQuota in the namespace (what admission then enforces)."""
        self.store.create("resourcequotas", ns, {"metadata": {"name": name},
                                                 "spec": {"hard": hard}})

    def labelled(self, cluster: str | None = None) -> list[str]:
        """Every object carrying the cluster label (of `cluster`, or of any)."""
        found = []
        for (res, ns, name), obj in list(self.store.objects.items()):
            labels = obj["metadata"].get("labels") or {}
            if "mgpu-cloud-cluster" in labels and cluster in (None,
                                                              labels["mgpu-cloud-cluster"]):
                found.append(f"{res}/{ns}/{name}")
        return found

    def stop(self) -> None:
        self.nodes.stop()
        self.jobsets.stop()
        self.kueue.stop()
        self.kubelet.close()
        self.api.stop()


class OnLog(logging.Handler):
    """Calls `act(message)` for each record of the tool's logger whose message contains
    `text`: a test acts when the provider says it waits, not after a guessed delay."""

    def __init__(self, text: str, act: Any) -> None:
        super().__init__()
        self.text, self.act = text, act
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.seen.append(message)
            self.act(message)

    def __enter__(self) -> OnLog:
        logger = logging.getLogger("mgpu_cloud")
        self._level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("mgpu_cloud")
        logger.removeHandler(self)
        logger.setLevel(self._level)


@contextlib.contextmanager
def checked(s: Standin) -> Iterator[Standin]:
    """Use `s`, then stop it; the test fails on any manifest the schemas refused and on any
    request the Role of docs/kubernetes.md for who sent it does not allow (rbac.py)."""
    import rbac

    try:
        yield s
    finally:
        s.stop()
    assert s.api.violations == [], "\n".join(s.api.violations)
    denied = rbac.denied_to_anyone(s.api.requests)
    assert denied == [], "requests the Roles of docs/kubernetes.md do not allow:\n" + \
        "\n".join(denied)
