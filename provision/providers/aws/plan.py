"""`plan`: validate a spec against AWS with read-only calls and describe what `up` will make.

Everything `create` needs is in the plan's typed `launch` (AwsLaunch); the resource list is its
rendering for people. `up` executes exactly the plan it printed.
Order of checks: local input first (nodes, CIDR, credentials, region), then describe calls.
"""

from __future__ import annotations

from provision.errors import UserInputError
from provision.model import StrictModel
from provision.plan import Plan, PlannedResource
from provision.providers.aws.api import Ec2
from provision.providers.aws.catalog import hourly_price, parse_instance_type
from provision.providers.aws.clients import new_session, require_credentials, resolve_region
from provision.providers.aws.errors import error_code
from provision.providers.aws.options import AwsOptions
from provision.spec import ClusterSpec, validate_cidr

# AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04), public SSM parameter.
DLAMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
DEFAULT_MAX_HOURS = 8.0
# AWS publishes no hard instance limit for one cluster placement group, but one RunInstances
# of more nodes than this into one group practically never finds capacity (larger clusters
# need capacity reservations / capacity blocks, which this tool does not manage).
MAX_NODES_PER_PLACEMENT_GROUP = 256
NODE_USER = "ubuntu"


def resource_name(cluster: str) -> str:
    return f"mgpu-cloud-{cluster}"


class ZoneSubnet(StrictModel):
    zone: str
    subnet: str  # the default subnet of the zone


class AwsLaunch(StrictModel):
    """What `create` does: everything resolved by `plan`, typed."""

    region: str
    instance_type: str
    zones: list[ZoneSubnet]  # in failover order
    vpc_id: str
    ami: str
    ami_name: str
    gpus: str  # e.g. "8 x NVIDIA A100 40 GiB", for people
    spot: bool
    spot_fallback: bool
    efa_interfaces: int
    device_rdma: bool
    disk_gb: int
    max_hours: float
    ssh_cidr: str
    private_ips: bool
    gateway_eip: bool  # multi-card types: no automatic public IP -> one Elastic IP on node-0

    @property
    def interfaces(self) -> int:
        return max(1, self.efa_interfaces)


class AwsPlan(Plan):
    launch: AwsLaunch


