"""Rules for the controller's IAM policy (issue 18): it reaches only its own cluster.

Sources: "Actions, resources, and condition keys for Amazon EC2" (Service Authorization
Reference): EC2's Describe* actions support no resource-level permissions (Resource "*" is the
only form), every other action used here takes instance/volume/... ARNs and the
aws:ResourceTag / aws:RequestTag / aws:TagKeys / ec2:CreateAction condition keys;
"Actions, resources, and condition keys for Amazon S3": object actions on
arn:aws:s3:::BUCKET/KEY, ListBucket on the bucket with the s3:prefix condition key;
"IAM JSON policy elements: Action" (a wildcard action "*" or "service:*" grants everything).
Trust: "IAM JSON policy elements: Principal" (an account principal arn:aws:iam::ACCOUNT:root
lets every identity of the account whose own policy allows it; a condition on
aws:PrincipalArn narrows it to one), "Role self-assumption" (a role assumes itself only when
its trust policy allows it explicitly). STS: sts:AssumeRole's resource is the role's ARN.
"""

from __future__ import annotations

from typing import Any

TAG = "mgpu-cloud-cluster"
TAG_CONDITIONS = (f"aws:ResourceTag/{TAG}", f"aws:RequestTag/{TAG}")
# Untagged resources the controller may use, named one by one (never "*"): the nodes' default
# subnets and capacity reservations for RunInstances, the VPC's default group it moves to.
NAMED = {"ec2:RunInstances": ("subnet", "capacity-reservation"),
         "ec2:ModifyInstanceAttribute": ("security-group",)}
# IAM: only removing its own profile and revoking its own policy (never PassRole, Create*,
# Put*, Attach*: those would let it grant itself more)
IAM_SELF = {"iam:GetInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
            "iam:DeleteInstanceProfile", "iam:DeleteRolePolicy"}


def _named_only(actions: list[str], resources: list[str]) -> bool:
    kinds = {k for a in actions for k in NAMED.get(a, ())}
    return bool(kinds) and all(
        "*" not in r and r.rsplit(":", 1)[-1].split("/", 1)[0] in kinds for r in resources)


def _iam_violations(where: str, cluster: str, actions: list[str],
                    resources: list[str]) -> list[str]:
    out = [f"{where}: IAM action {a} beyond removing itself" for a in actions
           if a.startswith("iam:") and a not in IAM_SELF]
    own = (f":role/mgpu-cloud/mgpu-ctl-{cluster}",
           f":instance-profile/mgpu-cloud/mgpu-ctl-{cluster}")
    out += [f"{where}: IAM on {r}, not its own role or profile" for r in resources
            if any(a.startswith("iam:") for a in actions) and not r.endswith(own)]
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def check_policy(cluster: str, document: dict[str, Any], store_folder: str | None) -> list[str]:
    """Violations of "nothing outside cluster `cluster`" in one policy document."""
    out = []
    for i, st in enumerate(document.get("Statement", [])):
        where = f"statement {st.get('Sid', i)}"
        if st.get("Effect") != "Allow":
            continue
        actions = _list(st.get("Action", []))
        resources = _list(st.get("Resource", []))
        conditions = st.get("Condition", {})
        flat = {k: v for op in conditions.values() for k, v in op.items()}
        for action in actions:
            if action == "*" or action.endswith(":*"):
                out.append(f"{where}: wildcard action {action!r}")
        if "*" in resources and any(not a.startswith("ec2:Describe") for a in actions):
            out.append(f"{where}: Resource '*' for {actions} (only Describe* may)")
        ec2_writes = [a for a in actions if a.startswith("ec2:") and not a.startswith(
            "ec2:Describe")]
        if ec2_writes:
            public_images = all(":image/" in r for r in resources)
            tagged = any(_list(flat.get(k)) == [cluster] for k in TAG_CONDITIONS)
            on_create = "ec2:CreateAction" in flat and actions == ["ec2:CreateTags"]
            if not (tagged or on_create or public_images or _named_only(actions, resources)):
                out.append(f"{where}: {ec2_writes} not limited to resources tagged {cluster}")
        out += _iam_violations(where, cluster, actions, resources)
        own_role = f":role/mgpu-cloud/mgpu-ctl-{cluster}"
        for action in (a for a in actions if a.startswith("sts:")):
            if action != "sts:AssumeRole" or not resources or not all(
                    r.startswith("arn:aws:iam::") and r.endswith(own_role) for r in resources):
                out.append(f"{where}: {action} on {resources}, not only its own role")
        for r in resources:
            if r.startswith("arn:aws:s3:::"):
                path = r[len("arn:aws:s3:::"):]
                if "/" in path:
                    if store_folder is None or not path.split("/", 1)[1].startswith(
                            store_folder + "/"):
                        out.append(f"{where}: S3 objects {r} outside the store's folder")
                elif not any(str(p).startswith(f"{store_folder}/")
                             for p in _list(flat.get("s3:prefix", []))):
                    out.append(f"{where}: ListBucket on {r} without an s3:prefix of the store")
    return out


def trust_allows(document: dict[str, Any], *, service: str | None = None,
                 principal_arn: str | None = None) -> bool:
    """Whether the trust policy lets `service`, or the identity `principal_arn` (an IAM role
    ARN, arn:aws:iam::ACCOUNT:role/PATH/NAME), call sts:AssumeRole."""
    for st in document.get("Statement", []):
        if st.get("Effect") != "Allow" or "sts:AssumeRole" not in _list(st.get("Action", [])):
            continue
        principal = st.get("Principal", {})
        if service is not None and service in _list(principal.get("Service", [])):
            return True
        if principal_arn is None:
            continue
        account = principal_arn.split(":")[4]
        aws = _list(principal.get("AWS", []))
        if principal_arn not in aws and f"arn:aws:iam::{account}:root" not in aws:
            continue
        wanted = {k: v for op in st.get("Condition", {}).values() for k, v in op.items()}
        if all(principal_arn in _list(v) for k, v in wanted.items()
               if k == "aws:PrincipalArn") and set(wanted) <= {"aws:PrincipalArn"}:
            return True
    return False


def check_trust(cluster: str, account: str, document: dict[str, Any]) -> list[str]:
    """The controller's role is assumed by EC2 and by itself, by nobody else."""
    out = []
    own = f"arn:aws:iam::{account}:role/mgpu-cloud/mgpu-ctl-{cluster}"
    for i, st in enumerate(document.get("Statement", [])):
        principal = st.get("Principal", {})
        if principal == "*" or "*" in _list(principal.get("AWS", [])):
            out.append(f"trust statement {i}: any principal")
        for aws in _list(principal.get("AWS", [])):
            arns = [v for op in st.get("Condition", {}).values()
                    for k, v in op.items() if k == "aws:PrincipalArn"]
            if aws != own and [own] not in [_list(a) for a in arns]:
                out.append(f"trust statement {i}: {aws} without aws:PrincipalArn = {own}")
    if not trust_allows(document, service="ec2.amazonaws.com"):
        out.append("trust: EC2 cannot assume the role (the instance profile would not work)")
    return out
