"""AWS provider: GPU clusters (p4d/p5/...) in one cluster placement group with EFA.

Importing this package is cheap: boto3/botocore are imported inside the functions that call
AWS, never at module level (the CLI must start fast).

    provider.py   AwsProvider: the Provider contract; the ONE place botocore errors become
                  MgpuErrors (errors.map_errors)
    plan.py       read-only validation + Plan (what `up` prints before it writes anything)
    create.py     the write steps of `up`, each resource recorded the moment its id exists
    teardown.py   destroy (idempotent, from the inventory + tag lookups) and `gc` orphans
    api.py        EC2 calls through retry.py; clients.py makes sessions/clients
    errors.py     error-code tables; retry.py tenacity policies (with the test seam)
    catalog.py    instance-type facts from describe_instance_types + the shipped prices.yaml
"""

from provision.providers.aws.provider import AwsProvider

PROVIDER_CLASS = AwsProvider

__all__ = ["PROVIDER_CLASS", "AwsProvider"]
