"""Issue 42 (the mutation run): docker's label-checked removal (docker/removal.py) at its
edges, against a scripted engine API that answers as docker's does: what a refusal and a
failure say, that removal is forced (a running container refuses a plain removal with 409,
which the code reads as "already in progress"), that `keep` wins over `first`, that one
failure never stops the others, and that only the records named are forgotten."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from provision.cluster.providers.docker.removal import (
    NotTheClusters,
    Removal,
    owned_network,
    refusal,
    remove_containers,
    remove_networks,
)
from provision.model.errors import TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, ResourceRecord

C1 = {CLUSTER_TAG: "c1"}


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code, self.reason, self.url = status, "", ""


def _error(status: int, text: str) -> docker.errors.APIError:
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(text, response=_Response(status), explanation=text)  # type: ignore[arg-type]


class ScriptedApi:
    """docker's low-level API as removal calls it; ids are 64 hex digits as the engine's."""

    def __init__(self, containers: dict[str, dict[str, str]],
                 networks: dict[str, dict[str, str]] | None = None,
                 broken: set[str] | None = None) -> None:
        self.containers, self.networks = dict(containers), dict(networks or {})
        self.broken = broken or set()  # refs whose inspection fails (500)
        self.unremovable: set[str] = set()  # ids whose removal fails (500)
        self.removed: list[str] = []
        self.inspected: list[str] = []

    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.inspected.append(ref)
        if ref in self.broken:
            raise _error(500, "the engine is unwell")
        cid = next((c for c in self.containers if c.startswith(ref)), None)
        if cid is None:
            raise _error(404, f"No such container: {ref}")
        return {"Id": cid, "Name": f"/{cid[:4]}", "Config": {"Labels": self.containers[cid]}}

    def remove_container(self, cid: str, force: bool = False) -> None:
        if force is not True:  # the engine: a running container needs force
            raise _error(409, "You cannot remove a running container; stop it first or "
                              "force remove")
        if cid in self.unremovable:
            raise _error(500, "driver failed removing the root filesystem")
        self.containers.pop(cid)
        self.removed.append(cid)

    def inspect_network(self, ref: str) -> dict[str, Any]:
        self.inspected.append(ref)
        if ref in self.broken:
            raise _error(500, "the engine is unwell")
        if ref not in self.networks:
            raise _error(404, f"network {ref} not found")
        return {"Id": ref, "Name": f"net-{ref[:4]}", "Labels": self.networks[ref]}

    def remove_network(self, nid: str) -> None:
        self.networks.pop(nid)
        self.removed.append(nid)


def _id(c: str) -> str:
    return c * 64


def test_a_refusal_names_the_object_its_owner_and_the_cluster() -> None:
    found = {"Name": "/web", "Id": "abcdef1234567890abcdef"}
    assert refusal("container", found, {CLUSTER_TAG: "other"}, "c1") == (
        "container web (abcdef123456) is labelled mgpu-cloud-cluster=other, not c1's: left "
        "as it is")
    assert refusal("container", {"Name": "/Xeno", "Id": "x"}, {}, "c1").startswith(
        "container Xeno (x) has no")  # only the one leading slash goes
    assert refusal("network", {}, {}, "c1") == (
        "network  () has no mgpu-cloud-cluster label, not c1's: left as it is")
    api = ScriptedApi({}, {"n1": {CLUSTER_TAG: "c2"}})
    with pytest.raises(NotTheClusters) as err:
        owned_network(api, "c1", "n1")
    assert err.value.message == ("network net-n1 (n1) is labelled mgpu-cloud-cluster=c2, not "
                                 "c1's: left as it is")


def test_removal_is_forced_and_keep_wins_over_first() -> None:
    ctl, node, other = _id("a"), _id("b"), _id("c")
    api = ScriptedApi({ctl: C1, node: C1, other: {CLUSTER_TAG: "c2"}})
    got = remove_containers(api, "c1", [node[:12], other[:12]], listed={ctl},
                            keep={ctl}, first={ctl})
    assert api.removed == [node]  # the kept controller is not removed, even named first
    assert ctl in api.containers and other in api.containers
    assert got.done == [("container", node[:12])]
    assert [r[:2] for r in got.refused] == [("container", other[:12])]
    assert got.failures == []


def test_first_goes_before_the_rest() -> None:
    ctl, n1, n2 = _id("a"), _id("b"), _id("c")
    api = ScriptedApi({ctl: C1, n1: C1, n2: C1})
    remove_containers(api, "c1", [], listed={n1, ctl, n2}, first={ctl})
    assert api.removed[0] == ctl and set(api.removed) == {ctl, n1, n2}


def test_one_failure_never_stops_the_others_and_says_what_failed() -> None:
    bad, good, stuck = _id("d"), _id("e"), _id("f")
    net = "n1-network-of-a-long-id"
    api = ScriptedApi({good: C1, stuck: C1}, {net: C1, "n2": C1}, broken={bad, net})
    api.unremovable = {stuck}
    got = remove_containers(api, "c1", [bad, good[:12], stuck], listed=set())
    assert got.failures == [f"container {bad[:12]}: the engine is unwell",
                            f"container {stuck[:12]}: driver failed removing the root "
                            "filesystem"]
    assert api.removed == [good] and got.done == [("container", good[:12])]
    remove_networks(api, "c1", [net, "n2"], listed=set(), into=got)
    assert got.failures[-1] == f"network {net[:12]}: the engine is unwell"
    assert "n2" in api.removed and ("network", "n2") in got.done
    with pytest.raises(TeardownError, match="^could not remove everything of cluster 'c1'"):
        got.raise_for("again")


def test_a_listed_network_is_not_looked_at_again_and_a_foreign_one_is_refused() -> None:
    api = ScriptedApi({}, {"mine": C1, "theirs": {}}, broken={"mine"})
    got = remove_networks(api, "c1", ["theirs"], listed={"mine"}, into=Removal("c1"))
    assert "mine" in api.removed and "mine" not in api.inspected
    assert got.refused == [("network", "theirs", "network net-thei (theirs) has no "
                                                 "mgpu-cloud-cluster label, not c1's: left "
                                                 "as it is")]


class _Forgets:
    def __init__(self) -> None:
        self.forgotten: list[tuple[str, str]] = []

    def forget(self, inv: Inventory, kind: str, resource_id: str) -> None:
        self.forgotten.append((kind, resource_id))


def test_only_the_records_named_are_forgotten_and_the_error_says_all() -> None:
    inv = Inventory(name="c1", provider="docker", resources=[
        ResourceRecord(kind="container", id="x"), ResourceRecord(kind="network", id="y"),
        ResourceRecord(kind="container", id="y2"), ResourceRecord(kind="network", id="x2")])
    out = Removal("c1", done=[("container", "x"), ("container", "not-in-it")],
                  refused=[("network", "y", "network y is not c1's")],
                  failures=["container z: boom"])
    store = _Forgets()
    out.forget(inv, store)
    assert store.forgotten == [("container", "x"), ("network", "y")]
    with pytest.raises(TeardownError) as err:
        out.raise_for("run `mgpu-cloud down c1` again")
    assert err.value.message == ("could not remove everything of cluster 'c1': container z: "
                                 "boom; network y is not c1's")
    assert err.value.hint == (
        "the inventory named 1 resource(s) the engine does not label as c1's (an inventory "
        "adopted from a store a node can write, or edited by hand?): they are dropped from "
        "it; run `mgpu-cloud down c1` again")
    Removal("c1", done=[("container", "x")]).raise_for("nothing")  # nothing to say
