"""Warm spares (issue 44) without any engine: the pool that answers "a node for this rank"
(job/sparepool.py) and the contract's create of N + K nodes (contract.KeepsSpares), on the
in-memory providers of tests/sparekit.py; a Slurm spare's promotion. What a plan says of
spares: tests/test_spares_plan.py; the managed hand-off: tests/managed/test_spares_handoff.py.
The same on real docker nodes: tests/integration/test_spares.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sparekit import FixedAllocation, MemoryCloud, make_cluster, make_pool

from provision.cluster.providers import spares
from provision.cluster.providers.contract import KeepsSpares, Recoverable
from provision.model.errors import CapacityError, MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.plan import Plan
from provision.model.spec import build_cluster_spec


def test_create_makes_n_plus_k_and_keeps_the_last_k_out_of_the_ranks(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path, cloud, nodes=3, k=2)
    assert cloud.asked_nodes == [5, 5]  # one plan and one create, for all of them
    assert [n.name for n in inv.nodes] == ["node-0", "node-1", "node-2"]
    assert [(n.name, n.rank) for n in inv.spares] == [("node-3", 3), ("node-4", 4)]
    assert inv.spares_made == 2
    assert {r.id for r in inv.resources} == {f"vm-{r}" for r in range(5)}  # `down` finds all
    again = store.load("sp")
    assert [n.name for n in again.spares] == ["node-3", "node-4"]


def test_a_lost_nodes_rank_moves_to_a_ready_spare_at_once_and_a_new_one_is_ordered(
        tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path, cloud)
    spare = inv.spares[0]
    cloud.gate = threading.Event()  # the new spare takes its time
    prepared: list[str] = []
    pool, said = make_pool(cloud, inv, store, prepared)
    lost = inv.nodes[1]
    got = pool.node_for(lost, "node lost")
    assert got.done()  # no provisioning on the critical path
    new = got.result()
    assert (new.name, new.rank, new.resource_id, new.address) == (
        "node-1", 1, spare.resource_id, spare.address)
    assert inv.nodes[1] == new and inv.spares == [] and store.load("sp").nodes[1] == new
    assert ("replace", "node-1") not in cloud.calls
    assert pool.held() == 1  # the one being made is paid for already
    cloud.gate.set()
    pool.wait()
    assert ("retire", f"node-1/{lost.resource_id}") in cloud.calls
    assert cloud.calls.index(("retire", f"node-1/{lost.resource_id}")) < cloud.calls.index(
        ("make_spare", "node-3"))  # the lost one's quota and place are freed first
    assert [(n.name, n.rank, n.resource_id) for n in inv.spares] == [("node-3", 3, "vm-spare-1")]
    assert prepared == ["node-3"] and inv.spares_made == 2 and pool.held() == 1
    assert inv.replacements[-1].reason == "spare"  # adopted like a replacement
    assert [n.name for n in store.load("sp").spares] == ["node-3"]
    assert any("warm spare node-2" in s for s in said), said


def test_with_no_spare_left_the_rank_gets_todays_replacement(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path, cloud, k=1)
    cloud.fail_spare = CapacityError("no capacity in z1")
    pool, said = make_pool(cloud, inv, store, [])
    first = pool.node_for(inv.nodes[0], "node lost").result()
    pool.wait()
    assert first.resource_id == "vm-2" and inv.spares == [] and pool.held() == 0
    assert any("no new spare (no capacity in z1)" in s for s in said), said
    second = pool.node_for(inv.nodes[1], "preemption").result(timeout=5)
    assert second.resource_id == "vm-new-1" and ("replace", "node-1") in cloud.calls


def test_a_spare_that_is_not_fit_is_deleted_and_not_kept(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path, cloud)
    prepared: list[str] = []
    pool, said = make_pool(cloud, inv, store, prepared, unfit="node-3")
    pool.node_for(inv.nodes[1], "slow node").result()
    pool.wait()
    assert prepared == ["node-3"] and inv.spares == [] and pool.held() == 0
    assert ("retire", "node-3/vm-spare-1") in cloud.calls
    assert any("torch 2.1" in s for s in said), said


def test_a_fixed_allocation_uses_its_spares_then_says_none_is_left(tmp_path: Path) -> None:
    alloc = FixedAllocation()
    inv, store = make_cluster(tmp_path, alloc, k=1)
    pool, _ = make_pool(alloc, inv, store, [])
    assert pool.node_for(inv.nodes[1], "node lost").result().resource_id == "vm-2"
    pool.wait()
    assert not any(c[0] == "make_spare" for c in alloc.calls)  # refills False
    assert ("retire", "node-1/vm-1") in alloc.calls and inv.spares == [] and pool.held() == 0
    with pytest.raises(MgpuError, match=r"cannot replace nodes \(node-0\) and no spare is "
                                        "left") as err:
        pool.node_for(inv.nodes[0], "node lost")
    assert "--on-node-loss restart" in (err.value.hint or "")


def test_after_stop_no_new_spare_is_ordered(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = make_cluster(tmp_path, cloud)
    pool, _ = make_pool(cloud, inv, store, [])
    pool.stop()
    pool.node_for(inv.nodes[0], "node lost").result()
    pool.wait()
    assert not any(c[0] == "make_spare" for c in cloud.calls) and inv.spares_made == 1


def test_a_slurm_spare_takes_the_rank_under_its_own_host_name_and_every_hostfile_says_so(
        tmp_path: Path) -> None:
    """A Slurm node is named by its host (srun --nodelist, the hostfile): the spare keeps
    its name, takes the rank, and the nodes that stay learn the new hostfile."""
    import io
    import tarfile

    from fake_nodes import FakeConnector

    from provision.cluster.providers.slurm.provider import SlurmProvider
    from provision.nodes import NodeGroup
    from provision.nodes.bootstrap import refresh_peers

    def host(name: str, rank: int) -> NodeRecord:
        return NodeRecord(name=name, rank=rank, address=name, private_address=name, slots=4,
                          resource_id="4242")

    store = InventoryStore(tmp_path)
    inv = Inventory(name="sp", provider="slurm", nodes=[host("c1", 0), host("c2", 1)],
                    spares=[host("c3", 2)], inter_node_ssh=False, manage_etc_hosts=False)
    store.create(inv)
    slurm = SlurmProvider()
    assert isinstance(slurm, KeepsSpares) and not isinstance(slurm, Recoverable)
    assert slurm.refills is False and slurm._replacement_estimate(inv.spec) is None  # type: ignore[arg-type]
    new = slurm.promote(inv, store, inv.spares[0], inv.nodes[1])
    assert (new.name, new.rank) == ("c3", 1) and [n.name for n in inv.nodes] == ["c1", "c3"]
    fake = FakeConnector()
    with NodeGroup(inv, [inv.nodes[0]], connector=fake) as group:
        refresh_peers(inv, store, group)
    (archive,) = fake.stdin("c1")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("hostfile"))
        text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    assert [line for line in text.splitlines() if line] == ["c1 slots=4", "c3 slots=4"]
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 2, "spares": 1})
    plan = Plan(provider="slurm", cluster="sp", nodes=3, slots_per_node=4)
    spares.describe(plan, spec, None, refills=False)
    assert "a used one is not made again (the lost node stays until the end)" in \
        plan.spares_text[0]


def test_a_spare_that_died_idle_is_dropped_and_the_next_one_takes_the_rank(
        tmp_path: Path) -> None:
    class Dying(MemoryCloud):
        def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
            return node.name != "node-2"

    cloud = Dying()
    inv, store = make_cluster(tmp_path, cloud, k=2)
    pool, said = make_pool(cloud, inv, store, [])
    pool.stop()  # no refill: only the choice is looked at
    new = pool.node_for(inv.nodes[1], "node lost").result()
    pool.wait()
    assert new.resource_id == "vm-3" and inv.spares == []  # node-3's machine took rank 1
    assert ("retire", "node-2/vm-2") in cloud.calls
    assert any("the warm spare node-2 is gone" in s for s in said), said
