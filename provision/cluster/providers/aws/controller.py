"""The AWS controller's identity (issue 18; docs/ARCHITECTURE.md, managed runs): an IAM role
and instance profile whose one inline policy reaches only this cluster's resources.

    role              /mgpu-cloud/mgpu-ctl-NAME, tagged, trusted by ec2.amazonaws.com (the
                      controller instance) and by ITSELF (`trust_policy`: the account as
                      principal, only with aws:PrincipalArn = the role's own ARN), so the
                      controller can mint short-lived store credentials for the nodes: an
                      AssumeRole of its own role with a session policy on the run's data
                      prefix (provision/job/managed/nodecreds.py); its ARN is in the
                      controller's inventory record (extra role_arn) and the role's (arn)
    policy            inline, `controller_policy`: EC2 writes only on resources tagged with
                      the cluster (aws:ResourceTag) or created with its tag (aws:RequestTag,
                      and no other tag key); Describe* on "*" (EC2's Describe actions support
                      no resource-level permissions); S3 only under the store's PREFIX/NAME/
    instance profile  /mgpu-cloud/mgpu-ctl-NAME, holding the role

Every piece is recorded in the inventory the moment it exists (kinds `iam-role`,
`iam-instance-profile`), so rollback and `down` delete it (`delete_identity`, idempotent:
NoSuchEntity is done) and `gc` finds it by its path and tag (`identity_orphans`).
The controller instance that uses this profile is controller_vm.py's; it calls
`create_identity` when it makes the controller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from provision.model.inventory import CLUSTER_TAG, ResourceRecord
from remote.store import StoreURL

PATH = "/mgpu-cloud/"
Record = Callable[[ResourceRecord], None]
POLICY_NAME = "cluster-only"
# What replacing a node takes (provision/cluster/providers/aws/replace.py): terminate the lost
# instance, run one like it (into the cluster's subnet, security group, placement group, with
# its key pair), give it an Elastic IP, read its host key from its console (GetConsoleOutput).
EC2_ON_CLUSTER = ["ec2:TerminateInstances", "ec2:StopInstances", "ec2:RebootInstances",
                  "ec2:GetConsoleOutput", "ec2:ModifyInstanceAttribute",
                  "ec2:AssociateAddress", "ec2:DisassociateAddress", "ec2:ReleaseAddress"]
RUN_INTO = ["subnet", "security-group", "placement-group", "key-pair"]
# A spot launch also makes a spot-instances-request, tagged with the rest (create.run_params);
# Karpenter's reference controller policy allows RunInstances and CreateTags on
# spot-instances-request/* under the same request-tag conditions.
RUN_CREATES = ["instance", "volume", "network-interface", "spot-instances-request"]
# AssociateAddress with NetworkInterfaceId (network.node_addresses) acts on the elastic-ip AND
# the network interface ("Actions, resources, and condition keys for Amazon EC2")
ON_CLUSTER = ["instance", "elastic-ip", "network-interface"]
# What deleting the cluster from inside takes (teardown.Teardown, controller_vm.py), on the
# cluster's tagged resources only
TEARDOWN = {"ec2:DeleteNatGateway": "natgateway", "ec2:DeleteSubnet": "subnet",
            "ec2:DeleteRouteTable": "route-table", "ec2:DisassociateRouteTable": "route-table",
            "ec2:DeletePlacementGroup": "placement-group",
            "ec2:DeleteSecurityGroup": "security-group", "ec2:DeleteKeyPair": "key-pair",
            "ec2:DeleteVolume": "volume", "ec2:DeleteNetworkInterface": "network-interface"}


def role_name(cluster: str) -> str:
    """At most 64 characters ("IAM and AWS STS quotas": role and instance profile names):
    9 + a cluster name of at most 40."""
    return f"mgpu-ctl-{cluster}"


def role_arn(account: str, cluster: str) -> str:
    return f"arn:aws:iam::{account}:role{PATH}{role_name(cluster)}"


def trust_policy(cluster: str, account: str) -> dict[str, Any]:
    """Who may assume the controller's role: EC2 (its instance profile), and the role itself.
    A role cannot name itself as the principal while it does not exist yet (a trust policy's
    principals must exist: "IAM JSON policy elements: Principal"), so the account is the
    principal and aws:PrincipalArn must be the role's own ARN ("Role self-assumption" needs
    the role's trust policy to allow it explicitly, IAM User Guide)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
         "Action": "sts:AssumeRole"},
        {"Sid": "ItselfForNodeCredentials", "Effect": "Allow",
         "Principal": {"AWS": f"arn:aws:iam::{account}:root"}, "Action": "sts:AssumeRole",
         "Condition": {"ArnEquals": {"aws:PrincipalArn": role_arn(account, cluster)}}},
    ]}


