"""How the nodes are bought: on-demand / spot (the default), a Capacity Block (--capacity-block)
or an existing capacity reservation (--reservation ID|auto).

Capacity Blocks for ML ("Find and purchase Capacity Blocks", "Launch instances using Capacity
Blocks", "Monitor Capacity Blocks using EventBridge", EC2 User Guide; API_CapacityBlock,
API_CapacityBlockOffering, API_PurchaseCapacityBlock, EC2 API Reference):
- `plan` finds offerings for N instances and a duration with DescribeCapacityBlockOfferings
  (durations "in 1-day increments up to 14 days, and in 7-day increments up to 182 days";
  "Each Capacity Block can have up to 64 instances"; offerings up to 8 weeks ahead) and shows
  the chosen one: zone, start, end, price (paid up front). Nothing is bought. The answer is
  paginated (NextToken): every page is read. An offering made of several segments
  (CapacityBlockOfferingSegments: "Each segment describes a distinct block of capacity with
  its own Availability Zone, instance type, schedule, and pricing"; after purchase "a separate
  Capacity Reservation is created for each segment", botocore's EC2 model) is skipped: the
  nodes are launched by one RunInstances into one reservation in one zone.
- `create` (after the user confirmed the plan) buys it with PurchaseCapacityBlock (recorded in
  the inventory at once: it is paid and cannot be cancelled, `down` only forgets it), waits
  until the reservation is `active` (payment-pending / scheduled before), and launches with
  InstanceMarketOptions.MarketType = capacity-block and CapacityReservationSpecification
  targeting it, in its zone (an instance "can't launch in a subnet in a different Availability
  Zone"). No placement group: "Instances that run inside a Capacity Block are automatically
  placed close together inside Amazon EC2 UltraClusters". EC2 starts terminating the instances
  30 minutes before the block ends ("Forty minutes before your Capacity Block reservation ends
  ... will begin to terminate in 10 minutes"): the nodes power themselves off 35 minutes
  before the end (lifetime_s), so a job's own shutdown path runs first.
  The block is paid up front for all its hours ("you pay ... up front", "Capacity Blocks
  pricing and billing"), so without --max-hours the block's end governs (node_hours): the
  nodes run to it. An explicit shorter --max-hours is kept, and the plan says the paid hours
  it gives up.
On-Demand Capacity Reservations ("Launch instances into an existing Capacity Reservation"):
an instance goes into a reservation that has matching attributes (type, platform, zone,
tenancy), enough available capacity and is `active`; targeted by id, in its zone, and into
its cluster placement group when it has one (PlacementGroupArn).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.api import Ec2, tag_spec
from provision.cluster.providers.aws.catalog import InstanceTypeInfo, markets_of, markets_source
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.request import AwsLaunch, CapacityBlock, Reservation
from provision.model.errors import ProvisionError, UserInputError
from provision.model.inventory import Inventory
from provision.model.spec import ClusterSpec

MAX_BLOCK_INSTANCES = 64
MAX_BLOCK_DAYS = 182
SEARCH_WEEKS = 8
END_MARGIN_S = 35 * 60  # power off before EC2 starts terminating (30 min before the end)
PLATFORM = "Linux/UNIX"
BLOCK_WAIT_STATES = frozenset({"payment-pending", "scheduled", "pending", "assessing", "delayed"})
BLOCK_DEAD_STATES = frozenset({"payment-failed", "failed", "cancelled", "expired", "unsupported",
                               "unavailable", "cancelling"})


def block_hours(max_hours: float) -> int:
    """The Capacity Block duration covering --max-hours: whole days up to 14, whole weeks
    beyond (UserInputError past 182 days)."""
    days = max(1, math.ceil(max_hours / 24))
    if days > 14:
        days = math.ceil(days / 7) * 7
    if days > MAX_BLOCK_DAYS:
        raise UserInputError(f"--max-hours {max_hours:g} is longer than a Capacity Block can "
                             f"be ({MAX_BLOCK_DAYS} days)", hint="ask for less --max-hours")
    return days * 24


def check_choice(spec: ClusterSpec, info: InstanceTypeInfo, regions: list[str]) -> None:
    """Local checks of how the nodes are bought; UserInputError before any call."""
    opts = spec.options_as(AwsOptions)
    if opts.capacity_block and opts.reservation:
        raise UserInputError("--capacity-block and --reservation exclude each other",
                             hint="buy a new block with --capacity-block, or launch into one "
                                  "you have with --reservation ID")
    if spec.spot and (opts.capacity_block or opts.reservation):
        raise UserInputError("--spot cannot be combined with --capacity-block or --reservation",
                             hint="drop --spot: reserved capacity is not interrupted")
    if opts.capacity_block and spec.nodes > MAX_BLOCK_INSTANCES:
        raise UserInputError(f"a Capacity Block holds at most {MAX_BLOCK_INSTANCES} instances; "
                             f"{spec.nodes} were asked for", hint="ask for fewer --nodes")
    if opts.reservation not in (None, "auto") and len(regions) > 1:
        raise UserInputError(f"reservation {opts.reservation} belongs to one region; it "
                             "cannot be combined with several --regions",
                             hint="pass its --region, or --reservation auto")
    markets = markets_of(info.name)
    if spec.spot and "spot" not in markets and "on-demand" in markets:
        raise UserInputError(f"{info.name} is not sold as spot ({markets_source(info.name)})",
                             hint="drop --spot")
    if not (opts.capacity_block or opts.reservation) and "on-demand" not in markets:
        raise UserInputError(
            f"{info.name} is sold as Capacity Blocks and reservations, not on demand "
            f"({markets_source(info.name)})",
            hint="buy a block with --capacity-block (the plan shows its price and start "
                 "first), or launch into a reservation you have with --reservation ID|auto")


# --- plan: find an offering / a reservation (read-only) ---------------------------------------
def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat(timespec="seconds")
    return str(value)


def find_block(ec2s: list[Ec2], spec: ClusterSpec, info: InstanceTypeInfo, *,
               zone: str | None = None,
               now: dt.datetime | None = None) -> tuple[str, CapacityBlock]:
    """The offering to buy: across `ec2s`' regions (in order), in `zone` when given, the one
    starting first, then the cheapest. UserInputError when none is offered in the next 8
    weeks."""
    now = now or CLOCK.now()
    hours = block_hours(spec.max_hours or 24.0)  # no --max-hours: the shortest block, 1 day
    found: list[tuple[dt.datetime, float, int, str, CapacityBlock]] = []
    segmented = 0
    for order, ec2 in enumerate(ec2s):
        offers = ec2.pages(
            "describe_capacity_block_offerings", "CapacityBlockOfferings",
            InstanceType=info.name, InstanceCount=spec.nodes, CapacityDurationHours=hours,
            StartDateRange=now, EndDateRange=now + dt.timedelta(weeks=SEARCH_WEEKS))
        for o in offers:
            if o.get("InstanceType") not in (None, info.name) or \
                    int(o.get("InstanceCount", spec.nodes)) < spec.nodes or \
                    (zone is not None and o.get("AvailabilityZone") != zone):
                continue
            if len(o.get("CapacityBlockOfferingSegments") or []) > 1:
                segmented += 1  # several zones/schedules: not one reservation for all nodes
                continue
            block = CapacityBlock(
                offering_id=str(o["CapacityBlockOfferingId"]), zone=str(o["AvailabilityZone"]),
                start=_iso(o["StartDate"]), end=_iso(o["EndDate"]),
                hours=int(o.get("CapacityBlockDurationHours") or hours),
                upfront_usd=float(o.get("UpfrontFee") or 0), currency=str(
                    o.get("CurrencyCode") or "USD"), instance_count=int(o["InstanceCount"]))
            found.append((o["StartDate"], block.upfront_usd, order, ec2.region, block))
    if not found:
        where = ", ".join(e.region for e in ec2s)
        also = (f" ({segmented} offering(s) made of several segments were skipped: each "
                "segment becomes a reservation of its own, and the nodes are launched into "
                "one)") if segmented else ""
        raise UserInputError(
            f"no Capacity Block offering for {spec.nodes} x {info.name} for {hours} h in {where} "
            f"within the next {SEARCH_WEEKS} weeks{also}",
            hint="try fewer --nodes, a shorter --max-hours, other --regions, or later")
    _, _, _, region, block = min(found, key=lambda f: (f[0], f[1], f[2]))
    return region, block


def _reservation(item: dict[str, Any]) -> Reservation:
    pg_arn = str(item.get("PlacementGroupArn") or "")
    return Reservation(
        id=str(item["CapacityReservationId"]), zone=str(item["AvailabilityZone"]),
        end=_iso(item["EndDate"]) if item.get("EndDate") else None,
        available=int(item.get("AvailableInstanceCount", 0)),
        capacity_block=item.get("ReservationType") == "capacity-block",
        placement_group=pg_arn.rsplit("/", 1)[-1] if pg_arn else None)


def _usable(item: dict[str, Any], spec: ClusterSpec, info: InstanceTypeInfo) -> str | None:
    """Why the reservation cannot take the cluster, or None when it can."""
    if item.get("InstanceType") != info.name:
        return f"it reserves {item.get('InstanceType')}, not {info.name}"
    if item.get("State") != "active":
        return f"it is {item.get('State')}, not active"
    if item.get("InstancePlatform", PLATFORM) != PLATFORM:
        return f"its platform is {item.get('InstancePlatform')}, not {PLATFORM}"
    if item.get("Tenancy", "default") != "default":
        return f"its tenancy is {item.get('Tenancy')}"
    if int(item.get("AvailableInstanceCount", 0)) < spec.nodes:
        return (f"it has {item.get('AvailableInstanceCount', 0)} instances available, "
                f"{spec.nodes} are needed")
    return None


def find_reservation(ec2s: list[Ec2], spec: ClusterSpec,
                     info: InstanceTypeInfo) -> tuple[str, Reservation]:
    """--reservation ID: that one, checked; auto: the first active one (regions in order)
    that can take every node. UserInputError saying why none fits."""
    wanted = spec.options_as(AwsOptions).reservation
    why: list[str] = []
    for ec2 in ec2s:
        if wanted and wanted != "auto":
            items = ec2.get("describe_capacity_reservations", "CapacityReservations",
                            CapacityReservationIds=[wanted])
        else:
            items = ec2.pages("describe_capacity_reservations", "CapacityReservations",
                              Filters=[{"Name": "instance-type", "Values": [info.name]},
                                       {"Name": "state", "Values": ["active"]}])
        for item in sorted(items, key=lambda i: -int(i.get("AvailableInstanceCount", 0))):
            problem = _usable(item, spec, info)
            if problem is None:
                return ec2.region, _reservation(item)
            why.append(f"{item['CapacityReservationId']} ({ec2.region}): {problem}")
    what = f"reservation {wanted}" if wanted != "auto" else f"no active reservation of {info.name}"
    raise UserInputError(
        f"{what} cannot take {spec.nodes} x {info.name}"
        + (": " + "; ".join(why) if why else f" in {', '.join(e.region for e in ec2s)}"),
        hint="check it: aws ec2 describe-capacity-reservations, or use --capacity-block")


# --- create: buy, wait, launch parameters --------------------------------------------------
def purchase_block(ec2: Ec2, cluster: str, block: CapacityBlock) -> dict[str, Any]:
    """Buy the offering (ONE call, never retried: PurchaseCapacityBlock has no idempotency
    token, a retry could pay twice). After an error, a reservation already tagged for the
    cluster (the call had gone through) is adopted instead. Returns the CapacityReservation."""
    from botocore.exceptions import ClientError

    try:
        answer = ec2.client.purchase_capacity_block(
            CapacityBlockOfferingId=block.offering_id, InstancePlatform=PLATFORM,
            TagSpecifications=tag_spec("capacity-reservation", cluster))
    except ClientError:
        bought = tagged_reservations(ec2, cluster)
        if bought:
            return bought[0]
        raise
    reservations = answer.get("CapacityReservations") or []
    if len(reservations) > 1:  # one per segment: the plan only picks one-segment offerings
        ids = ", ".join(str(r.get("CapacityReservationId")) for r in reservations)
        raise ProvisionError(f"Capacity Block offering {block.offering_id} was bought as "
                             f"{len(reservations)} reservations ({ids}); the nodes are "
                             "launched into one", hint="they are paid and end by themselves; "
                             "see them in the EC2 console (Capacity Reservations)")
    reservation: dict[str, Any] = answer.get("CapacityReservation") or {}
    if not reservation.get("CapacityReservationId"):
        bought = tagged_reservations(ec2, cluster)
        if not bought:
            raise ProvisionError("PurchaseCapacityBlock answered without a reservation id")
        return bought[0]
    return reservation


def tagged_reservations(ec2: Ec2, cluster: str) -> list[dict[str, Any]]:
    from provision.cluster.providers.aws.api import cluster_filter

    found: list[dict[str, Any]] = ec2.pages(
        "describe_capacity_reservations", "CapacityReservations",
        Filters=[cluster_filter(cluster)])
    return found


class Clock:
    """Time as this module sees it: a test injects its own (`CLOCK`), so that a block that
    starts in hours is waited for without sleeping, and the fake EC2 sees the same time."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


