"""Resolve a ClusterSpec against Compute Engine (read-only calls) into a Layout and a Plan.

`resolve` validates everything that can fail before a write: project, zone, machine type,
accelerator type, boot image (images.py: a current Deep Learning VM family, with fallbacks),
SSH CIDR. `offline_layout` is the same plan without Compute (no credentials): facts from the
shipped catalog, what needs Compute listed as unresolved; it is printed, never created.
`layout_to_plan` is pure: the GcpPlan carries the Layout itself, so `create` makes exactly
what was printed.
"""

from __future__ import annotations

import re
from typing import Any

from provision.cluster.providers.gcp.catalog import (
    catalog,
    cluster_cost,
    gpu_machine_types,
    known_gpus,
)
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.errors import map_errors
from provision.cluster.providers.gcp.gpudirect import (
    DATA_MTU,
    DataNetwork,
    Stack,
    data_networks,
    stack_for,
)
from provision.cluster.providers.gcp.images import DEFAULT_IMAGE_FAMILIES, resolve_image
from provision.cluster.providers.gcp.options import GcpOptions
from provision.model.base import StrictModel
from provision.model.errors import ProviderUnavailableError, UserInputError
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec, validate_cidr

DEFAULT_ZONE = "us-central1-a"
DEFAULT_MAX_HOURS = 8.0
NETWORK = "global/networks/default"
ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
UNRESOLVED = "(unresolved)"

POLICY = "resource-policy"
FIREWALL = "firewall"
INSTANCE = "instance"
NETWORK_KIND = "network"
SUBNETWORK = "subnetwork"


class Layout(StrictModel):
    """Everything `create` needs, resolved and validated."""

    cluster: str
    project: str
    region: str
    zones: list[str]  # zones[0] first, the others on capacity errors, in this order
    nodes: int
    machine_type: str
    gpus: int  # GPUs per VM (bundled or guest)
    accelerator_type: str | None  # guest accelerator; None when the machine type bundles GPUs
    slots: int
    image: str  # image self link; UNRESOLVED in an offline plan
    image_family: str
    image_tried: list[str] = []  # families skipped before image_family, and why
    disk_gb: int
    spot: bool
    max_hours: float
    ssh_cidr: str

    @property
    def tag(self) -> str:
        return f"mgpu-cloud-{self.cluster}"

    @property
    def policy_name(self) -> str:
        return f"{self.cluster}-compact"

    @property
    def firewall_names(self) -> tuple[str, str]:
        return f"{self.cluster}-ssh", f"{self.cluster}-internal"

    def instance_name(self, rank: int) -> str:
        return f"{self.cluster}-node-{rank}"

    @property
    def max_run_seconds(self) -> int:
        return int(round(self.max_hours * 3600))

    @property
    def gpu_direct(self) -> Stack | None:
        """GPUDirect-TCPX / TCPXO (gpudirect.py) for multi-node a3-highgpu / a3-megagpu."""
        return stack_for(self.machine_type, self.nodes)

    @property
    def data_networks(self) -> list[DataNetwork]:
        """The data NICs' VPC networks (each with a subnet and a firewall rule), in NIC
        order; [] without GPUDirect."""
        stack = self.gpu_direct
        return data_networks(self.cluster, stack) if stack is not None else []


class GcpPlan(Plan):
    layout: Layout


def region_of(zone: str) -> str:
    match = ZONE_RE.match(zone)
    if not match:
        raise UserInputError(
            f"{zone!r} is not a Compute Engine zone name",
            hint="zones look like us-central1-a; list them with `gcloud compute zones list`",
        )
    return match.group(1)


# --- resolve (read-only API calls) --------------------------------------------------------
def _get_or_none(clients: Clients, method: Any, request: Any, action: str) -> Any:
    with map_errors(action, ProviderUnavailableError):
        return clients.call_or_none(method, request)


def _zone_offers(clients: Clients, zone: str, machine_type: str, accelerator: str | None) -> Any:
    """The MachineType in `zone` (None when the zone lacks it or the accelerator)."""
    from google.cloud import compute_v1

    mt = _get_or_none(
        clients, clients.machine_types.get,
        compute_v1.GetMachineTypeRequest(project=clients.project, zone=zone,
                                         machine_type=machine_type),
        f"looking up machine type {machine_type} in {zone}",
    )
    if mt is None or accelerator is None:
        return mt
    acc = _get_or_none(
        clients, clients.accelerator_types.get,
        compute_v1.GetAcceleratorTypeRequest(project=clients.project, zone=zone,
                                             accelerator_type=accelerator),
        f"looking up accelerator type {accelerator} in {zone}",
    )
    return mt if acc is not None else None


