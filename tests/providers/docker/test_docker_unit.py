"""The docker provider against a scripted fake engine (fake_engine.py; the real engine is
covered by tests/integration): what it asks for, what it records, and how it fails and cleans
up. Each cluster's own network: test_docker_networks.py; what it refuses to touch:
test_docker_trust.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine, bring_up, cluster_spec, network_names

from provision.cluster.providers import get_provider
from provision.model.errors import (
    ClusterExistsError,
    ProviderUnavailableError,
    ProvisionError,
    TeardownError,
)
from provision.model.inventory import CLUSTER_TAG, InventoryStore


def test_plan_fails_before_anything_when_the_engine_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> Any:
        raise ProviderUnavailableError("the Docker engine is not reachable")

    monkeypatch.setattr("provision.cluster.providers.docker.provider.docker_client", down)
    with pytest.raises(ProviderUnavailableError):
        get_provider("docker").plan(cluster_spec())


def test_containers_of_the_name_left_on_the_engine_are_refused_before_anything_is_made(
        engine: FakeEngine, mgpu_home: Path) -> None:
    engine.create_container("mgpu-cloud/node:test", name="unit-node-0",
                            labels={CLUSTER_TAG: "unit", "mgpu-cloud-node": "0"})
    with pytest.raises(ClusterExistsError) as err:
        get_provider("docker").plan(cluster_spec())
    assert "no inventory here knows: unit-node-0" in str(err.value)
    assert "remove them: docker rm -f unit-node-0 (" in str(err.value)
    assert len(engine.containers) == 1 and engine.networks == {}
    engine.create_container("x", name="other-node-0", labels={CLUSTER_TAG: "other"})
    del engine.containers[next(iter(engine.containers))]
    assert get_provider("docker").plan(cluster_spec()).request.network == "unit-net"


def test_create_records_everything_and_pins_host_keys(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(3, cpus=1.5, memory="2g"), store)
    # the cluster's own network is made, labelled and recorded (`down` removes it)
    assert [r.kind for r in inv.resources] == ["network", "container", "container", "container"]
    assert [(n["Name"], n["Labels"]) for n in engine.networks.values()] == [
        ("unit-net", {CLUSTER_TAG: "unit"})]
    for rank, node in enumerate(inv.nodes):
        c = engine.containers[node.resource_id or ""]
        assert c["name"] == f"unit-node-{rank}" and c["hostname"] == f"node-{rank}"
        assert c["labels"] == {CLUSTER_TAG: "unit", "mgpu-cloud-node": str(rank)}
        host = c["host_config"]
        assert host["port_bindings"] == {22: ("127.0.0.1", None)}  # never on 0.0.0.0
        assert host["nano_cpus"] == 1_500_000_000 and host["mem_limit"] == "2g"
        assert host["network_mode"] == "unit-net" and c["nets"] == {"unit-net"}
        assert host["cap_drop"] == ["NET_RAW"]  # no raw sockets: no spoofing on the bridge
        # the host key and the authorized key are copied in before the start, 0600, root's;
        # nothing of them is in the container's environment (`docker inspect` shows that)
        assert "environment" not in c or not c["environment"], c.get("environment")
        mode, uid, key = c["files"]["/etc/ssh/ssh_host_ed25519_key"]
        assert (mode, uid) == (0o600, 0) and key.startswith("-----BEGIN OPENSSH PRIVATE KEY-")
        assert c["files"]["/root/.ssh/authorized_keys"] == (
            0o600, 0, (mgpu_home / "keys" / "unit" / "id_ed25519.pub").read_text())
        assert node.host_key and node.host_key.startswith("ssh-ed25519 ")
        # the others reach it by its IP there, named in /etc/hosts by bootstrap
        assert node.address == "127.0.0.1" and node.private_address.startswith("10.9.0.")
    assert len({n.private_address for n in inv.nodes}) == 3 and inv.manage_etc_hosts
    assert len({n.host_key for n in inv.nodes}) == 3  # one host key per node
    assert store.load("unit").status == "ready"
    assert inv.nccl_env["GLOO_SOCKET_IFNAME"] == "eth0" and inv.nccl_env["ACCELERATE_USE_CPU"] == "1"


def test_a_failing_container_rolls_back_everything(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    engine.fail["start"] = (500, "OCI runtime create failed", "unit-node-1")
    with pytest.raises(ProvisionError, match="starting container unit-node-1 failed: OCI runtime"):
        bring_up(cluster_spec(3), store)
    assert engine.containers == {} and network_names(engine) == []  # its network too
    assert not store.exists("unit")


def test_the_provider_says_it_waits_once_the_network_is_there(
        engine: FakeEngine, mgpu_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not as `create` begins: its imports would share the interpreter with the keys and the
    image lookup that the containers wait for (provision/nodes/pool.py provider_waits)."""
    seen: list[int] = []
    monkeypatch.setattr("provision.cluster.providers.docker.provider.provider_waits",
                        lambda: seen.append(len(engine.networks)))
    bring_up(cluster_spec(2), InventoryStore())
    assert seen == [1]


