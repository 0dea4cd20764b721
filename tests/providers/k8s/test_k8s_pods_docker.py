"""The pods' own shell as a kubelet meets it: the stand-in's docker kubelet runs each pod as a
container of the node image and stops it as a kubelet does (TERM, the grace period, the final
phase from the exit code). What the provider's start line does on TERM, on its self-stop, at
the cluster's end; and a quiet SSH session through a port-forward with an idle timeout.
One stand-in for the module; every cluster name is this module's own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import rbac
from kit import until
from standin import Standin

from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Recoverable
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("k8s_pods_docker")]  # one stand-in, tests in file order
INDEX = "batch.kubernetes.io/job-completion-index"
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"


@pytest.fixture(scope="module")
def dock(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Standin]:
    s = Standin(tmp_path_factory.mktemp("k8s-docker"), docker=True, image=node_image)
    try:
        yield s
    finally:
        s.stop()
    assert s.api.violations == [], "\n".join(s.api.violations)
    denied = rbac.denied([r for r in s.api.requests if r.who == "user"])
    assert denied == [], "requests the Role of docs/kubernetes.md does not allow:\n" + \
        "\n".join(denied)


@pytest.fixture
def standin(dock: Standin, monkeypatch: pytest.MonkeyPatch) -> Standin:
    for k, v in dock.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("provision.cluster.providers.k8s.pods.POLL_S", 0.05)
    return dock


def phases(s: Standin, uid: str) -> list[str]:
    """Every phase the API recorded for the pod of that uid, in order."""
    return [e["status"]["phase"] for _, _, res, e in list(s.store.events)
            if res == "pods" and e["metadata"]["uid"] == uid and e.get("status", {}).get("phase")]


def live(s: Standin, cluster: str) -> list[dict[str, Any]]:
    return [p for p in s.store.list("pods", "default", f"mgpu-cloud-cluster={cluster}")
            if p.get("status", {}).get("phase") in ("Pending", "Running")]


def connected(inv: Inventory, rank: int, store: InventoryStore) -> Any:
    """A connection to the pod of `rank` once its sshd answers (`up` here skips bootstrap,
    which would pin the host keys and wait for it)."""
    from provision.cluster.providers.k8s.transport import connector
    from provision.nodes.sshconn import write_cluster_known_hosts

    write_cluster_known_hosts(inv, store)
    deadline = time.monotonic() + 60
    while True:
        conn = connector(inv)(inv, inv.nodes[rank])
        try:
            if conn.run("true", timeout=10).ok:
                return conn
        except Exception:  # noqa: BLE001 - sshd not listening yet
            if time.monotonic() > deadline:
                raise
        conn.close()
        time.sleep(0.5)


def down(name: str, store: InventoryStore, s: Standin) -> None:
    from provision.cluster import pipeline

    pipeline.down(name, store=store, log=lambda m: None)
    assert s.labelled(name) == []


def test_a_deleted_pod_ends_failed_and_its_index_gets_a_new_pod(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """`kubectl delete pod` (a drain, an eviction): TERM to the start shell. Exit 0 would end
    the pod Succeeded and the Job would count its index complete, never making it again."""
    from kubernetes import client, config

    inv = up(make_spec(name="dk-del"))
    connected(inv, 1, store).close()  # its shell is past its start (TERM is trapped)
    lost = inv.nodes[1]
    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    client.CoreV1Api(api).delete_namespaced_pod(lost.address, "default")
    until(lambda: phases(standin, lost.resource_id or "")[-1:] in (["Failed"], ["Succeeded"]))
    assert phases(standin, lost.resource_id or "")[-1] == "Failed"
    new = until(lambda: [p for p in live(standin, "dk-del") if p["metadata"]["labels"][INDEX]
                         == "1" and p["metadata"]["uid"] != lost.resource_id])
    assert new[0]["metadata"]["name"] != lost.address
    down("dk-del", store, standin)


def test_replacing_a_running_pod_makes_a_new_one(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """--replace-slow replaces a pod that still runs: deleted, it ends Failed, and the Job's
    new pod is there well inside the timeout."""
    inv = up(make_spec(name="dk-slow", k8s={"ready_timeout_s": 60}))
    connected(inv, 0, store).close()  # its shell is past its start (TERM is trapped)
    prov = get_provider("k8s")
    assert isinstance(prov, Recoverable)
    old = inv.nodes[0]
    new = prov.replace(inv, store, old)
    assert new.resource_id != old.resource_id and new.rank == 0 and prov.node_alive(inv, new)
    assert phases(standin, old.resource_id or "")[-1] == "Failed"
    down("dk-slow", store, standin)


def test_the_self_stop_ends_the_pod_succeeded_and_its_index_complete(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """After a detached run each pod stops itself (ProviderInfo.self_stop): Succeeded, not
    made again, no longer holding the namespace's quota."""
    from provision.cluster.providers.k8s import INFO

    inv = up(make_spec(name="dk-stop"))
    node = inv.nodes[1]
    conn = connected(inv, 1, store)
    try:
        conn.run(f"nohup sh -c 'sleep 0.5; {INFO.self_stop}' >/dev/null 2>&1 &")
    finally:
        conn.close()
    until(lambda: phases(standin, node.resource_id or "")[-1:] == ["Succeeded"])
    time.sleep(1.5)  # the Job controller resyncs every 0.2 s
    assert [p["metadata"]["labels"][INDEX] for p in live(standin, "dk-stop")] == ["0"]
    down("dk-stop", store, standin)


