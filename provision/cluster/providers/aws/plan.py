"""`plan`: validate a spec against AWS with read-only calls and describe what `up` will make.

Everything `create` needs is in the plan's typed `launch` (AwsLaunch); the resource list is its
rendering for people. `up` executes exactly the plan it printed.
Order of checks: local input first (nodes, CIDR, regions, how the nodes are bought), then
describe calls: the type, the capacity (a Capacity Block offering or a reservation: capacity.py,
which fixes region and zone), then each region to try (sites.py).
Without credentials the plan is made from the shipped catalog (type facts, prices) and lists
what it could not look up (`unresolved`: AMI, subnets, Elastic IP quota, the Capacity Block
offering); it is printed by `--dry-run` and never created.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.aws import capacity, sites
from provision.cluster.providers.aws.api import Ec2
from provision.cluster.providers.aws.catalog import (
    InstanceTypeInfo,
    catalog,
    hourly_price,
    known_type,
    network_prices,
    parse_instance_type,
)
from provision.cluster.providers.aws.clients import new_session, resolve_region
from provision.cluster.providers.aws.errors import error_code
from provision.cluster.providers.aws.network import plan_egress
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.plan_text import plan_notes, planned_resources
from provision.cluster.providers.aws.request import (
    AwsLaunch,
    AwsPlan,
    CapacityBlock,
    Reservation,
    Site,
    ZoneSubnet,
)
from provision.model.errors import UserInputError
from provision.model.spec import ClusterSpec, validate_cidr

DEFAULT_MAX_HOURS = 8.0
# AWS publishes no hard instance limit for one cluster placement group, but one RunInstances
# of more nodes than this into one group practically never finds capacity (larger clusters
# need capacity reservations / capacity blocks, which this tool does not manage).
MAX_NODES_PER_PLACEMENT_GROUP = 256
NO_CREDENTIALS = "no AWS credentials"


def _validate_local(spec: ClusterSpec) -> None:
    """Checks that need no AWS call."""
    if spec.nodes > MAX_NODES_PER_PLACEMENT_GROUP:
        raise UserInputError(
            f"{spec.nodes} nodes do not fit one cluster placement group "
            f"(this tool launches at most {MAX_NODES_PER_PLACEMENT_GROUP} in one)",
            hint=f"ask for --nodes {MAX_NODES_PER_PLACEMENT_GROUP} or fewer",
        )


def _ssh_cidr(spec: ClusterSpec) -> str | None:
    """--ssh-cidr; else this machine's public address (UserInputError if unknown); None with
    --private-ips: the controller is inside the VPC and arrives from a private address, which
    no public lookup sees, so SSH is opened to the VPC's own ranges (vpc_cidrs)."""
    if spec.ssh_cidr is not None:
        try:
            return validate_cidr(spec.ssh_cidr)
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
    if spec.options_as(AwsOptions).private_ips:
        return None
    from provision.cluster.caller_address import caller_cidr

    return caller_cidr()


def _describe_type(ec2: Ec2, instance_type: str) -> InstanceTypeInfo:
    from botocore.exceptions import ClientError

    try:
        described = ec2.get("describe_instance_types", "InstanceTypes",
                            InstanceTypes=[instance_type])
    except ClientError as exc:
        if error_code(exc) == "InvalidInstanceType":
            raise UserInputError(
                f"unknown instance type {instance_type!r} in {ec2.region}",
                hint="e.g. --instance-type p4d.24xlarge or p5.48xlarge",
            ) from None
        raise
    if not described:
        raise UserInputError(f"unknown instance type {instance_type!r} in {ec2.region}")
    return parse_instance_type(described[0])


