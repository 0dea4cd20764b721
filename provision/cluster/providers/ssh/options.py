"""Options of the ssh provider (the `ssh:` section of a cluster YAML)."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel
from provision.model.sshhost import SshHostOptions  # an entry of `hosts:`


class SshOptions(StrictModel):
    inventory: str | None = None
    hostfile: str | None = None
    hosts: list[SshHostOptions] = Field(default_factory=list)
    user: str | None = None
    identity_file: str | None = None
    port: int = Field(22, ge=1, le=65535)
    accept_new_host_keys: bool = False
