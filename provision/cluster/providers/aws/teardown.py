"""Teardown (`down`, rollback of `up`) and orphan discovery (`gc`).

destroy_cluster works from the inventory's records plus lookups by the cluster tag, tries
every step even when one fails, and reports everything left at the end (TeardownError).
It deletes only what carries the cluster's own tag (mgpu-cloud-cluster=NAME) at that moment:
a recorded id is looked up by id first (`owned`), and one that EC2 shows untagged or tagged
for another cluster is refused by name, left alone and dropped from the inventory (an
inventory adopted from a store a node could write must not steer `down` onto another
cluster's resources). The same holds for `gc --delete` and the controller's teardown from
inside (both go through Teardown).
Order: instances (terminate, wait until terminated) -> NAT gateways (delete, wait until deleted:
their Elastic IP stays in use until then) -> Elastic IPs -> subnets and route table of the
--private-ips egress (retried while interfaces detach) -> placement group (retried while in
use) -> security group (retried on DependencyViolation) -> key pair -> stray volumes and
network interfaces. Idempotent: resources already gone count as deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.api import Ec2, cluster_filter, cluster_of
from provision.cluster.providers.aws.errors import BUSY_CODES, describe, is_not_found
from provision.model.errors import TeardownError
from provision.model.inventory import CLUSTER_TAG, ResourceRecord

Forget = Callable[[list[tuple[str, str]]], None]
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
NAT_LIVE_STATES = ["pending", "available", "deleting", "failed"]
CHUNK = 500  # ids per terminate call / filter
# kind -> how one is looked up by id: (Describe operation, answer key, id filter, id field,
# tags field). Filters, not ...Ids parameters: an id that is gone is then simply not listed
# (an Ids parameter fails the whole call with *.NotFound).
LOOKUP: dict[str, tuple[str, str, str, str, str]] = {
    "elastic-ip": ("describe_addresses", "Addresses", "allocation-id", "AllocationId", "Tags"),
    "nat-gateway": ("describe_nat_gateways", "NatGateways", "nat-gateway-id", "NatGatewayId",
                    "Tags"),
    "subnet": ("describe_subnets", "Subnets", "subnet-id", "SubnetId", "Tags"),
    "route-table": ("describe_route_tables", "RouteTables", "route-table-id", "RouteTableId",
                    "Tags"),
    "placement-group": ("describe_placement_groups", "PlacementGroups", "group-name",
                        "GroupName", "Tags"),
    "security-group": ("describe_security_groups", "SecurityGroups", "group-id", "GroupId",
                       "Tags"),
    "key-pair": ("describe_key_pairs", "KeyPairs", "key-pair-id", "KeyPairId", "Tags"),
    "volume": ("describe_volumes", "Volumes", "volume-id", "VolumeId", "Tags"),
    "network-interface": ("describe_network_interfaces", "NetworkInterfaces",
                          "network-interface-id", "NetworkInterfaceId", "TagSet"),
}


def _ids(records: list[ResourceRecord], kind: str) -> list[str]:
    return [r.id for r in records if r.kind == kind]


def _chunks(items: list[str]) -> list[list[str]]:
    return [items[i:i + CHUNK] for i in range(0, len(items), CHUNK)]


def _delete(ec2: Ec2, operation: str, *, busy: bool = False, **params: Any) -> None:
    """One delete call; 'not found' means done; with `busy`, retried while the resource is
    still in use (placement group with instances, security group with ENIs)."""
    from botocore.exceptions import ClientError

    def once() -> None:
        try:
            ec2.call(operation, **params)
        except ClientError as exc:
            if not is_not_found(exc):
                raise

    if busy:
        retry.while_busy(once, BUSY_CODES)
    else:
        once()


class Teardown:
    """`keep`: instance ids never terminated (the controller deleting the cluster from inside);
    `before_security_groups`: run before the security group goes (the controller leaves it)."""

    def __init__(self, ec2: Ec2, cluster: str, records: list[ResourceRecord], forget: Forget,
                 keep: set[str] | None = None,
                 before_security_groups: Callable[[], None] | None = None):
        self.ec2, self.cluster, self.records, self.forget = ec2, cluster, records, forget
        self.keep = keep or set()
        self.before_security_groups = before_security_groups
        self.problems: list[str] = []
        self.refused: list[tuple[str, str]] = []

    def attempt(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # keep going: report every failure at the end
            self.problems.append(f"{what}: {describe(exc)}")

    # --- whose is it: the tag at deletion time, never the record ----------------------------
    def owned(self, kind: str, seen: set[str] | frozenset[str] = frozenset()
              ) -> dict[str, dict[str, Any]]:
        """The recorded `kind` resources that exist now AND carry this cluster's tag, looked
        up by id: id -> EC2's description (those in `seen`, already found by the tag lookup,
        are not looked up again). A recorded one that EC2 no longer lists is gone
        (forgotten); one untagged or tagged for another cluster is refused (`refuse`)."""
        ids = [i for i in dict.fromkeys(_ids(self.records, kind))
               if i not in self.keep and i not in seen]
        if not ids:
            return {}
        operation, key, by_id, id_key, tags_key = LOOKUP[kind]
        param = "Filter" if kind == "nat-gateway" else "Filters"
        found: dict[str, dict[str, Any]] = {}
        for chunk in _chunks(ids):
            for item in self.ec2.get(operation, key, **{param: [{"Name": by_id,
                                                                  "Values": chunk}]}):
                found[str(item[id_key])] = item
        mine = {}
        for rid in ids:
            if rid not in found:
                self.forget([(kind, rid)])  # gone already
            elif cluster_of(found[rid].get(tags_key)) != self.cluster:
                self.refuse(kind, rid, cluster_of(found[rid].get(tags_key)))
            else:
                mine[rid] = found[rid]
        return mine

    def refuse(self, kind: str, rid: str, owner: str | None) -> None:
        """A record naming what is not this cluster's: left alone, named, forgotten."""
        whose = f"tagged {CLUSTER_TAG}={owner}" if owner is not None else \
            f"without the {CLUSTER_TAG} tag"
        self.problems.append(f"refused to delete {kind} {rid}: it is {whose}, not "
                             f"{CLUSTER_TAG}={self.cluster} (left alone; dropped from the "
                             "inventory)")
        self.refused.append((kind, rid))
        self.forget([(kind, rid)])

    # --- instances ---------------------------------------------------------------------------
    def instances(self) -> None:
        tag = cluster_filter(self.cluster)
        state = {"Name": "instance-state-name", "Values": LIVE_STATES}
        live = {i["InstanceId"] for i in self.ec2.instances([tag, state])} - self.keep
        recorded = [i for i in _ids(self.records, "instance") if i not in self.keep]
        unseen = [i for i in dict.fromkeys(recorded) if i not in live]
        for chunk in _chunks(unseen):  # the tag lookup missed them: whose are they?
            for inst in self.ec2.instances([{"Name": "instance-id", "Values": chunk}]):
                owner = cluster_of(inst.get("Tags"))
                if owner != self.cluster:
                    self.refuse("instance", inst["InstanceId"], owner)
                elif inst["State"]["Name"] in LIVE_STATES:
                    live.add(inst["InstanceId"])
        ids = sorted(live)
        for chunk in _chunks(ids):
            self.ec2.call("terminate_instances", InstanceIds=chunk)
        if ids:
            self._wait_terminated(ids)
        self.forget([("instance", i) for i in set(recorded) | live])

    def _wait_terminated(self, ids: list[str]) -> None:
        p = retry.policy()
        deadline = time.monotonic() + p.terminate_timeout_s
        while True:
            remaining = [
                i["InstanceId"] for chunk in _chunks(ids) for i in self.ec2.instances(
                    [{"Name": "instance-id", "Values": chunk},
                     {"Name": "instance-state-name", "Values": LIVE_STATES}])
            ]
            if not remaining:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"still not terminated after {p.terminate_timeout_s:.0f} s: "
                                   + ", ".join(remaining))
            time.sleep(p.poll_interval_s)

    # --- the rest ------------------------------------------------------------------------------
    def elastic_ips(self) -> None:
        found = self.ec2.get("describe_addresses", "Addresses", Filters=[cluster_filter(self.cluster)])
        addresses = {a["AllocationId"]: a for a in found}
        addresses.update(self.owned("elastic-ip", set(addresses)))
        for alloc, addr in addresses.items():
            if addr.get("AssociationId"):
                _delete(self.ec2, "disassociate_address", AssociationId=addr["AssociationId"])
            _delete(self.ec2, "release_address", AllocationId=alloc)
            self.forget([("elastic-ip", alloc)])

    def nat_gateways(self) -> None:
        live = {"Name": "state", "Values": NAT_LIVE_STATES}
        found = self.ec2.get("describe_nat_gateways", "NatGateways",
                             Filter=[cluster_filter(self.cluster), live])
        ids = {n["NatGatewayId"] for n in found}
        ids |= {n for n, item in self.owned("nat-gateway", ids).items()
                if item.get("State") in NAT_LIVE_STATES}
        for nat in sorted(ids):
            _delete(self.ec2, "delete_nat_gateway", NatGatewayId=nat)
        if ids:
            self._wait_nat_deleted(sorted(ids))
        self.forget([("nat-gateway", n) for n in ids | set(_ids(self.records, "nat-gateway"))
                     if ("nat-gateway", n) not in self.refused])

    def _wait_nat_deleted(self, ids: list[str]) -> None:
        from botocore.exceptions import ClientError

        p = retry.policy()
        deadline = time.monotonic() + p.terminate_timeout_s
        while True:
            try:
                found = self.ec2.get("describe_nat_gateways", "NatGateways", NatGatewayIds=ids)
            except ClientError as exc:
                if not is_not_found(exc):
                    raise
                return
            # 'failed' is final too: a failed NAT gateway holds no address and costs nothing
            remaining = [n["NatGatewayId"] for n in found
                         if n.get("State") not in ("deleted", "failed")]
            if not remaining:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"NAT gateways still not deleted after "
                                   f"{p.terminate_timeout_s:.0f} s: " + ", ".join(remaining))
            time.sleep(p.poll_interval_s)

    def subnets(self) -> None:
        found = self.ec2.pages("describe_subnets", "Subnets", Filters=[cluster_filter(self.cluster)])
        ids = {s["SubnetId"] for s in found}
        ids |= set(self.owned("subnet", ids))
        for subnet in sorted(ids):
            _delete(self.ec2, "delete_subnet", busy=True, SubnetId=subnet)
            self.forget([("subnet", subnet)])

    def route_tables(self) -> None:
        """A route table is deleted only without subnet associations ("Subnet route tables",
        Amazon VPC User Guide): they are removed first (gone with their subnet on EC2)."""
        found = self.ec2.pages("describe_route_tables", "RouteTables",
                               Filters=[cluster_filter(self.cluster)])
        tables = {r["RouteTableId"]: r for r in found}
        tables.update(self.owned("route-table", set(tables)))
        for table in tables.values():
            for assoc in table.get("Associations", []):
                if not assoc.get("Main") and assoc.get("RouteTableAssociationId"):
                    _delete(self.ec2, "disassociate_route_table",
                            AssociationId=assoc["RouteTableAssociationId"])
        for rt in sorted(tables):
            _delete(self.ec2, "delete_route_table", busy=True, RouteTableId=rt)
            self.forget([("route-table", rt)])

    def placement_groups(self) -> None:
        found = self.ec2.get(
            "describe_placement_groups", "PlacementGroups", Filters=[cluster_filter(self.cluster)]
        )
        names = {g["GroupName"] for g in found}
        names |= set(self.owned("placement-group", names))
        for name in sorted(names):
            _delete(self.ec2, "delete_placement_group", busy=True, GroupName=name)
            self.forget([("placement-group", name)])

    def security_groups(self) -> None:
        found = self.ec2.get(
            "describe_security_groups", "SecurityGroups", Filters=[cluster_filter(self.cluster)]
        )
        ids = {g["GroupId"] for g in found}
        ids |= set(self.owned("security-group", ids))
        for sg in sorted(ids):
            _delete(self.ec2, "delete_security_group", busy=True, GroupId=sg)
            self.forget([("security-group", sg)])

    def key_pairs(self) -> None:
        found = self.ec2.get("describe_key_pairs", "KeyPairs", Filters=[cluster_filter(self.cluster)])
        pairs = {k["KeyPairId"]: k for k in found}
        pairs.update(self.owned("key-pair", set(pairs)))
        for kp, item in sorted(pairs.items()):
            # By the name EC2 gives it (never the record's): key names are unique per region
            # and every EC2 implementation accepts them; the id is the fallback.
            name = item.get("KeyName")
            params = {"KeyName": name} if name else {"KeyPairId": kp}
            _delete(self.ec2, "delete_key_pair", **params)
            self.forget([("key-pair", kp)])

    def strays(self) -> None:
        """Volumes / interfaces that outlived their instance (only `gc` records them)."""
        for vol in self.owned("volume"):
            _delete(self.ec2, "delete_volume", busy=True, VolumeId=vol)
        for eni in self.owned("network-interface"):
            _delete(self.ec2, "delete_network_interface", busy=True, NetworkInterfaceId=eni)

    def run(self) -> None:
        self.attempt("terminating the instances", self.instances)
        self.attempt("deleting the NAT gateway", self.nat_gateways)
        self.attempt("releasing the Elastic IPs", self.elastic_ips)
        self.attempt("deleting the private subnets", self.subnets)
        self.attempt("deleting the route table", self.route_tables)
        self.attempt("deleting the placement group", self.placement_groups)
        if self.before_security_groups is not None:
            self.attempt("moving the controller off the security group",
                         self.before_security_groups)
        self.attempt("deleting the security group", self.security_groups)
        self.attempt("deleting the key pair", self.key_pairs)
        self.attempt("deleting stray volumes/network interfaces", self.strays)
        # A bought Capacity Block cannot be cancelled: it ends at its end date by itself.
        blocks = _ids(self.records, "capacity-block")
        if blocks:
            self.forget([("capacity-block", b) for b in blocks])
        if self.problems and len(self.problems) == len(self.refused):
            raise TeardownError(
                f"the inventory of cluster {self.cluster!r} names resources in "
                f"{self.ec2.region} that are not its own: " + "; ".join(self.problems),
                hint="everything tagged for the cluster is deleted; an inventory that names "
                "another cluster's resources may come from a store a node could write. "
                f"`mgpu-cloud down {self.cluster}` again drops the inventory")
        if self.problems:
            raise TeardownError(
                f"some resources of cluster {self.cluster!r} in {self.ec2.region} could not be "
                "deleted: " + "; ".join(self.problems),
                hint=f"run `mgpu-cloud down {self.cluster}` again (it is safe to repeat); "
                f"`mgpu-cloud gc --provider aws --region {self.ec2.region}` lists what is left",
            )