def test_pods_made_after_a_kueue_resume_end_at_the_clusters_end(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """Kueue evicts and later re-admits: the Job's deadline and the new pods' own start
    again from the resume; the cluster's end does not move (max_hours 0.01: 36 s)."""
    import datetime as dt

    standin.add_queue("dk-q")
    inv = up(make_spec(name="dk-end", max_hours=0.01, k8s={"queue": "dk-q"}))
    end = dt.datetime.fromisoformat(inv.created_at).replace(tzinfo=dt.UTC).timestamp() + 36
    standin.kueue.quota_pods = 0  # taken back: nothing re-admits it until there is quota
    standin.kueue.evict("default", "dk-end")
    until(lambda: not live(standin, "dk-end"))
    # re-admitted 15 s or more after the start, so that a deadline counted again from the
    # resume (the bug) ends the pods 15 s or more after the cluster's end
    time.sleep(max(0.0, end - 36 + 15 - time.time()))
    resumed_at = time.time()
    standin.kueue.set_quota(1 << 30)  # re-admitted: new pods, a new deadline for the Job
    resumed = until(lambda: len(live(standin, "dk-end")) == 2 and live(standin, "dk-end"))
    assert all(p["metadata"]["uid"] not in {n.resource_id for n in inv.nodes} for p in resumed)
    until(lambda: not live(standin, "dk-end"), timeout=120)
    ended = time.time()  # seen ended (on a loaded machine some seconds after they did)
    assert end - 1 <= ended < resumed_at + 36, ("a pod outlived --max-hours", end, ended)
    for pod in resumed:  # they ended themselves, Succeeded: their indexes are complete
        assert phases(standin, pod["metadata"]["uid"])[-1] == "Succeeded"
    down("dk-end", store, standin)


def test_a_quiet_session_outlives_the_streams_idle_timeout(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that prints nothing for longer than the idle timeout keeps its session: SSH
    keepalives are client data, what the kubelet's idle deadline counts."""
    from provision.cluster.providers.k8s import transport

    inv = up(make_spec(name="dk-idle"))
    monkeypatch.setattr(transport, "KEEPALIVE_S", 1)
    conn = connected(inv, 0, store)
    conn.close()
    # a keepalive every 1 s against 5 s idle: 4 s for a busy machine to send one late
    monkeypatch.setattr(standin.api, "stream_idle_timeout_s", 5)
    conn = transport.connector(inv)(inv, inv.nodes[0])
    try:
        res = conn.run("sleep 12; echo quiet-done", timeout=60)
    finally:
        conn.close()
    assert res.exit_code == 0 and "quiet-done" in res.stdout, res
    down("dk-idle", store, standin)


def test_a_pod_made_again_under_its_name_runs_though_the_earlier_ones_container_lingers(
        standin: Standin, node_image: str) -> None:
    """A lost controller pod is made again under its own name (k8s/controller.py) right
    after its deletion with grace 0. A real kubelet keys containers by the pod's UID, so the
    earlier pod's container (killed with its node, removed later by housekeeping) neither
    blocks the new one nor takes it down with it when its removal finally comes. Seen in a
    loaded suite run: the remade controller never started (409 Conflict on its name)."""
    import subprocess

    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(standin.kubeconfig)))
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dk-again", "labels": {"mgpu-cloud-cluster": "dk-again"}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": node_image, "command": ["sleep", "600"]}]}}

    def pod() -> dict[str, Any]:
        found = standin.store.list("pods", "default", "mgpu-cloud-cluster=dk-again")
        return found[0] if found else {}

    core.create_namespaced_pod("default", body)
    until(lambda: pod().get("status", {}).get("phase") == "Running")
    earlier = pod()
    container = standin.kubelet.container_name("default", "dk-again")
    subprocess.run(["docker", "kill", container], check=True, capture_output=True)
    until(lambda: pod().get("status", {}).get("phase") == "Failed")
    core.delete_namespaced_pod("dk-again", "default", grace_period_seconds=0)
    until(lambda: not pod())
    core.create_namespaced_pod("default", body)  # at once, as the take-back does
    until(lambda: pod().get("status", {}).get("phase") == "Running")
    assert pod()["metadata"]["uid"] != earlier["metadata"]["uid"]
    standin.kubelet.stop_pod(earlier, 1)  # the earlier pod's housekeeping, late
    time.sleep(1)
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert state == "true" and pod()["status"]["phase"] == "Running"
    core.delete_namespaced_pod("dk-again", "default", grace_period_seconds=0)
    until(lambda: not pod() and subprocess.run(["docker", "inspect", container],
                                               capture_output=True).returncode != 0)


