"""THE one way an archive a node sent is unpacked here (outputs, checkpoint copies, anything
`transport.fetch_tree` brings back). A node runs the user's code as root: its `tar` may be
anything, so the archive is hostile input.

    unpack(archive, dest, node="node-1") -> files written

- only regular files and folders: a symbolic or hard link, a device, a fifo, a sparse file
  or any other member refuses the whole archive (a node's `tar` is asked to dereference
  links, so a job's own links arrive as the files they point to);
- every name goes through the store's key rule (`remote.storekeys.checked_key`: no empty,
  `.` or `..` segment, not absolute, no backslash, no control character, at most 1024
  bytes), and no segment is longer than a filesystem takes (255 bytes); a leading `./` (what `tar -C DIR .` writes) is dropped; a name given twice, or
  one under a name that is a file, is refused;
- counts and sizes are bounded (MAX_MEMBERS, MAX_BYTES, MAX_HEADER_BYTES, and the bytes
  read from the stream as a whole); a negative size is refused;
- a file is written 0o755 when its owner may run it, 0o644 otherwise, folders 0o755 (less
  the umask), with the member's time when it is one (0 to 2**40 seconds);
- all or nothing: the members are written into a FRESH folder made beside `dest`, each with
  `os.open(O_CREAT|O_EXCL|O_NOFOLLOW)` relative to a folder descriptor opened with
  O_NOFOLLOW (no link anyone planted is followed); only when the whole archive passed are
  its entries moved into `dest` (renames relative to folder descriptors, after checking
  that nothing there is a link or of the other kind). A refusal writes nothing into `dest`
  and names the node.

`tarfile.extractall` is never used: its `data` filter lets nested links climb out of the
destination on Python before 3.11.13 / 3.12.11 / 3.13.4 (CVE-2025-4517).
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from remote.storekeys import UnsafeKey, checked_key

MAX_MEMBERS = 100_000  # members of one archive (a checkpoint folder has hundreds)
# bytes of file content in one archive; a bigger checkpoint: set MGPU_CLOUD_FETCH_MAX_BYTES
MAX_BYTES = int(os.environ.get("MGPU_CLOUD_FETCH_MAX_BYTES", str(512 << 30)))
MAX_HEADER_BYTES = 64 << 10  # one pax or GNU long-name header (a name is <= 1024 bytes)
MAX_SEGMENT = 255  # bytes of one name segment (NAME_MAX of Linux filesystems)
HEADER_ALLOWANCE = 4 * tarfile.BLOCKSIZE  # per member: its header, a long name, padding
CHUNK = 1 << 20
FILE_MODE, EXEC_MODE, DIR_MODE = 0o644, 0o755, 0o755
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
            tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class UnsafeArchive(Exception):
    """An archive from a node refused; the message names the node and why. Nothing was
    written into the destination."""


# what a node may send for one archive, counted as it arrives, before anything is unpacked:
# the files' bytes, every member's headers, and gzip's own overhead (5 bytes per 64 KiB
# stored block at worst: 1% is ample)
MAX_DOWNLOAD = MAX_BYTES + MAX_BYTES // 100 + MAX_MEMBERS * HEADER_ALLOWANCE + (1 << 20)


class CappedWriter:
    """`fh.write`, refused past `cap` bytes in all: an archive is bounded while it arrives
    (a node's endless stream would otherwise fill this machine's disk before the unpacking
    counts anything)."""

    def __init__(self, fh: IO[bytes], cap: int | None = None) -> None:
        self.fh, self.written = fh, 0
        self.cap = MAX_DOWNLOAD if cap is None else cap

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.cap:
            raise UnsafeArchive(f"it sent more than {self.cap} bytes for one archive: refused "
                                "(a bigger checkpoint: set MGPU_CLOUD_FETCH_MAX_BYTES)")
        return self.fh.write(data)


class _Refused(Exception):
    """Raised inside the reading; becomes UnsafeArchive with the node's name."""


