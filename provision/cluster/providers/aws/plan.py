"""`plan`: validate a spec against AWS with read-only calls and describe what `up` will make.

Everything `create` needs is in the plan's typed `launch` (AwsLaunch); the resource list is its
rendering for people. `up` executes exactly the plan it printed.
Order of checks: local input first (nodes, CIDR, region), then describe calls.
Without credentials the plan is made from the shipped catalog (type facts, prices) and lists
what it could not look up (`unresolved`: AMI, subnets, Elastic IP quota); it is printed by
`--dry-run` and never created.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.aws.api import Ec2
from provision.cluster.providers.aws.catalog import (
    InstanceTypeInfo,
    Price,
    catalog,
    hourly_price,
    known_type,
    network_prices,
    parse_instance_type,
)
from provision.cluster.providers.aws.clients import new_session, resolve_region
from provision.cluster.providers.aws.errors import error_code
from provision.cluster.providers.aws.network import Egress, plan_egress
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.plan_text import plan_notes, planned_resources
from provision.cluster.providers.aws.request import AwsLaunch, AwsPlan, ZoneSubnet
from provision.model.errors import UserInputError
from provision.model.spec import ClusterSpec, validate_cidr

# AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04), public SSM parameter.
DLAMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
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


def _ssh_cidr(spec: ClusterSpec) -> str:
    """--ssh-cidr, else this machine's public address (UserInputError if unknown)."""
    if spec.ssh_cidr is not None:
        try:
            return validate_cidr(spec.ssh_cidr)
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
    from provision.cluster.caller_address import caller_cidr

    return caller_cidr()


def _zones(ec2: Ec2, spec: ClusterSpec, instance_type: str) -> tuple[str, list[tuple[str, str]]]:
    offered = sorted(
        o["Location"]
        for o in ec2.pages(
            "describe_instance_type_offerings", "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
    )
    if not offered:
        raise UserInputError(
            f"{instance_type} is not offered in {ec2.region}",
            hint="choose another --region (p4d/p5 are in e.g. us-east-1, us-west-2)",
        )
    zone = spec.options_as(AwsOptions).zone
    if zone is not None:
        if zone not in offered:
            raise UserInputError(
                f"zone {zone!r} does not offer {instance_type}",
                hint=f"zones of {ec2.region} that do: {', '.join(offered)} (or omit --zone)",
            )
        offered = [zone]
    vpcs = ec2.get("describe_vpcs", "Vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])
    if not vpcs:
        raise UserInputError(
            f"{ec2.region} has no default VPC to launch into",
            hint=f"create one: aws ec2 create-default-vpc --region {ec2.region}",
        )
    vpc_id = str(vpcs[0]["VpcId"])
    subnets = ec2.pages(
        "describe_subnets", "Subnets",
        Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "default-for-az", "Values": ["true"]},
        ],
    )
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    zones = [(z, by_zone[z]) for z in offered if z in by_zone]
    if not zones:
        raise UserInputError(
            f"the default VPC of {ec2.region} has no default subnet in {', '.join(offered)}",
            hint=f"aws ec2 create-default-subnet --availability-zone {offered[0]}",
        )
    return vpc_id, zones


def _ami(ec2: Ec2, wanted: str | None, disk_gb: int) -> tuple[str, str, str]:
    """(AMI id, name, root device name). The root device name comes from the image (Ubuntu
    AMIs use /dev/sda1, Amazon Linux /dev/xvda: "Device names on Linux instances", EC2 User
    Guide); a mapping under another name would add a second volume instead of sizing root."""
    ami = wanted or ec2.ssm_parameter(DLAMI_PARAMETER)
    images = ec2.get("describe_images", "Images", ImageIds=[ami])
    if not images:
        raise UserInputError(f"AMI {ami!r} does not exist in {ec2.region}")
    image: dict[str, Any] = images[0]
    root = str(image.get("RootDeviceName") or "")
    if not root:
        raise UserInputError(f"AMI {ami!r} names no root device", hint="use an EBS-backed AMI")
    for mapping in image.get("BlockDeviceMappings") or []:
        size = (mapping.get("Ebs") or {}).get("VolumeSize")
        if mapping.get("DeviceName") == root and size and int(size) > disk_gb:
            raise UserInputError(
                f"AMI {ami!r} needs a root disk of at least {size} GB; {disk_gb} GB was asked for",
                hint=f"pass --disk-gb {size} or more",
            )
    return ami, str(image.get("Name") or ""), root


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
    region = resolve_region(session, opts.region)
    ec2 = Ec2(region, session)
    info = _describe_type(ec2, opts.instance_type)
    vpc_id, zones = _zones(ec2, spec, info.name)
    ami, ami_name, root = _ami(ec2, opts.ami, opts.disk_gb)
    egress = plan_egress(ec2, spec.nodes, info.interfaces, opts.private_ips)
    launch = _launch(spec, opts, info, region, ssh_cidr, egress, vpc_id=vpc_id,
                     zones=[ZoneSubnet(zone=z, subnet=sn) for z, sn in zones], ami=ami,
                     ami_name=ami_name or "(custom)", root=root)
    return _plan(spec, launch, hourly_price(info.name, region), info.gpu_count, [])