def test_a_failure_while_the_containers_start_rolls_back_every_one(
        engine: FakeEngine, mgpu_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL preset is rendered while the engine starts the containers: its failure waits
    for them to be recorded, so the rollback removes them all."""
    def broken(*args: Any, **kwargs: Any) -> str:
        raise OSError("template missing")

    monkeypatch.setattr("provision.cluster.providers.docker.provider.render", broken)
    store = InventoryStore()
    with pytest.raises(ProvisionError, match="template missing"):
        bring_up(cluster_spec(3), store)
    assert engine.containers == {} and network_names(engine) == []  # its network too
    assert not store.exists("unit")


def test_destroy_is_idempotent_and_sweeps_by_label(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    removed_by_hand = inv.nodes[0].resource_id or ""
    del engine.containers[removed_by_hand]
    stray = engine.create_container("x", name="unit-node-9", labels={CLUSTER_TAG: "unit"})["Id"]
    provider = get_provider("docker")
    provider.destroy(inv, store)
    assert engine.containers == {} and network_names(engine) == []
    assert stray not in engine.containers and inv.resources == []
    provider.destroy(inv, store)  # again: nothing to do, no error


def test_destroy_reports_what_it_could_not_remove_and_keeps_it(engine: FakeEngine,
                                                                 mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(1), store)
    cid = inv.nodes[0].resource_id or ""
    engine.fail["remove_container"] = (500, "device or resource busy", cid)
    with pytest.raises(TeardownError, match="device or resource busy"):
        get_provider("docker").destroy(inv, store)
    assert [r.id for r in store.load("unit").resources_of("container")] == [cid]
    del engine.fail["remove_container"]
    engine.fail["remove_container"] = (409, "removal already in progress", cid)
    get_provider("docker").destroy(inv, store)  # 409: someone else is removing it: fine


def test_gc_finds_only_clusters_without_an_inventory(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    bring_up(cluster_spec(1), store)
    engine.create_network("lost-net", "bridge", {CLUSTER_TAG: "lost"})
    engine.create_container("x", name="lost-node-0", labels={CLUSTER_TAG: "lost"})
    provider = get_provider("docker")
    found = provider.orphans(cluster_spec(), set(store.names()))
    assert sorted((r.kind, r.extra["cluster"]) for r in found) == [
        ("container", "lost"), ("network", "lost")]
    provider.delete_orphans(cluster_spec(), found)
    assert {c["name"] for c in engine.containers.values()} == {"unit-node-0"}
    assert network_names(engine) == ["unit-net"]  # a cluster with an inventory: not an orphan


def test_replace_of_a_container_already_gone(engine: FakeEngine, mgpu_home: Path) -> None:
    """SDK errors of replace are translated by the `errors` hook only (issue 20), so a lost
    container that docker already removed (404) is simply replaced."""
    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    lost = inv.nodes[1]
    del engine.containers[lost.resource_id or ""]
    new = get_provider("docker").replace(inv, store, lost)
    assert new.name == lost.name and new.resource_id != lost.resource_id
    assert [r.id for r in store.load("unit").resources_of("container")] == [
        inv.nodes[0].resource_id, new.resource_id]
    engine.fail["remove_container"] = (500, "device or resource busy", "")
    with pytest.raises(ProvisionError, match="replacing node-1 of cluster 'unit' failed: "
                                             "device or resource busy"):
        get_provider("docker").replace(inv, store, new)
