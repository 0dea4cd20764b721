"""The write steps of `up`, in order; each resource is recorded the moment its id exists.

    key pair -> security group (+ rules) -> placement group -> [nat: route table]
    -> ONE RunInstances (N nodes, zone/market failover on capacity errors; nat: a private subnet
    per zone tried) -> wait running -> egress (network.py: an Elastic IP per node on multi-card
    types, or the NAT gateway with --private-ips) -> inventory nodes + EFA container args + NCCL
    preset

Rollback is not done here: the pipeline destroys whatever the inventory holds when this raises.
Every write is safe to retry (ClientToken, or "Duplicate" answers resolved by tag).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from provision.cluster.providers.aws import capacity, efa, retry
from provision.cluster.providers.aws.api import Ec2, client_token, cluster_of, tag_spec
from provision.cluster.providers.aws.catalog import fabric_expectation
from provision.cluster.providers.aws.errors import describe, error_code, is_capacity, map_errors
from provision.cluster.providers.aws.hostkeys import wait_host_keys
from provision.cluster.providers.aws.network import EgressMaker
from provision.cluster.providers.aws.request import NODE_USER, AwsPlan, resource_name
from provision.cluster.providers.aws.userdata import user_data
from provision.model.errors import CapacityError, ProviderUnavailableError, ProvisionError
from provision.model.inventory import (
    Inventory,
    InventoryStore,
    NodeRecord,
    PreemptionSource,
    ResourceRecord,
)
from provision.model.keys import ensure_cluster_key
from provision.model.spec import ClusterSpec
from provision.model.timeline import reached

# Where a node reads its spot interruption notice (IMDSv2; remote/preempt.py "aws").
METADATA_URL = "http://169.254.169.254"


@contextmanager
def step(what: str) -> Iterator[None]:
    """Name the step in any error raised inside (botocore errors are translated here)."""
    with map_errors(f"{what} failed"):
        yield


class Creator:
    def __init__(self, spec: ClusterSpec, plan: AwsPlan, inv: Inventory, store: InventoryStore,
                 ec2: Ec2 | None = None):
        if plan.unresolved or plan.launch.vpc_id is None or plan.launch.ami is None:
            raise ProviderUnavailableError(
                "this AWS plan was made without AWS and cannot be created: "
                + "; ".join(plan.unresolved or ["AMI and VPC unresolved"]),
                hint="configure AWS credentials and run `up` again",
            )
        self.spec, self.inv, self.store = spec, inv, store
        self.s = plan.launch
        self.vpc_id: str = plan.launch.vpc_id
        self.ami: str = plan.launch.ami
        self.cluster = plan.cluster
        self.count = plan.nodes
        self.slots = plan.slots_per_node
        self.name = resource_name(plan.cluster)
        self.ec2 = ec2 or Ec2(self.s.region)
        # One per `up`, in every ClientToken: the retries of one call share a token, a later
        # `up` of the same name never gets an earlier (deleted) resource back.
        self.nonce = uuid.uuid4().hex
        self.egress = EgressMaker(self.ec2, self.cluster, self.vpc_id,
                                  lambda rec: self.record(rec), self.nonce)
        self.private_subnets: dict[str, str] = {}  # zone -> subnet (nat egress)
        self.spot_launched = False  # the market RunInstances succeeded in (spot fallback)
        self.group: str | None = self.name  # the placement group launched into
        self.reservation_id = self.s.reservation_id  # a bought block's, once bought

    def reserve(self) -> None:
        """Buy the plan's Capacity Block (recorded the moment its id exists: it is paid and
        cannot be cancelled) and wait until it is active (capacity.py)."""
        block = self.s.block
        if block is None:
            return
        with step(f"buying Capacity Block offering {block.offering_id}"):
            bought = capacity.purchase_block(self.ec2, self.cluster, block)
            self.reservation_id = str(bought["CapacityReservationId"])
            self.record(self._res("capacity-block", self.reservation_id, block.zone, {
                "offering": block.offering_id, "start": block.start, "end": block.end,
                "upfront_usd": f"{block.upfront_usd:.2f}"}))
        with step(f"waiting for Capacity Block {self.reservation_id} (starts {block.start})"):
            capacity.wait_active(self.ec2, self.reservation_id, block.start)

    # --- bookkeeping ---------------------------------------------------------------------
    def record(self, *resources: ResourceRecord) -> None:
        """Persist at once: nothing is made after this until the ids are on disk."""
        self.inv.resources.extend(resources)
        self.store.save(self.inv)

    def _res(self, kind: str, rid: str, zone: str | None = None,
             extra: dict[str, str] | None = None) -> ResourceRecord:
        return ResourceRecord(kind=kind, id=rid, name=self.name, region=self.s.region, zone=zone,
                              extra=extra or {})

    def _adopt(self, kind: str, found: list[dict[str, Any]], id_key: str) -> str:
        """A create answered 'Duplicate' (e.g. a retried call that had succeeded): use the
        existing resource only if it carries this cluster's tag."""
        for item in found:
            if cluster_of(item.get("Tags")) == self.cluster:
                return str(item[id_key])
        raise ProvisionError(
            f"a {kind} named {self.name!r} already exists in {self.s.region} and is not tagged "
            f"for cluster {self.cluster!r}",
            hint="delete it, or choose another --name",
        )

    # --- steps -----------------------------------------------------------------------------
    def key_pair(self, public_key: str) -> None:
        from botocore.exceptions import ClientError

        with step("importing the key pair"):
            try:
                kp_id = str(self.ec2.get(
                    "import_key_pair", "KeyPairId", KeyName=self.name,
                    PublicKeyMaterial=public_key.encode(),
                    TagSpecifications=tag_spec("key-pair", self.cluster),
                ))
            except ClientError as exc:
                if error_code(exc) != "InvalidKeyPair.Duplicate":
                    raise
                found = self.ec2.get("describe_key_pairs", "KeyPairs", KeyNames=[self.name])
                kp_id = self._adopt("key pair", found, "KeyPairId")
            self.record(self._res("key-pair", kp_id))

    def security_group(self) -> str:
        from botocore.exceptions import ClientError

        with step("creating the security group"):
            try:
                sg = str(self.ec2.get(
                    "create_security_group", "GroupId", GroupName=self.name, VpcId=self.vpc_id,
                    Description=f"mgpu-cloud cluster {self.cluster}: SSH from "
                    f"{', '.join(self.s.ssh_cidrs)}, all traffic within the group (EFA)"[:255],
                    TagSpecifications=tag_spec("security-group", self.cluster),
                ))
            except ClientError as exc:
                if error_code(exc) != "InvalidGroup.Duplicate":
                    raise
                found = self.ec2.get("describe_security_groups", "SecurityGroups", Filters=[
                    {"Name": "group-name", "Values": [self.name]},
                    {"Name": "vpc-id", "Values": [self.vpc_id]},
                ])
                sg = self._adopt("security group", found, "GroupId")
            self.record(self._res("security-group", sg))
        ssh: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
        for cidr in self.s.ssh_cidrs:
            ranges_key, range_key = (
                ("Ipv6Ranges", "CidrIpv6") if ":" in cidr else ("IpRanges", "CidrIp"))
            ssh.setdefault(ranges_key, []).append(
                {range_key: cidr, "Description": "mgpu-cloud controller"})
        itself = {"IpProtocol": "-1", "UserIdGroupPairs": [
            {"GroupId": sg, "Description": "cluster nodes (EFA needs all traffic)"}
        ]}
        with step("adding the security group's inbound rules"):
            self._authorize("authorize_security_group_ingress", sg, [ssh, itself])
        with step("adding the security group's outbound rule"):
            self._authorize("authorize_security_group_egress", sg, [itself])
        return sg

    def _authorize(self, operation: str, sg: str, rules: list[dict[str, Any]]) -> None:
        from botocore.exceptions import ClientError

        try:
            self.ec2.call(operation, GroupId=sg, IpPermissions=rules)
        except ClientError as exc:
            if error_code(exc) != "InvalidPermission.Duplicate":  # a retried call had succeeded
                raise

    def placement_group(self) -> None:
        """The cluster placement group; none in a Capacity Block (EC2 places its instances
        together in an UltraCluster) and a reservation's own group when it has one."""
        from botocore.exceptions import ClientError

        if self.s.market == "capacity-block" or self.s.reservation is not None:
            self.group = self.s.reservation.placement_group if self.s.reservation else None
            return
        with step("creating the placement group"):
            try:
                self.ec2.call(
                    "create_placement_group", GroupName=self.name, Strategy="cluster",
                    TagSpecifications=tag_spec("placement-group", self.cluster),
                )
            except ClientError as exc:
                if error_code(exc) != "InvalidPlacementGroup.Duplicate":
                    raise
                found = self.ec2.get(
                    "describe_placement_groups", "PlacementGroups", GroupNames=[self.name]
                )
                self._adopt("placement group", found, "GroupName")
            # The group binds to a zone only when its first instance lands, so after a
            # capacity error (RunInstances is all-or-nothing: it stays empty) it moves along
            # to the next zone.
            self.record(self._res("placement-group", self.name))

    def network_interfaces(self, subnet: str, sg: str) -> list[dict[str, Any]]:
        return efa.network_interfaces(self.s.efa_cards, subnet, sg,
                                      public=self.s.egress.mode == "public-ip")

    def run_params(self, zone: str, subnet: str, sg: str, spot: bool, user_data: str) -> dict[str, Any]:
        tags = tag_spec("instance", self.cluster) + tag_spec("volume", self.cluster) + tag_spec(
            "network-interface", self.cluster
        )
        market = "spot" if spot else "od"
        params: dict[str, Any] = {
            "ImageId": self.ami,
            "InstanceType": self.s.instance_type,
            "MinCount": self.count,
            "MaxCount": self.count,
            "KeyName": self.name,
            "NetworkInterfaces": self.network_interfaces(subnet, sg),
            "Placement": {"AvailabilityZone": zone,
                          **({"GroupName": self.group} if self.group else {})},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "UserData": user_data,
            "BlockDeviceMappings": [{
                "DeviceName": self.s.root_device,
                "Ebs": {"VolumeSize": self.s.disk_gb, "VolumeType": "gp3",
                        "DeleteOnTermination": True},
            }],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": tags,
            # Same token on every transient retry of this attempt: EC2 launches at most once.
            "ClientToken": client_token(self.cluster, self.nonce, zone, market),
        }
        params.update(capacity.market_params(self.s, self.reservation_id))
        if spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time",
                                "InstanceInterruptionBehavior": "terminate"},
            }
            params["TagSpecifications"] = tags + tag_spec("spot-instances-request", self.cluster)
        return params

    def subnet_for(self, zone: str, default_subnet: str) -> str:
        """The zone's default subnet, or (nat egress) the cluster's private subnet there,
        made on first use: failover to another zone makes another."""
        if self.s.egress.mode != "nat":
            return default_subnet
        if zone not in self.private_subnets:
            with step(f"creating the private subnet in {zone}"):
                self.private_subnets[zone] = self.egress.private_subnet(zone, self.count)
        return self.private_subnets[zone]

    def launch(self, sg: str, user_data: str) -> list[dict[str, Any]]:
        """ONE RunInstances of N nodes per attempt; capacity errors move to the next zone
        (spot first in every zone, then on-demand with --spot-fallback)."""
        from botocore.exceptions import ClientError

        markets = [True, False] if self.s.spot and self.s.spot_fallback else [self.s.spot]
        failures: list[str] = []
        for spot in markets:
            for zone, default_subnet in ((z.zone, z.subnet) for z in self.s.zones):
                subnet = self.subnet_for(zone, default_subnet)
                params = self.run_params(zone, subnet, sg, spot, user_data)
                with step(f"launching {self.count} x {self.s.instance_type} in {zone}"):
                    try:
                        instances: list[dict[str, Any]] = self.ec2.get(
                            "run_instances", "Instances", **params
                        )
                    except ClientError as exc:
                        if not is_capacity(exc):
                            raise
                        market = "spot" if spot else "on-demand"
                        failures.append(f"{zone} ({market}): {describe(exc)}")
                        continue
                # What a replacement of this node needs to launch it the same way (replace.py)
                how = {"ami": self.ami, "subnet": subnet, "group": self.group or "",
                       "market": "spot" if spot else self.s.market,
                       **({"reservation": self.reservation_id,
                           "capacity_end": capacity.capacity_end(self.s) or ""}
                          if self.reservation_id else {})}
                self.record(*(self._res("instance", i["InstanceId"], zone, dict(how))
                              for i in instances))
                self.spot_launched = spot
                return instances
        raise CapacityError(
            f"no zone had capacity for {self.count} x {self.s.instance_type} in one placement "
            "group: " + "; ".join(failures),
            hint="try fewer --nodes, another --region, --spot-fallback (with --spot), or later",
        )

    def wait_running(self, ids: list[str]) -> list[dict[str, Any]]:
        p = retry.policy()
        deadline = time.monotonic() + p.launch_timeout_s
        with step("waiting for the nodes to run"):
            while True:
                found = self.ec2.instances([{"Name": "instance-id", "Values": ids}])
                states = {i["InstanceId"]: i["State"]["Name"] for i in found}
                dead = [i for i in found if i["State"]["Name"] in ("shutting-down", "terminated", "stopped")]
                if dead:
                    reasons = ", ".join(
                        f"{i['InstanceId']}: {(i.get('StateReason') or {}).get('Message', i['State']['Name'])}"
                        for i in dead
                    )
                    raise ProvisionError(f"nodes stopped while starting ({reasons})")
                if len(states) == len(ids) and all(s == "running" for s in states.values()):
                    return sorted(found, key=lambda i: int(i.get("AmiLaunchIndex", 0)))
                if time.monotonic() > deadline:
                    raise ProvisionError(
                        f"nodes not running after {p.launch_timeout_s:.0f} s: {states}"
                    )
                time.sleep(p.poll_interval_s)

    def addresses(self, nodes: list[dict[str, Any]]) -> dict[str, str]:
        """Instance id -> the address the controller connects to; makes the egress."""
        mode = self.s.egress.mode
        if mode == "elastic-ip":
            with step("giving every node an Elastic IP"):
                return self.egress.node_addresses(nodes)
        if mode == "nat":
            zone = nodes[0]["Placement"]["AvailabilityZone"]
            public = next(z.subnet for z in self.s.zones if z.zone == zone)
            with step(f"creating the NAT gateway in {zone}"):
                self.egress.nat_gateway(public, zone)
            return {i["InstanceId"]: str(i.get("PrivateIpAddress") or "") for i in nodes}
        return {i["InstanceId"]: str(i.get("PublicIpAddress") or "") for i in nodes}

    def lifetime(self) -> int:
        seconds = capacity.lifetime_s(self.s)
        if seconds < 600:
            raise ProvisionError(f"the reserved capacity ends in {seconds // 60 + 35} min: too "
                                 "soon to start nodes in it", hint="pick a later block")
        return seconds

    # --- the whole of `up` ------------------------------------------------------------------
    def run(self) -> None:
        from provision.model.render import parse_env_file, render

        key_path, public_key = ensure_cluster_key(self.store.keys_dir(self.inv.name))
        self.inv.key_path = str(key_path)
        self.store.save(self.inv)  # on disk before the first write: see AwsProvider.destroy
        self.key_pair(public_key)
        sg = self.security_group()
        self.placement_group()
        self.reserve()
        data = user_data(self.cluster, self.lifetime(), self.s.image)
        if self.s.egress.mode == "nat":
            with step("creating the route table"):
                self.egress.route_table()
        launched = self.launch(sg, data)
        nodes = self.wait_running([i["InstanceId"] for i in launched])
        reached(self.inv, "nodes running", part_of="create call", detail=f"{len(nodes)} node(s)")
        addresses = self.addresses(nodes)
        with step("reading the nodes' host keys from their consoles"):
            host_keys = wait_host_keys(self.ec2, {i["InstanceId"]: f"node-{rank}"
                                                  for rank, i in enumerate(nodes)})

        records = []
        for rank, inst in enumerate(nodes):
            private = str(inst.get("PrivateIpAddress") or "")
            address = addresses.get(inst["InstanceId"], "")
            if not address or not private:
                raise ProvisionError(f"node {inst['InstanceId']} has no address to reach it on")
            records.append(NodeRecord(
                name=f"node-{rank}", rank=rank, address=address, private_address=private,
                user=NODE_USER, slots=self.slots, host_key=host_keys[inst["InstanceId"]],
                resource_id=inst["InstanceId"], zone=inst["Placement"]["AvailabilityZone"],
            ))
        self.inv.nodes = records
        self.inv.wait_for_gpu = True
        self.inv.manage_etc_hosts = True
        self.inv.container_image = self.s.image
        self.inv.gpu_model = self.s.gpu_model or None
        self.inv.container_args = efa.container_args(self.s.efa_interfaces)
        self.inv.container_library_path = efa.library_path(self.s.efa_interfaces)
        preset = "nccl/aws-efa.env.j2" if self.s.efa_interfaces else "nccl/tcp.env.j2"
        self.inv.nccl_env = parse_env_file(render(
            preset, instance_type=self.s.instance_type,
            efa_interfaces=self.s.efa_interfaces, device_rdma=self.s.device_rdma,
        ))
        # What the fabric gate expects between nodes (None: a type without a row is not gated
        # by `--fabric-check auto`); spot nodes watch for EC2's two-minute interruption notice.
        self.inv.fabric = fabric_expectation(self.s.instance_type)
        self.inv.preemption = (PreemptionSource(protocol="aws", url=METADATA_URL)
                               if self.spot_launched else None)
        self.store.save(self.inv)
