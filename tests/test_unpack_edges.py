"""Issue 42 (the mutation run): provision/nodes/unpack.py at the exact edge of each rule, each
archive bad (or good) because of ONE thing: a size or count one over its bound and one at it,
a segment of 255 bytes and of 256, a header of 64 KiB and one byte more, the words of every
refusal (the node named, a hostile name cut to 80 characters), the modes and times written,
and links or files planted in the destination between the check and the moves."""

from __future__ import annotations

import gzip
import io
import os
import resource
import signal
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from unpackkit import Member, fresh_box, refused, snapshot, tgz, unpack_bytes

from provision.nodes import unpack as unpack_mod
from provision.nodes.unpack import UnsafeArchive, unpack

LONG = "n" * 100  # a hostile name: refusals show its first 80 characters only
CUT = repr("n" * 80)


@pytest.fixture
def box(tmp_path: Path) -> Path:
    return fresh_box(tmp_path)


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0)  # nothing taken away: the modes seen are the ones asked for
    yield
    os.umask(old)


def message(data: bytes, box: Path, tmp: Path) -> str:
    """The whole refusal, which names the node and says nothing was kept."""
    text = refused(data, box, tmp)
    assert text.startswith("the archive from node-3 was refused (")
    assert text.endswith("); nothing of it was kept")
    return text.removeprefix("the archive from node-3 was refused (").removesuffix(
        "); nothing of it was kept")


def raw_tar(members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]],
            fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for m in members:
            info, body = m if isinstance(m, tuple) else (m, b"")
            tar.addfile(info, io.BytesIO(body) if body or info.isreg() else None)
    return buf.getvalue()


def info(name: str, size: int = 0, **attrs: object) -> tarfile.TarInfo:
    out = tarfile.TarInfo(name)
    out.size, out.mtime = size, 1_700_000_000
    for key, value in attrs.items():
        setattr(out, key, value)
    return out


# --- the words of each refusal -------------------------------------------------------------------
@pytest.mark.parametrize(("members", "why"), [
    ([Member(LONG, "symlink", link="t" * 100)],
     f"{CUT} -> {'t' * 80!r} is a symbolic link (only files and folders are accepted)"),
    ([Member("a", data=b"1"), Member(LONG, "hardlink", link="a")],
     f"{CUT} -> 'a' is a hard link (only files and folders are accepted)"),
    ([Member(LONG, "chardev")], f"{CUT} is a device (only files and folders are accepted)"),
    ([Member(LONG, "blockdev")], f"{CUT} is a device (only files and folders are accepted)"),
    ([Member(LONG, "fifo")], f"{CUT} is a fifo (only files and folders are accepted)"),
    ([Member(LONG, data=b"1"), Member(LONG, data=b"2")], f"{CUT} is in the archive twice"),
    ([Member(LONG, data=b"1"), Member(LONG + "/b", data=b"2")],
     f"{CUT} lies under the file {CUT}"),
    ([Member(".", data=b"1")], "the archive's root is not a folder"),
    ([Member("./", data=b"1")], "the archive's root is not a folder"),
    ([Member("d/f", data=b"1"), Member("d/f/x", data=b"2")], "'d/f/x' lies under the file 'd/f'"),
    ([Member("d/f", data=b"1"), Member("d", "dir"), Member("d", "dir")],
     "'d' is in the archive twice"),
    ([Member("a/../" + LONG)],
     f"name {repr(('a/../' + LONG)[:80])}: an empty, '.' or '..' segment leaves its folder"),
    ([Member("x" * 256)], f"{repr('x' * 80)}: a segment longer than 255 bytes"),
])
def test_each_refusal_says_what_and_cuts_the_name(members: list[Member], why: str, box: Path,
                                                   tmp_path: Path) -> None:
    assert message(tgz(members, fmt=tarfile.PAX_FORMAT), box, tmp_path) == why


