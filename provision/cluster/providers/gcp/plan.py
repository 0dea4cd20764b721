"""The GCP plan: a Layout (layout.py; resolve.py makes it with read-only calls) as a printable,
typed Plan, and the same plan without Compute (no credentials) from the shipped catalog.

`layout_to_plan` is pure: the GcpPlan carries the Layout itself, so `create` makes exactly what
was printed. `offline_layout` lists what needs Compute as unresolved; such a plan is printed,
never created.
"""

from __future__ import annotations

from provision.cluster.providers.gcp.catalog import (
    catalog,
    cluster_cost,
    gpu_machine_types,
    known_gpus,
)
from provision.cluster.providers.gcp.gpudirect import DATA_MTU
from provision.cluster.providers.gcp.images import DEFAULT_IMAGE_FAMILIES, training_image_of
from provision.cluster.providers.gcp.layout import (
    DEFAULT_MAX_HOURS,
    DEFAULT_ZONE,
    NETWORK,
    UNRESOLVED,
    Layout,
    RegionZones,
    check_purchase,
    disk_type_for,
    region_of,
)
from provision.cluster.providers.gcp.options import GcpOptions
from provision.model.errors import UserInputError
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

__all__ = ["DEFAULT_MAX_HOURS", "DEFAULT_ZONE", "NETWORK", "GcpPlan", "Layout", "RegionZones",
           "layout_to_plan", "offline_layout", "region_of"]

POLICY = "resource-policy"
FIREWALL = "firewall"
INSTANCE = "instance"
NETWORK_KIND = "network"
SUBNETWORK = "subnetwork"


class GcpPlan(Plan):
    layout: Layout


# --- without Compute (no credentials) -------------------------------------------------------
def offline_layout(spec: ClusterSpec, project: str | None, ssh_cidr: str | None,
                   why: str) -> tuple[Layout, list[str]]:
    """The Layout from the shipped catalog alone, and what could not be resolved (`why`:
    the reason Compute could not be asked). Never created."""
    opts = spec.options_as(GcpOptions)
    zone = opts.zone or DEFAULT_ZONE
    region = region_of(zone)
    facts = known_gpus(opts.machine_type)
    if facts is None:
        raise UserInputError(
            f"machine type {opts.machine_type!r} is not in the offline catalog, and without "
            "Compute Engine it cannot be looked up",
            hint=f"{why}; or use one of: {', '.join(gpu_machine_types())}",
        )
    bundled, gpus = facts
    accelerator = None
    if not gpus:
        if not opts.accelerator_type:
            raise UserInputError(f"machine type {opts.machine_type} has no GPUs",
                                 hint="use a GPU machine type, e.g. a2-ultragpu-8g")
        accelerator, gpus = opts.accelerator_type, opts.accelerator_count or 1
    check_purchase(opts.machine_type, spot=spec.spot, flex_start=opts.flex_start,
                   reservation=opts.reservation, max_hours=spec.max_hours,
                   guest_gpus=accelerator is not None)
    family = opts.image_family or DEFAULT_IMAGE_FAMILIES[0]
    unresolved = [
        f"boot image (family {family}{'' if opts.image_family else ' or a fallback'}: {why})",
        f"zone {zone} and the failover zones offering {opts.machine_type} ({why})",
    ]
    if opts.regions:
        unresolved.append(f"the zones of --regions {','.join(opts.regions)} ({why})")
    if opts.reservation:
        unresolved.append(f"reservation {opts.reservation}: its zone and free count ({why})")
    if not project:
        unresolved.insert(0, "project (pass --project)")
    if ssh_cidr is None:
        unresolved.append("SSH source range (this machine's address is unknown: pass "
                          "--ssh-cidr)")
    layout = Layout(
        cluster=spec.name, project=project or UNRESOLVED, region=region, zones=[zone],
        nodes=spec.nodes, machine_type=opts.machine_type, gpus=gpus,
        accelerator_type=accelerator, slots=spec.gpus_per_node or gpus, image=UNRESOLVED,
        image_family=family, disk_gb=opts.disk_gb, disk_type=disk_type_for(opts.machine_type),
        spot=spec.spot, flex_start=opts.flex_start, reservation=opts.reservation,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS, ssh_cidr=ssh_cidr or UNRESOLVED,
        **training_image_of(spec, accelerator or bundled, opts.machine_type),
    )
    return layout, unresolved


