from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from provision.model.errors import ClusterBusyError, ClusterExistsError, ClusterNotFoundError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord


def _inv(name: str = "demo") -> Inventory:
    return Inventory(name=name, provider="docker")


def test_roundtrip_and_mode(mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _inv()
    inv.nodes.append(NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=2222,
                                private_address="node-0"))
    store.create(inv)
    assert store.load("demo") == inv
    assert (store.path("demo").stat().st_mode & 0o777) == 0o600
    assert store.names() == ["demo"]


def test_create_refuses_existing() -> None:
    store = InventoryStore()
    store.create(_inv())
    with pytest.raises(ClusterExistsError, match="already exists"):
        store.create(_inv())


def test_load_missing_lists_known() -> None:
    store = InventoryStore()
    store.create(_inv("other"))
    with pytest.raises(ClusterNotFoundError, match="known clusters: other"):
        store.load("demo")


def test_record_is_persisted_at_once() -> None:
    store = InventoryStore()
    inv = _inv()
    store.create(inv)
    store.record(inv, ResourceRecord(kind="container", id="abc"))
    # A second reader (another process after a crash) sees it immediately.
    assert InventoryStore().load("demo").resources[0].id == "abc"
    store.forget(inv, "container", "abc")
    assert InventoryStore().load("demo").resources == []


def test_atomic_write_keeps_old_file_on_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InventoryStore()
    inv = _inv()
    store.create(inv)
    before = store.path("demo").read_text()

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    inv.resources.append(ResourceRecord(kind="network", id="n1"))
    with pytest.raises(OSError, match="disk full"):
        store.save(inv)
    assert store.path("demo").read_text() == before
    assert [p.name for p in store.clusters_dir.iterdir() if p.suffix == ".tmp"] == []


def test_lock_excludes_a_second_holder_in_process() -> None:
    store = InventoryStore()
    with store.lock("demo"):
        with pytest.raises(ClusterBusyError, match="in use"):
            with store.lock("demo"):
                pass
    with store.lock("demo"):  # released
        pass


def test_lock_excludes_another_process(mgpu_home: Path) -> None:
    store = InventoryStore()
    script = textwrap.dedent("""
        import sys, time
        from provision.model.inventory import InventoryStore
        with InventoryStore().lock("demo"):
            print("locked", flush=True)
            sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "MGPU_CLOUD_HOME": str(mgpu_home)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(ClusterBusyError):
            with store.lock("demo"):
                pass
    finally:
        proc.communicate("\n", timeout=10)
    with store.lock("demo"):
        pass


def test_delete_is_idempotent() -> None:
    store = InventoryStore()
    store.create(_inv())
    store.keys_dir("demo")
    store.delete("demo")
    store.delete("demo")
    assert not store.exists("demo")
    assert not (store.home / "keys" / "demo").exists()


def test_inventory_never_holds_key_material() -> None:
    from provision.model.keys import ensure_cluster_key

    store = InventoryStore()
    inv = _inv()
    path, _ = ensure_cluster_key(store.keys_dir("demo"))
    inv.key_path = str(path)
    store.create(inv)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert "PRIVATE KEY" not in store.path("demo").read_text()


@pytest.mark.parametrize("field,value", [
    ("user", "-oProxyCommand=touch /tmp/x"), ("user", "a b"), ("user", "u@h"), ("user", ""),
    ("address", "-oProxyCommand=touch /tmp/x"), ("address", "host;id"), ("address", "h h"),
    ("private_address", "-x"), ("name", "../x"), ("name", "-n"),
    ("proxy_jump", "-oProxyCommand=x@host:22"), ("proxy_jump", "u@-host:22"),
    ("proxy_jump", "u@host:22;id"), ("proxy_jump", "u@host:-1"),
])
def test_node_fields_that_ssh_could_read_as_options_are_refused(field: str, value: str) -> None:
    """user, addresses, name and jump host reach ssh/pdsh/hostfile command lines: nothing
    that starts with '-' or holds spaces, quotes, '@' or shell characters (issue 34)."""
    from pydantic import ValidationError

    fields = {"name": "node-0", "rank": 0, "address": "10.0.0.5", "private_address": "10.0.0.5",
              field: value}
    with pytest.raises(ValidationError, match="not starting with '-'|user@host:port"):
        NodeRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("field,value", [
    ("user", "ubuntu"), ("user", "ec2-user"), ("user", "first.last"), ("user", "_svc"),
    ("address", "203.0.113.7"), ("address", "ip-10-0-0-5.ec2.internal"), ("address", "::1"),
    ("address", "fe80::1%eth0"), ("private_address", "node-1"), ("name", "mgpu-x-node-0"),
    ("proxy_jump", "alice@login.example.org:2222"), ("proxy_jump", "bastion"),
])
def test_usual_logins_pass(field: str, value: str) -> None:
    fields = {"name": "node-0", "rank": 0, "address": "10.0.0.5", "private_address": "10.0.0.5",
              field: value}
    assert getattr(NodeRecord(**fields), field) == value  # type: ignore[arg-type]


def test_an_inventory_with_a_user_that_is_an_option_is_not_loaded() -> None:
    """A cluster file written elsewhere (a node's copy adopted from a store, a hand edit) with
    `user: -oProxyCommand=...` is refused when loaded, naming the field and the rule."""
    from provision.model.errors import InventoryUnreadableError

    store = InventoryStore()
    inv = _inv()
    inv.nodes.append(NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=2222,
                                private_address="node-0"))
    store.create(inv)
    path = store.path("demo")
    path.write_text(path.read_text().replace("user: root", "user: -oProxyCommand=touch /tmp/x"))
    with pytest.raises(InventoryUnreadableError, match="nodes.0.user.*not starting with '-'"):
        store.load("demo")
