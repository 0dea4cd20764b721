"""Options of the aws provider (the `aws:` section of a cluster YAML)."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel


class AwsOptions(StrictModel):
    instance_type: str = "p4d.24xlarge"
    region: str | None = None
    zone: str | None = None
    ami: str | None = None
    disk_gb: int = Field(200, ge=8, le=16384)
    spot_fallback: bool = False
    private_ips: bool = False