def build_plan(spec: ClusterSpec) -> AwsPlan:
    """Read-only: validates `spec` and returns the Plan. Never writes."""
    _validate_local(spec)
    opts = spec.options_as(AwsOptions)
    session = new_session()
    if session.get_credentials() is None:
        return _offline_plan(spec, opts, session)
    ssh_cidr = _ssh_cidr(spec)
    regions = sites.wanted_regions(session, opts)
    first = regions[0] if regions else (session.region_name or "us-east-1")
    info = _describe_type(Ec2(first, session), opts.instance_type)
    if regions is None:
        regions = sites.any_regions(session, info.name)
        if not regions:
            raise UserInputError(f"no region enabled for this account offers {info.name}")
    capacity.check_choice(spec, info, regions)
    block: CapacityBlock | None = None
    reservation: Reservation | None = None
    zone = opts.zone
    ec2s = [Ec2(r, session) for r in regions]
    if opts.capacity_block:
        region, block = capacity.find_block(ec2s, spec, info, zone=zone)
        regions, zone = [region], block.zone
    elif opts.reservation:
        region, reservation = capacity.find_reservation(ec2s, spec, info)
        regions, zone = [region], reservation.zone
    found, skipped = sites.plan_sites(session, regions, spec, info.name, info.interfaces,
                                      ssh_cidr, zone)
    launch = _launch(spec, opts, info, found[0], fallback=found[1:], block=block,
                     reservation=reservation)
    return _plan(spec, launch, info.gpu_count, [], skipped)


def _image(spec: ClusterSpec, info: InstanceTypeInfo) -> str:
    """--image (refused when it is a known NGC release too old for the GPUs), else the
    default training image of the GPUs' architecture (provision/nodes/container.py)."""
    from provision.nodes.container import training_image

    return training_image(spec.image, info.gpu_model, info.name)


def _launch(spec: ClusterSpec, opts: AwsOptions, info: InstanceTypeInfo, site: Site, *,
            fallback: list[Site], block: CapacityBlock | None = None,
            reservation: Reservation | None = None) -> AwsLaunch:
    reserved = "capacity-block" if opts.capacity_block else (
        "reservation" if opts.reservation else None)
    if reserved == "capacity-block" and block is None:  # offline: the block asked for
        max_hours = spec.max_hours or capacity.block_hours(24.0) - capacity.END_MARGIN_S / 3600
    else:
        max_hours = capacity.node_hours(spec.max_hours, DEFAULT_MAX_HOURS, block, reservation)
    return AwsLaunch(
        region=site.region, instance_type=info.name, zones=site.zones, vpc_id=site.vpc_id,
        ami=site.ami, ami_name=site.ami_name, root_device=site.root_device,
        gpus=info.gpu_summary(), gpu_model=info.gpu_model, image=_image(spec, info),
        spot=spec.spot,
        spot_fallback=spec.spot and opts.spot_fallback, efa_cards=list(info.efa_cards),
        device_rdma=info.device_rdma, disk_gb=opts.disk_gb,
        max_hours=max_hours, ssh_cidrs=site.ssh_cidrs,
        private_ips=opts.private_ips, egress=site.egress, fallback=fallback, block=block,
        reservation=reservation, reserved=reserved,
    )


def _cost(spec: ClusterSpec, launch: AwsLaunch) -> tuple[float | None, str]:
    """(USD per hour for the nodes, where the figure comes from). A Capacity Block is paid up
    front (Plan.upfront_usd): here spread over the hours the nodes run, so that the plan's
    total and `cost` come to the price paid."""
    if launch.block is not None:
        b = launch.block
        return (b.upfront_usd / max(0.01, launch.max_hours),
                f"Capacity Block offering {b.offering_id}: {b.currency} {b.upfront_usd:,.2f} "
                f"up front for {b.hours} h (DescribeCapacityBlockOfferings)")
    if launch.reserved == "capacity-block":  # offline: the offering is not known
        return None, ("the Capacity Block's price, paid up front: from its offering "
                      f"(DescribeCapacityBlockOfferings, {NO_CREDENTIALS})")
    price = hourly_price(launch.instance_type, launch.region)
    nodes = None if price.usd_per_hour is None else price.usd_per_hour * spec.nodes
    return nodes, f"{launch.instance_type}: {price.source}"