CLOCK = Clock()
MAX_SCHEDULED_PAUSE_S = 600.0  # a `scheduled` block is looked at again at least this often


def wait_active(ec2: Ec2, reservation_id: str, start: str) -> None:
    """Until the reservation is `active`; bounded by its start time plus the launch timeout.
    While it is `scheduled` it sleeps towards the start (at most MAX_SCHEDULED_PAUSE_S at a
    time: a block can start weeks later, and a cancelled one must be noticed), otherwise every
    poll interval. ProvisionError when it fails (payment failed, cancelled, expired...) or
    takes longer."""
    p = retry.policy()
    starts = _when(start)
    deadline = max(starts, CLOCK.now()) + dt.timedelta(seconds=p.launch_timeout_s)
    while True:
        (item,) = ec2.get("describe_capacity_reservations", "CapacityReservations",
                          CapacityReservationIds=[reservation_id])
        state = str(item.get("State"))
        if state == "active":
            return
        if state in BLOCK_DEAD_STATES or state not in BLOCK_WAIT_STATES:
            raise ProvisionError(f"Capacity Block {reservation_id} is {state}",
                                 hint="see it in the EC2 console (Capacity Reservations)")
        now = CLOCK.now()
        if now > deadline:
            raise ProvisionError(f"Capacity Block {reservation_id} still {state} after its "
                                 f"start ({start})")
        pause = p.poll_interval_s
        if state == "scheduled":  # towards the start; past it, EC2 is about to turn it active
            pause = max(pause, min(MAX_SCHEDULED_PAUSE_S, (starts - now).total_seconds()), 1.0)
        CLOCK.sleep(pause)