def destroy_cluster(region: str, cluster: str, records: list[ResourceRecord], forget: Forget) -> None:
    Teardown(Ec2(region), cluster, records, forget).run()


def find_orphans(region: str, known: set[str]) -> list[ResourceRecord]:
    """Everything tagged with the cluster tag in `region` whose cluster is not in `known`."""
    ec2 = Ec2(region)
    any_cluster = [cluster_filter(None)]
    found: list[tuple[str, str, list[dict[str, str]] | None, str | None]] = []
    for inst in ec2.instances(any_cluster + [{"Name": "instance-state-name", "Values": LIVE_STATES}]):
        found.append(("instance", inst["InstanceId"], inst.get("Tags"),
                      inst.get("Placement", {}).get("AvailabilityZone")))
    for a in ec2.get("describe_addresses", "Addresses", Filters=any_cluster):
        found.append(("elastic-ip", a["AllocationId"], a.get("Tags"), None))
    live_nat = {"Name": "state", "Values": ["pending", "available", "failed"]}
    for n in ec2.get("describe_nat_gateways", "NatGateways", Filter=any_cluster + [live_nat]):
        found.append(("nat-gateway", n["NatGatewayId"], n.get("Tags"), None))
    for s in ec2.pages("describe_subnets", "Subnets", Filters=any_cluster):
        found.append(("subnet", s["SubnetId"], s.get("Tags"), s.get("AvailabilityZone")))
    for r in ec2.pages("describe_route_tables", "RouteTables", Filters=any_cluster):
        found.append(("route-table", r["RouteTableId"], r.get("Tags"), None))
    for g in ec2.get("describe_placement_groups", "PlacementGroups", Filters=any_cluster):
        found.append(("placement-group", g["GroupName"], g.get("Tags"), None))
    for g in ec2.pages("describe_security_groups", "SecurityGroups", Filters=any_cluster):
        found.append(("security-group", g["GroupId"], g.get("Tags"), None))
    for k in ec2.get("describe_key_pairs", "KeyPairs", Filters=any_cluster):
        found.append(("key-pair", k["KeyPairId"], k.get("Tags"), None))
    available = {"Name": "status", "Values": ["available"]}
    for v in ec2.pages("describe_volumes", "Volumes", Filters=any_cluster + [available]):
        found.append(("volume", v["VolumeId"], v.get("Tags"), v.get("AvailabilityZone")))
    for n in ec2.pages("describe_network_interfaces", "NetworkInterfaces",
                       Filters=any_cluster + [available]):
        found.append(("network-interface", n["NetworkInterfaceId"], n.get("TagSet"),
                      n.get("AvailabilityZone")))
    out = []
    for kind, rid, tags, zone in found:
        cluster = cluster_of(tags)
        if cluster is not None and cluster not in known:
            out.append(ResourceRecord(kind=kind, id=rid, name=cluster, region=region, zone=zone))
    return out


def delete_orphans(region: str, resources: list[ResourceRecord]) -> None:
    """Destroy each orphaned cluster found by find_orphans (its records + its tag). Idempotent."""
    by_cluster: dict[str, list[ResourceRecord]] = {}
    for r in resources:
        by_cluster.setdefault(r.name or "", []).append(r)
    problems = []
    for cluster, records in sorted(by_cluster.items()):
        try:
            destroy_cluster(region, cluster, records, forget=lambda pairs: None)
        except TeardownError as exc:
            problems.append(exc.message)
    if problems:
        raise TeardownError("; ".join(problems))
