"""Render templates/ with Jinja2 (StrictUndefined: a missing value is an error, not a blank)."""

from __future__ import annotations

import shlex
from functools import cache
from typing import Any

from provision.model.assets import templates_dir


def _shquote(value: Any) -> str:
    return shlex.quote(str(value))


@cache
def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - shell scripts, env files and hostfiles, not HTML
    )
    env.filters["shquote"] = _shquote
    return env


def render(name: str, **context: Any) -> str:
    """Render templates/NAME. Any value that reaches a shell goes through `| shquote`."""
    return str(_env().get_template(name).render(**context))


def parse_env_file(text: str) -> dict[str, str]:
    """`KEY=VALUE` lines of a rendered env preset (comments and blanks skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out
