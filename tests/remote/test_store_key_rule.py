"""Issue 42 (the mutation run): the store's one key rule at its exact edges, and what each
refusal says. Every case here kills a mutant of remote/storekeys.py that the hostile-listing
tests let live (a bound off by one, a character class one wider, a message lost)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote.storekeys import (
    MAX_KEY,
    UnsafeKey,
    checked_key,
    checked_name,
    data_prefix,
    inside,
    job_data,
    job_records,
)


def _refusal(key: str) -> str:
    with pytest.raises(UnsafeKey) as err:
        checked_key(key)
    return str(err.value)


def test_a_key_of_the_stores_limit_passes_and_one_byte_more_is_refused() -> None:
    assert checked_key("a" * MAX_KEY) == "a" * MAX_KEY
    assert checked_key("é" * (MAX_KEY // 2)) == "é" * (MAX_KEY // 2)  # bytes, not characters
    assert _refusal("a" * (MAX_KEY + 1)) == (
        f"store key {'a' * 80!r}: empty or longer than {MAX_KEY} bytes")
    assert "longer than" in _refusal("é" * (MAX_KEY // 2 + 1))
    assert _refusal("") == "store key '': empty or longer than 1024 bytes"


@pytest.mark.parametrize("char", [chr(c) for c in (*range(32), 127)])
def test_every_control_character_is_refused(char: str) -> None:
    assert _refusal(f"a{char}b").endswith(": absolute, or a backslash or control character "
                                         "in it")


@pytest.mark.parametrize("char", [" ", "~", "\x80", "é", "#", "%", "'", '"', "$", "*"])
def test_printable_and_other_characters_pass(char: str) -> None:
    assert checked_key(f"step 1/a{char}b.pt") == f"step 1/a{char}b.pt"


def test_each_refusal_says_what_is_wrong() -> None:
    assert _refusal("/abs/x") == ("store key '/abs/x': absolute, or a backslash or control "
                                  "character in it")
    assert _refusal("a\\b") == ("store key 'a\\\\b': absolute, or a backslash or control "
                                "character in it")
    for key in ("a//b", "a/./b", "a/../b", "a/", "..", "."):
        assert _refusal(key) == (f"store key {key!r}: an empty, '.' or '..' segment leaves "
                                 "its folder")
    long_bad = "b" * 100 + "/../x"
    assert _refusal(long_bad) == (f"store key {'b' * 80!r}: an empty, '.' or '..' segment "
                                  "leaves its folder")


def test_names_at_their_edges_and_what_a_refusal_names() -> None:
    assert checked_name("a" * 63) == "a" * 63
    assert checked_name("9.a_b-c") == "9.a_b-c"
    for bad, what in (("a" * 64, "name"), (".x", "name"), ("-x", "name"), ("a/b", "name")):
        with pytest.raises(UnsafeKey) as err:
            checked_name(bad, what)
        assert str(err.value) == (f"{what} {bad[:80]!r} is not a plain name (letters, digits, "
                                  "'.', '_', '-', at most 63, starting with a letter or digit)")
    with pytest.raises(UnsafeKey, match=r"^name 'x{80}' is not"):
        checked_name("x" * 100)


def test_the_layout_names_what_it_refuses() -> None:
    assert data_prefix("c1") == "c1/data"
    assert job_data("c1", "7") == "c1/data/jobs/7"
    assert job_records("c1", "7") == "c1/jobs/7"
    for call, what in ((lambda: data_prefix("-c"), "cluster"),
                       (lambda: job_data("c1", "../7"), "job id"),
                       (lambda: job_data("-c", "7"), "cluster"),
                       (lambda: job_records("-c", "7"), "cluster"),
                       (lambda: job_records("c1", "7/x"), "job id")):
        with pytest.raises(UnsafeKey) as err:
            call()
        assert str(err.value).startswith(f"{what} '"), err.value


def test_inside_refuses_a_link_to_a_sibling_that_shares_the_prefix(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    sibling = tmp_path / "ckpt-evil"  # starts like root: only the separator tells them apart
    sibling.mkdir()
    (root / "out").symlink_to(sibling)
    with pytest.raises(UnsafeKey) as err:
        inside(str(root), "out/x")
    assert str(err.value) == f"store key 'out/x' leads outside {root} (a symbolic link)"
    (root / "sub").mkdir()
    assert inside(str(root), "sub/x") == os.path.join(str(root), "sub/x")
    (root / "self").symlink_to(root)  # a link back to the root itself stays inside
    assert inside(str(root), "self") == os.path.join(str(root), "self")


def test_long_keys_are_named_by_their_first_80_characters(tmp_path: Path) -> None:
    assert _refusal("c" * 100 + "\x01") == (f"store key {'c' * 80!r}: absolute, or a backslash "
                                           "or control character in it")
    root = tmp_path / "root"
    root.mkdir()
    (root / ("l" * 90)).symlink_to(tmp_path)
    rel = "l" * 90 + "/x"
    with pytest.raises(UnsafeKey) as err:
        inside(str(root), rel)
    assert str(err.value) == f"store key {rel[:80]!r} leads outside {root} (a symbolic link)"
