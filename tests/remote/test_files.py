"""remote/files.py: the one atomic write of the tool (nodes and CLI machine alike)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote.files import is_partial, replacing, write_atomic


def test_write_replaces_whole_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    target.write_text("old")
    write_atomic(target, "new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o600
    write_atomic(str(target), b"\x00bytes", mode=0o644)
    assert target.read_bytes() == b"\x00bytes" and target.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["f.json"], "no temporary file left behind"


def test_a_failed_fill_leaves_the_old_file_and_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        Path(tmp).write_text("half")
        assert is_partial(Path(tmp).name) and not is_partial("ckpt.pt")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["ckpt.pt"]
