"""Issue 42: everything the user's machine or the controller acts on is sealed, and checked
before use. The attacker writes into the store with a node's rights where the store lets it
(an S3-compatible endpoint without STS, the GCS emulator, a file:// store mounted whole); it
holds no records key, but it can copy any sealed object from one place to another."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from provision.cluster.providers import get_provider
from provision.job.managed.client import (
    adopt_from_store,
    all_jobs,
    cancel,
    forget_if_torn_down,
    latest_id,
)
from provision.job.managed.handoff import TEARDOWN_KEY
from provision.job.managed.records import JobLog, JobView, Record, claim_job_id, job_ids
from provision.job.managed.signing import (
    Unsigned,
    cluster_kind,
    heartbeat_kind,
    ledger_kind,
    mac,
    open_sealed,
    seal,
    spec_kind,
    verify,
)
from provision.job.managed.takeback import lost_job, take_back, take_back_if_lost
from provision.model.errors import LaunchError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, Replacement
from provision.model.keys import ensure_records_key
from provision.model.spec import build_cluster_spec, build_job_spec
from remote.store import Store, open_store

KEY = b"r" * 32
# a MAC's shape gone wrong: each must be a refusal, none an error
BAD_MACS = ["é" * 64, "a" * 63, "a" * 65, "", 7, None, ["a" * 64], {"mac": "a"},
            "g" * 64, "A" * 64, "\x00" * 64]


def _managed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             provider: str = "docker") -> tuple[InventoryStore, Inventory, Store, bytes]:
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    (tmp_path / "shared").mkdir()
    here = InventoryStore()
    url = f"file://{tmp_path}/shared"
    inv = Inventory(name="c1", provider=provider,
                    spec=build_cluster_spec({}, {"name": "c1", "store": url}),
                    nodes=[NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=32000,
                                      private_address="node-0", host_key="ssh-ed25519 K0")],
                    controller=NodeRecord(name="controller", rank=-1, address="127.0.0.1",
                                          port=32100, private_address="controller",
                                          host_key="ssh-ed25519 CTL"))
    here.create(inv)
    return here, inv, open_store(url), ensure_records_key(here.keys_dir("c1"))


def _spec(workdir: Path) -> bytes:
    job = build_job_spec({}, {"script": str(workdir / "train.py")})
    return json.dumps({**job.model_dump(mode="json"), TEARDOWN_KEY: True}).encode()


def _running_job(store: Store, key: bytes, spec: bytes, beat_age: float) -> str:
    """A sealed job that started (its attempt on the nodes named) and whose controller last
    wrote a sealed heartbeat `beat_age` seconds ago."""
    job_id = claim_job_id(store, "c1", spec, key)
    jl = JobLog(store, "c1", job_id, key=key)
    jl.record("submitted", "handed over")
    jl.record("started", "running", node_job="1")
    store.put_bytes(f"c1/jobs/{job_id}/control/heartbeat",
                    seal(key, heartbeat_kind("c1", job_id), str(time.time() - beat_age).encode()))
    return job_id


# --- spec.json: a take-back hands it to a controller again ---------------------------------
def test_take_back_refuses_a_forged_or_replayed_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a provider that makes no controller, and a controller that never answers: code that
    # let a forged spec through would fail at once, never make anything
    monkeypatch.setattr("provision.job.managed.takeback.REACH_S", 0.5)
    here, inv, store, key = _managed(tmp_path, monkeypatch, provider="ssh")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("pass\n")
    secret = tmp_path / "private-folder"  # what the attacker wants uploaded
    secret.mkdir()
    (secret / "train.py").write_text("pass\n")
    job = _running_job(store, key, _spec(project), beat_age=600)
    genuine = store.get_bytes(f"c1/jobs/{job}/spec.json") or b""
    other_key = ensure_records_key(here.keys_dir("c2"))
    forgeries = {
        "plain": _spec(secret),
        "made-up key": seal(b"x" * 32, spec_kind("c1", job), _spec(secret)),
        "another cluster's": seal(other_key, spec_kind("c2", job), _spec(secret)),
        "another job's": seal(key, spec_kind("c1", "9"), _spec(secret)),
        "kind renamed": seal(key, spec_kind("c1", "9"), _spec(secret)).replace(
            b'"spec c1/9"', f'"spec c1/{job}"'.encode()),
    }
    said: list[str] = []
    provider = get_provider("ssh")
    for why, forged in forgeries.items():
        store.put_bytes(f"c1/jobs/{job}/spec.json", forged)
        # no job at all without its sealed spec: nothing to take back ...
        assert lost_job(here.load("c1"), key) is None, why
        assert take_back_if_lost("c1", said.append, here) is None and said == [], why
        # ... and a take-back that read the store before the spec changed refuses it
        with pytest.raises(LaunchError, match="spec.json is not sealed for it") as err:
            take_back(provider, here.load("c1"), here, job, log=said.append)
        assert "not taken back" in err.value.message, why
    # the genuine one passes the seal and is read as the job (its script is gone here: the
    # next check a take-back makes, before any controller is asked)
    store.put_bytes(f"c1/jobs/{job}/spec.json", genuine)
    assert lost_job(here.load("c1"), key) == (job, pytest.approx(600, abs=5))
    (project / "train.py").unlink()
    with pytest.raises(LaunchError, match=r"(?s)spec.json is not a job: .*train.py' does not exist"):
        take_back_if_lost("c1", said.append, here)
    assert said and "taking the job back" in said[0]


def test_a_spec_not_sealed_for_its_job_is_no_job(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, store, key = _managed(tmp_path, monkeypatch)
    job = claim_job_id(store, "c1", b'{"script": "a.py"}', key)
    assert JobView(store, "c1", job, key).spec() == {"script": "a.py"}
    copied = store.get_bytes(f"c1/jobs/{job}/spec.json") or b""
    store.put_bytes("c1/jobs/2/spec.json", copied)  # replayed under the next id
    assert JobView(store, "c1", "2", key).spec() is None
    assert job_ids(store, "c1", key) == ["1"]
    assert job_ids(store, "c1") == ["1", "2"]  # without the key: listed, acted on by nobody
    assert JobView(store, "c1", "2").spec() == {"script": "a.py"}  # shown as it is
    store.put_bytes("c1/jobs/3/spec.json", b'{"script": "b.py"}')  # plain, as before sealing
    assert JobView(store, "c1", "3").spec() == {"script": "b.py"}
    assert JobView(store, "c1", "3", key).spec() is None
    for junk in (b"[1]", b"\xff", b'"s"'):
        store.put_bytes("c1/jobs/4/spec.json", junk)
        assert JobView(store, "c1", "4").spec() is None


# --- the newest job: nothing under CLUSTER/jobs/N+1/ hides job N's end ----------------------
@pytest.mark.parametrize("planted", ["events/000001.json", "spec.json", "log/000001.log",
                                     "control/heartbeat", "anything"])
def test_objects_under_the_next_job_hide_nothing(
        planted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv, store, key = _managed(tmp_path, monkeypatch, provider="ssh")
    job = claim_job_id(store, "c1", b'{"script": "a.py"}', key)
    jl = JobLog(store, "c1", job, key=key)
    jl.record("started", "running")
    jl.record("finished", "done", exit_code=0)
    jl.record("torn_down", "cluster removed")
    fake = Record(seq=1, cluster="c1", job="2", event="started", state="running",
                  message="forged")
    store.put_bytes(f"c1/jobs/2/{planted}", fake.to_json().encode())
    url = inv.spec.store if inv.spec and inv.spec.store else ""
    assert latest_id(url, "c1", None) == "1"
    jobs = all_jobs(url, "c1")
    assert [j["id"] for j in jobs] == ["1"] and jobs[-1]["torn_down"]
    assert lost_job(inv, key) is None  # job 1 ended: nothing to take back
    assert forget_if_torn_down("c1", jobs) is True and not here.exists("c1")


# --- the heartbeat: a take-back when it is old -----------------------------------------------
def test_only_a_heartbeat_sealed_for_the_job_counts(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv, store, key = _managed(tmp_path, monkeypatch)
    job = _running_job(store, key, b"{}", beat_age=600)
    view = JobView(store, "c1", job, key)
    assert view.heartbeat_age() == pytest.approx(600, abs=5)
    assert lost_job(inv, key) is not None
    old = str(time.time() - 600).encode()
    for forged in (old, seal(b"x" * 32, heartbeat_kind("c1", job), old),
                   seal(key, heartbeat_kind("c1", "7"), old),
                   seal(key, heartbeat_kind("c1", job), b"inf"),
                   seal(key, heartbeat_kind("c1", job), b"nan"),
                   seal(key, heartbeat_kind("c1", job), b"[]")):
        store.put_bytes(f"c1/jobs/{job}/control/heartbeat", forged)
        assert view.heartbeat_age() is None, forged
        assert lost_job(inv, key) is None  # no take-back on anyone else's word
    # the controller's own, through JobLog's writer
    jl = JobLog(store, "c1", job, key=key)
    store.put_bytes(f"c1/jobs/{job}/control/heartbeat",
                    jl._sealed(heartbeat_kind, str(time.time())))
    assert view.heartbeat_age() == pytest.approx(0, abs=5)


def test_only_a_ledger_sealed_for_the_job_is_taken_back(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller taking the job back goes on from the lost one's ledger (issue 44): only
    one sealed for this job; a forged or copied one is none (a new ledger begins)."""
    here, inv, store, key = _managed(tmp_path, monkeypatch)
    job = _running_job(store, key, b"{}", beat_age=600)
    view = JobView(store, "c1", job, key)
    kept = {"node_seconds": {"training": 1e9}, "wall_s": 5.0}
    body = json.dumps(kept).encode()
    for forged in (body, seal(b"x" * 32, ledger_kind("c1", job), body),
                   seal(key, ledger_kind("c1", "7"), body),
                   seal(key, heartbeat_kind("c1", job), body),
                   seal(key, ledger_kind("c1", job), b"[1]"),
                   seal(key, ledger_kind("c1", job), b"{not json")):
        store.put_bytes(f"c1/jobs/{job}/control/ledger", forged)
        assert view.ledger_state() is None, forged
    jl = JobLog(store, "c1", job, key=key)  # the controller's own, through its writer
    jl.ledger = lambda: kept
    jl.keep_ledger()
    assert view.ledger_state() == kept


