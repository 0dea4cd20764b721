"""Shell words for command lines run on nodes: every value quoted, $HOME kept live."""

from __future__ import annotations

import shlex

from provision.nodes.layout import HomePath


def word(value: str) -> str:
    """One shell word for `value` (HomePath keeps $HOME live, everything else is quoted)."""
    if isinstance(value, HomePath):
        return '"$HOME"/' + shlex.quote(str(value))
    return shlex.quote(value)


def words(parts: list[str]) -> str:
    return " ".join(word(p) for p in parts)


def assign(key: str, value: str) -> str:
    return f"{key}={word(value)}"
