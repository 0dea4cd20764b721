"""Slurm provider: the nodes are a Slurm allocation, reached through a login node over SSH.

Cheap to import (the CLI reads INFO at start-up): no pydantic, no paramiko here.
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="slurm",
    summary="an allocation on a Slurm cluster (through its login node)",
    options="provision.cluster.providers.slurm.options:SlurmOptions",
    implementation="provision.cluster.providers.slurm.provider:SlurmProvider",
    # A Slurm site bills in allocation hours against the user's account or fair share, not in
    # dollars this tool could show; the plan says what it asks for (nodes x time).
    costs_money=False,
    connector="provision.cluster.providers.slurm.transport:connector",
    flags=(
        Flag("--login", "login", help="login node, [user@]host[:port] (or an ssh config alias)",
             gc=True),
        Flag("--partition", "partition", help="Slurm partition (default: the site's default)"),
        Flag("--account", "account", help="Slurm account to charge"),
        Flag("--qos", "qos", help="Slurm QOS"),
        Flag("--constraint", "constraint", help="Slurm node features, e.g. 'a100&ib'"),
        Flag("--reservation", "reservation", help="Slurm reservation"),
        Flag("--node-access", "node_access",
             help="srun (default: through the login node) | ssh (to the nodes, if allowed)"),
        Flag("--queue-timeout", "queue_timeout_minutes", float,
             help="give up when the allocation has not started after this many minutes"),
        Flag("--proxy-jump", "proxy_jump", help="jump host to the login node, [user@]host[:port]",
             gc=True),
        Flag("--identity-file", "identity_file", short="-i", help="private key", gc=True),
        Flag("--accept-new-host-keys", "accept_new_host_keys", bool,
             help="pin unknown host keys"),
    ),
)
