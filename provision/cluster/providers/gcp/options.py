"""Options of the gcp provider (the `gcp:` section of a cluster YAML)."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel


class GcpOptions(StrictModel):
    project: str | None = None
    zone: str | None = None
    machine_type: str = "a2-ultragpu-8g"
    image_family: str | None = None
    image_project: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = Field(None, ge=1)
    disk_gb: int = Field(200, ge=10, le=65536)
