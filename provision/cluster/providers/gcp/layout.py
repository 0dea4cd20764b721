"""Layout: everything `create` needs, resolved and validated (resolve.py makes it, plan.py prints
it, create.py makes exactly it); and the pure rules of how a machine type can be bought.

How a GPU machine type can be bought (provisioning models; "Consumption options",
https://cloud.google.com/ai-hypercomputer/docs/consumption-models; "Provisioning models",
https://cloud.google.com/compute/docs/instances/provisioning-models):
    STANDARD (on demand)  every type except NO_ON_DEMAND (A3 Ultra, A4, A4X are sold as
                          reservations, flex-start and spot only)
    SPOT (--spot)         every GPU type except A4X; cannot consume a reservation ("Consume
                          reservations: Limitations", https://cloud.google.com/compute/docs/
                          instances/reservations-consume)
    FLEX_START            (--flex-start, DWS) accelerator-optimized types except A4X and G4;
                          runs at most 7 days; never consumes a reservation ("About Flex-start
                          VMs", https://cloud.google.com/compute/docs/instances/
                          about-flex-start-vms)
    reservation           (--reservation NAME) SPECIFIC_RESERVATION; A3 Ultra / A4 capacity
                          comes from future reservations and is RESERVATION_BOUND ("About
                          reservation-bound instances"), other types STANDARD
Placement: a COLLOCATED (compact) policy for STANDARD and SPOT; flex-start and reservations
place their VMs themselves (DWS and reservations allocate densely: "Consumption options",
"Resource allocation: Dense"), so no policy is made for them.
Boot disk: A3 Ultra, A4 and A4X take only Hyperdisk ("Accelerator-optimized machine family",
https://cloud.google.com/compute/docs/accelerator-optimized-machines: supported disk types);
the others pd-balanced.
"""

from __future__ import annotations

import re

from provision.cluster.providers.gcp.gpudirect import DataNetwork, Stack, data_networks, stack_for
from provision.model.base import StrictModel
from provision.model.errors import UserInputError
from provision.nodes.container import DEFAULT_TRAINING_IMAGE

DEFAULT_ZONE = "us-central1-a"
DEFAULT_MAX_HOURS = 8.0
NETWORK = "global/networks/default"
ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
UNRESOLVED = "(unresolved)"
FLEX_START_MAX_HOURS = 7 * 24.0
# Sold without an on-demand option ("Consumption options").
NO_ON_DEMAND = ("a3-ultragpu-", "a4-highgpu-", "a4x-")
# Their reservations come from future reservations: RESERVATION_BOUND.
RESERVATION_BOUND = ("a3-ultragpu-", "a4-highgpu-", "a4x-")
# Flex-start: accelerator-optimized types only, and not A4X or G4.
FLEX_START_FAMILIES = ("a2-", "a3-", "a4-", "g2-")
HYPERDISK_ONLY = ("a3-ultragpu-", "a4-", "a4x-")


def region_of(zone: str) -> str:
    match = ZONE_RE.match(zone)
    if not match:
        raise UserInputError(
            f"{zone!r} is not a Compute Engine zone name",
            hint="zones look like us-central1-a; list them with `gcloud compute zones list`",
        )
    return match.group(1)


def disk_type_for(machine_type: str) -> str:
    return "hyperdisk-balanced" if machine_type.startswith(HYPERDISK_ONLY) else "pd-balanced"


def check_purchase(machine_type: str, *, spot: bool, flex_start: bool,
                   reservation: str | None, max_hours: float | None,
                   guest_gpus: bool) -> None:
    """UserInputError for a combination Compute refuses (the sources are in the module
    docstring), before anything is asked or made."""
    ways = "--spot, --flex-start or --reservation NAME"
    if spot and flex_start:
        raise UserInputError("--spot and --flex-start are two provisioning models; a VM has one",
                             hint="pick one of them")
    if reservation and (spot or flex_start):
        raise UserInputError(
            f"--reservation cannot be combined with {'--spot' if spot else '--flex-start'}: "
            "Spot and flex-start VMs never consume reservations",
            hint="drop --reservation, or buy the nodes from the reservation alone")
    if flex_start:
        if guest_gpus or not machine_type.startswith(FLEX_START_FAMILIES):
            raise UserInputError(
                f"--flex-start is not offered for {machine_type}: only accelerator-optimized "
                "types (a2, a3, a4, g2; not A4X or N1 with guest GPUs) run as flex-start VMs",
                hint="use e.g. --machine-type a3-highgpu-8g, or drop --flex-start")
        if max_hours is not None and max_hours > FLEX_START_MAX_HOURS:
            raise UserInputError(
                f"--max-hours {max_hours:g}: flex-start VMs run at most "
                f"{FLEX_START_MAX_HOURS:g} h (7 days)",
                hint="use --max-hours 168 or less, or a reservation for longer runs")
    if machine_type.startswith(NO_ON_DEMAND) and not (spot or flex_start or reservation):
        raise UserInputError(
            f"{machine_type} is not sold on demand: Google offers it as reservations, "
            "flex-start (DWS) and Spot only",
            hint=f"add one of {ways} (see docs/clouds.md, 'How GCP GPUs can be bought')")


class RegionZones(StrictModel):
    """One region to try and its zones that offer the machine type, in the order tried."""

    region: str
    zones: list[str]
    price_usd_hour: float | None = None  # the whole cluster there; None: not in the catalog


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
    image: str  # boot image self link; UNRESOLVED in an offline plan
    image_family: str
    # The GPUs as Compute names them (e.g. nvidia-b200), and the training container the nodes
    # pull and jobs run in: --image, or the default of the GPUs' architecture
    # (provision/nodes/container.py training_image)
    gpu_model: str | None = None
    training_image: str | None = DEFAULT_TRAINING_IMAGE  # None: no pull at boot (an old inventory)
    image_tried: list[str] = []  # families skipped before image_family, and why
    disk_gb: int
    disk_type: str = "pd-balanced"
    spot: bool
    flex_start: bool = False
    reservation: str | None = None  # SPECIFIC_RESERVATION value: NAME or projects/P/reservations/N
    max_hours: float
    ssh_cidr: str
    regions_after: list[RegionZones] = []  # --regions: where to go when `region` has no capacity

    @property
    def tag(self) -> str:
        return f"mgpu-cloud-{self.cluster}"

    @property
    def policy_name(self) -> str:
        return f"{self.cluster}-compact"

    @property
    def placement_policy(self) -> bool:
        """Whether the VMs get the cluster's COLLOCATED policy (not for flex-start and
        reservations, which place the VMs themselves)."""
        return not (self.flex_start or self.reservation)

    @property
    def provisioning_model(self) -> str:
        if self.spot:
            return "SPOT"
        if self.flex_start:
            return "FLEX_START"
        if self.reservation and self.machine_type.startswith(RESERVATION_BOUND):
            return "RESERVATION_BOUND"
        return "STANDARD"

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

    @property
    def attempts(self) -> list[RegionZones]:
        """Where `create` tries, in order: this region's zones, then each of regions_after."""
        return [RegionZones(region=self.region, zones=self.zones), *self.regions_after]

    def in_region(self, where: RegionZones) -> Layout:
        """This layout moved to another region (its policy and subnets are made there)."""
        return self.model_copy(update={"region": where.region, "zones": list(where.zones),
                                       "regions_after": []})
