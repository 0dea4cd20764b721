"""The AWS plan's rendering for people: resources and notes (pure functions of AwsLaunch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.cluster.providers.aws.catalog import network_prices
from provision.model.plan import PlannedResource

if TYPE_CHECKING:
    from provision.cluster.providers.aws.request import AwsLaunch


def _name(cluster: str) -> str:
    return f"mgpu-cloud-{cluster}"


def planned_resources(cluster: str, nodes: int, launch: AwsLaunch) -> list[PlannedResource]:
    name = _name(cluster)
    egress = launch.egress
    net = network_prices()
    ipv4 = f"${float(net['public_ipv4_hour']):g}/h per address"
    resources = [
        PlannedResource(kind="key-pair", name=name, details={"key": "the cluster's ed25519 key"}),
        PlannedResource(
            kind="security-group", name=name,
            details={
                "vpc": launch.vpc_id or "(unresolved)", "ssh_from": launch.ssh_cidr,
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
                "zones": ",".join(f"{z.zone}={z.subnet}" for z in launch.zones) or "(unresolved)",
                "ami": launch.ami or "(unresolved)",
                "ami_name": launch.ami_name,
                "root_device": launch.root_device or "(unresolved)",
                "market": "spot" if launch.spot else "on-demand",
                "spot_fallback": "yes" if launch.spot_fallback else "no",
                "efa_interfaces": str(launch.efa_interfaces),
                "gpudirect_rdma": "yes" if launch.device_rdma else "no",
                "disk_gb": str(launch.disk_gb),
                "max_hours": f"{launch.max_hours:g}",
                "addresses": {"public-ip": "public IP per node (automatic)",
                              "elastic-ip": "one Elastic IP per node",
                              "nat": "private only"}[egress.mode],
            },
        ),
    ]
    quota = ("not checked" if egress.eip_quota is None
             else f"{egress.eips_in_use} of {egress.eip_quota} in use")
    if egress.mode == "elastic-ip":
        resources.append(PlannedResource(
            kind="elastic-ips", name=f"{nodes} x Elastic IP",
            details={"why": f"{launch.instance_type} has {launch.interfaces} network cards: "
                     "no automatic public IPv4", "cost": ipv4, "region_quota": quota},
        ))
    elif egress.mode == "nat":
        resources += [
            PlannedResource(kind="route-table", name=name,
                            details={"routes": "egress (all destinations) -> the NAT gateway"}),
            PlannedResource(kind="subnet", name=f"{name} (private)",
                            details={"where": "a free block of the default VPC, in the "
                                     "launch zone", "public_ips": "none"}),
            PlannedResource(kind="nat-gateway", name=name,
                            details={"where": "the launch zone's default subnet",
                                     "cost": f"${float(net['nat_gateway_hour']):g}/h + "
                                     f"${float(net['nat_gateway_gb']):g}/GB processed"}),
            PlannedResource(kind="elastic-ip", name=f"{name} (NAT)",
                            details={"cost": ipv4, "region_quota": quota}),
        ]
    return resources


def plan_notes(nodes: int, launch: AwsLaunch, *, max_hours_defaulted: bool) -> list[str]:
    net = network_prices()
    egress = launch.egress
    notes = [
        f"nodes shut down and terminate themselves after {launch.max_hours:g} h"
        + (" (default; change with --max-hours)" if max_hours_defaulted else ""),
        "zones tried in order on capacity errors: "
        + (", ".join(z.zone for z in launch.zones) or "(unresolved)"),
        f"internet: {egress.describe(nodes)}; ${egress.hourly_usd:,.3f}/h for the cluster, "
        "included in the cost"
        + (f", plus ${float(net['nat_gateway_gb']):g} per GB through the NAT gateway "
           "(image pulls count)" if egress.mode == "nat" else ""),
    ]
    if launch.private_ips:
        notes.append("--private-ips: the controller reaches the nodes on their private "
                     "addresses (it must run inside the VPC)")
    if launch.spot:
        notes.append("spot: the cost shown is the on-demand ceiling")
    return notes
