"""Issue 42: a cluster.json sealed with the right key (a controller bug, a leaked records key)
still never changes how this machine logs in to a node: its provider, each node's user and
jump host stay this machine's, even when the new values are perfectly valid names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provision.job.managed.client import adopt_from_store
from provision.job.managed.supervisor import publish_inventory
from provision.model.inventory import (
    Inventory,
    InventoryStore,
    NodeRecord,
    Replacement,
    ResourceRecord,
)
from provision.model.keys import ensure_records_key
from provision.model.spec import build_cluster_spec
from remote.store import Store, open_store


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             jump: str | None) -> tuple[InventoryStore, Inventory, Store, bytes]:
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    (tmp_path / "shared").mkdir()
    here = InventoryStore()
    inv = Inventory(name="c1", provider="docker", key_path=str(tmp_path / "id"),
                    spec=build_cluster_spec({}, {"name": "c1",
                                                 "store": f"file://{tmp_path}/shared"}))
    inv.nodes = [NodeRecord(name=f"node-{r}", rank=r, address="203.0.113.5", port=32000 + r,
                            private_address=f"node-{r}", host_key=f"ssh-ed25519 KEY{r}",
                            resource_id=f"id-{r}", user="ubuntu", proxy_jump=jump)
                 for r in range(2)]
    inv.controller = NodeRecord(name="controller", rank=-1, address="127.0.0.1", port=32100,
                                private_address="controller", host_key="ssh-ed25519 CTL")
    inv.resources = [ResourceRecord(kind="container", id=f"id-{r}") for r in range(2)]
    here.create(inv)
    key = ensure_records_key(here.keys_dir("c1"))
    return here, inv, open_store(f"file://{tmp_path}/shared"), key


def _replaced(inv: Inventory, **node1: Any) -> Inventory:
    """The controller's copy after it replaced node-1 (one more replacement, so this machine
    would take it), with node-1's fields changed by `node1`."""
    theirs = inv.model_copy(deep=True)
    theirs.nodes[1] = theirs.nodes[1].model_copy(update={
        "port": 32999, "resource_id": "id-9", "host_key": "ssh-ed25519 NEW", **node1})
    theirs.replacements.append(Replacement(rank=1, old="id-1", new="id-9", reason="lost"))
    return theirs


CHANGES = {
    "user": {"user": "admin"},  # a valid login name, only another one
    "jump host": {"proxy_jump": "ops@bastion2.example.com"},
    "jump host's user": {"proxy_jump": "root@bastion.example.com"},
    "jump host added": {"proxy_jump": "ops@bastion.example.com", "user": "ubuntu"},
    "jump host dropped": {"proxy_jump": None},
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_sealed_copy_that_changes_a_login_is_not_adopted(
        change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jump = None if change == "jump host added" else "ops@bastion.example.com"
    here, inv, store, key = _cluster(tmp_path, monkeypatch, jump)
    theirs = _replaced(inv, **CHANGES[change])
    assert theirs.nodes[1].user != inv.nodes[1].user or (
        theirs.nodes[1].proxy_jump != inv.nodes[1].proxy_jump)
    publish_inventory(store, theirs, {n.rank: n for n in theirs.nodes}, key)
    before = here.path("c1").read_text()
    warned: list[str] = []
    assert adopt_from_store("c1", here, warn=warned.append) is False
    assert here.path("c1").read_text() == before
    assert warned == ["the store's cluster.json of 'c1' is not adopted: it changes the "
                      "provider, the node set or the login of node-1"], warned


def test_the_same_logins_are_adopted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: what a replacement changes (port, resource, host key) is taken."""
    here, inv, store, key = _cluster(tmp_path, monkeypatch, "ops@bastion.example.com")
    theirs = _replaced(inv)
    publish_inventory(store, theirs, {n.rank: n for n in theirs.nodes}, key)
    assert adopt_from_store("c1", here) is True
    got = here.load("c1").nodes[1]
    assert (got.port, got.resource_id, got.user, got.proxy_jump) == (
        32999, "id-9", "ubuntu", "ops@bastion.example.com")


@pytest.mark.parametrize("change", ["provider", "one node less"])
def test_a_sealed_copy_with_another_provider_or_node_set_is_not_adopted(
        change: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv, store, key = _cluster(tmp_path, monkeypatch, None)
    theirs = _replaced(inv)
    if change == "provider":
        theirs.provider = "ssh"
    else:
        theirs.nodes = theirs.nodes[:1]
    publish_inventory(store, theirs, {n.rank: n for n in theirs.nodes}, key)
    assert adopt_from_store("c1", here, warn=lambda m: None) is False
    assert here.load("c1").nodes == inv.nodes