def _validate_local(spec: ClusterSpec) -> str:
    """Checks that need no AWS call; returns the SSH CIDR."""
    if spec.nodes > MAX_NODES_PER_PLACEMENT_GROUP:
        raise UserInputError(
            f"{spec.nodes} nodes do not fit one cluster placement group "
            f"(this tool launches at most {MAX_NODES_PER_PLACEMENT_GROUP} in one)",
            hint=f"ask for --nodes {MAX_NODES_PER_PLACEMENT_GROUP} or fewer",
        )
    if spec.ssh_cidr is not None:
        try:
            return validate_cidr(spec.ssh_cidr)
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
    from provision.caller_address import caller_cidr

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
    vpcs = ec2.call("describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
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


def _ami(ec2: Ec2, wanted: str | None) -> tuple[str, str]:
    ami = wanted or ec2.ssm_parameter(DLAMI_PARAMETER)
    images = ec2.call("describe_images", ImageIds=[ami])["Images"]
    if not images:
        raise UserInputError(f"AMI {ami!r} does not exist in {ec2.region}")
    return ami, str(images[0].get("Name") or "")


def build_plan(spec: ClusterSpec) -> Plan:
    """Read-only: validates `spec` and returns the Plan. Never writes."""
    ssh_cidr = _validate_local(spec)
    opts = spec.options_as(AwsOptions)
    session = new_session()
    region = resolve_region(session, opts.region)
    require_credentials(session)
    ec2 = Ec2(region, session)

    from botocore.exceptions import ClientError

    try:
        described = ec2.call("describe_instance_types", InstanceTypes=[opts.instance_type])
    except ClientError as exc:
        if error_code(exc) == "InvalidInstanceType":
            raise UserInputError(
                f"unknown instance type {opts.instance_type!r} in {region}",
                hint="e.g. --instance-type p4d.24xlarge or p5.48xlarge",
            ) from None
        raise
    if not described["InstanceTypes"]:
        raise UserInputError(f"unknown instance type {opts.instance_type!r} in {region}")
    info = parse_instance_type(described["InstanceTypes"][0])
    price, price_source = hourly_price(info.name, region)
    vpc_id, zones = _zones(ec2, spec, info.name)
    ami, ami_name = _ami(ec2, opts.ami)

    launch = AwsLaunch(
        region=region, instance_type=info.name, zones=[ZoneSubnet(zone=z, subnet=sn) for z, sn in zones],
        vpc_id=vpc_id, ami=ami, ami_name=ami_name or "(custom)", gpus=info.gpu_summary(),
        spot=spec.spot, spot_fallback=spec.spot and opts.spot_fallback,
        efa_interfaces=info.efa_interfaces, device_rdma=info.device_rdma, disk_gb=opts.disk_gb,
        max_hours=spec.max_hours or DEFAULT_MAX_HOURS, ssh_cidr=ssh_cidr,
        private_ips=opts.private_ips, gateway_eip=info.interfaces > 1 and not opts.private_ips,
    )
    return AwsPlan(
        provider="aws",
        cluster=spec.name,
        nodes=spec.nodes,
        slots_per_node=spec.gpus_per_node or info.gpu_count,
        resources=planned_resources(spec.name, spec.nodes, launch),
        hourly_cost_usd=round(price * spec.nodes, 4),
        max_hours=launch.max_hours,
        price_source=price_source,
        notes=plan_notes(launch, max_hours_defaulted=spec.max_hours is None),
        launch=launch,
    )


def planned_resources(cluster: str, nodes: int, launch: AwsLaunch) -> list[PlannedResource]:
    """The plan's rendering for people (pure)."""
    name = resource_name(cluster)
    resources = [
        PlannedResource(kind="key-pair", name=name, details={"key": "the cluster's ed25519 key"}),
        PlannedResource(
            kind="security-group", name=name,
            details={
                "vpc": launch.vpc_id, "ssh_from": launch.ssh_cidr,
                "intra_cluster": "all traffic in and out to the group itself (EFA)",
            },
        ),
        PlannedResource(kind="placement-group", name=name, details={"strategy": "cluster"}),
        PlannedResource(
            kind="instances", name=f"{nodes} x {launch.instance_type}",
            details={
                "region": launch.region,
                "instance_type": launch.instance_type,
                "gpus": launch.gpus,
                "zones": ",".join(f"{z.zone}={z.subnet}" for z in launch.zones),
                "ami": launch.ami,
                "ami_name": launch.ami_name,
                "market": "spot" if launch.spot else "on-demand",
                "spot_fallback": "yes" if launch.spot_fallback else "no",
                "efa_interfaces": str(launch.efa_interfaces),
                "gpudirect_rdma": "yes" if launch.device_rdma else "no",
                "disk_gb": str(launch.disk_gb),
                "max_hours": f"{launch.max_hours:g}",
                "addresses": "private" if launch.private_ips else (
                    "node-0 via Elastic IP, others through it" if launch.gateway_eip
                    else "public IP"
                ),
            },
        ),
    ]
    if launch.gateway_eip:
        resources.append(PlannedResource(
            kind="elastic-ip", name=f"{name}-node-0",
            details={"why": f"{launch.instance_type} has {launch.interfaces} network cards: "
                     "no automatic public IP"},
        ))
    return resources


def plan_notes(launch: AwsLaunch, *, max_hours_defaulted: bool) -> list[str]:
    notes = [
        f"nodes shut down and terminate themselves after {launch.max_hours:g} h"
        + (" (default; change with --max-hours)" if max_hours_defaulted else ""),
        f"zones tried in order on capacity errors: {', '.join(z.zone for z in launch.zones)}",
    ]
    if launch.spot:
        notes.append("spot: the cost shown is the on-demand ceiling")
    if launch.gateway_eip:
        notes.append("node-0 is the SSH gateway: other nodes are reached through it (ProxyJump)")
    return notes