def resolve(spec: ClusterSpec, clients: Clients, ssh_cidr: str) -> Layout:
    """Validate `spec` with read-only calls. Raises UserInputError naming the bad input."""
    from google.cloud import compute_v1

    opts = spec.options_as(GcpOptions)
    zone = opts.zone or DEFAULT_ZONE
    region = region_of(zone)
    region_obj = _get_or_none(
        clients, clients.regions.get,
        compute_v1.GetRegionRequest(project=clients.project, region=region),
        f"looking up region {region}",
    )
    region_zones = sorted(z.rsplit("/", 1)[-1] for z in (region_obj.zones if region_obj else []))
    if zone not in region_zones:
        raise UserInputError(
            f"unknown zone {zone!r} in project {clients.project!r}",
            hint="pick one from `gcloud compute zones list`, e.g. --zone us-central1-a",
        )
    mt = _zone_offers(clients, zone, opts.machine_type, None)
    if mt is None:
        raise UserInputError(
            f"machine type {opts.machine_type!r} does not exist in zone {zone}",
            hint=f"see `gcloud compute machine-types list --zones {zone}`; GPU types are "
            "e.g. a2-ultragpu-8g, a2-highgpu-8g, a3-highgpu-8g",
        )
    bundled = sum(int(a.guest_accelerator_count) for a in mt.accelerators)
    accelerator: str | None = None
    if bundled:
        if opts.accelerator_type:
            raise UserInputError(
                f"machine type {opts.machine_type} already has {bundled} GPU(s); "
                "accelerator_type cannot be added to it",
                hint="remove gcp.accelerator_type, or use an N1 machine type with guest GPUs",
            )
        gpus = bundled
    else:
        if not opts.accelerator_type:
            raise UserInputError(
                f"machine type {opts.machine_type} has no GPUs",
                hint="use a GPU machine type (--machine-type a2-ultragpu-8g), or attach GPUs "
                "with `gcp: {accelerator_type: nvidia-tesla-t4, accelerator_count: 1}`",
            )
        accelerator = opts.accelerator_type
        gpus = opts.accelerator_count or 1
        if _zone_offers(clients, zone, opts.machine_type, accelerator) is None:
            raise UserInputError(
                f"accelerator type {accelerator!r} does not exist in zone {zone}",
                hint=f"see `gcloud compute accelerator-types list --filter zone:{zone}`",
            )
    failover = [
        z for z in region_zones
        if z != zone and _zone_offers(clients, z, opts.machine_type, accelerator) is not None
    ]
    image = resolve_image(clients, opts.image_family, opts.image_project)
    return Layout(
        cluster=spec.name,
        project=clients.project,
        region=region,
        zones=[zone, *failover],
        nodes=spec.nodes,
        machine_type=opts.machine_type,
        gpus=gpus,
        accelerator_type=accelerator,
        slots=spec.gpus_per_node or gpus,
        image=image.self_link,
        image_family=image.family,
        image_tried=image.tried,
        disk_gb=opts.disk_gb,
        spot=spec.spot,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS,
        ssh_cidr=validate_cidr(ssh_cidr),
    )


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
    _bundled, gpus = facts
    accelerator = None
    if not gpus:
        if not opts.accelerator_type:
            raise UserInputError(f"machine type {opts.machine_type} has no GPUs",
                                 hint="use a GPU machine type, e.g. a2-ultragpu-8g")
        accelerator, gpus = opts.accelerator_type, opts.accelerator_count or 1
    family = opts.image_family or DEFAULT_IMAGE_FAMILIES[0]
    unresolved = [
        f"boot image (family {family}{'' if opts.image_family else ' or a fallback'}: {why})",
        f"zone {zone} and the failover zones offering {opts.machine_type} ({why})",
    ]
    if not project:
        unresolved.insert(0, "project (pass --project)")
    if ssh_cidr is None:
        unresolved.append("SSH source range (this machine's address is unknown: pass "
                          "--ssh-cidr)")
    layout = Layout(
        cluster=spec.name, project=project or UNRESOLVED, region=region, zones=[zone],
        nodes=spec.nodes, machine_type=opts.machine_type, gpus=gpus,
        accelerator_type=accelerator, slots=spec.gpus_per_node or gpus, image=UNRESOLVED,
        image_family=family, disk_gb=opts.disk_gb, spot=spec.spot,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS, ssh_cidr=ssh_cidr or UNRESOLVED,
    )
    return layout, unresolved


