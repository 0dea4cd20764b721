"""Issue 42: what --min-nodes promises, each held by a test that fails when it is broken.

- a lost node whose replacement cannot be had is dropped only while at least --min-nodes
  remain: `--min-nodes 2` on 2 nodes fails the run, it never shrinks it;
- --min-nodes above the cluster's node count, or with DeepSpeed's pdsh runner (its hostfile
  names every node), is refused before anything is made (here: at the dry run's plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit import cli

from provision.cluster.providers.contract import Recoverable
from provision.job import elastic
from provision.job.elastic import Grower
from provision.job.recovery import Recovery
from provision.model.errors import CapacityError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec, JobSpec, build_job_spec

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py")


class NoCapacity(Recoverable[Plan]):
    """A provider whose every replacement fails as a capacity error does (scripted)."""

    name = "no-capacity"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def plan_class(self) -> type[Plan]:
        return Plan

    def _plan(self, spec: ClusterSpec) -> Plan:
        raise NotImplementedError

    def _create(self, spec: ClusterSpec, plan: Plan, inv: Inventory,
                store: InventoryStore) -> None:
        raise NotImplementedError

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        raise NotImplementedError

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        raise NotImplementedError

    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        return False

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        self.asked.append(node.name)
        raise CapacityError(f"{node.name}: InsufficientInstanceCapacity in every zone")


def _recovery(nodes: int, min_nodes: int, tmp_path: Path) -> tuple[Recovery, list[str]]:
    store = InventoryStore(tmp_path / "home")
    inv = Inventory(name="c1", provider="docker", nodes=[
        NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=32000 + r,
                   private_address=f"node-{r}") for r in range(nodes)])
    store.create(inv)
    job = build_job_spec({}, {"script": EXAMPLE, "min_nodes": min_nodes, "max_restarts": 2})
    said: list[str] = []
    provider = NoCapacity()
    grower = Grower(provider, inv, store, job, said.append)
    keeper: Any = None  # a replacement asks nothing of it
    return Recovery(provider, inv, store, job, said.append, keeper, grower=grower), said


def test_min_nodes_2_on_2_nodes_fails_when_the_replacement_fails(tmp_path: Path) -> None:
    recovery, said = _recovery(2, 2, tmp_path)
    lost = recovery.inv.nodes[1]
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        recovery._replace([lost], "node lost")
    assert [n.name for n in recovery.inv.nodes] == ["node-0", "node-1"]  # not shrunk
    assert recovery.grower is not None and recovery.grower.missing == []
    assert not any("going on with" in line for line in said), said


def test_min_nodes_1_on_2_nodes_goes_on_without_it(tmp_path: Path) -> None:
    """The control: one node may go, so the run shrinks instead of failing."""
    recovery, said = _recovery(2, 1, tmp_path)
    try:
        assert recovery._replace([recovery.inv.nodes[1]], "node lost") == []
        assert [n.name for n in recovery.inv.nodes] == ["node-0"]
        assert recovery.grower is not None
        assert [m.node.name for m in recovery.grower.missing] == ["node-1"]
        assert any("going on with 1 node(s) (--min-nodes 1)" in line for line in said), said
    finally:
        if recovery.grower is not None:
            recovery.grower.stop()


def _job(**fields: Any) -> JobSpec:
    return build_job_spec({}, {"script": EXAMPLE, **fields})


@pytest.mark.parametrize(("fields", "nodes", "refused"), [
    ({"min_nodes": 3}, 2, "--min-nodes 3 is more than the cluster's 2 node"),
    ({"min_nodes": 2}, 2, None),
    ({"min_nodes": 1, "launcher": "deepspeed"}, 2, "DeepSpeed's pdsh runner"),
    ({"min_nodes": 1, "launcher": "deepspeed", "deepspeed_launcher": "no_ssh"}, 2, None),
    ({"min_nodes": 1, "launcher": "accelerate"}, 2, None),
    ({"launcher": "deepspeed"}, 2, None),
])
def test_the_min_nodes_rules(fields: dict[str, Any], nodes: int, refused: str | None) -> None:
    if refused is None:
        elastic.check(_job(**fields), nodes)
        return
    with pytest.raises(UserInputError, match=refused):
        elastic.check(_job(**fields), nodes)


@pytest.mark.parametrize(("words", "refused"), [
    (["--nodes", "2", "--min-nodes", "3"], "--min-nodes 3 is more than the cluster's 2 node"),
    (["--nodes", "2", "--min-nodes", "1", "--launcher", "deepspeed"], "DeepSpeed's pdsh"),
])
def test_run_refuses_them_before_anything_is_made(words: list[str], refused: str,
                                                  mgpu_home: Path) -> None:
    res = cli("run", "--provider", "docker", "--dry-run", *words, EXAMPLE, home=mgpu_home)
    assert res.returncode != 0, res.stdout + res.stderr
    assert refused in res.stderr, res.stderr
    assert not (mgpu_home / "clusters").exists() or not any((mgpu_home / "clusters").iterdir())
