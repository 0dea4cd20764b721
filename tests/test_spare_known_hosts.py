"""A spare made during a run is pinned while it is prepared, though a recovery rewrites the
cluster's known_hosts from the inventory meanwhile (seen in a suite run: the recovery's
refresh_peers wrote the file without the new spare between its bootstrap and its preflight,
which then refused it: 'presented an unknown ssh-ed25519 host key')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sparekit import MemoryCloud, make_cluster, make_pool

from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import generate_ed25519, known_hosts_line
from provision.nodes import bootstrap, checks, preflight
from provision.nodes.spares import prepare_spares
from provision.nodes.sshconn import write_cluster_known_hosts


def _node(rank: int, name: str) -> NodeRecord:
    key = generate_ed25519(name).public_openssh
    return NodeRecord(name=name, rank=rank, address="127.0.0.1", port=40000 + rank,
                      private_address=f"10.1.0.{rank}", host_key=key, resource_id=name)


def _cluster_file(inv: Inventory, store: InventoryStore) -> Path:
    """The cluster's known_hosts, where write_cluster_known_hosts writes it."""
    return Path(inv.known_hosts_path or store.keys_dir(inv.name) / "known_hosts")


def test_a_spare_being_prepared_stays_pinned_while_the_cluster_file_is_rewritten(
        mgpu_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = InventoryStore()
    inv = Inventory(name="kh", provider="docker", nodes=[_node(0, "node-0"), _node(1, "node-2")],
                    status="ready")
    store.create(inv)
    spare = _node(3, "node-3")
    pinned = known_hosts_line([spare.address], spare.port, spare.host_key or "")
    seen: list[str] = []

    def bootstrap_cluster(view: Inventory, store: InventoryStore, **_: Any) -> None:
        write_cluster_known_hosts(view, store)  # as the real one does first

    def gather_preflights(view: Inventory, **_: Any) -> dict[str, Any]:
        write_cluster_known_hosts(inv, store)  # the recovery's refresh_peers, meanwhile
        seen.append(_cluster_file(view, store).read_text())  # what the preflight's logins load
        return {}

    monkeypatch.setattr(bootstrap, "bootstrap_cluster", bootstrap_cluster)
    monkeypatch.setattr(preflight, "gather_preflights", gather_preflights)
    monkeypatch.setattr(checks, "compare_preflights", lambda reports, gpus: [])
    prepare_spares(inv, store, [spare], log=lambda m: None, beside_master=False)
    assert len(seen) == 1 and pinned in seen[0].splitlines(), seen
    keys = store.keys_dir(inv.name)
    assert sorted(p.name for p in keys.glob("known_hosts*")) == ["known_hosts"]  # its own: gone
    assert inv.spares == []  # the pool adds it (and pins it in the cluster's file) once ready


class _KeyedCloud(MemoryCloud):
    """Spares with a host key (a real provider reads one off every machine it makes)."""

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        made = super()._make_spare(inv, store, spare)
        return made.model_copy(update={"host_key": generate_ed25519(made.name).public_openssh})


class _Watching(InventoryStore):
    """Every save: the spares then in the inventory whose keys the cluster's file lacks."""

    unpinned: list[str]

    def save(self, inv: Inventory) -> None:
        path = _cluster_file(inv, self)
        text = path.read_text() if path.exists() else ""
        self.unpinned += [s.name for s in inv.spares if s.host_key and known_hosts_line(
            [s.address], s.port, s.host_key) not in text.splitlines()]
        super().save(inv)


def test_a_spare_made_during_a_run_is_pinned_before_it_is_in_the_inventory(
        tmp_path: Path) -> None:
    """A warm launcher is started on a spare as soon as Inventory.spares has it (WarmSpares.
    keep, every poll): its login loads the cluster's file, so the key must be there first
    (seen in CI: the new spare's launcher 'could not run (... presented an unknown ssh-ed25519
    host key ...)', the pool wrote the file after adding it)."""
    cloud = _KeyedCloud()
    inv, _ = make_cluster(tmp_path, cloud)
    store = _Watching(tmp_path)
    store.unpinned = []
    pool, said = make_pool(cloud, inv, store, [])
    pool.node_for(inv.nodes[1], "node lost").result()
    pool.wait()
    assert [s.name for s in inv.spares] == ["node-3"], said
    assert store.unpinned == [], "a spare was in the inventory before its key was pinned"
    new = inv.spares[0]
    assert known_hosts_line([new.address], new.port, new.host_key or "") in \
        _cluster_file(inv, store).read_text().splitlines()
