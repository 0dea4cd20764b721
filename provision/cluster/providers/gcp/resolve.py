"""Resolve a ClusterSpec against Compute Engine with read-only calls into a Layout.

Everything that can fail is checked here, before a write: project, zone, machine type and
accelerator type (where they are offered), how the type is bought (layout.check_purchase), the
reservation (its zone, machine type and free count), the NETWORKS quota for GPUDirect's data
networks, the boot image (images.py), the SSH CIDR.

Requests (every one a GET): regions.get (the zone exists), ONE machineTypes.aggregatedList
filtered by name (every zone offering the type, in every region: the failover zones and
--regions come from it), one acceleratorTypes.aggregatedList for N1 guest GPUs, the image
family look-ups, projects.get for GPUDirect (quota), reservations.get or aggregatedList with
--reservation.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.gcp.catalog import cluster_cost
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.images import resolve_image, training_image_of
from provision.cluster.providers.gcp.layout import (
    DEFAULT_MAX_HOURS,
    DEFAULT_ZONE,
    Layout,
    RegionZones,
    check_purchase,
    disk_type_for,
    region_of,
)
from provision.cluster.providers.gcp.options import ANY_REGION, GcpOptions
from provision.model.errors import ProviderUnavailableError, UserInputError
from provision.model.spec import ClusterSpec, validate_cidr

READ = ProviderUnavailableError


def _offering_zones(clients: Clients, kind: str, name: str) -> dict[str, Any]:
    """zone -> the machine type (kind "machine_types") or accelerator type
    ("accelerator_types") `name`, for every zone of the project that offers it: one call."""
    from google.cloud import compute_v1

    what = f"listing the zones that offer {name}"
    if kind == "machine_types":
        method, request = clients.machine_types.aggregated_list, \
            compute_v1.AggregatedListMachineTypesRequest(project=clients.project,
                                                         filter=f'name = "{name}"')
    else:
        method, request = clients.accelerator_types.aggregated_list, \
            compute_v1.AggregatedListAcceleratorTypesRequest(project=clients.project,
                                                             filter=f'name = "{name}"')
    out: dict[str, Any] = {}
    for scope, scoped in clients.iterate(clients.call(method, request, what, READ), what, READ):
        for item in getattr(scoped, kind):
            if item.name == name:
                out[scope.rsplit("/", 1)[-1]] = item
    return out


def _region_zones(clients: Clients, zone: str) -> list[str]:
    from google.cloud import compute_v1

    region = region_of(zone)
    found = clients.call_or_none(clients.regions.get, compute_v1.GetRegionRequest(
        project=clients.project, region=region), f"looking up region {region}", READ)
    zones = sorted(z.rsplit("/", 1)[-1] for z in (found.zones if found else []))
    if zone not in zones:
        raise UserInputError(
            f"unknown zone {zone!r} in project {clients.project!r}",
            hint="pick one from `gcloud compute zones list`, e.g. --zone us-central1-a")
    return zones


def _gpus(opts: GcpOptions, mt: Any) -> tuple[int, str | None]:
    """(GPUs per VM, guest accelerator type or None)."""
    bundled = sum(int(a.guest_accelerator_count) for a in mt.accelerators)
    if bundled:
        if opts.accelerator_type:
            raise UserInputError(
                f"machine type {opts.machine_type} already has {bundled} GPU(s); "
                "accelerator_type cannot be added to it",
                hint="remove gcp.accelerator_type, or use an N1 machine type with guest GPUs")
        return bundled, None
    if not opts.accelerator_type:
        raise UserInputError(
            f"machine type {opts.machine_type} has no GPUs",
            hint="use a GPU machine type (--machine-type a2-ultragpu-8g), or attach GPUs "
            "with `gcp: {accelerator_type: nvidia-tesla-t4, accelerator_count: 1}`")
    return opts.accelerator_count or 1, opts.accelerator_type


def _reservation(clients: Clients, name: str, zone: str | None) -> Any:
    """The Reservation `name` (NAME or projects/P/reservations/NAME), in `zone` or wherever it
    is. UserInputError when there is none."""
    from google.cloud import compute_v1

    project, short = clients.project, name
    if name.startswith("projects/"):
        project, short = name.split("/")[1], name.rsplit("/", 1)[-1]
    what = f"looking up reservation {name}"
    if zone:
        found = clients.call_or_none(clients.reservations.get, compute_v1.GetReservationRequest(
            project=project, zone=zone, reservation=short), what, READ)
    else:
        agg = clients.call(clients.reservations.aggregated_list,
                           compute_v1.AggregatedListReservationsRequest(
                               project=project, filter=f'name = "{short}"'), what, READ)
        found = next((r for _scope, scoped in clients.iterate(agg, what, READ)
                      for r in scoped.reservations if r.name == short), None)
    if found is None:
        where = f"zone {zone}" if zone else f"project {project}"
        raise UserInputError(f"no reservation {short!r} in {where}",
                             hint="list them with `gcloud compute reservations list`; a "
                             "reservation shared from another project is named "
                             "projects/PROJECT/reservations/NAME")
    return found


def _check_reservation(res: Any, name: str, machine_type: str, nodes: int) -> str:
    """The reservation's zone, once it is known to hold `nodes` x `machine_type`."""
    spec = res.specific_reservation
    reserved = str(spec.instance_properties.machine_type).rsplit("/", 1)[-1]
    if reserved != machine_type:
        raise UserInputError(
            f"reservation {name} holds {reserved or 'no machine type'}, not {machine_type}",
            hint=f"pass --machine-type {reserved}" if reserved else None)
    free = int(spec.count) - int(spec.in_use_count)
    if str(res.status) not in ("READY", ""):
        raise UserInputError(f"reservation {name} is {res.status}, not READY",
                             hint="wait until it is READY (`gcloud compute reservations "
                             "describe`)")
    if free < nodes:
        raise UserInputError(
            f"reservation {name} has {free} of {int(spec.count)} VMs free; {nodes} needed",
            hint=f"use --nodes {free} or fewer, or free VMs of the reservation")
    return str(res.zone).rsplit("/", 1)[-1]


