"""Archives as a hostile node's `tar` writes them, and a sandbox to unpack them in (for
tests/test_unpack*.py: provision/nodes/unpack.py).

Archives are built member by member with tarfile's writer (which writes any name and any
type it is given), into a sandbox holding the destination and a victim beside it; after
every refused unpack the whole sandbox is compared with what it was."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.nodes.unpack import UnsafeArchive, unpack

KINDS = ("file", "dir", "symlink", "hardlink", "fifo", "chardev", "blockdev")


@dataclass(frozen=True)
class Member:
    name: str
    kind: str = "file"
    data: bytes = b""
    link: str = ""
    mode: int = 0o644


def tgz(members: list[Member], *, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mode, info.mtime = m.mode, 1_700_000_000
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE,
                         "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE, "chardev": tarfile.CHRTYPE,
                         "blockdev": tarfile.BLKTYPE}[m.kind]
            info.linkname = m.link
            info.size = len(m.data) if m.kind == "file" else 0
            tar.addfile(info, io.BytesIO(m.data) if m.kind == "file" else None)
    return buf.getvalue()


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path under `root`: its kind and content (a link's target), never followed."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = p.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[str(p.relative_to(root))] = ("link", os.readlink(p))
            elif stat.S_ISDIR(mode):
                out[str(p.relative_to(root))] = ("dir", b"")
            elif stat.S_ISREG(mode):
                out[str(p.relative_to(root))] = ("file", p.read_bytes())
            else:  # a fifo: opening it would wait for a writer
                out[str(p.relative_to(root))] = ("other", oct(mode))
    return out


def unpack_bytes(data: bytes, dest: Path, tmp: Path) -> int:
    archive = tmp / "in.tgz"
    archive.write_bytes(data)
    try:
        return unpack(archive, dest, node="node-3")
    finally:
        archive.unlink()


def refused(data: bytes, box: Path, tmp: Path, why: str = "") -> str:
    """Unpack `data` into box/dest, expecting a refusal that names the node and changes
    nothing anywhere in the sandbox; returns the message."""
    before = snapshot(box)
    with pytest.raises(UnsafeArchive, match=r"node-3") as exc:
        unpack_bytes(data, box / "dest", tmp)
    assert snapshot(box) == before, "a refused archive changed the sandbox"
    assert why in str(exc.value), str(exc.value)
    return str(exc.value)


def fresh_box(tmp_path: Path) -> Path:
    """A sandbox of its own for one example (hypothesis runs many in one test)."""
    box = Path(tempfile.mkdtemp(dir=tmp_path)) / "box"
    (box / "victim").mkdir(parents=True)
    (box / "victim" / "secret").write_text("untouched")
    (box / "dest").mkdir()
    (box / "dest" / "kept.pt").write_bytes(b"an earlier copy")
    return box
