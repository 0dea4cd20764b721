"""A cluster's lifetime (`max_hours`) as every provider that replaces nodes counts it."""

from __future__ import annotations

import datetime as dt

from provision.model.inventory import Inventory


def remaining_seconds(inv: Inventory, max_hours: float, now: dt.datetime | None = None) -> int:
    """Seconds left of the cluster's lifetime, counted from the inventory's creation (written
    before its first nodes were made, so a replacement never outlives them). Negative once
    the lifetime is over."""
    return int((end_of(inv, max_hours) - (now or dt.datetime.now(dt.UTC))).total_seconds())


def end_of(inv: Inventory, max_hours: float) -> dt.datetime:
    """The cluster's absolute end: its inventory's creation + max_hours (UTC)."""
    created = dt.datetime.fromisoformat(inv.created_at)
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    return created + dt.timedelta(hours=max_hours)
