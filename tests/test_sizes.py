"""The project's size rules (STYLE.md), checked on every run: no module of provision/ or
remote/ over 400 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE, MAX_FUNCTION = 400, 80


def sources() -> list[Path]:
    return sorted(p for top in ("provision", "remote") for p in (ROOT / top).rglob("*.py"))


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE}
    assert long == {}, long


def test_no_function_over_80_lines() -> None:
    long = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}, long
