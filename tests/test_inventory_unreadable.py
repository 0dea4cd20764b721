"""One unreadable inventory file must not hide the others (issue 20): `load` names the file,
the line and the fix; listings skip it and say so; `down` of that cluster deletes nothing and
says what can still be done; `jobs` still shows the records kept apart from the inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit import cli

from provision.model.errors import InventoryUnreadableError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.jobstore import JobStore

BROKEN = "name: bad\nprovider: docker\nnodes: [\n  - {a: 1\n"  # an unclosed flow, line 4


def _homes(mgpu_home: Path) -> InventoryStore:
    store = InventoryStore()
    store.create(Inventory(name="good", provider="docker", status="ready"))
    store.clusters_dir.joinpath("bad.yaml").write_text(BROKEN)
    return store


def test_broken_yaml_names_the_file_the_line_and_the_fix(mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    with pytest.raises(InventoryUnreadableError) as err:
        store.load("bad")
    path = str(store.path("bad"))
    assert err.value.message.startswith(f"inventory {path!r} is not valid YAML at line 4,")
    assert (err.value.path, err.value.cluster, err.value.provider) == (path, "bad", "docker")
    assert f"mv {path} {path}.broken" in str(err.value.hint)
    assert "mgpu-cloud gc --provider docker" in str(err.value.hint)


@pytest.mark.parametrize("text,says", [
    ("- just\n- a list\n", "is not an inventory (the top level: "),
    ("name: bad\nprovider: docker\nnodes: 3\n", "is not an inventory (nodes: "),
    ("name: bad\nprovider: docker\nsurprise: 1\n", "is not an inventory (surprise: "),
])
def test_yaml_that_is_not_an_inventory_says_where(mgpu_home: Path, text: str, says: str) -> None:
    store = _homes(mgpu_home)
    store.path("bad").write_text(text)
    with pytest.raises(InventoryUnreadableError, match=r"bad\.yaml' " + says.replace("(", r"\(")):
        store.load("bad")


def test_bytes_that_are_not_text_are_unreadable_too(mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    store.path("bad").write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(InventoryUnreadableError, match="cannot be read") as err:
        store.load("bad")
    assert err.value.provider is None and "--provider P" in str(err.value.hint)


def test_scan_keeps_the_good_ones_and_names_the_bad_ones(mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    good, bad = store.scan()
    assert [inv.name for inv in good] == ["good"] == [inv.name for inv in store.all()]
    assert [exc.cluster for exc in bad] == ["bad"]


def test_a_file_not_named_after_a_cluster_is_named_too(mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    store.clusters_dir.joinpath("my copy.yaml").write_text("name: x\n")
    good, bad = store.scan()
    assert [inv.name for inv in good] == ["good"]
    assert [exc.cluster for exc in bad] == ["bad", "my copy"]
    assert "is not named after a cluster" in bad[1].message and "mv " in str(bad[1].hint)


def test_listings_show_the_rest_and_name_the_bad_file(mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    path = str(store.path("bad"))
    for args in (["status"], ["cost"]):
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        assert "good" in res.stdout and "Traceback" not in res.stderr
        assert f"warning: inventory {path!r} is not valid YAML at line 4" in res.stderr
        assert "cluster 'bad' left out of this list" in res.stderr
    listed = cli("status", "--json")
    assert [row["name"] for row in json.loads(listed.stdout)] == ["good"]
    one = cli("status", "bad")
    assert one.returncode == 1 and f"error: inventory {path!r}" in one.stderr
    assert "Traceback" not in one.stderr


def test_down_of_the_bad_one_deletes_nothing_and_says_what_can_be_done(
        mgpu_home: Path) -> None:
    store = _homes(mgpu_home)
    res = cli("down", "bad")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "cannot remove cluster 'bad'" in res.stderr and "nothing was deleted" in res.stderr
    assert "mgpu-cloud gc --provider docker" in res.stderr
    assert store.path("bad").read_text() == BROKEN, "the file is left for the user to fix"


def test_jobs_of_the_bad_one_are_shown_as_recorded(mgpu_home: Path) -> None:
    _homes(mgpu_home)
    JobStore().new({"cluster": "bad", "cluster_created_at": "2026-12-01T00:00:00+00:00",
                    "command": "train.py", "launcher": "torchrun"})
    res = cli("jobs", "bad", "--json")
    assert res.returncode == 0, res.stderr
    assert [job["id"] for job in json.loads(res.stdout)] == ["1"]
    assert "bad.yaml' is not valid YAML at line 4" in res.stderr
    assert "shown as last recorded" in res.stderr
