"""A lost pod replaced alone (both modes), what `down` refuses, and the API's errors as the
user sees them; against the stand-in with the kubelet that runs nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from standin import OnLog, Standin
from standin_store import ApiError

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Recoverable
from provision.model.errors import ProviderUnavailableError, ProvisionError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec


def fail_pod(s: Standin, name: str) -> None:
    """The pod's container died (what the docker kubelet reports for `docker kill`)."""
    s.kubelet.ended(s.store.get("pods", "default", name), 137, "Error")


def provider() -> Recoverable[Any]:
    prov = get_provider("k8s")
    assert isinstance(prov, Recoverable)
    return prov


@pytest.mark.parametrize("mode", ["jobset", "pods"])
def test_a_failed_pod_is_replaced_alone(standin: Standin, mode: str,
                                        make_spec: Callable[..., ClusterSpec],
                                        up: Callable[[ClusterSpec], Inventory],
                                        store: InventoryStore) -> None:
    inv = up(make_spec(k8s={"api": mode}))
    prov = provider()
    lost, kept = inv.nodes[1], inv.nodes[0]
    assert prov.node_alive(inv, lost)
    fail_pod(standin, lost.address)
    assert not prov.node_alive(inv, lost) and prov.node_alive(inv, kept)
    new = prov.replace(inv, store, lost)
    assert new.rank == 1 and new.name == "node-1" and new.resource_id != lost.resource_id
    assert new.host_key == lost.host_key  # the pod at index 1 reads host-key-1 again
    assert prov.node_alive(inv, new)
    assert inv.nodes[0] == kept  # node-0's pod untouched
    pods = standin.store.list("pods", "default", "mgpu-cloud-cluster=c1")
    assert sorted(p["metadata"]["uid"] for p in pods) == sorted(
        [kept.resource_id, new.resource_id])
    if mode == "pods":
        assert new.address == lost.address == "c1-node-0-1"
        assert [r.kind for r in inv.resources].count("k8s-pod") == 2
    pipeline.down("c1", store=store, log=lambda m: None)
    assert standin.labelled("c1") == []


def test_a_pod_that_cannot_start_fails_up_at_once_and_rolls_back(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """A reason the kubelet never retries ends `up` at once (a failed pull is waited out:
    test_k8s_cluster_rules.py)."""
    monkeypatch.setattr(standin.kubelet, "_run", lambda pod: standin.kubelet.waiting(
        pod, "CreateContainerConfigError", 'secret "c1-login" not found'))
    with pytest.raises(ProvisionError, match='CreateContainerConfigError: secret "c1-login"'):
        up(make_spec(k8s={"ready_timeout_s": 60}))
    assert standin.labelled("c1") == []


def test_down_refuses_a_recorded_object_that_lost_the_label(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    standin.store.update("secrets", "default", "c1-login",
                         lambda o: o["metadata"].update(labels={"team": "other"}))
    with caplog.at_level("INFO", logger="mgpu_cloud"):
        pipeline.down("c1", store=store, log=lambda m: None)
    assert "k8s-secret c1-login is not labelled mgpu-cloud-cluster=c1: left as it is" in \
        caplog.text
    assert standin.store.get("secrets", "default", "c1-login")  # still there
    assert standin.labelled("c1") == []


def test_forbidden_is_said_with_the_role_to_ask_for(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.api.faults.append(("POST", "/jobsets", ApiError(
        403, "Forbidden", 'jobsets.jobset.x-k8s.io is forbidden: User "alice" cannot create '
        'resource "jobsets" in API group "jobset.x-k8s.io" in the namespace "default"')))
    with pytest.raises(ProviderUnavailableError) as exc:
        up(make_spec())
    assert 'cannot create resource "jobsets"' in exc.value.message
    assert "docs/kubernetes.md" in (exc.value.hint or "")
    assert standin.labelled("c1") == []  # the Secret made before it: rolled back


def test_up_says_why_a_pod_waits_to_be_scheduled(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's PodScheduled=False message is said once per pod; each pod runs once
    `up` has said it."""
    kubelet = standin.kubelet
    run = type(kubelet)._run
    held: dict[str, dict[str, Any]] = {}

    def unschedulable(pod: dict[str, Any]) -> None:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}
        held[pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]] = pod
        kubelet._set(pod, lambda o: o.update(status={"phase": "Pending", "conditions": [cond]}))

    def release(message: str) -> None:
        run(kubelet, held[message.split("node-")[1][0]])

    monkeypatch.setattr(kubelet, "_run", unschedulable)
    with OnLog("waits to be scheduled", release) as said:
        inv = up(make_spec())
    assert len(inv.nodes) == 2
    assert sorted(said.seen) == [
        f"k8s: node-{r} waits to be scheduled (Unschedulable: 0/3 nodes are available: 3 "
        "Insufficient nvidia.com/gpu.)" for r in (0, 1)], said.seen