# --- cancel: the controller stops the job ---------------------------------------------------
def test_the_controller_acts_only_on_a_cancel_sealed_for_its_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv, store, key = _managed(tmp_path, monkeypatch)
    job = _running_job(store, key, b"{}", beat_age=0)
    controller = JobLog(store, "c1", job, key=key)
    assert controller.cancel_requested() is False
    url = inv.spec.store if inv.spec and inv.spec.store else ""
    other = _running_job(store, key, b"{}", beat_age=0)
    cancel(url, "c1", other)  # a genuine cancel of ANOTHER job ...
    copied = store.get_bytes(f"c1/jobs/{other}/control/cancel") or b""
    for forged in (b"2026-12-01T00:00:00Z", seal(b"x" * 32, f"cancel c1/{job}", b"now"),
                   copied):  # ... copied into this one
        store.put_bytes(f"c1/jobs/{job}/control/cancel", forged)
        assert controller.cancel_requested() is False, forged
    cancel(url, "c1", job)
    assert controller.cancel_requested() is True


def test_cancel_without_the_records_key_says_where_it_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, inv, store, key = _managed(tmp_path, monkeypatch)
    job = _running_job(store, key, b"{}", beat_age=0)
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "another-machine"))
    with pytest.raises(UserInputError, match="needs the cluster's records key") as err:
        cancel(inv.spec.store if inv.spec and inv.spec.store else "", "c1", job)
    assert "records.key" in (err.value.hint or "")
    assert store.get_bytes(f"c1/jobs/{job}/control/cancel") is None
    with pytest.raises(Unsigned):
        JobView(store, "c1", job).request_cancel()