# --- Layout <-> Plan (pure) ---------------------------------------------------------------
def layout_to_plan(layout: Layout, *, max_hours_defaulted: bool,
                   unresolved: list[str] | None = None) -> GcpPlan:
    l_ = layout
    ssh_fw, internal_fw = l_.firewall_names
    resources = [
        PlannedResource(kind=POLICY, name=l_.policy_name, details={
            "project": l_.project, "region": l_.region, "collocation": "COLLOCATED",
            "vm_count": str(l_.nodes), "zones": ",".join(l_.zones),
        }),
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
    for rank in range(l_.nodes):
        details = {
            "zone": l_.zones[0], "machine_type": l_.machine_type, "gpus": str(l_.gpus),
            "slots": str(l_.slots), "image": l_.image, "image_family": l_.image_family,
            "disk_gb": str(l_.disk_gb), "provisioning": "SPOT" if l_.spot else "STANDARD",
            "max_run_hours": f"{l_.max_hours:g}", "external_ip": "yes (egress and SSH)",
        }
        if l_.accelerator_type:
            details["accelerator"] = l_.accelerator_type
        if l_.data_networks:
            details["data_nics"] = ",".join(n.name for n in l_.data_networks)
        resources.append(PlannedResource(kind=INSTANCE, name=l_.instance_name(rank),
                                         details=details))
    cost = cluster_cost(l_.machine_type, l_.accelerator_type, l_.gpus, l_.nodes, l_.disk_gb,
                        l_.spot)
    ip = catalog()["external_ipv4_hour"]
    notes = [
        f"all {l_.nodes} nodes are created by one bulkInsert (minCount {l_.nodes}: all or "
        f"none) in one zone under a COLLOCATED placement policy; zones tried in order: "
        f"{', '.join(l_.zones)}",
        f"the cloud deletes every node after {l_.max_hours:g} h (maxRunDuration, DELETE)"
        + (" — default; set --max-hours to change it" if max_hours_defaulted else ""),
        f"network {NETWORK}; SSH (tcp/22) open to {l_.ssh_cidr} only",
        "internet: every node has an external IPv4 address on the default network "
        f"(${ip['spot' if l_.spot else 'standard']:g}/h each, included in the cost)",
        f"boot image {l_.image.rsplit('/', 1)[-1]} from family {l_.image_family}"
        + (f" (skipped: {'; '.join(l_.image_tried)})" if l_.image_tried else ""),
    ]
    notes += _fabric_notes(l_)
    if l_.spot:
        notes.append("spot VMs: the cloud may delete them at any time (preemption)")
    return GcpPlan(
        provider="gcp",
        cluster=l_.cluster,
        nodes=l_.nodes,
        slots_per_node=l_.slots,
        resources=resources,
        hourly_cost_usd=cost.usd_per_hour,
        max_hours=l_.max_hours,
        price_source="; ".join(cost.sources),
        notes=notes,
        unpriced=cost.unpriced,
        unresolved=unresolved or [],
        layout=layout,
    )


def _fabric_notes(l_: Layout) -> list[str]:
    """What the plan does for the machine type's GPU network, and what is not verified."""
    stack = l_.gpu_direct
    if stack is None:
        if l_.machine_type in ("a3-highgpu-8g", "a3-megagpu-8g"):
            return [f"{l_.machine_type} on one node: no GPUDirect set-up (no traffic between "
                    "nodes)"]
        if l_.machine_type.startswith("a3-ultragpu"):
            return [f"{l_.machine_type}: GPUDirect RDMA (RoCE VPC, gIB plugin) is not set up "
                    "by mgpu-cloud; NCCL uses TCP over the primary gVNIC, so the fabric gate "
                    "stops multi-node launches (--fabric-check off or --allow-slow-network to "
                    "run anyway)"]
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
        "--image-project) and guest interface names "
        f"{stack.ctrl_dev} + {','.join(stack.data_nics)}; a node whose set-up failed says why "
        "in /var/log/mgpu-cloud-gpudirect.log, and the fabric gate stops a launch that falls "
        "back to sockets",
    ]