def market_params(launch: AwsLaunch, reservation_id: str | None) -> dict[str, Any]:
    """RunInstances parameters of a reserved launch: the reservation targeted, and the
    capacity-block market for a block; {} for on-demand / spot."""
    if reservation_id is None:
        return {}
    params: dict[str, Any] = {"CapacityReservationSpecification": {
        "CapacityReservationTarget": {"CapacityReservationId": reservation_id}}}
    if launch.market == "capacity-block":
        params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return params


def capacity_end(launch: AwsLaunch) -> str | None:
    if launch.block is not None:
        return launch.block.end
    return launch.reservation.end if launch.reservation else None


def lifetime_s(launch: AwsLaunch, now: dt.datetime | None = None) -> int:
    """Seconds the nodes may live: --max-hours, cut to END_MARGIN_S before the reserved
    capacity ends."""
    seconds = int(launch.max_hours * 3600)
    end = capacity_end(launch)
    if end is not None:
        left = (_when(end) - (now or CLOCK.now())).total_seconds()
        seconds = min(seconds, int(left) - END_MARGIN_S)
    return seconds


def _when(iso: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(iso)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def usable_hours(block: CapacityBlock | None, reservation: Reservation | None,
                 now: dt.datetime | None = None) -> float | None:
    """Hours nodes can run in the reserved capacity: from the block's start (or now, when
    later) until END_MARGIN_S before its end; None when the capacity has no end."""
    now = now or CLOCK.now()
    if block is not None:
        start, end = max(_when(block.start), now), _when(block.end)
    elif reservation is not None and reservation.end:
        start, end = now, _when(reservation.end)
    else:
        return None
    return max(0.0, (end - start).total_seconds() - END_MARGIN_S) / 3600


def is_block(block: CapacityBlock | None, reservation: Reservation | None) -> bool:
    return block is not None or (reservation is not None and reservation.capacity_block)


def node_hours(max_hours: float | None, default: float, block: CapacityBlock | None,
               reservation: Reservation | None, now: dt.datetime | None = None) -> float:
    """How long the nodes run (AwsLaunch.max_hours): --max-hours, cut to END_MARGIN_S before
    reserved capacity ends. Without --max-hours a Capacity Block's end governs (it is paid to
    the end; `default` would throw the rest away); any other market gets `default`."""
    usable = usable_hours(block, reservation, now)
    if max_hours is None:
        max_hours = usable if usable is not None and is_block(block, reservation) else default
    if usable is not None:
        max_hours = min(max_hours, usable)
    return math.floor(max_hours * 100) / 100


def cluster_max_hours(inv: Inventory, max_hours: float | None, default: float,
                      now: dt.datetime | None = None) -> float:
    """The lifetime of an existing cluster, counted from its creation (replace.py): its
    --max-hours; without it, for nodes in a Capacity Block (recorded on its instances), until
    END_MARGIN_S before the block's end; else `default`."""
    if max_hours is not None:
        return max_hours
    ends = [r.extra["capacity_end"] for r in inv.resources_of("instance")
            if r.extra.get("market") == "capacity-block" and r.extra.get("capacity_end")]
    if not ends:
        return default
    created = _when(inv.created_at)
    return max(0.0, (_when(ends[0]) - created).total_seconds() - END_MARGIN_S) / 3600
