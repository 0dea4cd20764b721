"""The base of every user-facing pydantic model: unknown keys are errors, not ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """`extra="forbid"`: a typo in a YAML file or a flag mapped to the wrong key is an error."""

    model_config = ConfigDict(extra="forbid")
