from __future__ import annotations

import datetime as dt

from provision.cluster.providers.lifetime import remaining_seconds
from provision.model.inventory import Inventory

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_counted_from_the_inventory_s_creation_also_without_a_zone() -> None:
    inv = Inventory(name="c", provider="aws", created_at="2026-12-01T11:00:00+00:00")
    assert remaining_seconds(inv, 2.0, NOW) == 3600
    naive = Inventory(name="c", provider="gcp", created_at="2026-12-01T11:30:00")
    assert remaining_seconds(naive, 0.25, NOW) == -900, "over: negative"
