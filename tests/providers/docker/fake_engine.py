"""A scripted Docker engine for the docker provider's unit tests: the low-level API calls the
provider makes (docker.APIClient's names and arguments), with the engine's own state and its
answers (404, 409, 403 with active endpoints), and the high-level listings (label filters) that
destroy's sweep and gc use. The real engine is covered by tests/integration."""

from __future__ import annotations

import builtins
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import docker.errors

from provision.cluster import pipeline
from provision.model.inventory import Inventory, InventoryStore
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

    def list(self, all: bool = False, filters: dict[str, str] | None = None,  # noqa: A002
             ignore_removed: bool = False) -> list[Any]:  # listed and read at once here
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


def network_names(engine: FakeEngine) -> list[str]:
    return [n["Name"] for n in engine.networks.values()]


def cluster_spec(nodes: int = 2, **docker: Any) -> Any:
    """Cluster `unit` of the docker provider; `docker`: its docker options."""
    return build_cluster_spec({}, {"name": "unit", "nodes": nodes, "docker": docker})


def bring_up(spec: Any, store: InventoryStore) -> Inventory:
    """pipeline.up without bootstrap, auto-confirmed."""
    inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                      log=lambda m: None)
    assert inv is not None
    return inv
