"""Time an older revision beside the current tree, in the same run (`--against REV`).

`checkout(REV)` is a `git worktree add --detach` of REV in a temporary folder, removed (with
`git worktree prune`) when the block ends, even on failure. `Tree` runs the CLI of one tree:
`python -m provision.cli` with that tree first on PYTHONPATH (it wins over the venv's editable
install; `Tree.check` proves it by importing `provision` there). Timings of the trees are
interleaved (one run of each in turn), so a change in the machine's load hits both alike.
Every tree measured gets its bytecode first (`Tree.compile`), as an installed tool has it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Tree:
    label: str
    path: Path

    def env(self, **extra: str) -> dict[str, str]:
        rest = os.environ.get("PYTHONPATH", "")
        return {**os.environ, **extra,
                "PYTHONPATH": os.pathsep.join(p for p in (str(self.path), rest) if p)}

    def cli(self) -> list[str]:
        return [sys.executable, "-m", "provision.cli"]

    def compile(self) -> None:
        """Bytecode for the tree's own modules, as an installed tool has it (pip compiles at
        install; an editable install writes __pycache__ on first use). These machines set
        PYTHONDONTWRITEBYTECODE=1, so without it every CLI start here compiles the project's
        modules from source: `run`'s imports before its first engine call took 0.29-0.39 s
        that way and 0.22-0.31 s with bytecode (4 runs each)."""
        subprocess.run([sys.executable, "-m", "compileall", "-q", "provision", "remote"],
                       cwd=self.path, check=True, capture_output=True)

    def check(self) -> None:
        """Exit unless this tree's `provision` is the one its commands import."""
        found = subprocess.run([sys.executable, "-c", "import provision; print(provision.__file__)"],
                               capture_output=True, text=True, env=self.env(), check=True,
                               cwd=self.path).stdout.strip()
        if not Path(found).resolve().is_relative_to(self.path.resolve()):
            raise SystemExit(f"{self.label}: imports {found}, not the tree at {self.path}")


def current() -> Tree:
    return Tree("this tree", ROOT)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Tree]:
    """REV as a temporary worktree (detached), removed afterwards."""
    short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev],
                           capture_output=True, text=True, check=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix=f"mgpu-bench-{short}-"))
    tree = folder / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                    str(tree), rev], check=True)
    try:
        yield Tree(short, tree)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def trees(against: str | None) -> Iterator[list[Tree]]:
    """[this tree] or [this tree, REV]; each checked to import its own code."""
    with contextlib.ExitStack() as stack:
        found = [current()] + ([stack.enter_context(checkout(against))] if against else [])
        for tree in found:
            tree.check()
            tree.compile()
        yield found


def interleaved(trees: list[Tree], repeat: int,
                measure: Callable[[Tree], float]) -> dict[str, float]:
    """The median of `repeat` measurements per tree, taken in turn (A B A B ...)."""
    runs: dict[str, list[float]] = {t.label: [] for t in trees}
    for _ in range(repeat):
        for tree in trees:
            runs[tree.label].append(measure(tree))
    return {label: statistics.median(values) for label, values in runs.items()}


def timed_command(argv: list[str], env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, env=env, cwd=cwd)
    return time.perf_counter() - start
