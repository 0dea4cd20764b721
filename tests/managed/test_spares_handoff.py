"""Warm spares (issue 44) across a managed run's hand-off: the controller's view of them,
what it publishes, and what the user's machine adopts."""

from __future__ import annotations

from pathlib import Path

from sparekit import MemoryCloud, make_cluster, make_pool

from provision.model.inventory import Inventory, InventoryStore


def test_spares_survive_the_hand_off_seen_from_inside_and_published_as_seen_from_outside(
        tmp_path: Path) -> None:
    """The controller reaches the spares at their private addresses (localize), a spare it
    promotes or makes is published in cluster.json as the user's machine reaches it, and the
    user's machine adopts the spares with the rest (more replacements)."""
    from provision.job.managed.signing import cluster_kind, open_sealed
    from provision.job.managed.supervisor import InsideProvider, localize, publish_inventory
    from remote.store import open_store

    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path / "user", cloud)
    mine = inv.model_copy(deep=True)
    outside = {n.rank: n.model_copy() for n in [*inv.nodes, *inv.spares]}
    ctl = InventoryStore(tmp_path / "controller")
    ctl.save(inv)
    localize(inv, ctl)
    assert [(s.address, s.port) for s in inv.spares] == [("10.1.0.12", 22)]  # inside view
    inside = InsideProvider(cloud, outside)
    assert inside.refills
    pool, _ = make_pool(inside, inv, ctl, [])
    pool.node_for(inv.nodes[1], "node lost").result()
    pool.wait()
    assert inv.nodes[1].address == "10.1.0.12" and outside[1].address == "10.0.0.12"
    assert outside[1].name == "node-1" and 2 not in outside  # the spare's record moved
    [made] = inv.spares
    assert made.address == "10.1.0.13" and outside[3].address == "10.0.0.13"
    key = b"k" * 32
    bucket = open_store(f"file://{tmp_path / 'store'}")
    publish_inventory(bucket, inv, outside, key)
    sealed = (tmp_path / "store" / "sp" / "cluster.json").read_bytes()
    theirs = Inventory.model_validate_json(open_sealed(key, cluster_kind("sp"), sealed))
    assert [(n.name, n.address) for n in theirs.nodes] == [("node-0", "10.0.0.10"),
                                                          ("node-1", "10.0.0.12")]
    assert [(n.name, n.address) for n in theirs.spares] == [("node-3", "10.0.0.13")]
    assert mine.adopt(theirs)  # a promotion and a refill are replacements: taken
    assert [s.name for s in mine.spares] == ["node-3"] and mine.spares_made == 2


def test_a_stores_copy_whose_spare_logs_in_otherwise_is_not_adopted(tmp_path: Path) -> None:
    from provision.job.managed.client import _same_logins

    inv, _ = make_cluster(tmp_path, MemoryCloud())
    theirs = inv.model_copy(deep=True)
    said: list[str] = []
    assert _same_logins(inv, theirs, said.append)
    theirs.spares[0].proxy_jump = "evil@203.0.113.9:22"
    assert not _same_logins(inv, theirs, said.append)
    assert "node-2" in said[-1]
