"""THE extractor of what nodes send back (provision/nodes/unpack.py): files and folders only,
every name through the store key rule, bounded, all or nothing, nothing followed.

Archives are built member by member as a hostile node's `tar` would (tests/unpackkit.py), into
a sandbox holding the destination and a victim beside it; after every unpack the whole
sandbox is compared with what it was. Each rule at its exact edge: tests/test_unpack_edges.py."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unpackkit import KINDS, Member, fresh_box, refused, snapshot, tgz, unpack_bytes

from provision.nodes import unpack as unpack_mod
from provision.nodes.unpack import UnsafeArchive
from remote.storekeys import UnsafeKey, checked_key


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    return fresh_box(tmp_path)


# --- what a real node sends, and merging --------------------------------------------------------
def test_a_plain_tree_is_unpacked_and_merged_over_what_is_there(sandbox: Path,
                                                                tmp_path: Path) -> None:
    first = tgz([Member(".", "dir"), Member("./sub", "dir"), Member("./sub/a.pt", data=b"A"),
                 Member("./run.sh", data=b"#!/bin/sh\n", mode=0o755)])
    assert unpack_bytes(first, sandbox / "dest", tmp_path) == 2
    # a checkpoint copy: only the changed files, no folder members (tar -C DIR -- FILES)
    again = tgz([Member("sub/a.pt", data=b"A2"), Member("sub/deeper/b.pt", data=b"B")])
    assert unpack_bytes(again, sandbox / "dest", tmp_path) == 2
    got = snapshot(sandbox / "dest")
    assert got["sub/a.pt"] == ("file", b"A2") and got["sub/deeper/b.pt"] == ("file", b"B")
    assert got["kept.pt"] == ("file", b"an earlier copy")
    assert os.stat(sandbox / "dest" / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(sandbox / "dest" / "sub" / "a.pt").st_mode & 0o777 == 0o644
    assert [p.name for p in sandbox.iterdir() if p.name.startswith(".unpack")] == []


def test_the_destination_is_made_when_missing(tmp_path: Path) -> None:
    dest = tmp_path / "mgpu-outputs" / "c1" / "checkpoints"
    assert unpack_bytes(tgz([Member("a", data=b"x")]), dest, tmp_path) == 1
    assert (dest / "a").read_bytes() == b"x"


# --- the CVE-2025-4517 shape, and links planted here ---------------------------------------------
def test_nested_links_that_climb_out_are_refused(sandbox: Path, tmp_path: Path) -> None:
    """The shape tarfile's own test of CVE-2025-4517 builds (Lib/test/test_tarfile.py,
    test_realpath_limit_attack): folders with long names and a link to each, nested until
    the expanded path passes PATH_MAX, a last link of `..`s, a link through it, a hard link
    through that and files written over it. Python 3.11.7's `data` filter lets it write
    outside; here the first link refuses the whole archive."""
    steps, comp = "abcdefghijklmnop", "d" * 200
    members, path = [], ""
    for step in steps:
        members += [Member(f"{path}{comp}", "dir"), Member(f"{path}{step}", "symlink", link=comp)]
        path += comp + "/"
    linkpath = "/".join(steps) + "/" + "l" * 254
    members += [Member(linkpath, "symlink", link="/".join([".."] * len(steps))),
                Member("escape", "symlink", link=linkpath + "/.."),
                Member("flaglink", "hardlink", link="escape/victim/secret"),
                Member("flaglink", data=b"overwritten"),
                Member("escape/victim/new", data=b"new")]
    refused(tgz(members), sandbox, tmp_path, "symbolic link")


def test_a_link_planted_in_the_destination_is_never_followed(sandbox: Path,
                                                             tmp_path: Path) -> None:
    (sandbox / "dest" / "sub").symlink_to(sandbox / "victim")
    (sandbox / "dest" / "kept.pt").unlink()
    (sandbox / "dest" / "kept.pt").symlink_to(sandbox / "victim" / "secret")
    refused(tgz([Member("sub/secret", data=b"x")]), sandbox, tmp_path, "symbolic link")
    refused(tgz([Member("kept.pt", data=b"x")]), sandbox, tmp_path, "symbolic link")
    assert (sandbox / "victim" / "secret").read_text() == "untouched"


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "chardev", "blockdev"])
def test_anything_but_files_and_folders_is_refused(kind: str, sandbox: Path,
                                                   tmp_path: Path) -> None:
    safe = [Member("a.pt", data=b"x"), Member("d", "dir")]
    why = {"symlink": "symbolic link", "hardlink": "hard link"}.get(kind, "")
    refused(tgz([*safe, Member("z", kind, link="a.pt")]), sandbox, tmp_path, why)


def test_sparse_files_and_non_utf8_names_are_refused(sandbox: Path, tmp_path: Path) -> None:
    sparse = bytearray(tgz([Member("s", data=b"x" * 10)], fmt=tarfile.GNU_FORMAT))
    import gzip

    raw = bytearray(gzip.decompress(bytes(sparse)))
    raw[156:157] = b"S"  # GNUTYPE_SPARSE; the checksum is fixed below
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    refused(gzip.compress(bytes(raw)), sandbox, tmp_path, "sparse")
    latin = bytearray(gzip.decompress(tgz([Member("nameX", data=b"x")])))
    latin[4] = 0xFF  # the name's last byte, not UTF-8
    latin[148:156] = b" " * 8
    latin[148:156] = b"%06o\0 " % sum(latin[:512])
    refused(gzip.compress(bytes(latin)), sandbox, tmp_path, "")


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/x", "//x", "a//b", "./../x",
                                  "a/./b", "a\\..\\x", "a\x1bb", "a\nb", "x/", "..",
                                  "a" * 1025, "b/" + "é" * 128])
def test_names_the_key_rule_refuses_are_refused(name: str, sandbox: Path,
                                                tmp_path: Path) -> None:
    refused(tgz([Member("ok", data=b"1"), Member(name, data=b"2")], fmt=tarfile.PAX_FORMAT),
            sandbox, tmp_path)


def test_duplicates_and_names_under_a_file_are_refused(sandbox: Path, tmp_path: Path) -> None:
    refused(tgz([Member("a", data=b"1"), Member("a", data=b"2")]), sandbox, tmp_path, "twice")
    refused(tgz([Member("a", "dir"), Member("a", "dir")]), sandbox, tmp_path, "twice")
    refused(tgz([Member("a", data=b"1"), Member("a/b", data=b"2")]), sandbox, tmp_path,
            "under the file")
    refused(tgz([Member("a/b", data=b"1"), Member("a", data=b"2")]), sandbox, tmp_path,
            "twice")
    # a folder where this machine has a file, a file where it has a folder
    (sandbox / "dest" / "f").write_bytes(b"mine")
    (sandbox / "dest" / "d").mkdir()
    refused(tgz([Member("f/x", data=b"1")]), sandbox, tmp_path, "another kind")
    refused(tgz([Member("d", data=b"1")]), sandbox, tmp_path, "another kind")


# --- bounds ------------------------------------------------------------------------------------
def test_counts_and_sizes_are_bounded(sandbox: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpack_mod, "MAX_MEMBERS", 20)
    monkeypatch.setattr(unpack_mod, "MAX_BYTES", 1000)
    ok = [Member(f"f{i}", data=b"x" * 50) for i in range(20)]
    assert unpack_bytes(tgz(ok), tmp_path / "fits", tmp_path) == 20  # exactly at the limits
    refused(tgz([*ok, Member("one-more", "dir")]), sandbox, tmp_path, "more than 20 members")
    refused(tgz([Member("big", data=b"x" * 1001)]), sandbox, tmp_path, "1000 bytes")
    refused(tgz([Member(f"f{i}", data=b"x" * 100) for i in range(11)]), sandbox, tmp_path,
            "1000 bytes")


def test_the_stream_read_is_bounded_whatever_its_headers_say(
        sandbox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty pax headers of 60 KiB each (each under MAX_HEADER_BYTES, none a member) before
    one small file: 1.2 MiB of headers from an archive of a few KiB. The reading stops at
    the stream's bound (MAX_BYTES + a header allowance per member)."""
    monkeypatch.setattr(unpack_mod, "MAX_MEMBERS", 2)
    monkeypatch.setattr(unpack_mod, "MAX_BYTES", 1000)
    record = b"61440 comment=" + b"c" * (61440 - 15) + b"\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for _ in range(20):
            info = tarfile.TarInfo("././@PaxHeader")
            info.type, info.size = tarfile.XHDTYPE, len(record)
            tar.addfile(info, io.BytesIO(record))
        info = tarfile.TarInfo("a")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    assert len(buf.getvalue()) < 64 << 10
    refused(buf.getvalue(), sandbox, tmp_path, "bytes unpacked")


