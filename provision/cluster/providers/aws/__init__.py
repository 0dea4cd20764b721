"""AWS provider: GPU clusters (p4d/p5/...) in one cluster placement group with EFA.

Importing this package is cheap (the CLI reads INFO at start-up): boto3/botocore are imported
inside the functions that call AWS, never at module level.

    provider.py   AwsProvider: the Provider contract; the ONE place botocore errors become
                  MgpuErrors (errors.map_errors)
    plan.py       read-only validation -> AwsPlan (what `up` prints, and what `create` consumes)
    create.py     the write steps of `up`, each resource recorded the moment its id exists
    teardown.py   destroy (idempotent, from the inventory + tag lookups) and `gc` orphans
    replace.py    recovery (contract.Recoverable): node_alive, one instance in a lost one's place
    api.py        EC2 calls through retry.py; clients.py makes sessions/clients
    errors.py     error-code tables; retry.py tenacity policies (with the test seam)
    catalog.py    instance-type facts from describe_instance_types + the shipped prices.yaml
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="aws",
    summary="EC2 GPU instances in a cluster placement group, EFA",
    options="provision.cluster.providers.aws.options:AwsOptions",
    implementation="provision.cluster.providers.aws.provider:AwsProvider",
    costs_money=True,
    machine_type="instance_type",
    # Launched with InstanceInitiatedShutdownBehavior=terminate: power-off terminates.
    self_stop="sudo -n shutdown -h now",
    self_stop_note="each instance powers off, which terminates it (billing stops); `down` "
                   "removes the placement group, security group, key pair and the inventory",
    flags=(
        Flag("--instance-type", "instance_type", help="e.g. p4d.24xlarge"),
        Flag("--region", "region", help="region", gc=True),
        Flag("--zone", "zone", help="availability zone"),
        Flag("--ami", "ami", help="AMI id (default: Deep Learning Base GPU AMI)"),
        Flag("--disk-gb", "disk_gb", int, help="root disk size"),
        Flag("--spot-fallback", "spot_fallback", bool,
             help="fall back to on-demand when spot has no capacity"),
        Flag("--private-ips", "private_ips", bool,
             help="no Elastic IPs: the controller is inside the VPC"),
    ),
)
