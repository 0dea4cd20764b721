"""Warm spares (issue 44) without any engine: the pool that answers "a node for this rank"
(job/sparepool.py), the contract's plan and create of N + K nodes (contract.KeepsSpares,
cluster/providers/spares.py), and what a plan says the spares cost and save. The same on
real docker nodes: tests/integration/test_spares.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from provision.cluster.providers import spares
from provision.cluster.providers.contract import KeepsSpares, Provider, Recoverable
from provision.job.sparepool import SparePool
from provision.model.errors import BootstrapError, CapacityError, MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec, build_cluster_spec


def _node(rank: int, rid: str, name: str | None = None) -> NodeRecord:
    return NodeRecord(name=name or f"node-{rank}", rank=rank, address=f"10.0.0.{rank + 10}",
                      private_address=f"10.1.0.{rank + 10}", resource_id=rid, zone="z1")


class Memory(KeepsSpares[Plan]):
    """An in-memory provider with scripted behaviour: every call recorded in `calls`;
    `gate` (when set) holds make_spare until released; `fail_spare` makes it raise."""

    name = "docker"  # a registered name: the spec must validate

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.gate: threading.Event | None = None
        self.fail_spare: MgpuError | None = None
        self.made = 0
        self.asked_nodes: list[int] = []

    def plan_class(self) -> type[Plan]:
        return Plan

    def _plan(self, spec: ClusterSpec) -> Plan:
        self.asked_nodes.append(spec.nodes)
        return Plan(provider="docker", cluster=spec.name, nodes=spec.nodes, slots_per_node=1,
                    resources=[PlannedResource(kind="vm", name=f"{spec.name}-node-{r}")
                               for r in range(spec.nodes)],
                    hourly_cost_usd=10.0 * spec.nodes, node_hourly_usd=10.0)

    def _create(self, spec: ClusterSpec, plan: Plan, inv: Inventory,
                store: InventoryStore) -> None:
        self.asked_nodes.append(spec.nodes)
        for rank in range(spec.nodes):
            store.record(inv, ResourceRecord(kind="vm", id=f"vm-{rank}"))
            inv.nodes.append(_node(rank, f"vm-{rank}"))

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        for r in list(inv.resources):
            store.forget(inv, r.kind, r.id)

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None

    def _replacement_estimate(self, spec: ClusterSpec) -> spares.Estimate:
        return spares.Estimate(600.0, "assumed for the test")

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        self.calls.append(("retire", node.name + "/" + (node.resource_id or "")))

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        self.calls.append(("make_spare", spare.name))
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail_spare is not None:
            raise self.fail_spare
        self.made += 1
        store.record(inv, ResourceRecord(kind="vm", id=f"vm-spare-{self.made}"))
        return _node(spare.rank, f"vm-spare-{self.made}", name=spare.name)


class MemoryCloud(Memory, Recoverable[Plan]):
    """... that can also replace a node (a cloud)."""

    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        return True

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        self.calls.append(("replace", node.name))
        new = _node(node.rank, f"vm-new-{node.rank}")
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        return new


class FixedAllocation(Memory):
    """Like a Slurm allocation: spares come with it, none is made again, no replacement."""

    refills = False


def _cluster(tmp_path: Path, provider: Provider[Any], nodes: int = 2,
             k: int = 1) -> tuple[Inventory, InventoryStore]:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": nodes,
                                   "spares": k})
    store = InventoryStore(tmp_path)
    inv = Inventory(name="sp", provider="docker", spec=spec)
    store.create(inv)
    provider.create(spec, provider.plan(spec), inv, store)
    return inv, store


def _pool(provider: Provider[Any], inv: Inventory, store: InventoryStore,
          prepared: list[str], unfit: str | None = None) -> tuple[SparePool, list[str]]:
    said: list[str] = []

    def prepare(inv_: Inventory, store_: InventoryStore, made: list[NodeRecord]) -> None:
        prepared.extend(n.name for n in made)
        if unfit in {n.name for n in made}:
            raise BootstrapError(f"spare(s) not fit to take a rank: {unfit}: torch 2.1")

    return SparePool(provider, inv, store, said.append, prepare=prepare), said


def test_create_makes_n_plus_k_and_keeps_the_last_k_out_of_the_ranks(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = _cluster(tmp_path, cloud, nodes=3, k=2)
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
    inv, store = _cluster(tmp_path, cloud)
    spare = inv.spares[0]
    cloud.gate = threading.Event()  # the new spare takes its time
    prepared: list[str] = []
    pool, said = _pool(cloud, inv, store, prepared)
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
    inv, store = _cluster(tmp_path, cloud, k=1)
    cloud.fail_spare = CapacityError("no capacity in z1")
    pool, said = _pool(cloud, inv, store, [])
    first = pool.node_for(inv.nodes[0], "node lost").result()
    pool.wait()
    assert first.resource_id == "vm-2" and inv.spares == [] and pool.held() == 0
    assert any("no new spare (no capacity in z1)" in s for s in said), said
    second = pool.node_for(inv.nodes[1], "preemption").result(timeout=5)
    assert second.resource_id == "vm-new-1" and ("replace", "node-1") in cloud.calls


def test_a_spare_that_is_not_fit_is_deleted_and_not_kept(tmp_path: Path) -> None:
    cloud = MemoryCloud()
    inv, store = _cluster(tmp_path, cloud)
    prepared: list[str] = []
    pool, said = _pool(cloud, inv, store, prepared, unfit="node-3")
    pool.node_for(inv.nodes[1], "slow node").result()
    pool.wait()
    assert prepared == ["node-3"] and inv.spares == [] and pool.held() == 0
    assert ("retire", "node-3/vm-spare-1") in cloud.calls
    assert any("torch 2.1" in s for s in said), said


def test_a_fixed_allocation_uses_its_spares_then_says_none_is_left(tmp_path: Path) -> None:
    alloc = FixedAllocation()
    inv, store = _cluster(tmp_path, alloc, k=1)
    pool, _ = _pool(alloc, inv, store, [])
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
    inv, store = _cluster(tmp_path, cloud)
    pool, _ = _pool(cloud, inv, store, [])
    pool.stop()
    pool.node_for(inv.nodes[0], "node lost").result()
    pool.wait()
    assert not any(c[0] == "make_spare" for c in cloud.calls) and inv.spares_made == 1


class Machines(Provider[Plan]):
    """Like the ssh provider: existing machines, no spares, no replacement."""

    name = "docker"
    spares_refused = "uses machines you already have: it cannot make one more"

    def plan_class(self) -> type[Plan]:
        return Plan

    def _plan(self, spec: ClusterSpec) -> Plan:
        raise AssertionError("refused before the provider is asked")

    def _create(self, spec: ClusterSpec, plan: Plan, inv: Inventory,
                store: InventoryStore) -> None:
        return None

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        return None

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None


def test_a_provider_without_spares_refuses_them_at_plan_time_saying_why() -> None:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 2, "spares": 1})
    with pytest.raises(UserInputError, match="--spares 1: the docker provider keeps no "
                                             "spares: it uses machines you already have"):
        Machines().plan(spec)


def test_the_plan_says_what_the_spares_cost_and_save_at_the_assumed_failure_rate() -> None:
    """64 nodes at $98.32/h with 2 spares, a replacement assumed to take 10 min: the plan
    counts 64 ranks + 2 spares, prices them (2 x $98.32/h, in the total), names the failure
    rate it assumes and its source, and says what a failure a spare takes saves."""
    cloud = MemoryCloud()
    cloud._plan = lambda spec: Plan(  # type: ignore[method-assign]
        provider="docker", cluster=spec.name, nodes=spec.nodes, slots_per_node=8,
        hourly_cost_usd=round(98.32 * spec.nodes, 2), node_hourly_usd=98.32)
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 64, "spares": 2})
    plan = cloud.plan(spec)
    assert (plan.nodes, plan.spares, plan.hourly_cost_usd) == (66, 2, round(98.32 * 66, 2))
    text = plan.render()
    assert "64 node(s) + 2 warm spare(s) x 8 slot(s)" in text
    assert "spares: 2 x $98.32/h = $196.64/h, in the cost above" in text
    assert "the hostfile and the world size stay 64 node(s)" in text
    rate = spares.NODE_FAILURES_PER_HOUR  # 419 / (54 days x 24 h x 2,048 nodes)
    assert rate == pytest.approx(419 / (54 * 24 * 2048))
    assert "Llama 3's 419 unexpected interruptions in 54 days" in text
    assert f"1 per {1 / rate:,.0f} node-hours" in text
    every_h = 1 / (64 * rate)
    assert f"64 node(s) lose one about every {every_h:,.0f} h" in text
    # a failure a spare takes: 10 min of 64 nodes waiting = 10.67 node-hours = $1,048.75
    assert "~10.0 min on all 64 node(s) (assumed for the test): 10.67 node-hours ($1,048.75)" \
        in text
    saved_per_h = 64 * 600 / 3600 * 98.32 / every_h
    assert f"on average ${saved_per_h:,.2f}/h saved against $196.64/h" in text
    even = (2 / (rate * 600 / 3600)) ** 0.5
    assert f"from ~{even:,.0f} nodes" in text


def test_a_free_provider_says_its_spares_cost_nothing_and_one_without_replacements_why(
        ) -> None:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 2, "spares": 1})
    plan = Plan(provider="slurm", cluster="sp", nodes=3, slots_per_node=1, node_hourly_usd=0.0)
    spares.describe(plan, spec, None)
    assert (plan.nodes, plan.spares) == (3, 1)  # the machines made; 1 of them a spare
    assert plan.spares_text[0].startswith("1 x $0.00/h (local)")
    assert "slurm cannot make a replacement node: without a spare a lost node ends the run" \
        in plan.spares_text[-1]
    unknown = Plan(provider="aws", cluster="sp", nodes=3, slots_per_node=1)
    spares.describe(unknown, spec, spares.Estimate(60.0, "x"))
    assert unknown.spares_text[0].startswith("1 node(s), price unknown")


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


@pytest.mark.parametrize(("provider", "why"), [
    ("ssh", "uses the machines you list and cannot make one more"),
    ("k8s", "needs the pod's index kept apart from the rank: not built yet")])
def test_providers_that_keep_no_spares_refuse_them_in_their_plan_saying_why(
        provider: str, why: str) -> None:
    from provision.cluster.providers import get_provider

    spec = build_cluster_spec({}, {"name": "sp", "provider": provider, "nodes": 2,
                                   "spares": 1})
    with pytest.raises(UserInputError, match=f"--spares 1: the {provider} provider keeps no "
                                             "spares") as err:
        get_provider(provider).plan(spec)  # before anything is asked of a host or a cluster
    assert why in err.value.message