def controller_policy(cluster: str, region: str, account: str, store: StoreURL | None, *,
                      subnets: list[str] | None = None, park_group: str | None = None,
                      reservations: list[str] | None = None) -> dict[str, Any]:
    """The controller's inline policy: nothing outside cluster `cluster`. The untagged
    resources it must use are named one by one: the nodes' `subnets` (a default subnet is
    not the cluster's to tag), the VPC's default security group it moves to before deleting
    the cluster's (`park_group`), the capacity `reservations` the nodes run in."""
    arn = f"arn:aws:ec2:{region}:{account}"
    tagged = {"StringEquals": {f"aws:ResourceTag/{CLUSTER_TAG}": cluster}}
    statements: list[dict[str, Any]] = [
        {"Sid": "Describe", "Effect": "Allow", "Action": ["ec2:Describe*"], "Resource": "*"},
        {"Sid": "ClusterResources", "Effect": "Allow", "Action": EC2_ON_CLUSTER,
         "Resource": [f"{arn}:{kind}/*" for kind in ON_CLUSTER], "Condition": tagged},
        {"Sid": "RunIntoTheCluster", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [f"{arn}:{kind}/*" for kind in RUN_INTO], "Condition": tagged},
        {"Sid": "RunPublicImages", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [f"arn:aws:ec2:{region}::image/*"]},
        {"Sid": "CreateTagged", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:AllocateAddress"],
         "Resource": [f"{arn}:{kind}/*" for kind in RUN_CREATES] + [f"{arn}:elastic-ip/*"],
         "Condition": {"StringEquals": {f"aws:RequestTag/{CLUSTER_TAG}": cluster},
                       "ForAllValues:StringEquals": {"aws:TagKeys": [CLUSTER_TAG]}}},
        {"Sid": "TagOnCreate", "Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": [f"{arn}:{kind}/*" for kind in RUN_CREATES] + [f"{arn}:elastic-ip/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": ["RunInstances",
                                                             "AllocateAddress"]}}},
    ]
    if store is not None and store.scheme == "s3":
        folder = "/".join(p for p in (store.prefix, cluster) if p)
        statements += [
            {"Sid": "StoreObjects", "Effect": "Allow",
             "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject",
                        "s3:AbortMultipartUpload"],
             "Resource": [f"arn:aws:s3:::{store.bucket}/{folder}/*"]},
            {"Sid": "StoreList", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{store.bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{folder}/*"]}}},
            # the nodes' store credentials: its own role assumed with a session policy on the
            # run's data prefix (nodecreds.py); the session can never exceed this policy
            {"Sid": "MintNodeCredentials", "Effect": "Allow", "Action": ["sts:AssumeRole"],
             "Resource": [role_arn(account, cluster)]},
        ]
    statements += _named_statements(arn, subnets or [], park_group, reservations or [])
    statements += _teardown_statements(cluster, arn, account)
    return {"Version": "2012-10-17", "Statement": statements}


def _named_statements(arn: str, subnets: list[str], park_group: str | None,
                      reservations: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if subnets:
        out.append({"Sid": "RunIntoTheNodesSubnets", "Effect": "Allow",
                    "Action": ["ec2:RunInstances"],
                    "Resource": [f"{arn}:subnet/{s}" for s in sorted(set(subnets))]})
    if reservations:  # a Capacity Block or reservation the nodes were launched into
        out.append({"Sid": "RunIntoTheReservations", "Effect": "Allow",
                    "Action": ["ec2:RunInstances"],
                    "Resource": [f"{arn}:capacity-reservation/{r}" for r in reservations]})
    if park_group:
        out.append({"Sid": "ParkOnTheDefaultGroup", "Effect": "Allow",
                    "Action": ["ec2:ModifyInstanceAttribute"],
                    "Resource": [f"{arn}:security-group/{park_group}"]})
    return out


def _teardown_statements(cluster: str, arn: str, account: str) -> list[dict[str, Any]]:
    name = role_name(cluster)
    tagged = {"StringEquals": {f"aws:ResourceTag/{CLUSTER_TAG}": cluster}}
    by_kind: dict[str, list[str]] = {}
    for action, kind in TEARDOWN.items():
        by_kind.setdefault(kind, []).append(action)
    return [
        {"Sid": "DeleteTheCluster", "Effect": "Allow", "Action": sorted(TEARDOWN),
         "Resource": [f"{arn}:{kind}/*" for kind in sorted(by_kind)], "Condition": tagged},
        {"Sid": "RemoveItsOwnProfile", "Effect": "Allow",
         "Action": ["iam:GetInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile"],
         "Resource": [f"arn:aws:iam::{account}:instance-profile{PATH}{name}"]},
        {"Sid": "RevokeItsOwnPolicy", "Effect": "Allow", "Action": ["iam:DeleteRolePolicy"],
         "Resource": [f"arn:aws:iam::{account}:role{PATH}{name}"]},
    ]


def create_identity(iam: Any, cluster: str, policy: dict[str, Any], record: Record, *,
                    account: str) -> str:
    """Role + inline policy + instance profile; each recorded as soon as it exists (the
    role's record carries its ARN). Raises botocore errors (the caller maps them; rollback
    is `delete_identity`). Returns the instance profile's name."""
    name = role_name(cluster)
    tags = [{"Key": CLUSTER_TAG, "Value": cluster}]
    iam.create_role(RoleName=name, Path=PATH,
                    AssumeRolePolicyDocument=json.dumps(trust_policy(cluster, account)),
                    Description=f"mgpu-cloud controller of cluster {cluster}", Tags=tags)
    record(ResourceRecord(kind="iam-role", id=name, name=cluster,
                          extra={"arn": role_arn(account, cluster)}))
    iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME,
                        PolicyDocument=json.dumps(policy))
    iam.create_instance_profile(InstanceProfileName=name, Path=PATH, Tags=tags)
    record(ResourceRecord(kind="iam-instance-profile", id=name, name=cluster))
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return name


def _gone(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    return isinstance(response, dict) and response.get("Error", {}).get("Code") == "NoSuchEntity"


def _owner(iam: Any, r: ResourceRecord) -> tuple[str | None, str]:
    """(the cluster tag's value, the path) of a recorded role / instance profile, read from
    IAM now (NoSuchEntity propagates: gone)."""
    if r.kind == "iam-role":
        role = iam.get_role(RoleName=r.id)["Role"]
        tags = iam.list_role_tags(RoleName=r.id)["Tags"]
        return next((t["Value"] for t in tags if t["Key"] == CLUSTER_TAG), None), role["Path"]
    prof = iam.get_instance_profile(InstanceProfileName=r.id)["InstanceProfile"]
    return (next((t["Value"] for t in prof.get("Tags", []) if t["Key"] == CLUSTER_TAG), None),
            prof["Path"])


def _delete_one(iam: Any, r: ResourceRecord) -> None:
    if r.kind == "iam-instance-profile":
        for role in iam.get_instance_profile(InstanceProfileName=r.id)[
                "InstanceProfile"]["Roles"]:
            iam.remove_role_from_instance_profile(InstanceProfileName=r.id,
                                                  RoleName=role["RoleName"])
        iam.delete_instance_profile(InstanceProfileName=r.id)
    else:
        for policy in iam.list_role_policies(RoleName=r.id)["PolicyNames"]:
            iam.delete_role_policy(RoleName=r.id, PolicyName=policy)
        iam.delete_role(RoleName=r.id)


def delete_identity(iam: Any, records: list[ResourceRecord],
                    forget: Callable[[str, str], None], cluster: str | None = None) -> list[str]:
    """Delete the recorded profiles, then roles (inline policies first), each only if IAM
    shows it under PATH with the tag of `cluster` (None: each record's `name`, as `gc` found
    it) at that moment: a record naming another cluster's or an untagged identity is refused
    by name, left alone and forgotten. Idempotent; returns what could not be deleted (each
    problem one line)."""
    problems = []
    for kind, what in (("iam-instance-profile", "instance profile"), ("iam-role", "role")):
        for r in (r for r in records if r.kind == kind):
            want = cluster if cluster is not None else r.name
            try:
                owner, path = _owner(iam, r)
                if owner != want or path != PATH:
                    problems.append(f"refused to delete {what} {r.id}: it is not under {PATH} "
                                    f"with {CLUSTER_TAG}={want} (path {path}, tag {owner}); "
                                    "left alone")
                else:
                    _delete_one(iam, r)
            except Exception as exc:  # noqa: BLE001 - classified: NoSuchEntity is done
                if not _gone(exc):
                    problems.append(f"{what} {r.id}: {exc}")
                    continue
            forget(kind, r.id)
    return problems


def identity_orphans(iam: Any, known: set[str]) -> list[ResourceRecord]:
    """Controller roles and instance profiles (our path, our tag) of clusters not in `known`."""
    found = []
    for page in iam.get_paginator("list_roles").paginate(PathPrefix=PATH):
        for role in page["Roles"]:
            tags = iam.list_role_tags(RoleName=role["RoleName"])["Tags"]
            owner = next((t["Value"] for t in tags if t["Key"] == CLUSTER_TAG), None)
            if owner is not None and owner not in known:
                found.append(ResourceRecord(kind="iam-role", id=role["RoleName"], name=owner))
    for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix=PATH):
        for prof in page["InstanceProfiles"]:
            # GetInstanceProfile returns the profile's Tags ("IAM API Reference",
            # InstanceProfile data type): one call that moto also answers
            tags = iam.get_instance_profile(InstanceProfileName=prof["InstanceProfileName"])[
                "InstanceProfile"].get("Tags", [])
            owner = next((t["Value"] for t in tags if t["Key"] == CLUSTER_TAG), None)
            if owner is not None and owner not in known:
                found.append(ResourceRecord(kind="iam-instance-profile",
                                            id=prof["InstanceProfileName"], name=owner))
    return found