def _check_networks_quota(clients: Clients, needed: int, machine_type: str) -> None:
    """GPUDirect makes `needed` VPC networks: the project's NETWORKS quota must hold them
    ("VPC quotas": networks per project, https://cloud.google.com/vpc/docs/quota; Project.quotas,
    metric NETWORKS, Compute API reference)."""
    from google.cloud import compute_v1

    project = clients.call(clients.projects.get, compute_v1.GetProjectRequest(
        project=clients.project), f"reading the quotas of project {clients.project}", READ)
    quota = next((q for q in project.quotas if str(q.metric) == "NETWORKS"), None)
    if quota is None:
        return
    free = int(quota.limit - quota.usage)
    if free < needed:
        raise UserInputError(
            f"{machine_type} on several nodes needs {needed} extra VPC networks (GPUDirect data "
            f"NICs), but project {clients.project!r} has {free} of its NETWORKS quota left "
            f"({int(quota.usage)} of {int(quota.limit)} used)",
            hint=f"request a NETWORKS quota of at least {int(quota.usage) + needed} "
            "(https://console.cloud.google.com/iam-admin/quotas, metric NETWORKS), or delete "
            "unused networks (`gcloud compute networks list`)")


def _regions_after(opts: GcpOptions, spec: ClusterSpec, region: str, offered: dict[str, Any],
                   gpus: int, accelerator: str | None) -> list[RegionZones]:
    """--regions: the other regions to try, in order, with the zones offering the type."""
    if not opts.regions:
        return []
    by_region: dict[str, list[str]] = {}
    for z in sorted(offered):
        by_region.setdefault(region_of(z), []).append(z)
    wanted = sorted(by_region) if opts.regions == [ANY_REGION] else opts.regions
    missing = [r for r in wanted if r not in by_region and r != region]
    if missing and opts.regions != [ANY_REGION]:
        raise UserInputError(
            f"--regions: {', '.join(missing)} offer(s) no {opts.machine_type}"
            f"{' with ' + accelerator if accelerator else ''} to this project",
            hint="leave them out, or use --regions any")
    out = []
    for r in wanted:
        if r == region or r not in by_region:
            continue
        cost = cluster_cost(opts.machine_type, accelerator, gpus, spec.nodes, opts.disk_gb,
                            spec.spot, disk_type_for(opts.machine_type), region=r)
        out.append(RegionZones(region=r, zones=by_region[r],
                               price_usd_hour=None if cost.unpriced else cost.usd_per_hour))
    return out


