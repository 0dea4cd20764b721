"""An in-memory provider that keeps warm spares (issue 44), with scripted behaviour, and the
cluster and spare pool the spares' unit tests build on it (tests/test_spares.py,
tests/test_spares_plan.py, tests/managed/test_spares_handoff.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from provision.cluster.providers import spares
from provision.cluster.providers.contract import KeepsSpares, Provider, Recoverable
from provision.job.sparepool import SparePool
from provision.model.errors import BootstrapError, MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec, build_cluster_spec


def node_record(rank: int, rid: str, name: str | None = None) -> NodeRecord:
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
            inv.nodes.append(node_record(rank, f"vm-{rank}"))

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
        return node_record(spare.rank, f"vm-spare-{self.made}", name=spare.name)


class MemoryCloud(Memory, Recoverable[Plan]):
    """... that can also replace a node (a cloud)."""

    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        return True

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        self.calls.append(("replace", node.name))
        new = node_record(node.rank, f"vm-new-{node.rank}")
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        return new


class FixedAllocation(Memory):
    """Like a Slurm allocation: spares come with it, none is made again, no replacement."""

    refills = False


def make_cluster(tmp_path: Path, provider: Provider[Any], nodes: int = 2,
             k: int = 1) -> tuple[Inventory, InventoryStore]:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": nodes,
                                   "spares": k})
    store = InventoryStore(tmp_path)
    inv = Inventory(name="sp", provider="docker", spec=spec)
    store.create(inv)
    provider.create(spec, provider.plan(spec), inv, store)
    return inv, store


def make_pool(provider: Provider[Any], inv: Inventory, store: InventoryStore,
          prepared: list[str], unfit: str | None = None) -> tuple[SparePool, list[str]]:
    said: list[str] = []

    def prepare(inv_: Inventory, store_: InventoryStore, made: list[NodeRecord]) -> None:
        prepared.extend(n.name for n in made)
        if unfit in {n.name for n in made}:
            raise BootstrapError(f"spare(s) not fit to take a rank: {unfit}: torch 2.1")

    return SparePool(provider, inv, store, said.append, prepare=prepare), said
