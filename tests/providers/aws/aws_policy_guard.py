"""A small IAM policy evaluator over the calls a test makes (issue 18): every EC2/IAM call
the controller would make (a replacement, the teardown from inside, its own removal) must be
allowed by the controller's inline policy as SENT.

`PolicyGuard` is attached like the rules layer (clients.add_client_hook): before each call it
works out the (action, resource ARN, condition context) pairs the call needs, reading the
resources' tags from moto at that moment, and records a violation for each pair no statement
allows. An operation without a row in its table is a violation too (nothing passes unread).

Sources: "Actions, resources, and condition keys for Amazon EC2" / "... for AWS Identity and
Access Management" (Service Authorization Reference): the resource types each action names
(RunInstances: image, instance, volume, network-interface, subnet, security-group, key-pair,
placement-group, capacity-reservation; tags given at launch are aws:RequestTag/aws:TagKeys on
the created ones and need ec2:CreateTags with ec2:CreateAction), the ARN formats
(arn:aws:ec2:REGION::image/ID has no account; key-pair/NAME; iam::ACCOUNT:role/PATH/NAME);
"IAM JSON policy elements: Condition operators" (StringEquals, StringLike,
ForAllValues:StringEquals: true when the key is absent); Describe* take Resource "*".
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Need = tuple[str, str, dict[str, Any]]  # action, resource ARN, condition context
TAG = "mgpu-cloud-cluster"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _condition_holds(conditions: dict[str, Any], context: dict[str, Any]) -> bool:
    for op, pairs in conditions.items():
        for key, wanted in pairs.items():
            have = context.get(key)
            allowed = [str(w) for w in _list(wanted)]
            if op == "StringEquals":
                if have is None or not any(str(h) in allowed for h in _list(have)):
                    return False
            elif op == "StringLike":
                if have is None or not any(fnmatch.fnmatchcase(str(h), w)
                                           for h in _list(have) for w in allowed):
                    return False
            elif op == "ForAllValues:StringEquals":
                if have is not None and not all(str(h) in allowed for h in _list(have)):
                    return False
            else:
                return False  # an operator this evaluator does not read: not allowed
    return True


def allows(policy: dict[str, Any], action: str, arn: str, context: dict[str, Any]) -> bool:
    for st in policy.get("Statement", []):
        if st.get("Effect") != "Allow":
            continue
        if not any(fnmatch.fnmatchcase(action.lower(), a.lower())
                   for a in _list(st.get("Action", []))):
            continue
        if not any(fnmatch.fnmatchcase(arn, r) for r in _list(st.get("Resource", []))):
            continue
        if _condition_holds(st.get("Condition", {}), context):
            return True
    return False


@dataclass
class Ec2State:
    """Tags of existing resources, read from moto (and the placement-group fake)."""

    ec2: Any
    placement_groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tags(self, kind: str, rid: str) -> dict[str, str]:
        try:
            found = self._describe(kind, rid)
        except Exception:  # noqa: BLE001 - gone already: no tags
            return {}
        return {t["Key"]: t["Value"] for t in found or []}

    def _describe(self, kind: str, rid: str) -> list[dict[str, str]] | None:
        e = self.ec2
        if kind == "instance":
            rs = e.describe_instances(InstanceIds=[rid])["Reservations"]
            return rs[0]["Instances"][0].get("Tags") if rs else None
        if kind == "subnet":
            return e.describe_subnets(SubnetIds=[rid])["Subnets"][0].get("Tags")
        if kind == "security-group":
            return e.describe_security_groups(GroupIds=[rid])["SecurityGroups"][0].get("Tags")
        if kind == "key-pair":
            return e.describe_key_pairs(KeyNames=[rid])["KeyPairs"][0].get("Tags")
        if kind == "elastic-ip":
            return e.describe_addresses(AllocationIds=[rid])["Addresses"][0].get("Tags")
        if kind == "natgateway":
            return e.describe_nat_gateways(NatGatewayIds=[rid])["NatGateways"][0].get("Tags")
        if kind == "route-table":
            return e.describe_route_tables(RouteTableIds=[rid])["RouteTables"][0].get("Tags")
        if kind == "network-interface":
            return e.describe_network_interfaces(NetworkInterfaceIds=[rid])[
                "NetworkInterfaces"][0].get("TagSet")
        if kind == "volume":
            return e.describe_volumes(VolumeIds=[rid])["Volumes"][0].get("Tags")
        if kind == "placement-group":
            return self.placement_groups.get(rid, {}).get("Tags")
        return None

    def allocation_of(self, association: str) -> str:
        found = self.ec2.describe_addresses(Filters=[
            {"Name": "association-id", "Values": [association]}])["Addresses"]
        return str(found[0]["AllocationId"]) if found else "unknown"

    def table_of_association(self, association: str) -> str:
        found = self.ec2.describe_route_tables(Filters=[
            {"Name": "association.route-table-association-id", "Values": [association]}])
        return str(found["RouteTables"][0]["RouteTableId"]) if found["RouteTables"] else "unknown"


@dataclass
class PolicyGuard:
    policy: dict[str, Any]
    region: str
    account: str
    state: Ec2State
    violations: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def attach(self, client: Any) -> None:
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-parameter-build.{service}", self._check)

    def _check(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        op = model.name
        prefix = model.service_model.endpoint_prefix
        self.checked.append(op)
        needs = self.needs(prefix, op, params)
        if needs is None:
            self.violations.append(f"{prefix}:{op}: no permission table entry")
            return
        for action, arn, context in needs:
            if not allows(self.policy, action, arn, context):
                self.violations.append(f"{action} on {arn} ({context}) not allowed")

    # --- what each call needs -----------------------------------------------------------------
    def arn(self, kind: str, rid: str) -> str:
        if kind == "image":
            return f"arn:aws:ec2:{self.region}::image/{rid}"
        return f"arn:aws:ec2:{self.region}:{self.account}:{kind}/{rid}"

    def existing(self, action: str, kind: str, rid: str) -> Need:
        tags = self.state.tags(kind, rid)
        return action, self.arn(kind, rid), {f"aws:ResourceTag/{k}": v for k, v in tags.items()}

    def created(self, op: str, kind: str, tags: dict[str, str]) -> list[Need]:
        context: dict[str, Any] = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
        context["aws:TagKeys"] = sorted(tags)
        out: list[Need] = [(f"ec2:{op}", self.arn(kind, "*"), context)]
        if tags:
            out.append(("ec2:CreateTags", self.arn(kind, "*"),
                        {**context, "ec2:CreateAction": op}))
        return out

    def needs(self, prefix: str, op: str, p: dict[str, Any]) -> list[Need] | None:
        if prefix == "iam":
            return self._iam(op, p)
        if prefix == "sts" and op == "AssumeRole":  # resource: the role assumed
            return [("sts:AssumeRole", p["RoleArn"], {})]
        if prefix != "ec2":
            return None
        if op.startswith("Describe"):
            return [(f"ec2:{op}", "*", {})]
        a = f"ec2:{op}"
        simple: dict[str, tuple[str, Callable[[dict[str, Any]], list[str]]]] = {
            "TerminateInstances": ("instance", lambda q: q["InstanceIds"]),
            "GetConsoleOutput": ("instance", lambda q: [q["InstanceId"]]),
            "ReleaseAddress": ("elastic-ip", lambda q: [q["AllocationId"]]),
            "DeleteNatGateway": ("natgateway", lambda q: [q["NatGatewayId"]]),
            "DeleteSubnet": ("subnet", lambda q: [q["SubnetId"]]),
            "DeleteRouteTable": ("route-table", lambda q: [q["RouteTableId"]]),
            "DeletePlacementGroup": ("placement-group", lambda q: [q["GroupName"]]),
            "DeleteSecurityGroup": ("security-group", lambda q: [q["GroupId"]]),
            "DeleteKeyPair": ("key-pair", lambda q: [q.get("KeyName") or q["KeyPairId"]]),
            "DeleteVolume": ("volume", lambda q: [q["VolumeId"]]),
            "DeleteNetworkInterface": ("network-interface", lambda q: [q["NetworkInterfaceId"]]),
        }
        if op in simple:
            kind, ids = simple[op]
            return [self.existing(a, kind, rid) for rid in ids(p)]
        if op == "DisassociateAddress":
            return [self.existing(a, "elastic-ip", self.state.allocation_of(p["AssociationId"]))]
        if op == "DisassociateRouteTable":
            return [self.existing(a, "route-table",
                                  self.state.table_of_association(p["AssociationId"]))]
        if op == "AssociateAddress":
            out = [self.existing(a, "elastic-ip", p["AllocationId"])]
            if p.get("InstanceId"):
                out.append(self.existing(a, "instance", p["InstanceId"]))
            if p.get("NetworkInterfaceId"):
                out.append(self.existing(a, "network-interface", p["NetworkInterfaceId"]))
            return out
        if op == "AllocateAddress":
            return self.created(op, "elastic-ip", _tags(p, "elastic-ip"))
        if op == "ModifyInstanceAttribute":
            return [self.existing(a, "instance", p["InstanceId"])] + [
                self.existing(a, "security-group", g) for g in p.get("Groups", [])]
        if op == "RunInstances":
            return self._run(p)
        return None

    def _run(self, p: dict[str, Any]) -> list[Need]:
        a = "ec2:RunInstances"
        out: list[Need] = [(a, self.arn("image", p["ImageId"]), {})]
        kinds = ["instance", "volume", "network-interface"]
        if (p.get("InstanceMarketOptions") or {}).get("MarketType") == "spot":
            # a spot launch makes a spot-instances-request too ("Actions, resources, and
            # condition keys for Amazon EC2": RunInstances; Karpenter's reference policy
            # lists spot-instances-request/* with RunInstances and CreateTags)
            kinds.append("spot-instances-request")
        for kind in kinds:
            out += self.created("RunInstances", kind, _tags(p, kind))
        ifaces = p.get("NetworkInterfaces") or []
        for subnet in sorted({i["SubnetId"] for i in ifaces if i.get("SubnetId")}):
            out.append(self.existing(a, "subnet", subnet))
        for sg in sorted({g for i in ifaces for g in i.get("Groups", [])}):
            out.append(self.existing(a, "security-group", sg))
        if p.get("KeyName"):
            out.append(self.existing(a, "key-pair", p["KeyName"]))
        group = (p.get("Placement") or {}).get("GroupName")
        if group:
            out.append(self.existing(a, "placement-group", group))
        target = ((p.get("CapacityReservationSpecification") or {})
                  .get("CapacityReservationTarget") or {})
        if target.get("CapacityReservationId"):
            out.append((a, self.arn("capacity-reservation", target["CapacityReservationId"]),
                        {}))
        return out

    def _iam(self, op: str, p: dict[str, Any]) -> list[Need] | None:
        path = "/mgpu-cloud/"
        if op in ("GetInstanceProfile", "RemoveRoleFromInstanceProfile",
                  "DeleteInstanceProfile"):
            return [(f"iam:{op}", f"arn:aws:iam::{self.account}:instance-profile{path}"
                     f"{p['InstanceProfileName']}", {})]
        if op in ("DeleteRolePolicy", "DeleteRole", "ListRolePolicies"):
            return [(f"iam:{op}", f"arn:aws:iam::{self.account}:role{path}{p['RoleName']}", {})]
        return None


def _tags(p: dict[str, Any], kind: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for spec in p.get("TagSpecifications", [])
            if spec.get("ResourceType") == kind for t in spec.get("Tags", [])}
