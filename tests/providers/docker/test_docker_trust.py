"""The docker provider's trust boundaries (issue 34), against the scripted engine
(fake_engine.py): down, replace, gc and the controller remove only what the engine labels as
the cluster's; the controller authorizes its own key only; a file store mounts only the
cluster's data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import FakeEngine, bring_up, cluster_spec, network_names

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.docker.plan import SHARED_NETWORK
from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore, ResourceRecord
from provision.model.spec import build_cluster_spec


def _foreign(engine: FakeEngine) -> tuple[str, str]:
    """Another cluster's container and an unlabelled one, on the same engine."""
    other = engine.create_container("x", name="other-node-0",
                                    labels={CLUSTER_TAG: "other", "mgpu-cloud-node": "0"})["Id"]
    bare = engine.create_container("x", name="someones-db")["Id"]
    return other, bare


def _adopt(store: InventoryStore, inv: Inventory, *ids: str) -> None:
    """What an inventory adopted from a hostile store looks like: it names other containers."""
    for cid in ids:
        store.record(inv, ResourceRecord(kind="container", id=cid, name="x"))


def test_down_removes_only_containers_the_engine_labels_as_the_clusters(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    mine = {n.resource_id for n in inv.nodes}
    other, bare = _foreign(engine)
    _adopt(store, inv, other, "someones-db")  # by id, and by name
    with pytest.raises(TeardownError) as err:
        pipeline.down("unit", store=store, log=lambda m: None)
    text = str(err.value)
    assert f"container other-node-0 ({other[:12]}) is labelled {CLUSTER_TAG}=other, not unit's: " \
           "left as it is" in text, text
    assert f"container someones-db ({bare[:12]}) has no {CLUSTER_TAG} label, not unit's" in text
    assert "dropped from it" in str(err.value.hint)
    assert set(engine.containers) == {other, bare}  # both survive; the cluster's are gone
    assert mine <= set(engine.removed)
    # the inventory is kept without them: the next `down` finishes
    assert store.load("unit").resources == []
    pipeline.down("unit", store=store, log=lambda m: None)
    assert not store.exists("unit") and set(engine.containers) == {other, bare}


def test_a_network_the_inventory_names_is_removed_only_when_labelled_the_clusters(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(1), store)
    shared = engine.create_network(SHARED_NETWORK, "bridge", {"mgpu-cloud-network": "shared"})
    other = engine.create_network("other-net", "bridge", {CLUSTER_TAG: "other"})
    for net in (shared, other):
        store.record(inv, ResourceRecord(kind="network", id=net["Id"], name="x"))
    with pytest.raises(TeardownError) as err:
        get_provider("docker").destroy(inv, store)
    assert f"network mgpu-cloud ({shared['Id'][:12]}) has no " in str(err.value)
    assert f"network other-net ({other['Id'][:12]}) is labelled {CLUSTER_TAG}=other" \
        in str(err.value)
    assert network_names(engine) == [SHARED_NETWORK, "other-net"] and engine.containers == {}


def test_replace_refuses_a_record_naming_another_clusters_container(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    other, _ = _foreign(engine)
    before = set(engine.containers)
    victim = inv.nodes[1].model_copy(update={"resource_id": other})
    with pytest.raises(ProvisionError, match="node-1 of cluster 'unit' is not replaced: its "
                                             "record names a container that is not the "
                                             "cluster's \\(container other-node-0"):
        get_provider("docker").replace(inv, store, victim)
    assert set(engine.containers) == before  # nothing removed, nothing made


def test_gc_delete_checks_each_orphans_label_again(engine: FakeEngine, mgpu_home: Path) -> None:
    """A list handed to delete_orphans removes only what the engine labels as the cluster
    each record names."""
    lost = engine.create_container("x", name="lost-node-0", labels={CLUSTER_TAG: "lost"})["Id"]
    other, bare = _foreign(engine)
    found = [ResourceRecord(kind="container", id=cid, name="n", extra={"cluster": "lost"})
             for cid in (lost, other, bare)]
    with pytest.raises(TeardownError) as err:
        get_provider("docker").delete_orphans(cluster_spec(), found)
    assert "other-node-0" in str(err.value) and "someones-db" in str(err.value)
    assert set(engine.containers) == {other, bare} and engine.removed == [lost]


def test_the_controller_authorizes_its_own_key_only_and_tears_down_only_the_clusters(
        engine: FakeEngine, mgpu_home: Path) -> None:
    from provision.cluster.providers.docker.controller import (
        create_controller,
        remove_self,
        teardown_from_inside,
    )

    store = InventoryStore()
    inv = bring_up(cluster_spec(2), store)
    inv.controller = create_controller(inv, store)
    ctl = engine.containers[inv.controller.resource_id or ""]
    keys = mgpu_home / "keys" / "unit"
    assert ctl["files"]["/root/.ssh/authorized_keys"] == (
        0o600, 0, (keys / "controller_ed25519.pub").read_text())
    cluster_key = (keys / "id_ed25519.pub").read_text().split()[1]
    assert cluster_key not in ctl["files"]["/root/.ssh/authorized_keys"][2]
    assert not ctl.get("environment")
    # from inside: the nodes go, the controller stays, another's container is refused
    other, bare = _foreign(engine)
    _adopt(store, inv, other, bare)
    with pytest.raises(TeardownError, match="other-node-0 .* not unit's: left as it is"):
        teardown_from_inside(inv, store)
    assert set(engine.containers) == {inv.controller.resource_id, other, bare}
    assert network_names(engine) == [] and ctl["nets"] == set()  # its network: left, then removed
    # a controller record naming another container does not remove it
    with pytest.raises(ProvisionError, match="other-node-0 .* not unit's: left as it is"):
        remove_self(inv.model_copy(update={"controller": inv.controller.model_copy(
            update={"resource_id": other})}))
    assert other in engine.containers
    remove_self(inv)
    assert set(engine.containers) == {other, bare}


def test_a_file_store_mounts_only_the_clusters_data_folder_into_nodes(
        engine: FakeEngine, mgpu_home: Path, tmp_path: Path) -> None:
    from provision.cluster.providers.docker.controller import create_controller

    shared = tmp_path / "shared"
    store = InventoryStore()
    spec = build_cluster_spec({}, {"name": "unit", "nodes": 2, "store": f"file://{shared}/"})
    inv = bring_up(spec, store)
    data = f"{shared}/unit/data"
    for node in inv.nodes:
        binds = engine.containers[node.resource_id or ""]["host_config"]["binds"]
        assert binds == {data: {"bind": data, "mode": "rw"}}
    assert Path(data).is_dir()  # made here, not by the engine (as root, 0755)
    ctl = create_controller(inv, store)
    binds = engine.containers[ctl.resource_id or ""]["host_config"]["binds"]
    assert binds[str(shared)] == {"bind": str(shared), "mode": "rw"} and data not in binds
