"""SSH provider: existing machines (on-prem nodes, a lab box, hosts behind a login node)."""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="ssh",
    summary="machines you already have (hosts YAML or a DeepSpeed hostfile)",
    options="provision.cluster.providers.ssh.options:SshOptions",
    implementation="provision.cluster.providers.ssh.provider:SshProvider",
    costs_money=False,
    flags=(
        Flag("--inventory", "inventory", help="hosts YAML (see inventories/)"),
        Flag("--hostfile", "hostfile", help="DeepSpeed/MPI hostfile"),
        Flag("--user", "user", help="login user"),
        Flag("--identity-file", "identity_file", short="-i", help="private key"),
        Flag("--accept-new-host-keys", "accept_new_host_keys", bool,
             help="pin unknown host keys"),
    ),
)
