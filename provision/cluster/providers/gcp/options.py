"""Options of the gcp provider (the `gcp:` section of a cluster YAML)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from provision.model.base import StrictModel

ANY_REGION = "any"
_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
_RESERVATION = re.compile(r"^(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?"
                          r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


# The managed runs' controller (controller_vm.py): small, cheap, enough for the supervisor.
CONTROLLER_MACHINE_TYPE = "e2-small"


class GcpOptions(StrictModel):
    project: str | None = None
    zone: str | None = None
    machine_type: str = "a2-ultragpu-8g"
    image_family: str | None = None
    image_project: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = Field(None, ge=1)
    disk_gb: int = Field(200, ge=10, le=65536)
    # A specific reservation to consume: NAME (this project) or projects/P/reservations/NAME
    # (one shared with this project).
    reservation: str | None = None
    flex_start: bool = False  # DWS flex-start provisioning model
    # Regions to fail over to, in order (the zone's region first), or ["any"].
    regions: list[str] | None = None
    controller_machine_type: str = CONTROLLER_MACHINE_TYPE

    @field_validator("regions", mode="before")
    @classmethod
    def _split_regions(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            bad = [v for v in value if v != ANY_REGION and not _REGION.match(str(v))]
            if bad:
                raise ValueError(f"{', '.join(map(str, bad))}: not a region name (like "
                                 "us-central1); pass a comma-separated list, or `any`")
            if ANY_REGION in value and len(value) > 1:
                raise ValueError("`any` stands alone: it means every region offering the type")
        return value or None

    @field_validator("reservation")
    @classmethod
    def _reservation_name(cls, value: str | None) -> str | None:
        if value is not None and not _RESERVATION.match(value):
            raise ValueError(f"{value!r} is not a reservation name (NAME, or "
                             "projects/PROJECT/reservations/NAME for a shared one)")
        return value
