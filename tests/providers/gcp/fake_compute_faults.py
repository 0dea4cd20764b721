"""The faults a test scripts into the Compute fake (fake_compute.py): an HTTP error or an HTML
page instead of an answer (`fail`, `html`), and an operation that ends DONE with an error code
(`fail_operation`, `stockout`, the networks quota)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Fault:
    method: str
    pattern: re.Pattern[str]
    status: int
    reason: str
    times: int
    after: bool  # act first, then answer with the error (the reply is "lost")
    html: bytes | None = None  # answer with this HTML page instead (a proxy's, say)


@dataclass
class OpFault:
    method: str
    pattern: re.Pattern[str]
    code: str
    http_status: int
    times: int
    details: list[dict[str, Any]] = field(default_factory=list)