# --- malformed MACs: a refusal, never a crash ------------------------------------------------
@pytest.mark.parametrize("bad", BAD_MACS, ids=repr)
def test_a_malformed_mac_is_a_refusal(bad: object) -> None:
    body = b'{"a": 1}'
    assert verify(KEY, "k", body, bad) is False
    envelope = json.dumps({"kind": "k", "mac": bad, "body": body.decode()}).encode()
    with pytest.raises(Unsigned):
        open_sealed(KEY, "k", envelope)
    assert verify(KEY, "k", body, mac(KEY, "k", body)) is True  # the right one still opens
    assert open_sealed(KEY, "k", seal(KEY, "k", body)) == body


@pytest.mark.parametrize("envelope", [b"[]", b'"x"', b"1", b"\xff\xfe", b'{"kind": "k"}',
                                      b'{"kind": "k", "mac": "a", "body": 5}',
                                      b'{"kind": 5, "mac": "a", "body": "x"}'])
def test_what_is_not_an_envelope_is_unsigned(envelope: bytes) -> None:
    with pytest.raises(Unsigned):
        open_sealed(KEY, "k", envelope)


@pytest.mark.parametrize("bad", BAD_MACS, ids=repr)
def test_a_cluster_json_with_a_malformed_mac_is_not_adopted(
        bad: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, inv, store, key = _managed(tmp_path, monkeypatch)
    theirs = inv.model_copy(deep=True)
    theirs.replacements.append(Replacement(rank=0, old="a", new="b", reason="lost"))
    body = theirs.model_dump_json()
    store.put_bytes("c1/cluster.json",
                    json.dumps({"kind": cluster_kind("c1"), "mac": bad, "body": body}).encode())
    warned: list[str] = []
    assert adopt_from_store("c1", here, warn=warned.append) is False
    assert warned and "does not verify" in warned[0]


@pytest.mark.parametrize("bad", BAD_MACS, ids=repr)
def test_a_record_with_a_malformed_mac_is_left_out(
        bad: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, store, key = _managed(tmp_path, monkeypatch)
    rec = Record(seq=1, cluster="c1", job="1", event="torn_down", state="failed", message="x")
    store.put_bytes("c1/jobs/1/events/000001.json",
                    json.dumps({**json.loads(rec.to_json()), "mac": bad}).encode())
    view = JobView(store, "c1", "1", key)
    assert view.records() == [] and len(view.refused) == 1


@pytest.mark.parametrize("data", [
    b"[]", b"null", b'"x"', b"\xff", b"{", b'{"seq": 1}',
    b'{"seq": "1", "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": "m"}',
    b'{"seq": true, "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": "m"}',
    b'{"seq": 1, "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": "m",'
    b' "nodes": [1]}',
    b'{"seq": 1, "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": "m",'
    b' "surprise": 1}',
    b'{"seq": 1, "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": 5}',
    b'{"seq": 1, "cluster": "c1", "job": "1", "event": "e", "state": "s", "message": "m",'
    b' "exit_code": 1.5}'])
def test_what_is_not_a_record_is_left_out_without_the_key_too(
        data: bytes, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put_bytes("c1/jobs/1/events/000001.json", data)
    assert Record.read(data, None) is None
    view = JobView(store, "c1", "1")  # another machine: no key, still no crash
    assert view.records() == [] and len(view.refused) == 1


def test_a_well_formed_record_reads_back_with_and_without_the_key() -> None:
    rec = Record(seq=3, cluster="c1", job="1", event="failed", state="failed", message="m",
                 nodes=["node-1"], exit_code=None, node_job="4")
    assert Record.read(rec.sealed(KEY), KEY) == rec
    assert Record.read(rec.sealed(KEY), None) == rec
    assert Record.read(rec.sealed(None), KEY) is None  # no MAC
    assert Record.read(rec.sealed(b"x" * 32), KEY) is None