def test_a_pod_deleted_while_its_container_is_made_starts_nothing(
        standin: Standin, node_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod is deleted (and made again under its name) between its container's create and
    start: the remade pod's kubelet removes the earlier container first, so the start meets
    409 "marked for removal" (seen in a suite run: the start thread died). A kubelet starts
    nothing for a pod that is terminating; the container is gone, no error. Nor when the pod
    was deleted before its container was made and the start succeeds. For a pod still
    there, the start's error is an error."""
    import docker
    from standin_kubelet import STANDIN_LABEL

    api, kubelet = docker.from_env().api, standin.kubelet
    pod = {"metadata": {"name": "dk-made", "namespace": "default", "uid": "uid-dk-made"},
           "spec": {"containers": [{"name": "main", "image": node_image}]}}  # not in the API

    def made_then_removed() -> str:
        cid = str(api.create_container(node_image, command=["sleep", "600"],
                                       labels={STANDIN_LABEL: standin.sid})["Id"])
        api.remove_container(cid, force=True)
        return cid

    assert kubelet._start_container(made_then_removed(), pod) is False
    # deleted before its container was made: the deletion's stop_pod found nothing to stop,
    # and the start itself succeeds; the container must not stay (run 92: one left running)
    made = str(api.create_container(node_image, command=["sleep", "600"],
                                    labels={STANDIN_LABEL: standin.sid})["Id"])
    assert kubelet._start_container(made, pod) is False
    assert api.containers(all=True, filters={"id": made}) == []
    monkeypatch.setattr(kubelet, "_exists", lambda p: True)  # the pod is still there
    with pytest.raises(docker.errors.APIError):
        kubelet._start_container(made_then_removed(), pod)


def test_module_leaves_no_container(standin: Standin) -> None:
    """Run last in this module: every cluster above was taken down, and their pods'
    containers with it."""
    import docker
    from standin_kubelet import STANDIN_LABEL

    left = docker.from_env().containers.list(all=True, ignore_removed=True, filters={
        "label": f"{STANDIN_LABEL}={standin.sid}"})  # one removed meanwhile is not left
    assert left == [], [c.name for c in left]