# --- Layout <-> Plan (pure) ---------------------------------------------------------------
def _network_resources(l_: Layout) -> list[PlannedResource]:
    ssh_fw, internal_fw = l_.firewall_names
    resources = []
    if l_.placement_policy:
        resources.append(PlannedResource(kind=POLICY, name=l_.policy_name, details={
            "project": l_.project, "region": l_.region, "collocation": "COLLOCATED",
            "vm_count": str(l_.nodes), "zones": ",".join(l_.zones),
        }))
    resources += [
        PlannedResource(kind=FIREWALL, name=ssh_fw, details={
            "allow": "tcp:22", "source_ranges": l_.ssh_cidr, "target_tag": l_.tag,
        }),
        PlannedResource(kind=FIREWALL, name=internal_fw, details={
            "allow": "all", "source_tag": l_.tag, "target_tag": l_.tag,
        }),
    ]
    for net in l_.data_networks:
        resources += [
            PlannedResource(kind=NETWORK_KIND, name=net.name, details={
                "mtu": str(DATA_MTU), "subnets": "custom"}),
            PlannedResource(kind=SUBNETWORK, name=net.name, details={
                "region": l_.region, "range": net.cidr}),
            PlannedResource(kind=FIREWALL, name=net.firewall, details={
                "network": net.name, "allow": "tcp,udp,icmp", "source_ranges": net.cidr}),
        ]
    return resources


def _instance_resources(l_: Layout) -> list[PlannedResource]:
    out = []
    for rank in range(l_.nodes):
        details = {
            "zone": l_.zones[0], "machine_type": l_.machine_type, "gpus": str(l_.gpus),
            "slots": str(l_.slots), "image": l_.image, "image_family": l_.image_family,
            "training_image": l_.training_image,
            "disk_gb": str(l_.disk_gb), "disk_type": l_.disk_type,
            "provisioning": l_.provisioning_model,
            "max_run_hours": f"{l_.max_hours:g}", "external_ip": "yes (egress and SSH)",
        }
        if l_.reservation:
            details["reservation"] = l_.reservation
        if l_.accelerator_type:
            details["accelerator"] = l_.accelerator_type
        if l_.data_networks:
            details["data_nics"] = ",".join(n.name for n in l_.data_networks)
        out.append(PlannedResource(kind=INSTANCE, name=l_.instance_name(rank), details=details))
    return out


def _where_notes(l_: Layout, usd_hour: float) -> list[str]:
    """Where `up` tries, in which order, at what price."""
    placed = ("under a COLLOCATED placement policy" if l_.placement_policy else
              f"placed by {'the reservation' if l_.reservation else 'DWS (flex-start)'}, "
              "no placement policy")
    notes = [f"all {l_.nodes} nodes are created by one bulkInsert (minCount {l_.nodes}: all or "
             f"none) in one zone {placed}; zones tried in order: {', '.join(l_.zones)}"]
    if l_.regions_after:
        parts = [f"{l_.region} ({', '.join(l_.zones)}; ${usd_hour:.2f}/h)"]
        for r in l_.regions_after:
            price = (f"${r.price_usd_hour:.2f}/h" if r.price_usd_hour is not None
                     else "price not in the catalog")
            parts.append(f"{r.region} ({', '.join(r.zones)}; {price})")
        notes.append("--regions: regions tried in order when one has no capacity: "
                     + " -> ".join(parts) + "; catalog prices are us-central1 list prices, "
                     "other regions often differ by 10-25%")
    return notes


def _purchase_notes(l_: Layout, max_hours_defaulted: bool) -> list[str]:
    if l_.provisioning_model == "RESERVATION_BOUND":
        notes = [f"the VMs are bound to reservation {l_.reservation}: its end deletes them; "
                 "the reservation is billed whether or not they run (the price shown is the "
                 "on-demand list price of what runs)"]
    else:
        notes = [f"the cloud deletes every node after {l_.max_hours:g} h (maxRunDuration, "
                 "DELETE)" + (" — default; set --max-hours to change it"
                             if max_hours_defaulted else "")]
    if l_.reservation and l_.provisioning_model == "STANDARD":
        notes.append(f"the VMs consume reservation {l_.reservation} (SPECIFIC_RESERVATION), "
                     "which is billed whether or not they run")
    if l_.flex_start:
        # compute_v1: the wait (InstanceParams.request_valid_for_duration) is a field of
        # instances.insert's Instance only; bulkInsert's BulkInsertInstanceResource and
        # InstanceProperties have none, so a flex-start bulkInsert is never queued
        notes.append("flex-start (DWS): the nodes come from one bulkInsert, which does not "
                     "queue for capacity (only a single-VM insert can wait): Compute gives "
                     "all nodes at once or answers with a stockout, and `up` moves on to the "
                     "next zone at once; flex-start prices are discounted and not in the "
                     "catalog: the cost shown is the on-demand upper bound")
    if l_.spot:
        notes.append("spot VMs: the cloud may delete them at any time (preemption)")
    return notes


