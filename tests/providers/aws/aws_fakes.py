"""Small, explicit fakes for what moto lacks, attached to every client the AWS provider makes
(the `fakes` fixture of conftest.py; benchmarks/aws_api_calls.py uses them too):

- `AwsFakes.sent`: a recorder of what the provider SENT (moto drops EFA interface types and
  Placement.GroupName, so assertions about them must look at the request, not at moto).
- a placement-group fake (moto raises NotImplementedError for *PlacementGroup*): in-memory
  groups with tags, 'InUse' while a launched instance of the group is alive, scripted extra
  'InUse' answers for retry tests.
- the DLAMI public SSM parameter (moto has none and `/aws/service/...` cannot be put).
- fault injectors: `fail(op, code, status, when=..., times=...)` and `throttle(rate, seed)`,
  answered from a `before-call` handler (a `before-send` handler would not stop moto).

- a console-output fake (moto's GetConsoleOutput returns canned text): every instance has a
  host key of its own (`host_keys`, made on first ask, as the instance makes one at first
  boot) and its console shows what cloud-init prints at the end of first boot
  (console_output(): fingerprints and public keys, syslog-prefixed), after `console_delay`
  polls of plain boot output; `console_script(iid, n)` can answer anything instead.
- the region's Elastic IP quota (`eip_quota`; None: moto's answer, 5, AWS's default).
- scripted images (`images`): moto's RegisterImage ignores RootDeviceName and the block device
  mappings (always /dev/sda1, 15 GB), so AMIs with another root are answered from here.

Also here: moto's own state seen through plain clients (`moto_client`), what carries a
cluster's tag (`tagged_resources`), a cluster spec of the provider (`make_spec`) and `up`.
"""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aws_capacity import CapacityFake
from aws_console import console_output

REGION = "us-east-1"
TAG = "mgpu-cloud-cluster"
WRITE_PREFIXES = (
    "Create", "Run", "Import", "Authorize", "Allocate", "Associate", "Delete", "Terminate",
    "Release", "Disassociate", "Revoke", "Put", "Modify",
)


_MOTO_CLIENTS: dict[str, Any] = {}
# The plan resolves several regions in threads (--regions): the per-region set-up below (moto
# clients, the real-looking default VPC, the DLAMI) happens once, under this lock.
SETUP = threading.RLock()


def moto_client(region: str = REGION) -> Any:
    """A plain EC2 client (no fakes attached) for looking at moto's state directly. One per
    region and process: making a botocore client costs ~50 ms, and moto's state lives outside
    it."""
    with SETUP:
        return _moto_client(region)


def _moto_client(region: str) -> Any:
    if region not in _MOTO_CLIENTS:
        from provision.cluster.providers.aws.clients import new_session

        _MOTO_CLIENTS[region] = new_session().client("ec2", region_name=region)
    return _MOTO_CLIENTS[region]


def register_dlami(ec2: Any, ubuntu: str = "22.04") -> str:
    image: str = ec2.register_image(
        Name=f"Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu {ubuntu}) 20250601",
        Architecture="x86_64", RootDeviceName="/dev/sda1", VirtualizationType="hvm",
    )["ImageId"]
    return image


# Canonical's Ubuntu 24.04 server AMIs, by the public SSM parameter's architecture (the AWS
# controller's image): a name as Canonical gives its AMIs
UBUNTU_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/"


def register_ubuntu(ec2: Any, arch: str) -> str:
    image: str = ec2.register_image(
        Name=f"ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-{arch}-server-20250601",
        Architecture="x86_64" if arch == "amd64" else "arm64", RootDeviceName="/dev/sda1",
        VirtualizationType="hvm")["ImageId"]
    return image


def _offered_zones(region: str, instance_type: str) -> list[str]:
    """The zones moto offers the type in (where the capacity fake places its offerings)."""
    found = moto_client(region).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}])["InstanceTypeOfferings"]
    return sorted(o["Location"] for o in found)


def _live_instances(region: str, ids: list[str]) -> int:
    found = moto_client(region).describe_instances(InstanceIds=ids)["Reservations"]
    return sum(1 for r in found for i in r["Instances"]
               if i["State"]["Name"] in ("pending", "running"))