class _Header(tarfile.TarInfo):
    """tarfile's members with the two header kinds that are read whole into memory bounded:
    `_proc_member` is the subclass hook tarfile documents for this ("can be overridden in a
    subclass"; Lib/tarfile.py, TarInfo)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.type in _HEADERS and self.size > MAX_HEADER_BYTES:
            raise _Refused(f"a header of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Refused(f"{self.name[:80]!r} is a sparse file")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


class _Bounded:
    """A reader that refuses to go past `limit` bytes (the decompressed stream: a small gzip
    can stand for terabytes)."""

    def __init__(self, inner: gzip.GzipFile, limit: int) -> None:
        self.inner, self.limit, self.read_bytes = inner, limit, 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise _Refused(f"more than {self.limit} bytes unpacked")
        return data


@dataclass
class _Plan:
    """What the archive holds, by checked name: 'dir', 'implied' (a folder only named as a
    parent) or 'file'."""

    kinds: dict[str, str] = field(default_factory=dict)
    files: int = 0
    content: int = 0

    def add(self, name: str, kind: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if self.kinds.get(parent) == "file":
                raise _Refused(f"{name[:80]!r} lies under the file {parent[:80]!r}")
            self.kinds.setdefault(parent, "implied")
        seen = self.kinds.get(name)
        if seen is not None and not (seen == "implied" and kind == "dir"):
            raise _Refused(f"{name[:80]!r} is in the archive twice")
        self.kinds[name] = kind


def member_name(raw: str) -> str | None:
    """The checked name of a member (None: the archive's root, `.`); _Refused otherwise."""
    name = raw.removeprefix("./")
    if raw in (".", "./"):
        return None
    try:
        checked_key(name)
        if max(len(part.encode()) for part in name.split("/")) > MAX_SEGMENT:
            raise _Refused(f"{name[:80]!r}: a segment longer than {MAX_SEGMENT} bytes")
    except UnsafeKey as exc:
        raise _Refused(str(exc).replace("store key", "name")) from None
    return name  # a name is UTF-8: tarfile decodes it strictly (`errors="strict"` below)


def _kind(m: tarfile.TarInfo) -> str:
    if m.isdir():
        return "dir"
    if m.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and m.sparse is None:
        return "file"
    what = ("a symbolic link" if m.issym() else "a hard link" if m.islnk() else
            "a fifo" if m.isfifo() else "a device" if m.isdev() else f"of type {m.type!r}")
    target = f" -> {m.linkname[:80]!r}" if m.linkname else ""
    raise _Refused(f"{m.name[:80]!r}{target} is {what} (only files and folders are accepted)")


def unpack(archive: Path, dest: Path, *, node: str) -> int:
    """Unpack the gzip tar `archive` that `node` sent into `dest` (made when missing; its
    entries merged over what is there: a file replaces the file of the same name). Returns
    the number of files. UnsafeArchive (naming `node`) when anything in it is refused:
    nothing is written into `dest` then."""
    dest.mkdir(parents=True, exist_ok=True)  # this machine's own path: links there are the user's
    fresh = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.resolve().parent))
    try:
        try:
            plan = _write(archive, fresh)
            _merge(fresh, dest)
        except _Refused as exc:
            raise UnsafeArchive(f"the archive from {node} was refused ({exc}); nothing of it "
                                "was kept") from None
        return plan.files
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def _write(archive: Path, fresh: Path) -> _Plan:
    """Every member into `fresh` (a folder made here, empty), checked as it is read."""
    plan = _Plan()
    limit = MAX_BYTES + MAX_MEMBERS * HEADER_ALLOWANCE + (1 << 20)
    root = os.open(fresh, _NOFOLLOW_DIR)
    try:
        with gzip.open(archive) as raw, tarfile.open(
                fileobj=_Bounded(raw, limit), mode="r|",  # type: ignore[call-overload]
                tarinfo=_Header, errors="strict") as tar:
            for count, m in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise _Refused(f"more than {MAX_MEMBERS} members")
                name, kind = member_name(m.name), _kind(m)
                if name is None and kind == "dir":
                    continue  # the root, `.`
                if name is None:
                    raise _Refused("the archive's root is not a folder")
                plan.add(name, kind)
                if kind == "dir":
                    os.close(_folder(root, name, create=True))
                    continue
                if m.size < 0:  # tarfile 3.11 reads a negative size: it would lower `content`
                    raise _Refused(f"{name[:80]!r} has a negative size ({m.size})")
                plan.files += 1
                plan.content += m.size
                if plan.content > MAX_BYTES:
                    raise _Refused(f"more than {MAX_BYTES} bytes of files (set "
                                   "MGPU_CLOUD_FETCH_MAX_BYTES for a bigger one)")
                src = tar.extractfile(m)
                assert src is not None  # a regular file always has a reader
                _write_file(root, name, src, m)
    except (tarfile.TarError, EOFError, zlib.error, UnicodeError, RecursionError,
            gzip.BadGzipFile) as exc:
        raise _Refused(f"not a readable gzip tar ({type(exc).__name__}: {exc})") from None
    except OSError as exc:  # a name too long for this filesystem, this disk full
        raise _Refused(f"could not be written here ({exc.strerror or exc})") from None
    finally:
        os.close(root)
    return plan


