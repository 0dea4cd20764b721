"""Resolve a ClusterSpec against Compute Engine (read-only calls) into a Layout and a Plan.

`resolve` validates everything that can fail before a write: project, zone, machine type,
accelerator type, image family, SSH CIDR. `layout_to_plan` is pure: the GcpPlan carries the
Layout itself, so `create` makes exactly what was printed.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provision.errors import ProviderUnavailableError, UserInputError
from provision.model import StrictModel
from provision.plan import Plan, PlannedResource
from provision.providers.gcp.clients import Clients
from provision.providers.gcp.errors import map_errors
from provision.providers.gcp.options import GcpOptions
from provision.spec import ClusterSpec, validate_cidr

DEFAULT_ZONE = "us-central1-a"
DEFAULT_MAX_HOURS = 8.0
DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"
DEFAULT_IMAGE_FAMILY = "common-cu121-debian-11-py310"
NETWORK = "global/networks/default"
ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
PRICES_PATH = Path(__file__).with_name("prices.yaml")

POLICY = "resource-policy"
FIREWALL = "firewall"
INSTANCE = "instance"


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
    image: str  # image self link
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


@cache
def load_prices() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(PRICES_PATH.read_text())
    return data


def hourly_price(layout: Layout) -> float | None:
    """Whole-cluster USD/hour, or None when the machine or accelerator type has no price."""
    prices = load_prices()
    kind = "spot" if layout.spot else "on_demand"
    vm = prices["machine_types"].get(layout.machine_type)
    if vm is None:
        return None
    per_vm = float(vm[kind])
    if layout.accelerator_type:
        acc = prices["accelerators"].get(layout.accelerator_type)
        if acc is None:
            return None
        per_vm += float(acc[kind]) * layout.gpus
    per_vm += float(prices["disk_gb_month"]) * layout.disk_gb / 730.0
    return round(per_vm * layout.nodes, 2)


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
    family = opts.image_family or DEFAULT_IMAGE_FAMILY
    image_project = opts.image_project or DEFAULT_IMAGE_PROJECT
    image = _get_or_none(
        clients, clients.images.get_from_family,
        compute_v1.GetFromFamilyImageRequest(project=image_project, family=family),
        f"looking up image family {family}",
    )
    if image is None:
        raise UserInputError(
            f"image family {family!r} not found in project {image_project!r}",
            hint="list Deep Learning VM families with `gcloud compute images list --project "
            "deeplearning-platform-release --no-standard-images`, then pass --image-family",
        )
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
        disk_gb=opts.disk_gb,
        spot=spec.spot,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS,
        ssh_cidr=validate_cidr(ssh_cidr),
    )


# --- Layout <-> Plan (pure) ---------------------------------------------------------------
def layout_to_plan(layout: Layout, *, max_hours_defaulted: bool) -> GcpPlan:
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
    for rank in range(l_.nodes):
        details = {
            "zone": l_.zones[0], "machine_type": l_.machine_type, "gpus": str(l_.gpus),
            "slots": str(l_.slots), "image": l_.image, "disk_gb": str(l_.disk_gb),
            "provisioning": "SPOT" if l_.spot else "STANDARD",
            "max_run_hours": f"{l_.max_hours:g}",
        }
        if l_.accelerator_type:
            details["accelerator"] = l_.accelerator_type
        resources.append(PlannedResource(kind=INSTANCE, name=l_.instance_name(rank),
                                         details=details))
    price = hourly_price(layout)
    prices = load_prices()
    notes = [
        f"all nodes in one zone under a COLLOCATED placement policy; zones tried in order: "
        f"{', '.join(l_.zones)}",
        f"the cloud deletes every node after {l_.max_hours:g} h (maxRunDuration, DELETE)"
        + (" — default; set --max-hours to change it" if max_hours_defaulted else ""),
        f"network {NETWORK}; SSH (tcp/22) open to {l_.ssh_cidr} only",
    ]
    if l_.spot:
        notes.append("spot VMs: the cloud may delete them at any time (preemption)")
    if price is None:
        notes.append(f"no price known for {l_.machine_type}"
                     + (f" + {l_.accelerator_type}" if l_.accelerator_type else "")
                     + "; the cost shown is $0")
    return GcpPlan(
        provider="gcp",
        cluster=l_.cluster,
        nodes=l_.nodes,
        slots_per_node=l_.slots,
        resources=resources,
        hourly_cost_usd=price or 0.0,
        max_hours=l_.max_hours,
        price_source=f"{prices['source']}, {prices['date']}" if price is not None else None,
        notes=notes,
        layout=layout,
    )