@dataclass
class Fault:
    operation: str
    code: str
    status: int = 400
    when: Callable[[dict[str, Any]], bool] = lambda params: True
    times: int | None = None  # None: every time

    def fires(self, operation: str, params: dict[str, Any]) -> bool:
        if operation != self.operation or self.times == 0 or not self.when(params):
            return False
        if self.times is not None:
            self.times -= 1
        return True


@dataclass
class AwsFakes:
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    placement_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_of_instance: dict[str, str] = field(default_factory=dict)
    extra_in_use: int = 0
    throttle_rate: float = 0.0
    throttled: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(1234))
    dlami: str = ""  # the DLAMI of REGION
    dlamis: dict[str, str] = field(default_factory=dict)  # other regions, registered on first use
    ubuntu: dict[tuple[str, str], str] = field(default_factory=dict)  # (region, arch) -> AMI
    dlamis_2404: dict[str, str] = field(default_factory=dict)  # region -> the 24.04 DLAMI
    eip_quota: int | None = None
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_keys: dict[str, Any] = field(default_factory=dict)  # instance id -> its KeyPair
    console_calls: dict[str, int] = field(default_factory=dict)
    console_delay: int = 0  # polls that see only boot messages, per instance
    console_script: Callable[[str, int], str | None] | None = None
    capacity: CapacityFake = field(default_factory=CapacityFake)

    def __post_init__(self) -> None:
        self.capacity.live = _live_instances

    # --- assertions helpers ------------------------------------------------------------------
    def calls(self, operation: str) -> list[dict[str, Any]]:
        return [p for op, p in self.sent if op == operation]

    def operations(self) -> list[str]:
        return [op for op, _ in self.sent]

    def writes(self) -> list[str]:
        return [op for op in self.operations() if op.startswith(WRITE_PREFIXES)]

    # --- scripting ----------------------------------------------------------------------------
    def fail(self, operation: str, code: str, status: int = 400,
             when: Callable[[dict[str, Any]], bool] = lambda p: True, times: int | None = None) -> None:
        self.faults.append(Fault(operation, code, status, when, times))

    def throttle(self, rate: float, seed: int = 1234) -> None:
        self.throttle_rate, self.rng = rate, random.Random(seed)

    # --- botocore handlers -------------------------------------------------------------------
    def dlami_in(self, region: str) -> str:
        """The DLAMI id of `region` (moto keeps images per region)."""
        if region == REGION:
            return self.dlami
        with SETUP:
            if region not in self.dlamis:
                self.dlamis[region] = register_dlami(moto_client(region))
            return self.dlamis[region]

    def dlami_2404_in(self, region: str) -> str:
        with SETUP:
            if region not in self.dlamis_2404:
                self.dlamis_2404[region] = register_dlami(moto_client(region), "24.04")
            return self.dlamis_2404[region]

    def ubuntu_in(self, region: str, arch: str) -> str:
        with SETUP:
            if (region, arch) not in self.ubuntu:
                self.ubuntu[(region, arch)] = register_ubuntu(moto_client(region), arch)
            return self.ubuntu[(region, arch)]

    def attach(self, client: Any) -> None:
        events = client.meta.events
        service = client.meta.service_model.service_id.hyphenize()
        region = client.meta.region_name
        events.register(f"before-parameter-build.{service}", self._record)
        events.register(f"before-call.{service}",
                        lambda model, context, **kw: self._answer(model, context, region))
        events.register(f"after-call.{service}.RunInstances",
                        lambda parsed, context, **kw: self._launched(parsed, context, region))

    def _record(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        snapshot = copy.deepcopy(params)
        context["fake_params"] = snapshot
        self.sent.append((model.name, snapshot))

    @staticmethod
    def _response(status: int, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        from botocore.awsrequest import AWSResponse

        body.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = status
        return AWSResponse("https://fake.invalid/", status, {}, None), body

    def _error(self, code: str, status: int = 400) -> tuple[Any, dict[str, Any]]:
        return self._response(status, {"Error": {"Code": code, "Message": f"injected {code}"}})

    def _answer(self, model: Any, context: dict[str, Any], region: str) -> Any:
        op, params = model.name, context.get("fake_params", {})
        if self.throttle_rate and self.rng.random() < self.throttle_rate:
            self.throttled += 1
            return self._error("RequestLimitExceeded", 503)
        for fault in self.faults:
            if fault.fires(op, params):
                return self._error(fault.code, fault.status)
        if op == "DescribeImages" and set(params.get("ImageIds", [])) & set(self.images):
            return self._response(200, {"Images": [
                copy.deepcopy(self.images[i]) for i in params["ImageIds"] if i in self.images]})
        if op == "DescribeAccountAttributes" and self.eip_quota is not None:
            return self._response(200, {"AccountAttributes": [{
                "AttributeName": "vpc-max-elastic-ips",
                "AttributeValues": [{"AttributeValue": str(self.eip_quota)}]}]})
        if op == "GetParameter" and params.get("Name", "").startswith("/aws/service/deeplearning/"):
            image = (self.dlami_2404_in(region) if "ubuntu-24.04" in params["Name"]
                     else self.dlami_in(region))
            return self._response(200, {"Parameter": {
                "Name": params["Name"], "Type": "String", "Value": image, "Version": 1}})
        if op == "GetParameter" and params.get("Name", "").startswith(UBUNTU_PARAMETER):
            arch = params["Name"][len(UBUNTU_PARAMETER):].split("/")[0]
            return self._response(200, {"Parameter": {
                "Name": params["Name"], "Type": "String",
                "Value": self.ubuntu_in(region, arch), "Version": 1}})
        if op == "GetConsoleOutput":
            return self._console(params["InstanceId"])
        answered = self.capacity.answer(op, params, region, _offered_zones)
        if answered is not None:
            return self._response(*answered)
        if op == "CreatePlacementGroup":
            return self._create_pg(params)
        if op == "DescribePlacementGroups":
            return self._describe_pgs(params)
        if op == "DeletePlacementGroup":
            return self._delete_pg(params)
        if op == "RunInstances":
            group = (params.get("Placement") or {}).get("GroupName")
            if group and group not in self.placement_groups:
                return self._error("InvalidPlacementGroup.Unknown")
        return None

    def host_key(self, iid: str) -> str:
        """The instance's own public host key ('ssh-ed25519 BASE64')."""
        from provision.model.keys import generate_ed25519, host_key_only

        if iid not in self.host_keys:
            self.host_keys[iid] = generate_ed25519(f"root@{iid}")
        return host_key_only(self.host_keys[iid].public_openssh)

    def _console(self, iid: str) -> Any:
        import base64
        import datetime as dt

        n = self.console_calls[iid] = self.console_calls.get(iid, 0) + 1
        text = self.console_script(iid, n) if self.console_script else None
        if text is None:
            text = console_output(self.host_key(iid), with_keys=n > self.console_delay)
        return self._response(200, {
            "InstanceId": iid, "Timestamp": dt.datetime.now(dt.UTC),
            "Output": base64.b64encode(text.encode()).decode()})

    def _launched(self, parsed: dict[str, Any], context: dict[str, Any], region: str) -> None:
        # moto tags no network interface at launch; EC2 tags each one the launch makes with the
        # request's "network-interface" TagSpecifications (RunInstances, EC2 API Reference)
        params = context.get("fake_params", {})
        nic_tags = [t for s in params.get("TagSpecifications", [])
                    if s.get("ResourceType") == "network-interface" for t in s.get("Tags", [])]
        enis = [n["NetworkInterfaceId"] for i in parsed.get("Instances", [])
                for n in i.get("NetworkInterfaces", [])]
        if nic_tags and enis:
            moto_client(region).create_tags(Resources=enis, Tags=nic_tags)
        target = (context.get("fake_params", {}).get("CapacityReservationSpecification") or {}
                  ).get("CapacityReservationTarget") or {}
        if target.get("CapacityReservationId"):
            self.capacity.joined(target["CapacityReservationId"],
                                 [i["InstanceId"] for i in parsed.get("Instances", [])])
        group = (context.get("fake_params", {}).get("Placement") or {}).get("GroupName")
        if group:
            for inst in parsed.get("Instances", []):
                self.group_of_instance[inst["InstanceId"]] = group

    def _create_pg(self, params: dict[str, Any]) -> Any:
        name = params["GroupName"]
        if name in self.placement_groups:
            return self._error("InvalidPlacementGroup.Duplicate")
        tags = [t for spec in params.get("TagSpecifications", []) for t in spec.get("Tags", [])]
        group = {"GroupName": name, "GroupId": f"pg-{len(self.placement_groups):017x}",
                 "Strategy": params.get("Strategy"), "State": "available", "Tags": tags}
        self.placement_groups[name] = group
        return self._response(200, {"PlacementGroup": copy.deepcopy(group)})

    def _describe_pgs(self, params: dict[str, Any]) -> Any:
        groups = list(self.placement_groups.values())
        names = params.get("GroupNames")
        if names:
            missing = [n for n in names if n not in self.placement_groups]
            if missing:
                return self._error("InvalidPlacementGroup.Unknown")
            groups = [g for g in groups if g["GroupName"] in names]
        for flt in params.get("Filters", []):
            key, values = flt["Name"], flt["Values"]
            if key == "tag-key":
                groups = [g for g in groups if any(t["Key"] in values for t in g["Tags"])]
            elif key.startswith("tag:"):
                groups = [g for g in groups if any(
                    t["Key"] == key[4:] and t["Value"] in values for t in g["Tags"])]
            elif key == "group-name":
                groups = [g for g in groups if g["GroupName"] in values]
        return self._response(200, {"PlacementGroups": copy.deepcopy(groups)})

    def _delete_pg(self, params: dict[str, Any]) -> Any:
        name = params["GroupName"]
        if name not in self.placement_groups:
            return self._error("InvalidPlacementGroup.Unknown")
        if self.extra_in_use > 0:
            self.extra_in_use -= 1
            return self._error("InvalidPlacementGroup.InUse")
        members = [i for i, g in self.group_of_instance.items() if g == name]
        if members:
            ec2 = moto_client()  # moto's state, not through the hooks
            live = [
                i for r in ec2.describe_instances(InstanceIds=members)["Reservations"]
                for i in r["Instances"] if i["State"]["Name"] != "terminated"
            ]
            if live:
                return self._error("InvalidPlacementGroup.InUse")
        del self.placement_groups[name]
        return self._response(200, {})



def tagged_resources(fakes: AwsFakes, cluster: str | None = None) -> dict[str, list[str]]:
    """What exists in (moto + the placement-group fake) carrying the cluster tag."""
    ec2 = moto_client()
    flt = ([{"Name": f"tag:{TAG}", "Values": [cluster]}] if cluster
           else [{"Name": "tag-key", "Values": [TAG]}])
    out = {
        "instance": [
            i["InstanceId"] for r in ec2.describe_instances(Filters=flt)["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] != "terminated"
        ],
        "security-group": [g["GroupId"] for g in ec2.describe_security_groups(Filters=flt)["SecurityGroups"]],
        "key-pair": [k["KeyPairId"] for k in ec2.describe_key_pairs(Filters=flt)["KeyPairs"]],
        "elastic-ip": [a["AllocationId"] for a in ec2.describe_addresses(Filters=flt)["Addresses"]],
        "volume": [v["VolumeId"] for v in ec2.describe_volumes(Filters=flt)["Volumes"]],
        "nat-gateway": [n["NatGatewayId"] for n in ec2.describe_nat_gateways(Filter=flt)["NatGateways"]
                        if n["State"] != "deleted"],
        "subnet": [n["SubnetId"] for n in ec2.describe_subnets(Filters=flt)["Subnets"]],
        "route-table": [r["RouteTableId"] for r in ec2.describe_route_tables(Filters=flt)["RouteTables"]],
        "placement-group": [
            g["GroupName"] for g in fakes.placement_groups.values()
            if any(t["Key"] == TAG and (cluster is None or t["Value"] == cluster) for t in g["Tags"])
        ],
    }
    return {k: v for k, v in out.items() if v}


def make_spec(name: str = "c1", nodes: int = 2, **aws: Any) -> Any:
    from provision.model.spec import build_cluster_spec

    top = {k: aws.pop(k) for k in ("ssh_cidr", "max_hours", "spot", "image", "gpus_per_node")
           if k in aws}
    return build_cluster_spec({}, {"provider": "aws", "name": name, "nodes": nodes,
                                   "aws": {"region": REGION, **aws}, **top})


def up(spec: Any, store: Any) -> Any:
    from provision.cluster import pipeline

    return pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                       log=lambda msg: None)
