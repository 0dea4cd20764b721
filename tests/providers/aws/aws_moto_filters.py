"""EC2's documented tag filters that moto ignores, applied to its answers on the provider's
clients (attached with the request rules, aws_rules.AwsRules.attach).

DescribeNatGateways (EC2 API Reference, "Filter"): "tag:<key> - The key/value combination of
a tag assigned to the resource" and "tag-key - The key of a tag assigned to the resource,
regardless of the tag value". moto 5 filters NAT gateways only by nat-gateway-id, vpc-id,
subnet-id and state (moto/ec2/models/nat_gateways.py, describe_nat_gateways) and answers
every other one unfiltered: a lookup by one cluster's tag would list every cluster's NAT
gateways, and a teardown would delete another cluster's."""

from __future__ import annotations

from typing import Any


def _tagged(item: dict[str, Any], name: str, values: list[str]) -> bool:
    tags = {t.get("Key"): t.get("Value") for t in item.get("Tags") or []}
    if name == "tag-key":
        return any(v in tags for v in values)
    key = name.removeprefix("tag:")
    return key in tags and tags[key] in values


def nat_gateway_tag_filters(parsed: dict[str, Any], context: dict[str, Any],
                            **_: Any) -> None:
    """after-call.ec2.DescribeNatGateways: keep what every tag filter of the request takes
    (the request as aws_rules stored it in `context`)."""
    filters = [f for f in context.get("rules_params", {}).get("Filter", [])
               if f.get("Name") == "tag-key" or str(f.get("Name", "")).startswith("tag:")]
    if "NatGateways" in parsed and filters:
        parsed["NatGateways"] = [n for n in parsed["NatGateways"]
                                 if all(_tagged(n, f["Name"], f.get("Values", []))
                                        for f in filters)]
