"""Issue 42: the state folder and every key file stay on this machine, whatever payload carries
the job's folder (the attached sync and bootstrap, the hand-off to the controller, the
controller's own syncs to the nodes), and wherever they lie under that folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_nodes import FakeConnector, archive_files

from provision.job.launch import workdir_of
from provision.job.managed.handoff import controller_layout, controller_payload
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import ensure_cluster_key, ensure_controller_key, ensure_records_key
from provision.model.spec import build_cluster_spec, build_job_spec
from provision.nodes import NodeGroup
from provision.nodes.bootstrap import sync_workdir
from provision.nodes.shipping import workdir_archive


def _cluster(store: InventoryStore, name: str, identity: Path | None = None) -> Inventory:
    """A managed docker cluster recorded in `store`, with all three keys made."""
    keys = store.keys_dir(name)
    key, _ = ensure_cluster_key(keys)
    ensure_controller_key(keys)
    ensure_records_key(keys)
    node = NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=4000,
                      private_address="node-0", host_key="ssh-ed25519 AAAA",
                      identity_file=str(identity) if identity else None)
    spec = build_cluster_spec({}, {"name": name, "store": "s3://b/runs"})
    inv = Inventory(name=name, provider="docker", spec=spec, nodes=[node], status="ready",
                    key_path=str(key))
    store.create(inv)
    return inv


def _secrets(home: Path) -> dict[str, bytes]:
    """Every key file of every cluster in the state folder `home`, by path."""
    return {str(p): p.read_bytes() for p in (home / "keys").rglob("*")
            if p.is_file() and not p.name.endswith(".pub")}



def _leaks(members: dict[str, bytes], secrets: dict[str, bytes], work: str) -> list[str]:
    """Members under `work` that hold a key's bytes (or are named like one)."""
    names = ("records.key", "controller_ed25519", "id_ed25519", "known_hosts")
    return [n for n, data in members.items() if n.startswith(work + "/") and (
        any(s and s in data for s in secrets.values()) or n.rsplit("/", 1)[-1] in names)]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, InventoryStore]:
    """A script's folder that holds the state folder (MGPU_CLOUD_HOME inside the project),
    with two clusters' keys in it."""
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "data" / "a.txt").write_text("a\n")
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(root / "state"))
    store = InventoryStore()
    _cluster(store, "other")
    return root, store


def test_the_hand_off_to_the_controller_ships_no_key_of_any_cluster(
        project: tuple[Path, InventoryStore]) -> None:
    root, store = project
    inv = _cluster(store, "c1")
    said: list[str] = []
    job = build_job_spec({}, {"script": str(root / "train.py")})
    data = controller_payload(inv, job, "1", {}, controller_layout(inv), said.append)
    members = archive_files(data)
    work = ".mgpu-cloud/controller/jobs/1/work"
    assert {f"{work}/train.py", f"{work}/data/a.txt"} <= set(members)
    assert _leaks(members, _secrets(root / "state"), work) == []
    assert not any(n.startswith(f"{work}/state") for n in members)
    # the controller still gets what it needs (its home), never its own login key
    home_keys = {n.rsplit("/", 1)[-1] for n in members if "/home/keys/" in n}
    assert home_keys == {"id_ed25519", "id_ed25519.pub", "records.key"}, home_keys
    assert said == [f"left out of {root} (the tool's state and key files never leave this "
                    "machine): state"]


def test_the_attached_sync_ships_no_key_and_says_so(
        project: tuple[Path, InventoryStore]) -> None:
    root, store = project
    inv = _cluster(store, "c1")
    fake = FakeConnector()
    said: list[str] = []
    sync_workdir(inv, workdir_of(inv, build_job_spec({}, {"script": str(root / "train.py")})),
                 log=said.append, group=NodeGroup(inv, connector=fake))
    members = archive_files(fake.stdin("node-0")[0])
    assert ".mgpu-cloud/work/train.py" in members
    assert _leaks(members, _secrets(root / "state"), ".mgpu-cloud/work") == []
    assert any(line.startswith(f"left out of {root}") and line.endswith(": state")
               for line in said), said


def test_the_script_in_home_with_the_default_state_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python ~/train.py` with no MGPU_CLOUD_HOME: the state folder is ~/.mgpu-cloud, inside
    the script's folder."""
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.delenv("MGPU_CLOUD_HOME")
    monkeypatch.setenv("HOME", str(home))
    (home / "train.py").write_text("print('hi')\n")
    inv = _cluster(InventoryStore(), "c1")
    assert Path(inv.key_path or "").is_relative_to(home / ".mgpu-cloud")
    job = build_job_spec({}, {"script": str(home / "train.py")})
    members = archive_files(controller_payload(inv, job, "1", {}, controller_layout(inv)))
    work = ".mgpu-cloud/controller/jobs/1/work"
    assert f"{work}/train.py" in members
    assert _leaks(members, _secrets(home / ".mgpu-cloud"), work) == []


def test_keys_elsewhere_under_the_folder_are_matched_by_what_they_are(
        project: tuple[Path, InventoryStore]) -> None:
    """A node key file an inventory names (another cluster's: the ssh provider's
    identity_file) and a hard link to a records key under an innocent name stay here."""
    root, store = project
    ssh_key = root / "keys-of-my-hosts" / "hosts_key"
    ssh_key.parent.mkdir()
    ssh_key.write_bytes(b"an ssh provider's private key\n")
    _cluster(store, "byssh", identity=ssh_key)
    inv = _cluster(store, "c1")
    os.link(root / "state" / "keys" / "other" / "records.key", root / "data" / "weights.bin")
    (root / "data" / "link-to-state").symlink_to(root / "state")
    said: list[str] = []
    data = workdir_archive(root, [], inv, said.append)
    names = set(archive_files(data))
    assert names >= {"train.py", "data/a.txt"}
    assert not names & {"state", "data/weights.bin", "keys-of-my-hosts/hosts_key",
                        "data/link-to-state"}, names
    [line] = said
    for rel in ("state", "data/weights.bin", "keys-of-my-hosts/hosts_key"):
        assert rel in line.split(": ", 1)[1].split(", "), line


def test_a_job_folder_inside_the_state_folder_is_refused(
        project: tuple[Path, InventoryStore]) -> None:
    root, store = project
    inv = _cluster(store, "c1")
    inner = root / "state" / "scripts"
    inner.mkdir()
    with pytest.raises(UserInputError, match="lies in the tool's state folder"):
        workdir_archive(inner, [], inv, None)


def test_the_controller_sends_the_nodes_nothing_of_its_own_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the controller (MGPU_CLOUD_HOME = its home, the job's folder under jobs/ID/work),
    a replacement's bootstrap carries neither its home nor the cluster's keys, even when
    the hand-off had put a copy of them into the job's folder."""
    ctl = tmp_path / "controller"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(ctl / "home"))
    inv = _cluster(InventoryStore(), "c1")
    work = ctl / "jobs" / "1" / "work"
    work.mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    os.link(inv.key_path or "", work / "copied_key")  # the same file under the job's folder
    members = archive_files(workdir_archive(work, [], inv, None))
    assert set(members) == {"train.py"}, set(members)
