"""Recovery (contract.Recoverable): whether a node's VM is gone, and a new VM in its place.

node_alive  instances.get: gone when Compute no longer has the VM (a Spot VM or one past its
            maxRunDuration is DELETEd) or it is stopping, stopped, suspended or terminated
            (host maintenance stops GPU VMs: they cannot live-migrate); alive otherwise, also
            when Compute cannot be asked (the recovery loop then tries an SSH login).
replace     the old VM is deleted FIRST and waited for: the cluster's COLLOCATED policy holds
            exactly vmCount = N VMs ("Placement policies": vmCount), and the new VM takes the
            old one's name. Then ONE VM by instances.insert (the same InstanceProperties as
            `up`'s bulkInsert, bodies.instance_body; read back by instances.get: a single
            insert and a get name the VM itself, which the controller's resource-name
            condition can allow, while a bulkInsert or a zone-wide list name only the zone),
            in the same zone, under the same policy, from the same boot image (recorded with
            each instance at `up`),
            with the same scheduling and a maxRunDuration of what is left of the cluster's
            --max-hours; the new VM's own host key is then read from Compute (hostkeys.py)
            and pinned. Recorded before the insert is sent, like every instance. A stockout is
            a CapacityError naming the zone; what the attempt recorded is deleted again
            (nothing half-made stays).
make_spare  (issue 44) one more VM the same way, NAME-node-S, under the same policy (its
            vmCount counted the spares at `up`); retire_node the lost VM's deletion alone
            (its rank went to a spare), done before the new spare is made so that the
            policy's vmCount still holds.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.gcp import bodies, hostkeys, teardown
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.create import node_record
from provision.cluster.providers.gcp.errors import ZoneCapacityError
from provision.cluster.providers.gcp.layout import (
    DEFAULT_MAX_HOURS,
    Layout,
    disk_type_for,
    region_of,
)
from provision.cluster.providers.gcp.options import GcpOptions
from provision.cluster.providers.gcp.writes import insert, request_id
from provision.cluster.providers.lifetime import remaining_seconds
from provision.model.errors import CapacityError, MgpuError, ProvisionError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.keys import ensure_cluster_key

GONE_STATUSES = frozenset({"STOPPING", "PENDING_STOP", "STOPPED", "SUSPENDING", "SUSPENDED",
                           "TERMINATED", "DEPROVISIONING"})
# Replacing a node is pointless when the cluster's --max-hours ends sooner than a new node
# could boot, bootstrap and train a little (and maxRunDuration must be >= 30 s).
MIN_REMAINING_S = 600


def _record_of(inv: Inventory, node: NodeRecord) -> ResourceRecord | None:
    return next((r for r in inv.resources_of(teardown.INSTANCE)
                 if r.name == node.resource_id and r.zone == node.zone), None)


def node_alive(clients: Clients, inv: Inventory, node: NodeRecord) -> bool:
    from google.cloud import compute_v1

    if not node.resource_id or not node.zone:
        return True
    rec = _record_of(inv, node)
    project = rec.extra.get("project", clients.project) if rec else clients.project
    inst = clients.call_or_none(clients.instances.get, compute_v1.GetInstanceRequest(
        project=project, zone=node.zone, instance=node.resource_id), f"looking up {node.name}")
    return inst is not None and str(inst.status) not in GONE_STATUSES


def replacement_layout(clients: Clients, inv: Inventory, node: NodeRecord, image: str | None,
                       seconds: int) -> Layout:
    """The cluster's Layout (what `up` made), for one VM in `node`'s zone that lives
    `seconds` more."""
    assert inv.spec is not None and node.zone is not None
    opts = inv.spec.options_as(GcpOptions)
    image_family = opts.image_family or ""
    if not image:  # an inventory from before images were recorded: the family's image now
        from provision.cluster.providers.gcp.images import resolve_image

        resolved = resolve_image(clients, opts.image_family, opts.image_project)
        image, image_family = resolved.self_link, resolved.family
    return Layout(
        cluster=inv.name, project=clients.project, region=region_of(node.zone),
        zones=[node.zone], nodes=len(inv.nodes), machine_type=opts.machine_type,
        gpus=(opts.accelerator_count or 1) if opts.accelerator_type else node.slots,
        accelerator_type=opts.accelerator_type, slots=node.slots, image=image,
        image_family=image_family, disk_gb=opts.disk_gb,
        disk_type=disk_type_for(opts.machine_type), spot=inv.spec.spot,
        flex_start=opts.flex_start, reservation=opts.reservation,
        max_hours=seconds / 3600, ssh_cidr=inv.spec.ssh_cidr or "(the cluster's)",
        training_image=inv.container_image,
    )


def _lifetime_left(inv: Inventory, node: NodeRecord) -> int:
    """Seconds left of the cluster's --max-hours; ProvisionError when too few for a node."""
    assert inv.spec is not None
    max_hours = inv.spec.max_hours or DEFAULT_MAX_HOURS
    left = remaining_seconds(inv, max_hours)
    if left < MIN_REMAINING_S:
        raise ProvisionError(
            f"not replacing {node.name}: the cluster's --max-hours {max_hours:g} ends in "
            f"{max(0, left)} s", hint="start a new cluster for the rest of the run")
    return left