def resolve(spec: ClusterSpec, clients: Clients, ssh_cidr: str) -> Layout:
    """Validate `spec` with read-only calls. Raises UserInputError naming the bad input."""
    opts = spec.options_as(GcpOptions)
    check_purchase(opts.machine_type, spot=spec.spot, flex_start=opts.flex_start,
                   reservation=opts.reservation, max_hours=spec.max_hours,
                   guest_gpus=opts.accelerator_type is not None)
    if opts.reservation and opts.regions:
        raise UserInputError("--regions cannot be combined with --reservation: a reservation "
                             "is in one zone", hint="drop --regions")
    zone = opts.zone
    reservation = _reservation(clients, opts.reservation, zone) if opts.reservation else None
    if reservation is not None:
        zone = _check_reservation(reservation, opts.reservation or "", opts.machine_type,
                                  spec.nodes)
    zone = zone or DEFAULT_ZONE
    region = region_of(zone)
    region_zones = _region_zones(clients, zone)
    offered = _offering_zones(clients, "machine_types", opts.machine_type)
    if zone not in offered:
        raise UserInputError(
            f"machine type {opts.machine_type!r} does not exist in zone {zone}",
            hint=f"see `gcloud compute machine-types list --zones {zone}`; GPU types are "
            "e.g. a2-ultragpu-8g, a2-highgpu-8g, a3-highgpu-8g")
    gpus, accelerator = _gpus(opts, offered[zone])
    if accelerator is not None:
        with_acc = _offering_zones(clients, "accelerator_types", accelerator)
        offered = {z: mt for z, mt in offered.items() if z in with_acc}
        if zone not in offered:
            raise UserInputError(
                f"accelerator type {accelerator!r} does not exist in zone {zone}",
                hint=f"see `gcloud compute accelerator-types list --filter zone:{zone}`")
    failover = [] if reservation is not None else [
        z for z in region_zones if z != zone and z in offered]
    layout = Layout(
        cluster=spec.name, project=clients.project, region=region, zones=[zone, *failover],
        nodes=spec.nodes, machine_type=opts.machine_type, gpus=gpus,
        accelerator_type=accelerator, slots=spec.gpus_per_node or gpus, image="(pending)",
        image_family="", disk_gb=opts.disk_gb, disk_type=disk_type_for(opts.machine_type),
        spot=spec.spot, flex_start=opts.flex_start, reservation=opts.reservation,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS, ssh_cidr=validate_cidr(ssh_cidr),
        regions_after=_regions_after(opts, spec, region, offered, gpus, accelerator),
    )
    stack = layout.gpu_direct
    if stack is not None:
        _check_networks_quota(clients, stack.nic_count, opts.machine_type)
    image = resolve_image(clients, opts.image_family, opts.image_project)
    gpu_model = accelerator or next(
        (str(a.guest_accelerator_type) for a in offered[zone].accelerators), None)
    return layout.model_copy(update={"image": image.self_link, "image_family": image.family,
                                     "image_tried": image.tried,
                                     **training_image_of(spec, gpu_model, opts.machine_type)})
