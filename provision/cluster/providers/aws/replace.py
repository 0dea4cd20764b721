"""Recovery (contract.Recoverable): whether a node's instance is gone, and a new one in its place.

node_alive  DescribeInstances of the node's instance: gone when EC2 no longer lists it or it is
            shutting-down / terminated / stopping / stopped; alive otherwise (also when EC2
            cannot be asked: the recovery loop then tries an SSH login).
replace     the lost instance is terminated first (it is lost or about to be: a preempted
            spot instance goes within two minutes) and its Elastic IP released, so the new
            one fits the placement group's capacity and the region's address quota that `plan`
            checked for N nodes; then ONE instance is launched the way the cluster's were
            (create.Creator, the same request with MinCount = MaxCount = 1): same AMI, type,
            EFA interfaces, security group, key pair, placement group, zone and subnet, same
            market (spot stays spot; --spot-fallback may buy on-demand), user data with what
            is left of the cluster's --max-hours; then its own Elastic IP where the egress
            gives each node one, and its own host key read from its console (hostkeys.py). Every new resource is recorded the moment
            its id exists (down / rollback / gc cover it); the old instance and address are
            forgotten once deleted.
            A capacity error is a CapacityError naming the zone; whatever the replacement had
            made is deleted again before the error is raised, so nothing half-made is left.

How the cluster's instances were launched (AMI, subnet, market) is in each instance record's
`extra` (create.py); an inventory from before that falls back to describing the instance or a
sibling.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from provision.cluster.providers.aws import capacity
from provision.cluster.providers.aws.api import Ec2
from provision.cluster.providers.aws.create import Creator, step
from provision.cluster.providers.aws.errors import is_not_found
from provision.cluster.providers.aws.hostkeys import wait_host_keys
from provision.cluster.providers.aws.network import Egress, egress_mode, primary_interface
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.plan import DEFAULT_MAX_HOURS, _describe_type
from provision.cluster.providers.aws.request import (
    NODE_USER,
    AwsLaunch,
    AwsPlan,
    Reservation,
    ZoneSubnet,
)
from provision.cluster.providers.aws.sites import ami_of
from provision.cluster.providers.aws.userdata import user_data
from provision.cluster.providers.lifetime import remaining_seconds
from provision.model.errors import CapacityError, MgpuError, ProvisionError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord

log = logging.getLogger(__name__)
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
# Replacing a node is pointless when the cluster's --max-hours ends sooner than a new node
# could boot, bootstrap and train a little.
MIN_REMAINING_S = 600
LAUNCH_FACTS = ("ami", "subnet", "market")


def node_alive(ec2: Ec2, node: NodeRecord) -> bool:
    if not node.resource_id:
        return True
    found = ec2.instances([{"Name": "instance-id", "Values": [node.resource_id]}])
    if not found:
        return False
    return str(found[0]["State"]["Name"]) not in GONE_STATES


class Replacer:
    def __init__(self, ec2: Ec2, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        if inv.spec is None or inv.spec.provider != "aws":
            raise ProvisionError(f"cluster {inv.name!r}: its inventory has no AWS spec to "
                                 "replace a node from")
        self.ec2, self.inv, self.store, self.node = ec2, inv, store, node
        self.spec = inv.spec
        self.opts = inv.spec.options_as(AwsOptions)
        self.old = next((r for r in inv.resources_of("instance") if r.id == node.resource_id),
                        None)

    # --- what the cluster was launched with --------------------------------------------------
    def launch_facts(self) -> dict[str, str]:
        """AMI, subnet and market of the node's instance: from its record, else (an inventory
        from before they were recorded) from EC2's description of it or of a sibling."""
        if self.old is not None and all(self.old.extra.get(k) for k in LAUNCH_FACTS):
            return dict(self.old.extra)
        ids = [r.id for r in self.inv.resources_of("instance")]
        if self.node.resource_id and self.node.resource_id not in ids:
            ids.insert(0, self.node.resource_id)
        found = self.ec2.instances([{"Name": "instance-id", "Values": ids}]) if ids else []
        found.sort(key=lambda i: i["InstanceId"] != self.node.resource_id)  # the node's first
        for inst in found:
            try:
                subnet = next(n["SubnetId"] for n in inst.get("NetworkInterfaces", [])
                              if n["NetworkInterfaceId"] == primary_interface(inst))
            except (ProvisionError, StopIteration):
                continue
            return {"ami": str(inst["ImageId"]), "subnet": str(subnet),
                    "market": "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"}
        raise ProvisionError(
            f"cannot tell how {self.node.name} was launched (AMI, subnet): its inventory does "
            "not say and EC2 no longer describes any instance of the cluster",
            hint=f"recreate the cluster: mgpu-cloud down {self.inv.name}, then up")

    def creator(self, facts: dict[str, str], zone: str, max_hours: float) -> Creator:
        """create.Creator set up for ONE node launched like the cluster's."""
        info = _describe_type(self.ec2, self.opts.instance_type)
        ami, ami_name, root = ami_of(self.ec2, facts["ami"], self.opts.disk_gb)
        mode = egress_mode(info.interfaces, self.opts.private_ips)
        spot = facts["market"] == "spot"
        launch = AwsLaunch(
            region=self.ec2.region, instance_type=info.name,
            zones=[ZoneSubnet(zone=zone, subnet=facts["subnet"])], vpc_id="(the cluster's)",
            ami=ami, ami_name=ami_name or "(custom)", root_device=root,
            gpus=info.gpu_summary(), image=self.inv.container_image or "", spot=spot,
            spot_fallback=spot and self.opts.spot_fallback,
            efa_cards=list(info.efa_cards), device_rdma=info.device_rdma,
            disk_gb=self.opts.disk_gb, max_hours=max_hours, ssh_cidrs=["(the cluster's)"],
            private_ips=self.opts.private_ips,
            egress=Egress(mode=mode, elastic_ips=1 if mode == "elastic-ip" else 0,
                          hourly_usd=0.0),
            reservation=Reservation(
                id=facts["reservation"], zone=zone, end=facts.get("capacity_end") or None,
                available=1, capacity_block=facts["market"] == "capacity-block",
                placement_group=None) if facts.get("reservation") else None,
        )
        plan = AwsPlan(provider="aws", cluster=self.inv.name, nodes=1,
                       slots_per_node=self.node.slots, launch=launch)
        creator = Creator(self.spec, plan, self.inv, self.store, self.ec2)
        creator.private_subnets[zone] = facts["subnet"]  # nat egress: the cluster's subnet
        if "group" in facts:  # none in a Capacity Block; a reservation's own group
            creator.group = facts["group"] or None
        return creator

    # --- the steps -----------------------------------------------------------------------------
    def retire_old(self) -> None:
        """Terminate the node's instance and release its Elastic IP; forget both. Not waited
        for: the instance is lost, and releasing the address needs only its disassociation."""
        from botocore.exceptions import ClientError

        if self.node.resource_id:
            with step(f"terminating the lost instance of {self.node.name}"):
                try:
                    self.ec2.call("terminate_instances", InstanceIds=[self.node.resource_id])
                except ClientError as exc:
                    if not is_not_found(exc):
                        raise
            self.store.forget(self.inv, "instance", self.node.resource_id)
        for eip in self._old_addresses():
            with step(f"releasing the Elastic IP {eip.name} of {self.node.name}"):
                self._release(eip.id)
            self.store.forget(self.inv, "elastic-ip", eip.id)

    def _old_addresses(self) -> list[ResourceRecord]:
        """The node's own Elastic IP: the record named by the address the node was reached on
        (a NAT gateway's address is never a node's)."""
        return [r for r in self.inv.resources_of("elastic-ip") if r.name == self.node.address]

    def _release(self, allocation: str) -> None:
        from botocore.exceptions import ClientError

        try:
            found = self.ec2.get("describe_addresses", "Addresses", AllocationIds=[allocation])
        except ClientError as exc:
            if is_not_found(exc):
                return
            raise
        for addr in found:
            if addr.get("AssociationId"):
                with contextlib.suppress(ClientError):
                    self.ec2.call("disassociate_address", AssociationId=addr["AssociationId"])
            self.ec2.call("release_address", AllocationId=allocation)

    def undo(self, made: list[ResourceRecord]) -> None:
        """Delete what a failed replacement made (best effort; what stays is still recorded,
        so `down` deletes it)."""
        for rec in reversed(made):
            try:
                if rec.kind == "instance":
                    self.ec2.call("terminate_instances", InstanceIds=[rec.id])
                elif rec.kind == "elastic-ip":
                    self._release(rec.id)
            except Exception as exc:  # noqa: BLE001 - keep the record, report the rest
                log.warning("could not delete %s %s of a failed replacement: %s",
                            rec.kind, rec.id, exc)
                continue
            self.store.forget(self.inv, rec.kind, rec.id)

    def run(self, *, spare: bool = False) -> NodeRecord:
        """The new node; `spare` (issue 44): one more, named after `self.node` (a warm
        spare's number), nothing retired and inv.nodes untouched."""
        # without --max-hours, nodes in a Capacity Block live until its end (capacity.py)
        max_hours = capacity.cluster_max_hours(self.inv, self.spec.max_hours, DEFAULT_MAX_HOURS)
        left = remaining_seconds(self.inv, max_hours)
        if left < MIN_REMAINING_S:
            raise ProvisionError(
                f"not replacing {self.node.name}: the cluster's lifetime ({max_hours:g} h) ends "
                f"in {max(0, left)} s",
                hint="start a new cluster for the rest of the run")
        sg = next((r.id for r in self.inv.resources_of("security-group")), None)
        zone = self.node.zone or (self.old.zone if self.old else None)
        if sg is None or zone is None:
            raise ProvisionError(f"cluster {self.inv.name!r}: its inventory names no security "
                                 f"group or zone for {self.node.name}")
        facts = self.launch_facts()
        creator = self.creator(facts, zone, left / 3600)
        if not spare:
            self.retire_old()
        before = {(r.kind, r.id) for r in self.inv.resources}
        try:
            left = min(left, capacity.lifetime_s(creator.s))  # before a block's end
            (launched,) = creator.launch(
                sg, user_data(self.inv.name, left, self.inv.container_image))
            (inst,) = creator.wait_running([launched["InstanceId"]])
            address = self._address(creator, inst)
            with step(f"reading the host key of the new {self.node.name} from its console"):
                host_key = wait_host_keys(self.ec2, {inst["InstanceId"]: self.node.name})[
                    inst["InstanceId"]]
        except MgpuError as exc:
            self.undo([r for r in self.inv.resources if (r.kind, r.id) not in before])
            if isinstance(exc, CapacityError):
                raise CapacityError(
                    f"no capacity to replace {self.node.name}: {zone} has no "
                    f"{self.opts.instance_type} ({facts['market']}) for placement group "
                    f"{creator.name} now ({exc.message})",
                    hint="the run cannot go on with this node; try again later (`mgpu-cloud "
                    f"launch {self.inv.name} ...` restarts from the last checkpoint) or "
                    "recreate the cluster in another zone") from exc
            raise
        new = NodeRecord(
            name=self.node.name, rank=self.node.rank, address=address,
            private_address=str(inst.get("PrivateIpAddress") or ""), user=NODE_USER,
            slots=self.node.slots, host_key=host_key,
            resource_id=str(inst["InstanceId"]), zone=zone,
        )
        if not spare:
            self.inv.nodes = [new if n.rank == self.node.rank else n for n in self.inv.nodes]
            self.store.save(self.inv)
        return new

    def _address(self, creator: Creator, inst: dict[str, Any]) -> str:
        mode = creator.s.egress.mode
        if mode == "elastic-ip":
            with step(f"giving {self.node.name} an Elastic IP"):
                address = creator.egress.node_addresses([inst])[inst["InstanceId"]]
        elif mode == "nat":
            address = str(inst.get("PrivateIpAddress") or "")
        else:
            address = str(inst.get("PublicIpAddress") or "")
        if not address or not inst.get("PrivateIpAddress"):
            raise ProvisionError(f"the new node {inst['InstanceId']} has no address to reach "
                                 "it on")
        return address


def replace_node(region: str, inv: Inventory, store: InventoryStore,
                 node: NodeRecord) -> NodeRecord:
    return Replacer(Ec2(region), inv, store, node).run()
