"""How values read on the pages (Jinja filters): money, times, durations, hours left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from provision.operations.status import when


def money(value: float | None, places: int = 2) -> str:
    if value is None:
        return "-"
    return f"${value:,.{places}f}"


def duration(seconds: float | None) -> str:
    """65 -> '1m05s', 3725 -> '1h02m', 90061 -> '1d01h'."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def hours(value: float | None) -> str:
    """Hours left of a limit: '-' without one, 'ended' at 0."""
    if value is None:
        return "-"
    return "ended" if value <= 0 else duration(value * 3600)


def gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} GB/s"


def span_end(phases: list[dict[str, Any]]) -> float:
    """Where the last of the bring-up phases ends (seconds after the start)."""
    return max((float(p["start_s"]) + float(p["seconds"]) for p in phases), default=0.0)


def tojson_attr(value: Any) -> str:
    """JSON for a data-* attribute (Jinja autoescapes it)."""
    return json.dumps(value, separators=(",", ":"))


def environment(templates: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(money=money, when=when, duration=duration, hours=hours, gbps=gbps,
                       tojson_attr=tojson_attr, span_end=span_end)
    return env
