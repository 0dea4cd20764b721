"""The AWS controller's role can mint the nodes' short-lived store credentials (issue 34): its
trust policy lets the role assume ITSELF (the account as principal, only with aws:PrincipalArn
= its own ARN) besides EC2, its inline policy allows sts:AssumeRole on its own ARN and nothing
else of STS, and the ARN is recorded where the controller reads it (its inventory record).
Checked on the documents as SENT under moto (aws_iam_rules.py: trust_allows, check_trust,
check_policy; aws_policy_guard.allows), each rule able to fail."""

from __future__ import annotations

import json

import aws_iam_rules as iam_rules
from aws_policy_guard import allows

from provision.cluster.providers import get_provider
from provision.cluster.providers.aws.controller import controller_policy, trust_policy
from provision.cluster.providers.aws.controller_vm import is_controller
from remote.store import parse_url

ACCOUNT = "123456789012"  # moto's
OWN = f"arn:aws:iam::{ACCOUNT}:role/mgpu-cloud/mgpu-ctl-c1"
OTHER = f"arn:aws:iam::{ACCOUNT}:role/mgpu-cloud/mgpu-ctl-c2"


def test_the_controller_role_may_assume_itself_and_no_other(fakes, spec_for, store,
                                                            up_cluster) -> None:
    """Before: the role trusted ec2.amazonaws.com only (a role cannot assume itself unless its
    trust says so) and its policy had no sts:AssumeRole: no node credentials could be minted
    on the controller."""
    inv = up_cluster(spec_for(instance_type="g6.xlarge", max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": "s3://ckpt-bucket/runs"})
    get_provider("aws").create_controller(inv, store)
    (role,) = fakes.calls("CreateRole")
    trust = json.loads(role["AssumeRolePolicyDocument"])
    assert iam_rules.check_trust("c1", ACCOUNT, trust) == []
    assert iam_rules.trust_allows(trust, principal_arn=OWN)
    assert iam_rules.trust_allows(trust, service="ec2.amazonaws.com")
    assert not iam_rules.trust_allows(trust, principal_arn=OTHER)
    assert not iam_rules.trust_allows(trust, principal_arn=f"arn:aws:iam::{ACCOUNT}:role/admin")
    (sent,) = fakes.calls("PutRolePolicy")
    policy = json.loads(sent["PolicyDocument"])
    assert iam_rules.check_policy("c1", policy, "runs/c1") == []
    assert allows(policy, "sts:AssumeRole", OWN, {})
    assert not allows(policy, "sts:AssumeRole", OTHER, {})
    # where the controller reads it: its own inventory record (and the role's)
    saved = store.load("c1")
    (ctl,) = [r for r in saved.resources if is_controller(r)]
    assert ctl.extra["role_arn"] == OWN
    assert next(r for r in saved.resources if r.kind == "iam-role").extra["arn"] == OWN


def test_the_trust_and_sts_rules_can_fail() -> None:
    loose = trust_policy("c1", ACCOUNT)
    loose["Statement"][1].pop("Condition")  # the whole account could assume it
    assert any("without aws:PrincipalArn" in v for v in iam_rules.check_trust("c1", ACCOUNT,
                                                                             loose))
    assert iam_rules.trust_allows(loose, principal_arn=OTHER)
    doc = controller_policy("c1", "us-east-1", ACCOUNT, parse_url("s3://ckpt-bucket/runs"))
    mint = next(st for st in doc["Statement"] if st.get("Sid") == "MintNodeCredentials")
    mint["Resource"] = [f"arn:aws:iam::{ACCOUNT}:role/*"]
    assert any("not only its own role" in v for v in iam_rules.check_policy("c1", doc,
                                                                          "runs/c1"))
