"""A node that writes into the store cannot steer the user's machine (issue 34).

The attacker has a node's rights: it can write any object it likes where the store lets nodes
write (on a file:// store before issue 34, or an S3 endpoint without policies, anywhere). It
does NOT hold the cluster's records key. Each case ends in a refusal, and nothing is lost.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from provision.job.managed.client import adopt_from_store, all_jobs, forget_if_torn_down
from provision.job.managed.records import JobLog, JobView, Record, claim_job_id
from provision.job.managed.signing import seal
from provision.job.managed.supervisor import inside_view, publish_inventory
from provision.model.inventory import (
    Inventory,
    InventoryStore,
    NodeRecord,
    Replacement,
    ResourceRecord,
)
from provision.model.keys import ensure_records_key
from provision.model.spec import build_cluster_spec
from remote.store import open_store


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[InventoryStore, Inventory]:
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    (tmp_path / "shared").mkdir()
    here = InventoryStore()
    inv = Inventory(name="c1", provider="docker", key_path=str(tmp_path / "id"),
                    known_hosts_path=str(tmp_path / "home" / "kh"))
    inv.spec = build_cluster_spec({}, {"name": "c1", "store": f"file://{tmp_path}/shared"})
    inv.nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=32000 + r,
                            private_address=f"node-{r}", host_key=f"ssh-ed25519 KEY{r}",
                            resource_id=f"id-{r}") for r in range(2)]
    inv.controller = NodeRecord(name="controller", rank=-1, address="127.0.0.1", port=32100,
                                private_address="controller", host_key="ssh-ed25519 CTL")
    inv.resources = [ResourceRecord(kind="container", id=f"id-{r}") for r in range(2)]
    here.create(inv)
    return here, inv


def _hostile_copy(inv: Inventory) -> Inventory:
    """What a node would like the user's machine to take: its own login command, its own host
    key pinned, a container of someone else's to delete."""
    theirs = inv.model_copy(deep=True)
    theirs.nodes[1] = theirs.nodes[1].model_copy(update={"host_key": "ssh-ed25519 EVIL"})
    theirs.resources.append(ResourceRecord(kind="container", id="someone-elses"))
    theirs.replacements.append(Replacement(rank=1, old="id-1", new="id-1", reason="lost"))
    return theirs


def test_a_node_written_cluster_json_is_not_adopted(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv = _cluster(tmp_path, monkeypatch)
    ensure_records_key(here.keys_dir("c1"))
    store = open_store(inv.spec.store if inv.spec and inv.spec.store else "")
    before = here.path("c1").read_text()
    theirs = _hostile_copy(inv)
    warned: list[str] = []
    # 1. written plain, as the controller did before issue 34
    store.put_bytes("c1/cluster.json", theirs.model_dump_json().encode())
    assert adopt_from_store("c1", here, warn=warned.append) is False
    # 2. sealed with a key the node made up
    forged = seal(b"k" * 32, "cluster.json c1", theirs.model_dump_json().encode())
    store.put_bytes("c1/cluster.json", forged)
    assert adopt_from_store("c1", here, warn=warned.append) is False
    # 3. the real controller's copy replayed under another cluster's name
    other = ensure_records_key(here.keys_dir("c2"))
    store.put_bytes("c1/cluster.json", seal(other, "cluster.json c2",
                                            theirs.model_dump_json().encode()))
    assert adopt_from_store("c1", here, warn=warned.append) is False
    assert here.path("c1").read_text() == before  # nothing taken
    assert len(warned) == 3 and all("not adopted" in w for w in warned)
    assert "no MAC" in warned[0] and "does not verify" in warned[1]


def test_a_sealed_copy_with_a_hostile_login_is_still_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with the MAC right (a controller bug, or a key leak), a user or address that an
    ssh command line would read as an option never reaches one."""
    here, inv = _cluster(tmp_path, monkeypatch)
    key = ensure_records_key(here.keys_dir("c1"))
    store = open_store(inv.spec.store if inv.spec and inv.spec.store else "")
    theirs = _hostile_copy(inv).model_dump(mode="json")
    theirs["nodes"][1]["user"] = "-oProxyCommand=touch /tmp/x"
    body = json.dumps(theirs).encode()
    store.put_bytes("c1/cluster.json", seal(key, "cluster.json c1", body))
    warned: list[str] = []
    assert adopt_from_store("c1", here, warn=warned.append) is False
    assert warned and "not adopted" in warned[0]


def test_the_controllers_sealed_copy_is_adopted(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv = _cluster(tmp_path, monkeypatch)
    key = ensure_records_key(here.keys_dir("c1"))
    store = open_store(inv.spec.store if inv.spec and inv.spec.store else "")
    theirs = inv.model_copy(deep=True)
    new = theirs.nodes[1].model_copy(update={"port": 32999, "resource_id": "id-9",
                                             "host_key": "ssh-ed25519 NEW"})
    theirs.nodes = [inside_view(theirs.nodes[0]), inside_view(new)]
    theirs.replacements.append(Replacement(rank=1, old="id-1", new="id-9", reason="lost"))
    publish_inventory(store, theirs, {0: inv.nodes[0], 1: new}, key)
    assert adopt_from_store("c1", here) is True
    assert here.load("c1").nodes[1].port == 32999


def test_forged_records_steer_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `torn_down` record would make `jobs` run `down` and drop the inventory; a `failed`
    one would end `attach`. Without the controller's MAC they are left out and counted."""
    here, inv = _cluster(tmp_path, monkeypatch)
    key = ensure_records_key(here.keys_dir("c1"))
    url = inv.spec.store if inv.spec and inv.spec.store else ""
    store = open_store(url)
    jl = JobLog(store, "c1", claim_job_id(store, "c1", b"{}", key), key=key)
    jl.record("submitted", "x")
    jl.record("started", "running")
    for seq, event in ((3, "failed"), (4, "torn_down")):
        fake = Record(seq=seq, cluster="c1", job="1", event=event, state="failed",
                      message="forged")
        store.put_bytes(f"c1/jobs/1/events/{seq:06d}.json", fake.to_json().encode())
    view = JobView(store, "c1", "1", key)
    assert [r.event for r in view.records()] == ["submitted", "started"]
    assert len(view.refused) == 2
    jobs = all_jobs(url, "c1")
    assert jobs[0]["state"] == "running" and not jobs[0]["torn_down"]
    assert forget_if_torn_down("c1", jobs) is False and here.exists("c1")
    # the controller's next record is not lost: it takes the next free number
    jl.record("finished", "done", exit_code=0)
    assert [r.event for r in view.records()][-1] == "finished"


def test_two_writers_of_job_ids_get_two_ids(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    got: list[str] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        job_id = claim_job_id(open_store(f"file://{tmp_path}"), "c1", str(i).encode(),
                              b"k" * 32)
        with lock:
            got.append(job_id)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got, key=int) == ["1", "2", "3", "4", "5"]
    specs = {store.get_bytes(f"c1/jobs/{i}/spec.json") for i in got}
    assert len(specs) == 5  # every writer's spec kept


def test_a_job_id_that_is_not_a_plain_name_is_never_listed(tmp_path: Path) -> None:
    from provision.job.managed.records import job_ids

    store = open_store(f"file://{tmp_path}")
    store.put_bytes("c1/jobs/1/spec.json", b"{}")
    (tmp_path / "c1" / "jobs" / "-rf" / "events").mkdir(parents=True)
    (tmp_path / "c1" / "jobs" / "-rf" / "events" / "000001.json").write_text("{}")
    assert job_ids(store, "c1") == ["1"]
