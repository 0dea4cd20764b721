"""Where a cluster can be launched: regions (--region, --regions a,b / any) and, per region,
its default VPC, the zones offering the type with their default subnets, the AMI and the
egress. Read-only calls; `plan` turns each usable region into a Site (request.py), in the
order `create` tries them.

--regions any: every region enabled for the account (DescribeRegions) whose offerings list the
type, the caller's default region first, then by known on-demand price, then by name.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from provision.cluster.providers.aws.api import Ec2
from provision.cluster.providers.aws.catalog import hourly_price
from provision.cluster.providers.aws.clients import resolve_region
from provision.cluster.providers.aws.network import plan_egress
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.request import Site, ZoneSubnet
from provision.model.errors import MgpuError, UserInputError
from provision.model.spec import ClusterSpec

# AWS Deep Learning Base OSS Nvidia Driver GPU AMI, public SSM parameters ("DLAMI" developer
# guide, each AMI's "SSM Parameter Query"); {ubuntu} is 22.04 or 24.04.
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-"
                   "{ubuntu}/latest/ami-id")
# Types the Ubuntu 22.04 DLAMI no longer lists among its supported instances (its release
# notes' "Supported EC2 instances"; p6-b300 is launched on the 24.04 family, which lists it)
UBUNTU_2404_ONLY = ("p6-b300.",)


def dlami_parameter(instance_type: str | None) -> str:
    """The DLAMI for the type: Ubuntu 22.04 (what the nodes' EFA paths were checked on), or
    24.04 where 22.04 does not support the type."""
    newer = instance_type is not None and instance_type.startswith(UBUNTU_2404_ONLY)
    return DLAMI_PARAMETER.format(ubuntu="24.04" if newer else "22.04")
ANY = "any"
MAX_PARALLEL_REGIONS = 8


def wanted_regions(session: Any, opts: AwsOptions) -> list[str] | None:
    """The regions asked for, checked locally, in order; None for `any` (resolved with AWS).
    UserInputError for combinations that name one region's things (--ami, --zone)."""
    if not opts.regions:
        return [resolve_region(session, opts.region)]
    if opts.region:
        raise UserInputError("--region and --regions exclude each other",
                             hint="list every region in --regions, first choice first")
    for flag, value in (("--ami", opts.ami), ("--zone", opts.zone)):
        if value:
            raise UserInputError(f"{flag} {value} belongs to one region; it cannot be combined "
                                 "with --regions", hint=f"pass --region with {flag}, or drop it")
    if opts.regions == [ANY]:
        return None
    if ANY in opts.regions:
        raise UserInputError("--regions any cannot be mixed with region names")
    return list(dict.fromkeys(resolve_region(session, r) for r in opts.regions))


def any_regions(session: Any, instance_type: str) -> list[str]:
    """Every enabled region offering `instance_type`, ordered (module docstring)."""
    regions = [str(r["RegionName"]) for r in Ec2("us-east-1", session).get(
        "describe_regions", "Regions", AllRegions=False)]
    offered = [r for r in _in_parallel(regions, lambda r: _offers(None, r, instance_type))
               if r is not None]
    home = session.region_name

    def order(region: str) -> tuple[int, float, str]:
        price = hourly_price(instance_type, region).usd_per_hour
        return (region != home, price if price is not None else float("inf"), region)

    return sorted(offered, key=order)


def _offers(session: Any | None, region: str, instance_type: str) -> str | None:
    found = Ec2(region, session).get(
        "describe_instance_type_offerings", "InstanceTypeOfferings", LocationType="region",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return region if found else None


def _in_parallel(items: list[str], fn: Callable[[str], Any]) -> list[Any]:
    """fn over items with a few threads (read-only calls to different regions), in order."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_REGIONS, len(items))) as pool:
        return list(pool.map(fn, items))


def plan_site(session: Any | None, region: str, spec: ClusterSpec, instance_type: str,
              interfaces: int, ssh_cidr: str | None, zone: str | None) -> Site:
    """One region resolved (UserInputError when it cannot take the cluster). `session`: None
    makes a fresh one (boto3 sessions are not shared between threads)."""
    opts = spec.options_as(AwsOptions)
    ec2 = Ec2(region, session)
    vpc, zones = zones_of(ec2, instance_type, zone)
    ami, ami_name, root = ami_of(ec2, opts.ami, opts.disk_gb, instance_type)
    egress = plan_egress(ec2, spec.nodes, interfaces, opts.private_ips)
    price = hourly_price(instance_type, region)
    return Site(region=region, vpc_id=str(vpc["VpcId"]),
                ssh_cidrs=[ssh_cidr] if ssh_cidr else vpc_cidrs(vpc),
                zones=[ZoneSubnet(zone=z, subnet=sn) for z, sn in zones], ami=ami,
                ami_name=ami_name or "(custom)", root_device=root, egress=egress,
                usd_per_hour=price.usd_per_hour, price_source=price.source)


def plan_sites(session: Any, regions: list[str], spec: ClusterSpec, instance_type: str,
               interfaces: int, ssh_cidr: str | None,
               zone: str | None = None) -> tuple[list[Site], list[str]]:
    """(usable sites in order, "region: why not" for the others). With one region its error
    is raised as it is; with several, only when none is usable."""
    if len(regions) == 1:
        return [plan_site(session, regions[0], spec, instance_type, interfaces, ssh_cidr,
                          zone)], []

    def one(region: str) -> Site | str:
        try:
            return plan_site(None, region, spec, instance_type, interfaces, ssh_cidr, zone)
        except MgpuError as exc:
            return f"{region}: {exc.message}"

    results = _in_parallel(regions, one)
    sites = [r for r in results if isinstance(r, Site)]
    skipped = [r for r in results if isinstance(r, str)]
    if not sites:
        raise UserInputError(f"no region can take {spec.nodes} x {instance_type}: "
                             + "; ".join(skipped), hint="try other --regions")
    return sites, skipped


def vpc_cidrs(vpc: dict[str, Any]) -> list[str]:
    """The VPC's IPv4 ranges (primary and associated secondary blocks, "VPC CIDR blocks",
    Amazon VPC User Guide): where a controller inside the VPC can come from."""
    blocks = [str(b["CidrBlock"]) for b in vpc.get("CidrBlockAssociationSet") or []
              if (b.get("CidrBlockState") or {}).get("State", "associated") == "associated"]
    return blocks or [str(vpc["CidrBlock"])]


def zones_of(ec2: Ec2, instance_type: str, zone: str | None) -> tuple[dict[str, Any],
                                                                     list[tuple[str, str]]]:
    """The default VPC of the region and [(zone, default subnet)] of the zones offering the
    type (only `zone` when given). UserInputError saying what is missing."""
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
    vpc: dict[str, Any] = vpcs[0]
    vpc_id = str(vpc["VpcId"])
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
    return vpc, zones


def ami_of(ec2: Ec2, wanted: str | None, disk_gb: int,
           instance_type: str | None = None) -> tuple[str, str, str]:
    """(AMI id, name, root device name). The root device name comes from the image (Ubuntu
    AMIs use /dev/sda1, Amazon Linux /dev/xvda: "Device names on Linux instances", EC2 User
    Guide); a mapping under another name would add a second volume instead of sizing root."""
    ami = wanted or ec2.ssm_parameter(dlami_parameter(instance_type))
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


