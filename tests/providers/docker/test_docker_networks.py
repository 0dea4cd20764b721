"""The docker provider's networks, against the scripted engine (fake_engine.py): each cluster
its own (issue 42), one of that name not the cluster's refused at plan, and a cluster made on
the old shared network kept there for its replacements and controller."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import FakeEngine, bring_up, cluster_spec, network_names

from provision.cluster.providers import get_provider
from provision.cluster.providers.docker.plan import SHARED_NETWORK
from provision.model.errors import UserInputError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore
from provision.model.spec import build_cluster_spec


def test_each_cluster_gets_its_own_network_and_one_left_by_a_killed_run_is_used(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    first = bring_up(cluster_spec(1), store)
    second = bring_up(build_cluster_spec({}, {"name": "two", "nodes": 1}), store)
    assert network_names(engine) == ["unit-net", "two-net"]
    for inv, net in ((first, "unit-net"), (second, "two-net")):
        [c] = [engine.containers[n.resource_id or ""] for n in inv.nodes]
        assert c["nets"] == {net}
    get_provider("docker").destroy(first, store)
    assert network_names(engine) == ["two-net"]
    get_provider("docker").destroy(second, store)
    assert engine.containers == {} and network_names(engine) == []
    # a network of the cluster's name and label (a run killed with the machine; or another
    # `up` made it between this plan's look and its create: 409) is used, and removed by down
    engine.create_network("three-net", "bridge", {CLUSTER_TAG: "three"})
    inv = bring_up(build_cluster_spec({}, {"name": "three", "nodes": 1}), store)
    assert network_names(engine) == ["three-net"] and [r.name for r in inv.resources_of("network")] \
        == ["three-net"]
    get_provider("docker").destroy(inv, store)
    assert network_names(engine) == []


@pytest.mark.parametrize("labels", [{"someone": "else"}, {CLUSTER_TAG: "other"},
                                    {"mgpu-cloud-network": "shared"}])
def test_a_network_of_that_name_not_the_clusters_is_refused_at_plan(
        engine: FakeEngine, mgpu_home: Path, labels: dict[str, str]) -> None:
    engine.create_network("unit-net", "macvlan", labels)
    with pytest.raises(UserInputError, match="network named 'unit-net' that is not cluster "
                                             "'unit''s \\(driver 'macvlan'") as err:
        get_provider("docker").plan(cluster_spec())
    assert "docker network rm unit-net" in str(err.value.hint)
    assert engine.containers == {}


def _on_the_shared_network(engine: FakeEngine, store: InventoryStore) -> Inventory:
    """A cluster made while every docker cluster shared one network (before issue 42): its
    inventory records no network, its containers are on `mgpu-cloud`."""
    inv = bring_up(cluster_spec(2), store)
    own = inv.resources_of("network")[0]
    shared = engine.create_network(SHARED_NETWORK, "bridge",
                                   {"mgpu-cloud-network": "shared"})["Id"]
    for node in inv.nodes:
        engine.connect_container_to_network(node.resource_id or "", shared)
        engine.disconnect_container_from_network(node.resource_id or "", own.id)
        engine.containers[node.resource_id or ""]["host_config"]["network_mode"] = \
            SHARED_NETWORK
    store.forget(inv, "network", own.id)
    engine.remove_network(own.id)
    return inv


def test_a_cluster_of_the_shared_network_keeps_it_for_replacements_and_its_controller(
        engine: FakeEngine, mgpu_home: Path) -> None:
    from provision.cluster.providers.docker.controller import create_controller

    store = InventoryStore()
    inv = _on_the_shared_network(engine, store)
    new = get_provider("docker").replace(inv, store, inv.nodes[1])
    assert engine.containers[new.resource_id or ""]["nets"] == {SHARED_NETWORK}
    ctl = create_controller(inv, store)
    assert engine.containers[ctl.resource_id or ""]["nets"] == {SHARED_NETWORK}
    get_provider("docker").destroy(inv, store)
    assert engine.containers == {} and network_names(engine) == [SHARED_NETWORK]  # no cluster's


def test_a_replacement_and_the_controller_join_the_clusters_own_network(
        engine: FakeEngine, mgpu_home: Path) -> None:
    from provision.cluster.providers.docker.controller import create_controller

    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    new = get_provider("docker").replace(inv, store, inv.nodes[1])
    assert engine.containers[new.resource_id or ""]["nets"] == {"unit-net"}
    assert engine.containers[new.resource_id or ""]["host_config"]["cap_drop"] == ["NET_RAW"]
    ctl = engine.containers[create_controller(inv, store).resource_id or ""]
    assert ctl["nets"] == {"unit-net"} and ctl["host_config"]["cap_drop"] == ["NET_RAW"]
