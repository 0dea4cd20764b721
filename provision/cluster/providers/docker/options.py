"""Options of the docker provider (the `docker:` section of a cluster YAML)."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel

DEFAULT_BASE_IMAGE = "debian:bookworm-slim"


class DockerOptions(StrictModel):
    """Local emulation: nodes are containers of the top-level Dockerfile image."""

    base_image: str = DEFAULT_BASE_IMAGE
    image: str | None = Field(None, description="use this node image instead of building one")
    cpus: float | None = Field(None, gt=0, description="CPU limit per node container")
    memory: str | None = Field(None, description="memory limit per node container, e.g. 4g")
    gpus: bool = Field(False, description="pass the host's GPUs through (needs nvidia runtime)")
    # issue 44: a cloud node's boot made visible (a benchmark shows what a warm spare saves)
    simulate_boot: float = Field(0.0, ge=0, le=1800, description="seconds each node (new, "
                                 "replacement or spare) takes to boot before SSH answers")