def retyped(data: bytes, kind: bytes) -> bytes:
    """`data` (one GNU member first) with that member's type byte changed, checksum fixed."""
    raw = bytearray(gzip.decompress(data))
    raw[156:157] = kind
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    return gzip.compress(bytes(raw))


def test_a_sparse_file_is_refused_by_its_name(box: Path, tmp_path: Path) -> None:
    data = retyped(tgz([Member(LONG, data=b"x" * 10)]), tarfile.GNUTYPE_SPARSE)
    assert message(data, box, tmp_path) == f"{CUT} is a sparse file"


def test_what_does_not_read_says_what_tarfile_said(box: Path, tmp_path: Path) -> None:
    assert message(b"not gzip", box, tmp_path) == \
        "not a readable gzip tar (BadGzipFile: Not a gzipped file (b'no'))"
    latin = bytearray(gzip.decompress(tgz([Member("nameX", data=b"x")])))
    latin[4] = 0xFF  # the name's last byte: not UTF-8
    latin[148:156] = b" " * 8
    latin[148:156] = b"%06o\0 " % sum(latin[:512])
    assert message(gzip.compress(bytes(latin)), box, tmp_path).startswith(
        "not a readable gzip tar (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff")


def test_a_contiguous_file_is_refused_by_its_type(box: Path, tmp_path: Path) -> None:
    """tarfile reads type `7` (contiguous) as a regular file; only `0` and NUL are taken."""
    member = info(LONG, 1, type=tarfile.CONTTYPE)
    assert message(raw_tar([(member, b"1")]), box, tmp_path) == \
        f"{CUT} is of type b'7' (only files and folders are accepted)"


def test_a_name_over_what_the_destination_holds_says_what_is_there(box: Path,
                                                                   tmp_path: Path) -> None:
    dest = box / "dest"
    (dest / "Xd").mkdir()
    (dest / "Xd" / LONG).mkdir()
    (dest / "Xf").write_bytes(b"mine")
    os.mkfifo(dest / "Xp")
    (dest / "Xl").symlink_to(box / "victim")
    at = f"in {dest}, and the archive holds another kind there"
    assert message(tgz([Member(f"Xd/{LONG}", data=b"1")]), box, tmp_path) == \
        f"{repr(f'Xd/{LONG}'[:80])} is a folder {at}"
    assert message(tgz([Member("Xf/a", data=b"1")]), box, tmp_path) == f"'Xf' is a file {at}"
    assert message(tgz([Member("Xp", data=b"1")]), box, tmp_path) == \
        f"'Xp' is neither a file nor a folder {at}"
    assert message(tgz([Member("Xl", "dir")]), box, tmp_path) == \
        f"'Xl' is a symbolic link {at}"


# --- bounds, each at its edge --------------------------------------------------------------------
def test_a_segment_of_255_bytes_is_taken_and_one_of_256_refused(box: Path,
                                                                tmp_path: Path) -> None:
    name = "é" * 127 + "x"  # 255 bytes in 128 characters
    two = "a" * 200 + "/" + "b" * 200  # the segments count, not the whole name
    assert unpack_bytes(tgz([Member(two, data=b"2")], fmt=tarfile.PAX_FORMAT), box / "dest",
                        tmp_path) == 1
    assert unpack_bytes(tgz([Member(f"d/{name}", data=b"1")], fmt=tarfile.PAX_FORMAT),
                        box / "dest", tmp_path) == 1
    assert (box / "dest" / "d" / name).read_bytes() == b"1"
    assert "a segment longer than 255 bytes" in message(
        tgz([Member(f"d/{name}x", data=b"1")], fmt=tarfile.PAX_FORMAT), box, tmp_path)


def test_one_file_of_exactly_max_bytes_is_taken(box: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpack_mod, "MAX_BYTES", 100)
    assert unpack_bytes(tgz([Member("a", data=b"x" * 100)]), box / "dest", tmp_path) == 1
    assert message(tgz([Member("b", data=b"x" * 101)]), box, tmp_path) == \
        "more than 100 bytes of files (set MGPU_CLOUD_FETCH_MAX_BYTES for a bigger one)"


