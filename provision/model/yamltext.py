"""Where a YAML text is broken, in the words every message of the tool uses."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

YAML_HINT = "check indentation and that every `key: value` pair has a space after the colon"


@dataclass(frozen=True)
class YamlProblem:
    """A YAML error's position (1-based; None where the parser gave none) and its problem."""

    line: int | None
    column: int | None
    problem: str

    @classmethod
    def of(cls, exc: yaml.YAMLError) -> YamlProblem:
        mark = getattr(exc, "problem_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        if mark is None:
            return cls(None, None, problem)
        return cls(mark.line + 1, mark.column + 1, problem)

    def at(self) -> str:
        """' at line L, column C', or '' without a position."""
        return f" at line {self.line}, column {self.column}" if self.line is not None else ""
