"""How every resource is made: recorded in the inventory BEFORE its insert is sent (its name,
chosen by the tool, is its id), so even an insert whose reply is lost is found by `down`; sent
with a requestId that the retries of that insert reuse, so a retry never makes a second
resource. A 409 means the name belongs to something that is not ours: the records are dropped
(rollback must not delete it) and the error names it.
"""

from __future__ import annotations

import uuid
from typing import Any

from provision.cluster.providers.gcp import teardown
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.errors import AlreadyExistsError
from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore, ResourceRecord


def request_id() -> str:
    return str(uuid.uuid4())


def insert(clients: Clients, store: InventoryStore, inv: Inventory,
           recs: list[ResourceRecord], method: Any, request: Any) -> Any:
    """Record `recs`, send the insert (retried with the same requestId), return its Operation."""
    what = f"creating {recs[0].kind} {', '.join(str(r.name) for r in recs)}"
    for rec in recs:
        store.record(inv, rec)
    try:
        return clients.call(method, request, what)
    except AlreadyExistsError as exc:
        for rec in recs:
            store.forget(inv, rec.kind, rec.id)
        raise ProvisionError(
            f"{what}: a {recs[0].kind} of that name already exists in project "
            f"{clients.project!r} and is not part of this cluster",
            hint="if it is left from an earlier cluster of this name, list and remove "
            f"it: mgpu-cloud gc --provider gcp --project {clients.project} --delete",
        ) from exc


def insert_all(clients: Clients, store: InventoryStore, inv: Inventory,
               inserts: list[tuple[ResourceRecord, Any, Any]]) -> None:
    """Send every (record, method, request) insert, then wait for all of them."""
    ops = [(rec, insert(clients, store, inv, [rec], method, request))
           for rec, method, request in inserts]
    for rec, op in ops:
        clients.wait(op, f"creating {rec.kind} {rec.name}")


def delete_now(clients: Clients, store: InventoryStore, inv: Inventory,
               recs: list[ResourceRecord], why: str) -> None:
    """Delete what an attempt made (and forget each one gone); ProvisionError if some of it
    stays (it stays recorded, so `down` finds it)."""
    failures = teardown.delete_records(clients, recs,
                                       on_deleted=lambda r: store.forget(inv, r.kind, r.id),
                                       cluster=inv.name)
    if failures:
        raise ProvisionError(f"could not clean up {why}: " + "; ".join(failures))