def retire_node(clients: Clients, inv: Inventory, store: InventoryStore,
                node: NodeRecord) -> None:
    """`node`'s VM deleted and waited for (read first: deleted only if marked for the
    cluster), forgotten. ProvisionError when it could not be."""
    if not node.zone or not node.resource_id:
        return
    old = _record_of(inv, node) or teardown.instance_record(clients.project, node.zone,
                                                            node.resource_id)
    failures = teardown.delete_records(clients, [old],
                                       on_deleted=lambda r: store.forget(inv, r.kind, r.id),
                                       cluster=inv.name)
    if failures:
        raise ProvisionError(f"could not delete the VM of {node.name}: " + "; ".join(failures))


def replace_node(clients: Clients, inv: Inventory, store: InventoryStore,
                 node: NodeRecord) -> NodeRecord:
    if inv.spec is None or inv.spec.provider != "gcp" or not node.zone or not node.resource_id:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory does not say where "
                             f"{node.name} runs (spec, zone, instance)")
    left = _lifetime_left(inv, node)
    old = _record_of(inv, node) or teardown.instance_record(clients.project, node.zone,
                                                            node.resource_id)
    layout = replacement_layout(clients, inv, node, old.extra.get("image"), left)
    retire_node(clients, inv, store, node)
    new = _make(clients, inv, store, node, node.resource_id, layout)
    inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
    store.save(inv)
    return new


def make_spare(clients: Clients, inv: Inventory, store: InventoryStore,
               spare: NodeRecord) -> NodeRecord:
    """One more VM like the cluster's (issue 44), VM NAME-node-S (S: the spare's number), in
    the zone of `spare` (the lost node's), from the image the cluster's VMs there were made
    from; nothing deleted, inv.nodes untouched."""
    if inv.spec is None or inv.spec.provider != "gcp" or not spare.zone:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory does not say where a "
                             "spare would run (spec, zone)")
    like = next((r for r in inv.resources_of(teardown.INSTANCE) if r.zone == spare.zone), None)
    layout = replacement_layout(clients, inv, spare, like.extra.get("image") if like else None,
                                _lifetime_left(inv, spare))
    return _make(clients, inv, store, spare, layout.instance_name(spare.rank), layout)


def _make(clients: Clients, inv: Inventory, store: InventoryStore, node: NodeRecord,
          name: str, layout: Layout) -> NodeRecord:
    """VM `name` for `node`'s rank (or spare number), its host key read and pinned; a
    stockout is a CapacityError naming the zone, and what the attempt recorded is deleted."""
    assert node.zone is not None
    zone = node.zone
    _, login_public = ensure_cluster_key(store.keys_dir(inv.name))
    rec = teardown.instance_record(clients.project, zone, name, layout.image)
    try:
        inst = _insert_one(clients, store, inv, layout, zone, name, login_public)
        keys = hostkeys.read_host_keys(clients, zone, {name: node.name})
    except ZoneCapacityError as exc:
        _undo(clients, inv, store, rec)
        raise CapacityError(
            f"no capacity to replace {node.name}: {zone} has no {layout.machine_type}"
            f"{' (spot)' if layout.spot else ''} for placement policy "
            f"{layout.policy_name} now ({', '.join(sorted(set(exc.codes)))})",
            hint="the run cannot go on with this node; try again later (`mgpu-cloud "
            f"launch {inv.name} ...` restarts from the last checkpoint) or recreate the "
            "cluster in another zone") from exc
    except MgpuError:
        _undo(clients, inv, store, rec)
        raise
    return node_record(node.rank, inst, zone, node.slots, keys[name])


def _insert_one(clients: Clients, store: InventoryStore, inv: Inventory, layout: Layout,
                zone: str, name: str, login_public: str) -> Any:
    """ONE VM (recorded first), waited for and read back. ZoneCapacityError when the zone
    has no capacity now."""
    from google.cloud import compute_v1

    rec = teardown.instance_record(clients.project, zone, name, layout.image)
    op = insert(clients, store, inv, [rec], clients.instances.insert_unary,
                compute_v1.InsertInstanceRequest(
                    project=clients.project, zone=zone, request_id=request_id(),
                    instance_resource=bodies.instance_body(layout, login_public, name, zone)))
    clients.wait(op, f"creating {name} ({layout.machine_type}) in {zone}")
    return clients.call(clients.instances.get, compute_v1.GetInstanceRequest(
        project=clients.project, zone=zone, instance=name), f"reading {name} in {zone}")


def _undo(clients: Clients, inv: Inventory, store: InventoryStore, rec: ResourceRecord) -> None:
    """Delete what a failed replacement made (a VM that came up halfway); forget it once gone.
    What cannot be deleted stays recorded, so `down` deletes it. A record `_insert` dropped
    (the name belongs to a VM that is not ours) is left alone."""
    if any((r.kind, r.id) == (rec.kind, rec.id) for r in inv.resources):
        teardown.delete_records(clients, [rec],
                                on_deleted=lambda r: store.forget(inv, r.kind, r.id),
                                cluster=inv.name)
