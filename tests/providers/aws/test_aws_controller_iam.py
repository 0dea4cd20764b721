"""The AWS controller's own IAM against what a replacement SENDS (issue 38), under moto and the
policy evaluator (aws_policy_guard.py, sources there): a spot node replaced on a multi-card
type (a spot launch tags a spot-instances-request; an Elastic IP is associated with the new
node's network interface) makes only calls the controller's policy allows."""

from __future__ import annotations

import json

import aws_iam_rules as iam_rules
from aws_policy_guard import Ec2State, PolicyGuard

from provision.cluster.providers import get_provider
from provision.cluster.providers.aws import clients

REGION, ACCOUNT = "us-east-1", "123456789012"  # conftest.REGION, moto's account


def test_a_spot_replacement_with_an_elastic_ip_is_allowed(fakes, spec_for, store, up_cluster,
                                                          moto_ec2) -> None:
    """Before: RunInstances' spot-instances-request (and CreateTags on it) and
    AssociateAddress's network interface were outside the policy: every such replacement
    would be denied on AWS (moto does not evaluate policies)."""
    inv = up_cluster(spec_for(instance_type="p4d.24xlarge", spot=True, max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": "s3://ckpt-bucket/runs"})
    provider = get_provider("aws")
    provider.create_controller(inv, store)
    (sent,) = fakes.calls("PutRolePolicy")
    policy = json.loads(sent["PolicyDocument"])
    assert iam_rules.check_policy("c1", policy, "runs/c1") == []
    guard = PolicyGuard(policy, REGION, ACCOUNT, Ec2State(moto_ec2, fakes.placement_groups))
    remove = clients.add_client_hook(guard.attach)
    try:
        provider.replace(inv, store, inv.nodes[1])
    finally:
        remove()
    run = fakes.calls("RunInstances")[-1]
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    assert {"RunInstances", "AllocateAddress", "AssociateAddress"} <= set(guard.checked)
    assert guard.violations == []
