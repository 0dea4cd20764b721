"""The project's size rules (STYLE.md), checked on every run: no Python module git tracks
(provision/, remote/, tests/, benchmarks/, examples/, scripts/) over 400 lines, no function
over 80."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE, MAX_FUNCTION = 400, 80
TOPS = ("provision", "remote", "tests", "benchmarks", "examples", "scripts")


def sources() -> list[Path]:
    """Every .py file git tracks here (a file git ignores, a virtual environment's, is not the
    project's). Each top folder of the project must be among them: a `git ls-files` that
    found only some, or none, fails rather than passing quietly."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    found = sorted(ROOT / name for name in listed.split("\0") if name)
    tops = {p.relative_to(ROOT).parts[0] for p in found}
    assert set(TOPS) <= tops, f"git ls-files found none in {sorted(set(TOPS) - tops)}"
    return [p for p in found if p.exists()]  # removed from the tree, not yet from git: gone


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
