"""What `down` leaves behind on the controller: no lock file, no installed ssh config; stale
lock files of clusters that do not exist are swept; a deleted lock file is never shared."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from provision.model.errors import ClusterBusyError
from provision.model.inventory import Inventory, InventoryStore


def _inv(name: str) -> Inventory:
    return Inventory(name=name, provider="docker", status="ready")


def test_down_removes_the_lock_file_and_stale_locks_go(mgpu_home: Path) -> None:
    store = InventoryStore()
    inv = _inv("a")
    with store.lock("a"):
        store.create(inv)
        store.delete("a")  # `down` deletes while holding the lock
    assert not (store.clusters_dir / "a.lock").exists()
    with pytest.raises(Exception):  # noqa: B017 - any error: the cluster does not exist
        with store.lock("ghost"):
            store.load("ghost")
    assert (store.clusters_dir / "ghost.lock").exists()
    assert store.clean_stale_locks() == 1
    assert not (store.clusters_dir / "ghost.lock").exists()


def test_a_held_lock_survives_cleaning_and_a_deleted_one_is_not_shared(mgpu_home: Path) -> None:
    store = InventoryStore()
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock("busy"):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    entered.wait(10)
    try:
        assert store.clean_stale_locks() == 0  # held: someone is creating it right now
        with pytest.raises(ClusterBusyError):
            with store.lock("busy"):
                pass
    finally:
        release.set()
        t.join()
    # The file is replaced under a holder: a new lock must be taken on the new file.
    with store.lock("busy"):
        (store.clusters_dir / "busy.lock").unlink()
        with store.lock("busy"):  # not busy: the old file is gone; this one is new
            pass
