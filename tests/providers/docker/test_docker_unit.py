"""The docker provider against a scripted fake engine (the real engine is covered by
tests/integration): what it asks for, what it records, and how it fails and cleans up."""

from __future__ import annotations

import builtins
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.docker.plan import SHARED_NETWORK
from provision.model.errors import (
    ClusterExistsError,
    ProviderUnavailableError,
    ProvisionError,
    TeardownError,
    UserInputError,
)
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore, ResourceRecord
from provision.model.spec import build_cluster_spec


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code = status
        self.reason = "fake"


def _api_error(status: int, text: str) -> docker.errors.APIError:
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(text, response=_Response(status), explanation=text)


@dataclass
class FakeEngine:
    """The low-level API calls the provider makes, with the engine's own state."""

    networks: dict[str, dict[str, Any]] = field(default_factory=dict)
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # call -> (status, text, name)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    removed: list[str] = field(default_factory=list)  # container ids, in the order removed
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def api(self) -> FakeEngine:
        return self

    def _maybe_fail(self, call: str, name: str = "") -> None:
        if call in self.fail and self.fail[call][2] in ("", name):
            status, text, _ = self.fail[call]
            raise _api_error(status, text)

    # --- low-level API used by create/destroy ---------------------------------------------
    def create_host_config(self, **kw: Any) -> dict[str, Any]:
        return kw

    def create_networking_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        return cfg

    def create_endpoint_config(self, **kw: Any) -> dict[str, Any]:
        return kw

    def create_network(self, name: str, driver: str, labels: dict[str, str],
                       check_duplicate: bool | None = None) -> dict[str, str]:
        self._maybe_fail("create_network", name)
        with self.lock:
            # Engines before API 1.44 make a second network of the same name unless asked to
            # check (the SDK's check_duplicate; 1.44 always checks): 409 Conflict then.
            if check_duplicate and any(n["Name"] == name for n in self.networks.values()):
                raise _api_error(409, f"network with name {name} already exists")
            nid = f"net{next(self.ids):060d}"
            self.networks[nid] = {"Name": name, "Labels": labels, "Driver": driver}
        return {"Id": nid}

    def inspect_network(self, name: str) -> dict[str, Any]:
        found = [{"Id": nid, **n} for nid, n in self.networks.items() if name in (nid, n["Name"])]
        if not found:
            raise _api_error(404, f"network {name} not found")
        return found[0]

    def create_container(self, image: str, **kw: Any) -> dict[str, str]:
        self._maybe_fail("create_container", kw["name"])
        net = kw.get("host_config", {}).get("network_mode")
        if net and not any(n["Name"] == net for n in self.networks.values()):
            raise _api_error(404, f"network {net} not found")  # the engine checks at create
        with self.lock:
            cid = f"c{next(self.ids):063d}"
            self.containers[cid] = {"image": image, "running": False, "files": {},
                                    "labels": {}, "nets": {net} if net else set(), **kw}
        return {"Id": cid}

    def _network(self, ref: str) -> str:
        return str(self.inspect_network(ref)["Name"])

    def connect_container_to_network(self, ref: str, net: str) -> None:
        self.containers[self._resolve(ref)]["nets"].add(self._network(net))

    def disconnect_container_from_network(self, ref: str, net: str, force: bool = False) -> None:
        self.containers[self._resolve(ref)]["nets"].discard(self._network(net))

    def put_archive(self, cid: str, path: str, data: bytes) -> bool:
        """Unpacks the tar into the container's files (path -> (mode, text)), as the engine
        does; only before the container starts here (the provider's promise)."""
        import io
        import tarfile

        c = self.containers[self._resolve(cid)]
        assert not c["running"], "files copied in after the start"
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                text = tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                c["files"][f"{path.rstrip('/')}/{m.name}"] = (m.mode, m.uid, text)
        return True

    def start(self, cid: str) -> None:
        self._maybe_fail("start", self.containers[cid]["name"])
        self.containers[cid]["running"] = True

    def _resolve(self, ref: str) -> str:
        """An id or a name, as the engine takes either; 404 when neither."""
        for cid, c in self.containers.items():
            if ref in (cid, c["name"]):
                return cid
        raise _api_error(404, f"No such container: {ref}")

    def inspect_container(self, ref: str) -> dict[str, Any]:
        cid = self._resolve(ref)
        c = self.containers[cid]
        port = 40000 + int(cid[1:]) % 1000
        net = (c.get("host_config") or {}).get("network_mode", "bridge")
        return {"Id": cid, "Name": "/" + c["name"],
                "Config": {"Image": c["image"], "Labels": c["labels"]},
                "NetworkSettings": {
                    "Ports": {"22/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]},
                    "Networks": {net: {"IPAddress": f"10.9.0.{int(cid[1:]) % 250}"}}}}

    def remove_container(self, cid: str, force: bool) -> None:
        try:
            self._maybe_fail("remove_container", cid)
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "removal already in progress": another one finishes it
                self.containers.pop(cid, None)
            raise
        with self.lock:
            if cid not in self.containers:
                raise _api_error(404, "No such container")
            del self.containers[cid]
            self.removed.append(cid)

    def remove_network(self, nid: str) -> None:
        self._maybe_fail("remove_network", nid)
        if nid not in self.networks:
            raise _api_error(404, "No such network")
        name = self.networks[nid]["Name"]
        if any(name in c["nets"] for c in self.containers.values()):  # as the engine refuses
            raise _api_error(403, f"error while removing network: network {name} id {nid} "
                                  "has active endpoints")
        del self.networks[nid]

    # --- high-level listing used by destroy's label sweep and gc ---------------------------
    @property
    def containers_api(self) -> Any:
        return self

    def list(self, all: bool = False, filters: dict[str, str] | None = None) -> list[Any]:  # noqa: A002
        key, _, value = (filters or {}).get("label", "").partition("=")
        out = []
        for cid, c in self.containers.items():
            if key in c["labels"] and (not value or c["labels"][key] == value):
                out.append(_Obj(id=cid, name=c["name"], labels=c["labels"], attrs={}))
        return out


@dataclass
class _Obj:
    id: str
    name: str
    labels: dict[str, str]
    attrs: dict[str, Any]


class _Networks:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def list(self, filters: dict[str, str] | None = None) -> list[_Obj]:
        key, _, value = (filters or {}).get("label", "").partition("=")
        return [_Obj(id=nid, name=n["Name"], labels=n["Labels"], attrs={"Labels": n["Labels"]})
                for nid, n in self.engine.networks.items()
                if key in n["Labels"] and (not value or n["Labels"][key] == value)]


class _Api:
    """The low-level client: the engine's calls, plus the container list as the engine answers
    it (dicts; every `label` filter must match, as Docker's API does)."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def containers(self, all: bool = False, filters: dict[str, Any] | None = None  # noqa: A002
                   ) -> list[dict[str, Any]]:
        pairs = _label_pairs(filters)
        return [{"Id": cid, "Names": ["/" + c["name"]], "Labels": c["labels"]}
                for cid, c in self.engine.containers.items()
                if all or c["running"]
                if builtins.all(k in c["labels"] and (not v or c["labels"][k] == v) for k, _, v in pairs)]

    def networks(self, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        pairs = _label_pairs(filters)
        return [{"Id": nid, "Name": n["Name"], "Labels": n["Labels"]}
                for nid, n in self.engine.networks.items()
                if builtins.all(k in n["Labels"] and (not v or n["Labels"][k] == v) for k, _, v in pairs)]


def _label_pairs(filters: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    wanted = (filters or {}).get("label", [])
    return [w.partition("=") for w in ([wanted] if isinstance(wanted, str) else wanted)]


class FakeClient:
    def __init__(self, engine: FakeEngine) -> None:
        self.api = _Api(engine)
        self.containers = engine
        self.networks = _Networks(engine)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    eng = FakeEngine()
    client = FakeClient(eng)
    monkeypatch.setattr("provision.cluster.providers.docker.provider.docker_client", lambda: client)
    monkeypatch.setattr("provision.cluster.providers.docker.controller.docker_client",
                        lambda: client)
    monkeypatch.setattr("provision.cluster.providers.docker.images.ensure_node_image",
                        lambda opts, log, client=None: "mgpu-cloud/node:test")
    return eng


def _names(engine: FakeEngine) -> list[str]:
    return [n["Name"] for n in engine.networks.values()]


def _spec(nodes: int = 2, **docker: Any) -> Any:
    return build_cluster_spec({}, {"name": "unit", "nodes": nodes, "docker": docker})


def _up(spec: Any, store: InventoryStore) -> Inventory:
    inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                      log=lambda m: None)
    assert inv is not None
    return inv


def test_plan_fails_before_anything_when_the_engine_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> Any:
        raise ProviderUnavailableError("the Docker engine is not reachable")

    monkeypatch.setattr("provision.cluster.providers.docker.provider.docker_client", down)
    with pytest.raises(ProviderUnavailableError):
        get_provider("docker").plan(_spec())


def test_containers_of_the_name_left_on_the_engine_are_refused_before_anything_is_made(
        engine: FakeEngine, mgpu_home: Path) -> None:
    engine.create_container("mgpu-cloud/node:test", name="unit-node-0",
                            labels={CLUSTER_TAG: "unit", "mgpu-cloud-node": "0"})
    with pytest.raises(ClusterExistsError) as err:
        get_provider("docker").plan(_spec())
    assert "no inventory here knows: unit-node-0" in str(err.value)
    assert "remove them: docker rm -f unit-node-0 (" in str(err.value)
    assert len(engine.containers) == 1 and engine.networks == {}
    engine.create_container("x", name="other-node-0", labels={CLUSTER_TAG: "other"})
    del engine.containers[next(iter(engine.containers))]
    assert get_provider("docker").plan(_spec()).request.network == "unit-net"


def test_create_records_everything_and_pins_host_keys(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _up(_spec(3, cpus=1.5, memory="2g"), store)
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
        _up(_spec(3), store)
    assert engine.containers == {} and _names(engine) == []  # its network too
    assert not store.exists("unit")


def test_the_provider_says_it_waits_once_the_network_is_there(
        engine: FakeEngine, mgpu_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not as `create` begins: its imports would share the interpreter with the keys and the
    image lookup that the containers wait for (provision/nodes/pool.py provider_waits)."""
    seen: list[int] = []
    monkeypatch.setattr("provision.cluster.providers.docker.provider.provider_waits",
                        lambda: seen.append(len(engine.networks)))
    _up(_spec(2), InventoryStore())
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
        _up(_spec(3), store)
    assert engine.containers == {} and _names(engine) == []  # its network too
    assert not store.exists("unit")


def test_destroy_is_idempotent_and_sweeps_by_label(engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _up(_spec(2), store)
    removed_by_hand = inv.nodes[0].resource_id or ""
    del engine.containers[removed_by_hand]
    stray = engine.create_container("x", name="unit-node-9", labels={CLUSTER_TAG: "unit"})["Id"]
    provider = get_provider("docker")
    provider.destroy(inv, store)
    assert engine.containers == {} and _names(engine) == []
    assert stray not in engine.containers and inv.resources == []
    provider.destroy(inv, store)  # again: nothing to do, no error


def test_destroy_reports_what_it_could_not_remove_and_keeps_it(engine: FakeEngine,
                                                                 mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _up(_spec(1), store)
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
    _up(_spec(1), store)
    engine.create_network("lost-net", "bridge", {CLUSTER_TAG: "lost"})
    engine.create_container("x", name="lost-node-0", labels={CLUSTER_TAG: "lost"})
    provider = get_provider("docker")
    found = provider.orphans(_spec(), set(store.names()))
    assert sorted((r.kind, r.extra["cluster"]) for r in found) == [
        ("container", "lost"), ("network", "lost")]
    provider.delete_orphans(_spec(), found)
    assert {c["name"] for c in engine.containers.values()} == {"unit-node-0"}
    assert _names(engine) == ["unit-net"]  # a cluster with an inventory: not an orphan


def test_replace_of_a_container_already_gone(engine: FakeEngine, mgpu_home: Path) -> None:
    """SDK errors of replace are translated by the `errors` hook only (issue 20), so a lost
    container that docker already removed (404) is simply replaced."""
    store = InventoryStore()
    inv = _up(_spec(2), store)
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


def test_each_cluster_gets_its_own_network_and_one_left_by_a_killed_run_is_used(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    first = _up(_spec(1), store)
    second = _up(build_cluster_spec({}, {"name": "two", "nodes": 1}), store)
    assert _names(engine) == ["unit-net", "two-net"]
    for inv, net in ((first, "unit-net"), (second, "two-net")):
        [c] = [engine.containers[n.resource_id or ""] for n in inv.nodes]
        assert c["nets"] == {net}
    get_provider("docker").destroy(first, store)
    assert _names(engine) == ["two-net"]
    get_provider("docker").destroy(second, store)
    assert engine.containers == {} and _names(engine) == []
    # a network of the cluster's name and label (a run killed with the machine; or another
    # `up` made it between this plan's look and its create: 409) is used, and removed by down
    engine.create_network("three-net", "bridge", {CLUSTER_TAG: "three"})
    inv = _up(build_cluster_spec({}, {"name": "three", "nodes": 1}), store)
    assert _names(engine) == ["three-net"] and [r.name for r in inv.resources_of("network")] \
        == ["three-net"]
    get_provider("docker").destroy(inv, store)
    assert _names(engine) == []


@pytest.mark.parametrize("labels", [{"someone": "else"}, {CLUSTER_TAG: "other"},
                                    {"mgpu-cloud-network": "shared"}])
def test_a_network_of_that_name_not_the_clusters_is_refused_at_plan(
        engine: FakeEngine, mgpu_home: Path, labels: dict[str, str]) -> None:
    engine.create_network("unit-net", "macvlan", labels)
    with pytest.raises(UserInputError, match="network named 'unit-net' that is not cluster "
                                             "'unit''s \\(driver 'macvlan'") as err:
        get_provider("docker").plan(_spec())
    assert "docker network rm unit-net" in str(err.value.hint)
    assert engine.containers == {}


def _on_the_shared_network(engine: FakeEngine, store: InventoryStore) -> Inventory:
    """A cluster made while every docker cluster shared one network (before issue 42): its
    inventory records no network, its containers are on `mgpu-cloud`."""
    inv = _up(_spec(2), store)
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
    assert engine.containers == {} and _names(engine) == [SHARED_NETWORK]  # no cluster's


def test_a_replacement_and_the_controller_join_the_clusters_own_network(
        engine: FakeEngine, mgpu_home: Path) -> None:
    from provision.cluster.providers.docker.controller import create_controller

    store = InventoryStore()
    inv = _up(_spec(2), store)
    new = get_provider("docker").replace(inv, store, inv.nodes[1])
    assert engine.containers[new.resource_id or ""]["nets"] == {"unit-net"}
    assert engine.containers[new.resource_id or ""]["host_config"]["cap_drop"] == ["NET_RAW"]
    ctl = engine.containers[create_controller(inv, store).resource_id or ""]
    assert ctl["nets"] == {"unit-net"} and ctl["host_config"]["cap_drop"] == ["NET_RAW"]


# --- trust boundaries (issue 34) ----------------------------------------------------------
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
    inv = _up(_spec(2), store)
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
    inv = _up(_spec(1), store)
    shared = engine.create_network(SHARED_NETWORK, "bridge", {"mgpu-cloud-network": "shared"})
    other = engine.create_network("other-net", "bridge", {CLUSTER_TAG: "other"})
    for net in (shared, other):
        store.record(inv, ResourceRecord(kind="network", id=net["Id"], name="x"))
    with pytest.raises(TeardownError) as err:
        get_provider("docker").destroy(inv, store)
    assert f"network mgpu-cloud ({shared['Id'][:12]}) has no " in str(err.value)
    assert f"network other-net ({other['Id'][:12]}) is labelled {CLUSTER_TAG}=other" \
        in str(err.value)
    assert _names(engine) == [SHARED_NETWORK, "other-net"] and engine.containers == {}


def test_replace_refuses_a_record_naming_another_clusters_container(
        engine: FakeEngine, mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _up(_spec(2), store)
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
        get_provider("docker").delete_orphans(_spec(), found)
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
    inv = _up(_spec(2), store)
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
    assert _names(engine) == [] and ctl["nets"] == set()  # its network: left, then removed
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
    inv = _up(spec, store)
    data = f"{shared}/unit/data"
    for node in inv.nodes:
        binds = engine.containers[node.resource_id or ""]["host_config"]["binds"]
        assert binds == {data: {"bind": data, "mode": "rw"}}
    assert Path(data).is_dir()  # made here, not by the engine (as root, 0755)
    ctl = create_controller(inv, store)
    binds = engine.containers[ctl.resource_id or ""]["host_config"]["binds"]
    assert binds[str(shared)] == {"bind": str(shared), "mode": "rw"} and data not in binds
