"""One machine the user already has, as written in a spec or a hosts file (plain data: the
login is resolved by provision/nodes/sshhosts.py). Kept apart from paramiko so that building a
spec does not import it."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel


class SshHostOptions(StrictModel):
    """One pre-existing machine (an entry of the ssh provider's hosts; slurm's login node)."""

    name: str | None = None
    address: str
    user: str | None = None
    port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    slots: int | None = Field(None, ge=1)
    proxy_jump: str | None = None
    private_address: str | None = None
