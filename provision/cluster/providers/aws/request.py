"""The typed request an AWS plan carries and `create` / `replace` consume (AwsLaunch): built by
plan.py from read-only calls, rendered for people by plan_text.py, never parsed back."""

from __future__ import annotations

from provision.cluster.providers.aws.network import Egress
from provision.model.base import StrictModel
from provision.model.plan import Plan

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
    vpc_id: str | None  # None: unresolved (offline plan)
    ami: str | None
    ami_name: str
    root_device: str | None  # the AMI's RootDeviceName: where disk_gb applies
    gpus: str  # e.g. "8 x NVIDIA A100 40 GiB", for people
    spot: bool
    spot_fallback: bool
    efa_interfaces: int
    device_rdma: bool
    disk_gb: int
    max_hours: float
    ssh_cidr: str
    private_ips: bool
    egress: Egress

    @property
    def interfaces(self) -> int:
        return max(1, self.efa_interfaces)


class AwsPlan(Plan):
    launch: AwsLaunch
