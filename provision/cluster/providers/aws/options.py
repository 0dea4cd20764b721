"""Options of the aws provider (the `aws:` section of a cluster YAML)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from provision.model.base import StrictModel

# The managed runs' controller (controller_vm.py): small, cheap, enough for the supervisor.
CONTROLLER_TYPE = "t3.small"


class AwsOptions(StrictModel):
    instance_type: str = "p4d.24xlarge"
    region: str | None = None
    # Regions to try in order (failover when one has no capacity), or ["any"]: every enabled
    # region offering the type. The CLI's `--regions a,b` arrives as one string.
    regions: list[str] | None = None
    zone: str | None = None
    ami: str | None = None
    disk_gb: int = Field(200, ge=8, le=16384)
    spot_fallback: bool = False
    private_ips: bool = False
    capacity_block: bool = False  # buy a Capacity Block for the nodes (capacity.py)
    reservation: str | None = Field(None, pattern=r"^(auto|cr-[0-9a-f]+)$")
    controller_type: str = CONTROLLER_TYPE

    @field_validator("regions", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        return value or None