def _plan(spec: ClusterSpec, launch: AwsLaunch, gpus: int, unresolved: list[str],
          skipped: list[str]) -> AwsPlan:
    nodes_cost, source = _cost(spec, launch)
    unpriced = [] if nodes_cost is not None else [source]
    notes = plan_notes(spec.nodes, launch, max_hours_defaulted=spec.max_hours is None)
    notes += [f"region skipped: {why}" for why in skipped]
    return AwsPlan(
        provider="aws",
        cluster=spec.name,
        nodes=spec.nodes,
        slots_per_node=spec.gpus_per_node or gpus,
        resources=planned_resources(spec.name, spec.nodes, launch),
        hourly_cost_usd=round((nodes_cost or 0.0) + launch.egress.hourly_usd, 4),
        node_hourly_usd=None if nodes_cost is None else round(nodes_cost / spec.nodes, 4),
        upfront_usd=launch.block.upfront_usd if launch.block is not None else 0.0,
        max_hours=launch.max_hours,
        price_source=f"{source}; network: {network_prices()['source']}",
        notes=notes,
        unpriced=unpriced,
        unresolved=unresolved,
        launch=launch,
    )


def _offline_site(spec: ClusterSpec, opts: AwsOptions, info: InstanceTypeInfo, region: str,
                  ssh_cidr: str) -> Site:
    price = hourly_price(info.name, region)
    zones = [ZoneSubnet(zone=opts.zone, subnet="(unresolved)")] if opts.zone else []
    return Site(region=region, vpc_id=None, ssh_cidrs=[ssh_cidr], zones=zones, ami=opts.ami,
                ami_name="(unresolved)", root_device=None,
                egress=plan_egress(None, spec.nodes, info.interfaces, opts.private_ips),
                usd_per_hour=price.usd_per_hour, price_source=price.source)


def _offline_plan(spec: ClusterSpec, opts: AwsOptions, session: Any) -> AwsPlan:
    """The plan without AWS (no credentials): facts and prices from the shipped catalog;
    what needs AWS is listed as unresolved. Never created (create() and `up` refuse it)."""
    unresolved: list[str] = []
    try:
        ssh_cidr = _ssh_cidr(spec) or "(the default VPC's ranges, unresolved)"
    except UserInputError as exc:
        ssh_cidr = "(unresolved)"
        unresolved.append(f"SSH source range ({exc.message}; pass --ssh-cidr)")
    why = f"{NO_CREDENTIALS}: configure them (aws configure, AWS_PROFILE, aws sso login)"
    if opts.regions:
        regions = sites.wanted_regions(session, opts)
        if regions is None:
            regions = [str(catalog()["reference_region"])]
            unresolved.append(f"the regions offering {opts.instance_type} (--regions any; "
                              f"{regions[0]} shown; {why})")
    elif opts.region or session.region_name:
        regions = [resolve_region(session, opts.region)]  # a local check: botocore's list
    else:
        regions = [str(catalog()["reference_region"])]
        unresolved.append(f"region ({regions[0]} assumed: pass --region)")
    info = known_type(opts.instance_type)
    if info is None:
        raise UserInputError(
            f"{opts.instance_type!r} is not in the offline catalog, and without AWS "
            "credentials it cannot be looked up",
            hint="configure AWS credentials, or use one of: "
            + ", ".join(sorted(catalog()["types"])),
        )
    capacity.check_choice(spec, info, regions)
    unresolved += [
        f"AMI ({opts.ami or 'the Deep Learning Base GPU AMI'}: {why})",
        f"zones and subnets of the default VPC in {', '.join(regions)} ({why})",
    ]
    found = [_offline_site(spec, opts, info, r, ssh_cidr) for r in regions]
    if found[0].egress.elastic_ips:
        unresolved.append(f"Elastic IP quota: {found[0].egress.elastic_ips} needed, not "
                          f"checked ({why})")
    if opts.capacity_block:
        hours = capacity.block_hours(spec.max_hours or 24.0)
        unresolved.append(
            f"Capacity Block offering for {spec.nodes} x {info.name} for {hours} h: its zone, "
            f"start and price come from DescribeCapacityBlockOfferings ({why}); nothing is "
            "bought before a plan with credentials shows them and you confirm")
    if opts.reservation:
        unresolved.append(f"capacity reservation {opts.reservation}: its zone, end, free "
                          "instances and placement group (if it has one, the nodes go into "
                          f"it; none is made) come from DescribeCapacityReservations ({why})")
    launch = _launch(spec, opts, info, found[0], fallback=found[1:])
    return _plan(spec, launch, info.gpu_count, unresolved, [])
