"""lifecycle.start: the one entry of `run` and `launch` in every supervision mode, on fake
nodes (tests/fake_nodes.py) and an in-memory provider: the temporary cluster's teardown policy,
the checks made before anything is created, and the fabric gate step in each mode.

    attached (Attached)          the gate in the job's own processes (`injob` on every node)
    detached (SelfStopping)      the separate gate (`allreduce --gate`) before `job start`
    managed (Controller)         the separate gate before the hand-off to the controller
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fake_nodes import FakeConnector
from test_gate import raw, summary

from provision.cluster import pipeline
from provision.cluster.pipeline import NewCluster
from provision.cluster.providers.contract import Supervising
from provision.job import lifecycle
from provision.job.attached import Attached
from provision.job.detached import SelfStopping
from provision.job.gate.judge import FabricGateError
from provision.job.managed import handoff
from provision.job.managed.handoff import Controller
from provision.job.managed.modes import StoreAttached, supervision
from provision.job.supervision import Started, Supervision
from provision.model.errors import LaunchError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.keys import ensure_cluster_key
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec, JobSpec, build_cluster_spec, build_job_spec
from provision.nodes import group

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
GATE = r"allreduce --gate"


class FakeCloud(Supervising[Plan]):
    """A provider whose nodes are the fake transport's: it records what it made and removed
    (and could make a controller: the hand-off itself is replaced in these tests)."""

    name = "docker"

    def __init__(self) -> None:
        self.created: list[str] = []
        self.destroyed: list[str] = []

    def plan_class(self) -> type[Plan]:
        return Plan

    def _plan(self, spec: ClusterSpec) -> Plan:
        return Plan(provider="docker", cluster=spec.name, nodes=spec.nodes, slots_per_node=1)

    def _create(self, spec: ClusterSpec, plan: Plan, inv: Inventory,
                store: InventoryStore) -> None:
        inv.key_path = str(ensure_cluster_key(store.keys_dir(inv.name))[0])
        for r in range(spec.nodes):
            store.record(inv, ResourceRecord(kind="node", id=f"{spec.name}-{r}"))
            inv.nodes.append(NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1",
                                        port=4000 + r, private_address=f"node-{r}", slots=1,
                                        host_key="ssh-ed25519 AAAA"))
        store.save(inv)
        self.created.append(spec.name)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        self.destroyed.append(inv.name)

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None

    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        raise AssertionError("the hand-off is replaced in these tests")

    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        raise AssertionError("not on this side")

    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        raise AssertionError("not on this side")


class _Packed(dict[tuple[str, str], bytes]):
    """The fake nodes' files, where every `tar -czf -` (rank 0's outputs) packs nothing."""

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        if key not in self and "tar -czf -" in key[1]:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz"):
                pass
            return buf.getvalue()
        return super().get(key, default)


@pytest.fixture
def world(mgpu_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)  # ./mgpu-outputs
    fake = FakeConnector()
    fake.files = _Packed()
    cloud = FakeCloud()
    monkeypatch.setattr(group, "default_connector", lambda inv: fake)
    monkeypatch.setattr(pipeline, "get_provider", lambda name: cloud)
    monkeypatch.setattr(lifecycle, "get_provider", lambda name: cloud)
    handed: list[str] = []

    def hand_off(provider: Any, inv: Inventory, store: InventoryStore, job: JobSpec,
                 env: dict[str, str], *, teardown: bool, log: Any) -> str:
        handed.append(f"{inv.name} teardown={teardown}")
        return "7"

    monkeypatch.setattr(handoff, "hand_off", hand_off)
    return {"fake": fake, "cloud": cloud, "handed": handed, "store": InventoryStore()}


def _spec(name: str = "c1", **more: Any) -> ClusterSpec:
    return build_cluster_spec({}, {"name": name, "nodes": 2, **more})


def _job(**more: Any) -> JobSpec:
    return build_job_spec({}, {"script": EXAMPLE, **more})


def _start(world: dict[str, Any], mode: Supervision, job: JobSpec | None = None,
           keep: bool = False, spec: ClusterSpec | None = None,
           confirm: bool = True) -> Started:
    new = NewCluster(spec or _spec(), lambda plan: confirm, keep=keep)
    return lifecycle.start(new, job or _job(), mode, store=world["store"], log=lambda m: None)


def _store_url(tmp_path: Path) -> str:
    folder = tmp_path / "objects"
    folder.mkdir(exist_ok=True)
    return f"file://{folder}"


# ------------------------------------------------------------------ the temporary cluster
def test_an_attached_run_removes_its_cluster_and_keep_keeps_it(world: dict[str, Any]) -> None:
    assert _start(world, Attached()) == Started(code=0)
    assert world["cloud"].created == ["c1"] and world["cloud"].destroyed == ["c1"]
    assert not world["store"].exists("c1")
    assert _start(world, Attached(), keep=True, spec=_spec("c2")).code == 0
    assert world["cloud"].destroyed == ["c1"] and world["store"].exists("c2")


def test_a_detached_run_hands_its_cluster_to_the_nodes(world: dict[str, Any]) -> None:
    started = _start(world, SelfStopping(idle_minutes=0))
    assert started.job_id == "1" and world["cloud"].destroyed == []
    line = world["fake"].assert_ran("node-0", r"job start")
    assert "--then" in line  # the provider's self-stop, after the job
    assert world["store"].exists("c1")


def test_a_detached_job_that_cannot_start_takes_its_cluster_with_it(
        world: dict[str, Any]) -> None:
    world["fake"].on(r"job start", node="node-1", exit_code=1, stderr="no python3")
    with pytest.raises(LaunchError, match="node-1"):
        _start(world, SelfStopping())
    assert world["cloud"].destroyed == ["c1"] and not world["store"].exists("c1")


def test_a_managed_run_hands_its_cluster_to_the_controller(world: dict[str, Any],
                                                           tmp_path: Path) -> None:
    spec = _spec(store=_store_url(tmp_path))
    started = _start(world, Controller(env={}), spec=spec)
    assert started.job_id == "7" and world["handed"] == ["c1 teardown=True"]
    assert world["cloud"].destroyed == [] and world["store"].exists("c1")


def test_a_declined_plan_makes_nothing(world: dict[str, Any]) -> None:
    for mode in (Attached(), SelfStopping()):
        assert _start(world, mode, confirm=False) == Started(declined=True)
    assert world["cloud"].created == [] and not world["store"].exists("c1")


# ------------------------------------------------------ refused before anything is made
def test_keep_with_detach_is_refused_before_anything_is_made(world: dict[str, Any],
                                                             tmp_path: Path) -> None:
    for mode, spec in ((SelfStopping(), _spec()),
                       (Controller(env={}), _spec(store=_store_url(tmp_path)))):
        with pytest.raises(UserInputError, match="--keep and --detach contradict"):
            _start(world, mode, keep=True, spec=spec)
    assert world["cloud"].created == []


def test_supervision_flags_without_a_store_are_refused_before_anything_is_made(
        world: dict[str, Any]) -> None:
    with pytest.raises(UserInputError, match="--max-restarts needs a supervisor"):
        _start(world, supervision(detach=True, store=None), job=_job(max_restarts=2))
    assert world["cloud"].created == []


def test_a_store_is_checked_before_anything_is_made(world: dict[str, Any],
                                                    tmp_path: Path) -> None:
    missing = _spec(store=f"file://{tmp_path}/none")
    for mode in (StoreAttached(), Controller(env={})):
        with pytest.raises(UserInputError, match="is not a folder here"):
            _start(world, mode, spec=missing)
    assert world["cloud"].created == []


def test_the_choice_of_supervision() -> None:
    assert type(supervision(detach=False, store=None)) is StoreAttached
    assert type(supervision(detach=True, store=None)) is SelfStopping
    assert type(supervision(detach=True, store="s3://b/p")) is Controller


# -------------------------------------------------------------- the gate, in every mode
def _ready_cluster(store: InventoryStore, name: str = "g1", url: str | None = None) -> None:
    spec = build_cluster_spec({}, {"name": name, "nodes": 2, **({"store": url} if url else {})})
    inv = Inventory(name=name, provider="docker", status="ready", spec=spec)
    inv.key_path = str(ensure_cluster_key(store.keys_dir(name))[0])
    inv.nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                            private_address=f"node-{r}", slots=1, host_key="ssh-ed25519 AAAA")
                 for r in range(2)]
    store.create(inv)


def _order(fake: FakeConnector, node: str, *patterns: str) -> list[int]:
    """The position of the first command matching each pattern (-1: none)."""
    import re

    commands = fake.commands(node)
    return [next((i for i, c in enumerate(commands) if re.search(p, c)), -1) for p in patterns]


@pytest.mark.parametrize("mode", ["attached", "detached", "managed"])
def test_the_gate_step_runs_in_every_mode(mode: str, world: dict[str, Any],
                                          tmp_path: Path) -> None:
    store, fake = world["store"], world["fake"]
    url = _store_url(tmp_path) if mode == "managed" else None
    _ready_cluster(store, url=url)
    chosen = supervision(detach=mode != "attached", store=url)
    if mode == "managed":
        chosen = Controller(env={})
    job = _job(fabric_check="on")
    # the separate gate passes on these CPU nodes (rank 0's summary, gloo)
    fake.on(GATE, node="node-0", stream=raw(summary(0.5, 2, pairwise=False)))
    said: list[str] = []
    if mode == "attached":  # the gate in the job's processes: nothing prints its verdict
        with pytest.raises(FabricGateError, match="fabric gate failed"):
            lifecycle.start("g1", job, chosen, store=store, log=said.append)
        gate_at, separate_at = _order(fake, "node-0", r"injob", GATE)
        assert gate_at >= 0 and separate_at == -1
        assert any("in the job's own processes" in m for m in said)
        return
    started = lifecycle.start("g1", job, chosen, store=store, log=said.append)
    assert started.job_id is not None
    assert any("a run of its own before the job" in m for m in said), said
    assert any(m.startswith("fabric gate: pass") for m in said), said
    assert store.load("g1").fabric_gate is not None  # the result kept, as attached runs do
    gate_at, job_at = _order(fake, "node-0", GATE, r"job start.*train_ddp")
    assert gate_at >= 0
    if mode == "detached":
        assert job_at > gate_at  # the gate first, then the job
    else:
        assert job_at == -1 and world["handed"] == ["g1 teardown=False"]


def test_a_failed_gate_keeps_a_detached_job_from_starting(world: dict[str, Any]) -> None:
    store, fake = world["store"], world["fake"]
    _ready_cluster(store)
    fake.on(GATE, node="node-0", exit_code=1, stream=raw(json.dumps({"error": "gloo timeout"})))
    with pytest.raises(FabricGateError):
        lifecycle.start("g1", _job(fabric_check="on"), SelfStopping(), store=store,
                        log=lambda m: None)
    assert _order(fake, "node-0", r"job start.*train_ddp") == [-1]