def _folder(root: int, rel: str, *, create: bool = False) -> int:
    """A descriptor of folder `rel` under `root`, each segment opened without following a
    link (and made when `create`)."""
    fd = os.dup(root)
    for part in [p for p in rel.split("/") if p]:
        if create:
            try:
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            nxt = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise _Refused(f"{rel[:80]!r}: {part!r} is not a folder here ({exc.strerror})") \
                from None
        os.close(fd)
        fd = nxt
    return fd


def _write_file(root: int, name: str, src: IO[bytes], m: tarfile.TarInfo) -> None:
    parent, _, base = name.rpartition("/")
    pfd = _folder(root, parent, create=True)
    try:
        mode = EXEC_MODE if m.mode & 0o100 else FILE_MODE
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=pfd)
    finally:
        os.close(pfd)
    with os.fdopen(fd, "wb") as out:
        left = m.size
        while left > 0:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                raise _Refused(f"{name[:80]!r} is cut short")
            out.write(chunk)
            left -= len(chunk)
        out.flush()  # the last bytes written after the time would set it to now
        if 0 <= m.mtime < 1 << 40:  # a time that makes sense (1e300 would not)
            os.utime(out.fileno(), (m.mtime, m.mtime))


def _merge(fresh: Path, dest: Path) -> None:
    """Move what `fresh` holds into `dest`: first check every entry against what `dest` has
    (a folder over a folder or nothing, a file over a regular file or nothing, never a link),
    then rename, relative to folder descriptors (a rename replaces a name, it never follows
    it)."""
    src = os.open(fresh, _NOFOLLOW_DIR)
    dst = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        moves: list[tuple[str, str]] = []
        _check(src, dst, "", moves, str(dest))
        for parent, name in moves:
            sfd, dfd = _folder(src, parent), _folder(dst, parent)
            try:
                os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        os.close(src)
        os.close(dst)


def _check(src: int, dst: int, rel: str, moves: list[tuple[str, str]], dest: str) -> None:
    for entry in sorted(os.listdir(src)):
        shown = f"{rel}/{entry}".lstrip("/")
        mine = os.stat(entry, dir_fd=src, follow_symlinks=False)
        try:
            there = os.stat(entry, dir_fd=dst, follow_symlinks=False)
        except FileNotFoundError:
            moves.append((rel, entry))  # a whole new file or folder: one rename
            continue
        if stat.S_ISDIR(mine.st_mode) and stat.S_ISDIR(there.st_mode):
            sfd = os.open(entry, _NOFOLLOW_DIR, dir_fd=src)
            dfd = os.open(entry, _NOFOLLOW_DIR, dir_fd=dst)
            try:
                _check(sfd, dfd, shown, moves, dest)
            finally:
                os.close(sfd)
                os.close(dfd)
        elif stat.S_ISREG(mine.st_mode) and stat.S_ISREG(there.st_mode):
            moves.append((rel, entry))
        else:
            here = ("a symbolic link" if stat.S_ISLNK(there.st_mode) else
                    "a folder" if stat.S_ISDIR(there.st_mode) else
                    "a file" if stat.S_ISREG(there.st_mode) else "neither a file nor a folder")
            raise _Refused(f"{shown[:80]!r} is {here} in {dest}, and the archive holds another "
                           "kind there")
