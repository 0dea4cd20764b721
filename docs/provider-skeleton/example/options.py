"""The `example:` section of a cluster YAML (and what the --example-* flags set)."""

from __future__ import annotations

from pydantic import Field

from provision.model.base import StrictModel


class ExampleOptions(StrictModel):
    hosts: str = Field("", description="comma-separated addresses")
    user: str = "root"
