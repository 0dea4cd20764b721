"""The typed request an AWS plan carries and `create` / `replace` consume (AwsLaunch): built by
plan.py from read-only calls, rendered for people by plan_text.py, never parsed back."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from provision.cluster.providers.aws.catalog import interface_count
from provision.cluster.providers.aws.network import Egress
from provision.model.base import StrictModel
from provision.model.plan import Plan

NODE_USER = "ubuntu"


def resource_name(cluster: str) -> str:
    return f"mgpu-cloud-{cluster}"


class ZoneSubnet(StrictModel):
    zone: str
    subnet: str  # the default subnet of the zone


class Site(StrictModel):
    """One region resolved for a launch: where `create` tries, in the plan's order (--regions)."""

    region: str
    vpc_id: str | None  # None: unresolved (offline plan)
    ssh_cidrs: list[str]
    zones: list[ZoneSubnet]  # in failover order
    ami: str | None
    ami_name: str
    root_device: str | None
    egress: Egress
    usd_per_hour: float | None = None  # one node, on-demand; None: unknown
    price_source: str = ""


class CapacityBlock(StrictModel):
    """A Capacity Block offering found by `plan` (DescribeCapacityBlockOfferings), bought by
    `create` after confirmation (PurchaseCapacityBlock)."""

    offering_id: str
    zone: str
    start: str  # ISO 8601, UTC
    end: str
    hours: int
    upfront_usd: float
    currency: str
    instance_count: int


class Reservation(StrictModel):
    """An On-Demand Capacity Reservation (or an already-bought Capacity Block) to launch into,
    targeted by id (DescribeCapacityReservations)."""

    id: str
    zone: str
    end: str | None  # ISO 8601; None: no end date
    available: int
    capacity_block: bool  # ReservationType capacity-block: launched with that market type
    placement_group: str | None  # the cluster placement group the reservation is in


class AwsLaunch(StrictModel):
    """What `create` does: everything resolved by `plan`, typed. The region fields are those
    of the first site; `fallback` holds the next regions to try (--regions)."""

    region: str
    instance_type: str
    zones: list[ZoneSubnet]  # in failover order
    vpc_id: str | None  # None: unresolved (offline plan)
    ami: str | None
    ami_name: str
    root_device: str | None  # the AMI's RootDeviceName: where disk_gb applies
    gpus: str  # e.g. "8 x NVIDIA A100 40 GiB", for people
    gpu_model: str = ""  # e.g. "NVIDIA A100" (catalog): recorded for the job image check
    image: str  # the training image: --image, or the default for the GPUs' architecture
    spot: bool
    spot_fallback: bool
    efa_cards: list[int]  # one EFA interface on each (catalog.card_layout); []: no EFA
    device_rdma: bool
    disk_gb: int
    max_hours: float
    ssh_cidrs: list[str]  # SSH source ranges: the caller's /32, --ssh-cidr, or the VPC's
    private_ips: bool
    egress: Egress
    fallback: list[Site] = Field(default_factory=list)
    block: CapacityBlock | None = None
    reservation: Reservation | None = None
    # How the nodes are bought as asked (--capacity-block / --reservation), also when the plan
    # could not look the block or reservation up (offline): the market it shows then.
    reserved: Literal["capacity-block", "reservation"] | None = None

    @property
    def market(self) -> str:
        if self.block is not None or (self.reservation and self.reservation.capacity_block):
            return "capacity-block"
        if self.reservation is not None:
            return "reservation"
        if self.reserved is not None:
            return self.reserved
        return "spot" if self.spot else "on-demand"

    @property
    def reservation_id(self) -> str | None:
        """The capacity reservation the nodes are launched into (bought block or given one);
        set on the block by `create` once bought."""
        return self.reservation.id if self.reservation else None

    def at(self, site: Site) -> AwsLaunch:
        """This launch in another region (a fallback site)."""
        fields = site.model_dump(exclude={"usd_per_hour", "price_source"})
        return self.model_copy(update={**fields, "zones": site.zones, "egress": site.egress,
                                       "fallback": []})

    @property
    def efa_interfaces(self) -> int:
        return len(self.efa_cards)

    @property
    def interfaces(self) -> int:
        return interface_count(self.efa_cards)


class AwsPlan(Plan):
    launch: AwsLaunch