def test_a_negative_size_is_refused(box: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A pax `size` of -511 reads as an empty file and would take 511 bytes off the count
    of content (tarfile 3.11 takes it): MAX_BYTES would not hold."""
    monkeypatch.setattr(unpack_mod, "MAX_BYTES", 100)
    neg = info(LONG, pax_headers={"size": "-511"})
    assert message(raw_tar([neg, (info("big", 600), b"x" * 600)]), box, tmp_path) == \
        f"{CUT} has a negative size (-511)"
    assert unpack_bytes(tgz([Member("empty")]), box / "dest", tmp_path) == 1  # size 0 is fine


def pax_header(size: int) -> tarfile.TarInfo:
    """A file whose pax header is `size` bytes long (one comment record)."""
    body = size - len(" comment=\n") - len(str(size))
    return info("a", 1, pax_headers={"comment": "c" * body})


def test_a_header_of_64_kib_is_read_and_one_byte_more_refused(box: Path,
                                                              tmp_path: Path) -> None:
    limit = unpack_mod.MAX_HEADER_BYTES
    assert unpack_bytes(raw_tar([(pax_header(limit), b"1")]), box / "dest", tmp_path) == 1
    assert message(raw_tar([(pax_header(limit + 1), b"1")]), box, tmp_path) == \
        f"a header of {limit + 1} bytes (at most {limit})"


def test_a_big_file_is_not_a_big_header(box: Path, tmp_path: Path) -> None:
    big = b"x" * (unpack_mod.MAX_HEADER_BYTES + 1)
    assert unpack_bytes(tgz([Member("big", data=big)]), box / "dest", tmp_path) == 1


def test_the_stream_bound_is_the_content_plus_an_allowance_per_member(
        box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_BYTES + MAX_MEMBERS * 2 KiB + 1 MiB of the unpacked stream: pax headers of 60 KiB
    each (none a member, each under MAX_HEADER_BYTES) just past it are refused, saying it."""
    monkeypatch.setattr(unpack_mod, "MAX_BYTES", 1000)
    monkeypatch.setattr(unpack_mod, "MAX_MEMBERS", 100)
    limit = 1000 + 100 * 4 * 512 + (1 << 20)
    record = b"61440 comment=" + b"c" * (61440 - 15) + b"\n"
    headers = []
    for _ in range(limit // (61440 + 512) + 1):  # each takes its 512-byte header too
        headers.append((info("././@PaxHeader", len(record), type=tarfile.XHDTYPE), record))
    data = raw_tar([*headers, (info("a", 1), b"1")], fmt=tarfile.GNU_FORMAT)
    assert message(data, box, tmp_path) == f"more than {limit} bytes unpacked"


def test_the_bound_counts_every_read_and_holds_at_its_edge() -> None:
    reader = unpack_mod._Bounded(io.BytesIO(b"x" * 10), 10)  # type: ignore[arg-type]
    assert reader.read(6) == b"x" * 6 and reader.read() == b"x" * 4  # 10 bytes: at the bound
    over = unpack_mod._Bounded(io.BytesIO(b"x" * 12), 10)  # type: ignore[arg-type]
    assert over.read(6) == b"x" * 6
    with pytest.raises(unpack_mod._Refused, match="^more than 10 bytes unpacked$"):
        over.read(6)


# --- what is written -----------------------------------------------------------------------------
@pytest.mark.usefixtures("umask")
def test_only_the_owners_execute_bit_makes_an_executable(box: Path, tmp_path: Path) -> None:
    members = [Member("d", "dir", mode=0o700), Member("d/x", data=b"1", mode=0o700),
               Member("d/others", data=b"1", mode=0o601), Member("d/group", data=b"1",
                                                                   mode=0o610),
               Member("deep/er/f", data=b"1")]  # folders only named as a file's parents
    assert unpack_bytes(tgz(members), box / "dest", tmp_path) == 4
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [box / "dest" / "d",
                                                             *(box / "dest" / "d").iterdir()]}
    assert modes == {"d": 0o755, "x": 0o755, "others": 0o644, "group": 0o644}
    assert stat.S_IMODE((box / "dest" / "deep" / "er").stat().st_mode) == 0o755


def test_a_folder_named_after_its_files_is_taken(box: Path, tmp_path: Path) -> None:
    """`d` as a member after `d/f` (a tar that lists a folder's files first): the folder the
    file's name implied, not a name given twice."""
    assert unpack_bytes(tgz([Member("d/f", data=b"1"), Member("d", "dir")]), box / "dest",
                        tmp_path) == 1
    assert (box / "dest" / "d" / "f").read_bytes() == b"1"


def test_an_empty_folder_is_made(box: Path, tmp_path: Path) -> None:
    assert unpack_bytes(tgz([Member("empty", "dir"), Member("./e2/", "dir")]),
                        box / "dest", tmp_path) == 0
    assert (box / "dest" / "empty").is_dir() and (box / "dest" / "e2").is_dir()


@pytest.mark.parametrize(("mtime", "kept"), [(0, True), (1_700_000_000, True),
                                              ((1 << 40) - 1, True), (1 << 40, False),
                                              (-1, False), (1e300, False)])
def test_a_files_time_is_kept_when_it_makes_sense(mtime: float, kept: bool, box: Path,
                                                  tmp_path: Path) -> None:
    before = time.time()
    assert unpack_bytes(raw_tar([(info("a", 1, mtime=mtime), b"1")]), box / "dest",
                        tmp_path) == 1
    got = (box / "dest" / "a").stat().st_mtime
    if not kept:
        assert before - 5 <= got <= time.time() + 5  # when it was written
    elif mtime < 1 << 34:
        assert got == mtime
    else:
        assert got > time.time() + 100 * 365 * 86400  # as far as the filesystem goes


def test_a_file_is_copied_a_chunk_at_a_time(box: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    read = tarfile.ExFileObject.read

    def spy(self: tarfile.ExFileObject, size: int | None = -1) -> bytes:
        asked.append(-1 if size is None else size)
        return read(self, size)
    monkeypatch.setattr(unpack_mod, "CHUNK", 3)
    monkeypatch.setattr(tarfile.ExFileObject, "read", spy)
    assert unpack_bytes(tgz([Member("a", data=b"0123456789")]), box / "dest", tmp_path) == 1
    assert asked == [3, 3, 3, 1]
    assert (box / "dest" / "a").read_bytes() == b"0123456789"


def test_the_fresh_folder_is_hidden_beside_the_destination(box: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []
    write = unpack_mod._write

    def spy(archive: Path, fresh: Path) -> unpack_mod._Plan:
        seen.append(fresh)
        return write(archive, fresh)
    monkeypatch.setattr(unpack_mod, "_write", spy)
    unpack_bytes(tgz([Member("a", data=b"1")]), box / "dest", tmp_path)
    assert len(seen) == 1 and seen[0].parent == box and seen[0].name.startswith(".unpack-")
    assert not seen[0].exists()


def test_a_write_this_machine_refuses_is_a_refusal(box: Path, tmp_path: Path) -> None:
    """A file over this process's file size limit (as a full disk would): EFBIG."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    data = tgz([Member("a", data=b"x" * 5000)])
    archive = tmp_path / "in.tgz"
    archive.write_bytes(data)
    before = snapshot(box)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(UnsafeArchive) as exc:
            unpack(archive, box / "dest", node="node-3")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert "could not be written here (File too large)" in str(exc.value)
    assert snapshot(box) == before


def test_a_name_already_in_the_fresh_folder_is_never_opened(
        box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file is made (O_CREAT|O_EXCL|O_NOFOLLOW), never opened: a link planted under its
    name in the fresh folder (here before the write) is refused, not written through."""
    write_file = unpack_mod._write_file

    def plant(root: int, name: str, src: IO[bytes], m: tarfile.TarInfo) -> None:
        os.symlink(box / "victim" / "secret", name, dir_fd=root)
        write_file(root, name, src, m)
    monkeypatch.setattr(unpack_mod, "_write_file", plant)
    assert message(tgz([Member("a", data=b"x")]), box, tmp_path) == \
        "could not be written here (File exists)"
    assert (box / "victim" / "secret").read_text() == "untouched"


def test_every_entry_is_checked_and_moved_past_a_new_one(box: Path, tmp_path: Path) -> None:
    (box / "dest" / "b").write_bytes(b"old")
    assert unpack_bytes(tgz([Member("a", data=b"A"), Member("b", data=b"B")]), box / "dest",
                        tmp_path) == 2
    assert (box / "dest" / "b").read_bytes() == b"B"
    (box / "dest" / "z").mkdir()
    assert "'z' is a folder" in message(tgz([Member("y", data=b"Y"), Member("z", data=b"Z")]),
                                        box, tmp_path)


# --- the destination changed between the check and the moves -------------------------------------
@pytest.mark.parametrize(("planted", "why"), [
    ("link", "Not a directory"), ("file", "Not a directory"),
    ("removed", "No such file or directory")])
def test_what_changes_after_the_check_is_not_followed(planted: str, why: str, box: Path,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The moves open each folder again without following a link, as a folder only, never
    made again: a local process that swaps `dest/LONG` for a link to the victim, a file, or
    nothing after the check gets a refusal, not a write into the victim."""
    dest = box / "dest"
    (dest / LONG).mkdir()
    check = unpack_mod._check

    def swap(src: int, dst: int, rel: str, moves: list[tuple[str, str]], where: str) -> None:
        check(src, dst, rel, moves, where)
        if rel == "":
            os.rmdir(dest / LONG)
            if planted == "link":
                (dest / LONG).symlink_to(box / "victim")
            elif planted == "file":
                (dest / LONG).write_bytes(b"planted")
    monkeypatch.setattr(unpack_mod, "_check", swap)
    with pytest.raises(UnsafeArchive) as exc:
        unpack_bytes(tgz([Member(f"{LONG}/new", data=b"x")]), dest, tmp_path)
    assert f"({CUT}: {LONG!r} is not a folder here ({why}))" in str(exc.value)
    assert sorted(p.name for p in (box / "victim").iterdir()) == ["secret"]
    assert not (dest / LONG / "new").exists()


def test_a_download_is_refused_one_byte_past_its_cap_and_not_at_it() -> None:
    """CappedWriter (the SSH and srun transports write a node's archive through it): exactly
    `cap` bytes pass, in any pieces; one more is refused with the cap and the setting named,
    and that byte is not written."""
    out = io.BytesIO()
    writer = unpack_mod.CappedWriter(out, cap=10)
    assert writer.write(b"abcd") == 4 and writer.write(b"efghij") == 6
    with pytest.raises(UnsafeArchive) as refusal:
        writer.write(b"k")
    assert out.getvalue() == b"abcdefghij"
    assert str(refusal.value) == ("it sent more than 10 bytes for one archive: refused (a "
                                  "bigger checkpoint: set MGPU_CLOUD_FETCH_MAX_BYTES)")


def test_the_download_cap_covers_the_largest_archive_that_unpacks() -> None:
    """MAX_DOWNLOAD: every byte of content, every member's headers, and gzip's overhead; the
    cap is looked up when a writer is made (a setting read at import is what it is)."""
    assert unpack_mod.MAX_DOWNLOAD == (unpack_mod.MAX_BYTES + unpack_mod.MAX_BYTES // 100
                                       + unpack_mod.MAX_MEMBERS * unpack_mod.HEADER_ALLOWANCE
                                       + (1 << 20))
    assert unpack_mod.CappedWriter(io.BytesIO()).cap == unpack_mod.MAX_DOWNLOAD
