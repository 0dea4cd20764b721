"""SSH provider: existing machines (on-prem nodes, a lab box, hosts behind a login node)."""

from provision.providers.ssh.provider import SshProvider

PROVIDER_CLASS = SshProvider

__all__ = ["PROVIDER_CLASS", "SshProvider"]