def _launch(spec: ClusterSpec, opts: AwsOptions, info: InstanceTypeInfo, region: str,
            ssh_cidr: str, egress: Egress, *, vpc_id: str | None, zones: list[ZoneSubnet],
            ami: str | None, ami_name: str, root: str | None) -> AwsLaunch:
    return AwsLaunch(
        region=region, instance_type=info.name, zones=zones, vpc_id=vpc_id, ami=ami,
        ami_name=ami_name, root_device=root, gpus=info.gpu_summary(), spot=spec.spot,
        spot_fallback=spec.spot and opts.spot_fallback, efa_interfaces=info.efa_interfaces,
        device_rdma=info.device_rdma, disk_gb=opts.disk_gb,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS, ssh_cidr=ssh_cidr,
        private_ips=opts.private_ips, egress=egress,
    )


def _plan(spec: ClusterSpec, launch: AwsLaunch, price: Price, gpus: int,
          unresolved: list[str]) -> AwsPlan:
    nodes_cost = None if price.usd_per_hour is None else price.usd_per_hour * spec.nodes
    unpriced = [] if nodes_cost is not None else [f"{launch.instance_type}: {price.source}"]
    return AwsPlan(
        provider="aws",
        cluster=spec.name,
        nodes=spec.nodes,
        slots_per_node=spec.gpus_per_node or gpus,
        resources=planned_resources(spec.name, spec.nodes, launch),
        hourly_cost_usd=round((nodes_cost or 0.0) + launch.egress.hourly_usd, 4),
        max_hours=launch.max_hours,
        price_source=f"{launch.instance_type}: {price.source}; network: "
                     f"{network_prices()['source']}",
        notes=plan_notes(spec.nodes, launch, max_hours_defaulted=spec.max_hours is None),
        unpriced=unpriced,
        unresolved=unresolved,
        launch=launch,
    )


def _offline_plan(spec: ClusterSpec, opts: AwsOptions, session: Any) -> AwsPlan:
    """The plan without AWS (no credentials): facts and prices from the shipped catalog;
    what needs AWS is listed as unresolved. Never created (create() and `up` refuse it)."""
    unresolved: list[str] = []
    try:
        ssh_cidr = _ssh_cidr(spec)
    except UserInputError as exc:
        ssh_cidr = "(unresolved)"
        unresolved.append(f"SSH source range ({exc.message}; pass --ssh-cidr)")
    if opts.region or session.region_name:
        region = resolve_region(session, opts.region)  # a local check: botocore's region list
    else:
        region = str(catalog()["reference_region"])
        unresolved.append(f"region ({region} assumed: pass --region)")
    info = known_type(opts.instance_type)
    if info is None:
        raise UserInputError(
            f"{opts.instance_type!r} is not in the offline catalog, and without AWS "
            "credentials it cannot be looked up",
            hint="configure AWS credentials, or use one of: "
            + ", ".join(sorted(catalog()["types"])),
        )
    why = f"{NO_CREDENTIALS}: configure them (aws configure, AWS_PROFILE, aws sso login)"
    unresolved += [
        f"AMI ({opts.ami or 'the Deep Learning Base GPU AMI'}: {why})",
        f"zones and subnets of the default VPC in {region} ({why})",
    ]
    egress = plan_egress(None, spec.nodes, info.interfaces, opts.private_ips)
    if egress.elastic_ips:
        unresolved.append(f"Elastic IP quota: {egress.elastic_ips} needed, not checked ({why})")
    zones = [ZoneSubnet(zone=opts.zone, subnet="(unresolved)")] if opts.zone else []
    launch = _launch(spec, opts, info, region, ssh_cidr, egress, vpc_id=None, zones=zones,
                     ami=opts.ami, ami_name="(unresolved)", root=None)
    return _plan(spec, launch, hourly_price(info.name, region), info.gpu_count, unresolved)
