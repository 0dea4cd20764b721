"""Atomic file writes: readers see the old file or the new one, never half of one.

The one helper for every replace-by-rename in the tool, on the nodes (remote/) and on the
machine that runs the CLI (provision/ imports it: remote/ is stdlib-only and below it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

PathLike = str | os.PathLike[str]
PARTIAL_PREFIX, PARTIAL_SUFFIX = ".", ".tmp"


def is_partial(name: str) -> bool:
    """A file name `replacing` gives its temporary files (listings leave them out)."""
    return name.startswith(PARTIAL_PREFIX) and name.endswith(PARTIAL_SUFFIX)


@contextlib.contextmanager
def replacing(path: PathLike, *, mode: int = 0o600, fsync: bool = True) -> Iterator[str]:
    """Yield the path of a new temporary file in `path`'s folder (which must exist); fill it.
    When the block ends normally the file gets `mode`, is flushed to disk (`fsync`) and
    renamed over `path`; when it raises, the temporary file is removed and `path` untouched."""
    folder, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f"{PARTIAL_PREFIX}{name}.",
                               suffix=PARTIAL_SUFFIX)
    os.close(fd)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: PathLike, data: str | bytes, *, mode: int = 0o600,
                 fsync: bool = True) -> None:
    """Replace `path` with `data` (text is written as UTF-8) atomically; see `replacing`."""
    raw = data.encode() if isinstance(data, str) else data
    with replacing(path, mode=mode, fsync=fsync) as tmp, open(tmp, "wb") as fh:
        fh.write(raw)