def layout_to_plan(layout: Layout, *, max_hours_defaulted: bool,
                   unresolved: list[str] | None = None) -> GcpPlan:
    l_ = layout
    resources = _network_resources(l_) + _instance_resources(l_)
    cost = cluster_cost(l_.machine_type, l_.accelerator_type, l_.gpus, l_.nodes, l_.disk_gb,
                        l_.spot, l_.disk_type)
    ip = catalog()["external_ipv4_hour"]
    notes = _where_notes(l_, cost.usd_per_hour) + _purchase_notes(l_, max_hours_defaulted) + [
        f"network {NETWORK}; SSH (tcp/22) open to {l_.ssh_cidr} only",
        "internet: every node has an external IPv4 address on the default network "
        f"(${ip['spot' if l_.spot else 'standard']:g}/h each, included in the cost)",
        f"boot image {l_.image.rsplit('/', 1)[-1]} from family {l_.image_family}"
        + (f" (skipped: {'; '.join(l_.image_tried)})" if l_.image_tried else ""),
        "host keys: each VM makes its own; `up` reads their public halves from Compute "
        "(guest attributes) and pins them before the first SSH connection",
    ]
    notes += _fabric_notes(l_)
    return GcpPlan(
        provider="gcp",
        cluster=l_.cluster,
        nodes=l_.nodes,
        slots_per_node=l_.slots,
        resources=resources,
        hourly_cost_usd=cost.usd_per_hour,
        node_hourly_usd=None if cost.unpriced else round(cost.usd_per_hour / l_.nodes, 4),
        max_hours=l_.max_hours,
        price_source="; ".join(cost.sources),
        notes=notes,
        unpriced=cost.unpriced,
        unresolved=unresolved or [],
        layout=layout,
    )


# Machine types whose GPUs talk over GPUDirect RDMA (RoCE, gIB: "A3 Ultra and A4 machine
# types", Compute docs / Cluster Toolkit's a3-ultragpu and a4-highgpu blueprints), which
# mgpu-cloud does not set up
RDMA_TYPES = ("a3-ultragpu-", "a4-highgpu-", "a4x-")


def _fabric_notes(l_: Layout) -> list[str]:
    """What the plan does for the machine type's GPU network, and what is not verified."""
    stack = l_.gpu_direct
    if stack is None:
        if l_.machine_type in ("a3-highgpu-8g", "a3-megagpu-8g"):
            return [f"{l_.machine_type} on one node: no GPUDirect set-up (no traffic between "
                    "nodes)"]
        if l_.machine_type.startswith(RDMA_TYPES) and l_.nodes > 1:
            return [f"{l_.machine_type}: GPUDirect RDMA (its RoCE VPC network, the gIB NCCL "
                    "plugin) is NOT set up by mgpu-cloud: NCCL between the nodes uses TCP over "
                    "the primary gVNIC, far below the machine's RDMA fabric; where the fabric "
                    "gate has a row for the type it stops multi-node launches "
                    "(--fabric-check off or --allow-slow-network to run anyway)"]
        return []
    flavour = "GPUDirect-TCPX" if stack.name == "tcpx" else "GPUDirect-TCPXO"
    return [
        f"{flavour}: {stack.nic_count} extra gVNIC data NICs, each in its own VPC network "
        f"(MTU {DATA_MTU}) with one subnet and one firewall rule; every node's startup script "
        f"installs the NCCL plugin ({stack.plugin_image.rsplit('/', 1)[-1]}) and starts the "
        f"receive-datapath manager ({stack.rxdm_image.rsplit('/', 1)[-1]}); jobs run with the "
        f"plugin's NCCL preset",
        f"{flavour} is NOT verified by mgpu-cloud's tests (no real A3 VMs): it needs a boot "
        "image whose kernel supports it (the default Deep Learning VM image is not known to; "
        "build one with Cluster Toolkit's A3 blueprint and pass --image-family/"
        "--image-project); the node finds its data NICs by PCI address (named e.g. "
        f"{stack.data_nics[0]} or {stack.data_nics[0]}f0 depending on the image); a node whose "
        "set-up failed says why "
        "in /var/log/mgpu-cloud-gpudirect.log, and the fabric gate stops a launch that falls "
        "back to sockets",
    ]
