"""Fixtures every provider folder that brings up clusters through the pipeline shares; each
folder's own conftest supplies `store` (where its inventories are kept)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec


@pytest.fixture
def up(store: InventoryStore) -> Callable[[ClusterSpec], Inventory]:
    """pipeline.up without bootstrap, auto-confirmed (rollback on failure included)."""
    from provision.cluster import pipeline

    def run(spec: ClusterSpec) -> Inventory:
        inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                          log=lambda msg: None)
        assert inv is not None
        return inv

    return run