def test_a_huge_header_is_refused_before_it_is_read(sandbox: Path, tmp_path: Path) -> None:
    name = "n/" * 40_000 + "x"  # a pax header of 80 KiB
    refused(tgz([Member(name, data=b"1")], fmt=tarfile.PAX_FORMAT), sandbox, tmp_path,
            "header")


def test_what_is_not_a_gzip_tar_is_refused(sandbox: Path, tmp_path: Path) -> None:
    refused(b"not gzip at all", sandbox, tmp_path, "readable")
    cut = tgz([Member("a", data=os.urandom(5000))])
    refused(cut[: len(cut) // 2], sandbox, tmp_path, "")  # a node that died mid-copy


# --- properties ----------------------------------------------------------------------------------
SEGMENTS = st.sampled_from(["a", "b", "c d", "..", ".", "", "é", "x\x1b[2J", "lib\\x",
                            "l" * 300])
NAMES = st.builds(lambda lead, parts: lead + "/".join(parts),
                  st.sampled_from(["", "", "./", "/", "../"]),
                  st.lists(SEGMENTS, min_size=1, max_size=4))
MEMBERS = st.builds(Member, NAMES, st.sampled_from(KINDS), st.binary(max_size=64),
                    st.one_of(NAMES, st.just("/etc/passwd"), st.just("../../victim")))
SAFE = st.builds(Member, st.lists(st.sampled_from(["a", "b", "c d", "é", "data.pt"]),
                                  min_size=1, max_size=3).map("/".join),
                 st.sampled_from(["file", "dir"]), st.binary(max_size=64))
HYPO = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _parsed(data: bytes) -> list[tuple[str, str, bytes]]:
    """(name, kind, content) of each member as tarfile reads it back (it drops a trailing
    `/` of a folder, and of a pax path), the way a reader of the archive sees it."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar:
            kind = ("dir" if m.isdir() else "file" if m.type in (tarfile.REGTYPE,
                    tarfile.AREGTYPE) else "other")
            reader = tar.extractfile(m) if kind == "file" else None
            out.append((m.name, kind, reader.read() if reader else b""))
    return out


def _accepted(members: list[tuple[str, str, bytes]]) -> bool:
    """Whether the rule as written accepts the archive: files and folders only, names the
    key rule takes (a leading `./` dropped, the root `.` skipped), segments of at most 255
    bytes, no name twice, nothing under a file."""
    kinds: dict[str, str] = {}
    for raw, kind, _ in members:
        if kind == "other":
            return False
        if raw == "." and kind == "dir":
            continue  # the archive's root
        name = raw.removeprefix("./")
        try:
            checked_key(name)
            if max(len(part.encode()) for part in name.split("/")) > 255:
                return False
        except (UnsafeKey, UnicodeError):
            return False
        parts = name.split("/")
        for i in range(1, len(parts)):
            if kinds.setdefault("/".join(parts[:i]), "implied") == "file":
                return False
        seen = kinds.get(name)
        if seen is not None and not (seen == "implied" and kind == "dir"):
            return False
        kinds[name] = kind
    return True


@HYPO
@given(members=st.lists(MEMBERS, max_size=6))
def test_any_archive_is_unpacked_whole_inside_or_refused_with_nothing_changed(
        members: list[Member], tmp_path: Path) -> None:
    sandbox = fresh_box(tmp_path)
    dest = sandbox / "dest"
    before = snapshot(sandbox)
    data = tgz(members, fmt=tarfile.PAX_FORMAT)
    parsed = _parsed(data)
    try:
        files = unpack_bytes(data, dest, sandbox.parent)
    except UnsafeArchive as exc:
        assert "node-3" in str(exc)
        assert snapshot(sandbox) == before
        assert not _accepted(parsed), f"a safe archive was refused: {exc}"
        return
    assert _accepted(parsed), "an unsafe archive was accepted"
    after = snapshot(sandbox)
    changed = {p for p in after if after[p] != before.get(p)}
    assert all(p.startswith("dest/") for p in changed), changed
    assert all(kind in ("file", "dir") for kind, _ in after.values())
    wrote = {name.removeprefix("./"): body for name, kind, body in parsed if kind == "file"}
    assert files == len(wrote)
    for name, body in wrote.items():
        assert after[f"dest/{name}"] == ("file", body)
    assert after["victim/secret"] == before["victim/secret"]


@HYPO
@given(safe=st.lists(SAFE, min_size=1, max_size=6), kind=st.sampled_from(KINDS[2:]),
       where=st.integers(min_value=0, max_value=6))
def test_one_link_or_device_anywhere_refuses_the_whole_archive(
        safe: list[Member], kind: str, where: int, sandbox: Path, tmp_path: Path) -> None:
    members = list(safe)
    members.insert(min(where, len(members)), Member("zz", kind, link="a"))
    refused(tgz(members), sandbox, tmp_path)


@HYPO
@given(limit=st.integers(min_value=1, max_value=60),
       count=st.integers(min_value=1, max_value=60))
def test_counts_over_the_limit_are_refused_and_at_it_accepted(
        limit: int, count: int, sandbox: Path, tmp_path: Path) -> None:
    members = [Member(f"f{i:03d}", data=b"x") for i in range(count)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unpack_mod, "MAX_MEMBERS", limit)
        if count > limit:
            refused(tgz(members), sandbox, tmp_path, f"more than {limit} members")
        else:
            out = tmp_path / f"fits-{limit}-{count}"
            assert unpack_bytes(tgz(members), out, tmp_path) == count
            __import__("shutil").rmtree(out)
