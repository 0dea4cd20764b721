"""What the user's machine hands the controller, checked without Docker."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from provision.job.managed.handoff import controller_layout, controller_payload, start_line
from provision.job.managed.supervisor import inside_view
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.spec import build_cluster_spec, build_job_spec
from remote.store import parse_url

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")


def _inv(tmp_path: Path) -> Inventory:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("PRIVATE")
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAA")
    (keys / "known_hosts").write_text("x")
    spec = build_cluster_spec({}, {"name": "c1", "store": "s3://b/runs"})
    return Inventory(name="c1", provider="docker", spec=spec, key_path=str(keys / "id_ed25519"),
                     nodes=[NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=32000,
                                       private_address="node-0")])


def test_the_payload_has_the_code_the_state_and_the_job(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    job = build_job_spec({}, {"script": EXAMPLE, "args": ["--steps", "3"], "max_restarts": 2})
    env = {"AWS_ACCESS_KEY_ID": "AKIA-secret"}
    data = controller_payload(inv, job, "7", env, controller_layout(inv))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}

        def text(name: str) -> str:
            fh = tar.extractfile(members[name])
            assert fh is not None
            return fh.read().decode()

        root = ".mgpu-cloud/controller"
        assert f"{root}/lib/provision/job/managed/supervisor.py" in members
        assert f"{root}/lib/remote/store.py" in members
        assert f"{root}/lib/templates/hostfile.j2" in members
        assert f"{root}/jobs/7/work/train_ddp.py" in members
        assert ".mgpu-cloud/remote.pyz" in members
        assert not any("__pycache__" in n for n in members)
        assert members[f"{root}/home/keys/c1/id_ed25519"].mode == 0o600
        assert f"{root}/home/keys/c1/known_hosts" not in members  # rewritten there
        spec = json.loads(text(f"{root}/jobs/7/job.json"))
        assert spec["script"] == "train_ddp.py" and spec["workdir"] is None
        assert spec["max_restarts"] == 2
        # credentials only in the 0600 env file, never in the inventory
        assert members[f"{root}/home/store-env.json"].mode == 0o600
        assert "AKIA-secret" in text(f"{root}/home/store-env.json")
        assert "AKIA-secret" not in text(f"{root}/home/clusters/c1.yaml")


def test_the_start_line_is_one_quoted_shell_line(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    line = start_line(inv, "3", parse_url("s3://b/it's here"), teardown=True)
    words = subprocess.run(["bash", "-c", f"HOME=/h; printf '%s\\n' {line}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[:4] == ["python3", "/h/.mgpu-cloud/remote.pyz", "job", "start"]
    assert "PYTHONPATH=/h/.mgpu-cloud/controller/lib" in words
    assert words[words.index("--store") + 1] == "s3://b/it's here"
    assert words[-1] == "--teardown"
    assert shlex.split(line)  # parses


def test_the_controller_sees_nodes_at_their_private_addresses() -> None:
    node = NodeRecord(name="node-1", rank=1, address="127.0.0.1", port=32768,
                      private_address="node-1", proxy_jump="u@bastion")
    seen = inside_view(node)
    assert (seen.address, seen.port, seen.proxy_jump) == ("node-1", 22, None)


def test_the_controllers_inventory_is_adopted_here_only_when_newer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller publishes CLUSTER/cluster.json (nodes as seen from outside, no paths of
    its own); this machine takes it when it has recorded more replacements, and re-pins."""
    from provision.job.managed.client import adopt_from_store
    from provision.job.managed.supervisor import inside_view, publish_inventory
    from provision.model.inventory import InventoryStore, Replacement, ResourceRecord
    from provision.model.keys import ensure_records_key
    from remote.store import open_store

    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    folder = tmp_path / "shared"
    folder.mkdir()
    here = InventoryStore()
    inv = _inv(tmp_path)
    inv.spec = build_cluster_spec({}, {"name": "c1", "store": f"file://{folder}"})
    inv.nodes.append(NodeRecord(name="node-1", rank=1, address="127.0.0.1", port=32001,
                                private_address="node-1", host_key="ssh-ed25519 OLDKEY",
                                resource_id="old-id"))
    inv.controller = NodeRecord(name="controller", rank=-1, address="127.0.0.1", port=32100,
                                private_address="controller", host_key="ssh-ed25519 CTL")
    inv.resources = [ResourceRecord(kind="container", id="old-id")]
    here.create(inv)
    store = open_store(f"file://{folder}")
    assert adopt_from_store("c1", here) is False  # nothing published yet
    # the controller's copy: inside view, its own paths; node-1 replaced once
    theirs = inv.model_copy(deep=True)
    theirs.key_path, theirs.known_hosts_path = "/root/ctl/id_ed25519", "/root/ctl/kh"
    new = NodeRecord(name="node-1", rank=1, address="127.0.0.1", port=32999,
                     private_address="node-1", host_key="ssh-ed25519 NEWKEY",
                     resource_id="new-id")
    outside = {n.rank: n for n in theirs.nodes}
    theirs.nodes = [inside_view(n) for n in theirs.nodes]
    key = ensure_records_key(here.keys_dir("c1"))
    publish_inventory(store, theirs, outside, key)
    assert adopt_from_store("c1", here) is False  # same replacements: not newer
    outside[1] = new
    theirs.nodes[1] = inside_view(new)
    theirs.resources = [ResourceRecord(kind="container", id="new-id")]
    theirs.replacements.append(Replacement(rank=1, old="old-id", new="new-id", reason="lost"))
    publish_inventory(store, theirs, outside, key)
    text = (folder / "c1" / "cluster.json").read_text()
    assert "/root/ctl" not in text and "PRIVATE" not in text  # no paths, no key material
    assert adopt_from_store("c1", here) is True
    got = here.load("c1")
    assert (got.nodes[1].port, got.nodes[1].host_key, got.nodes[1].address) == (
        32999, "ssh-ed25519 NEWKEY", "127.0.0.1")  # the outside view, not node-1:22
    assert [r.id for r in got.resources] == ["new-id"] and len(got.replacements) == 1
    assert got.key_path == inv.key_path and got.controller == inv.controller
    assert "NEWKEY" in Path(got.known_hosts_path or "").read_text()
    assert "OLDKEY" not in Path(got.known_hosts_path or "").read_text()
    assert adopt_from_store("c1", here) is False  # adopted once


def test_resuming_a_previous_run_on_purpose_needs_its_checkpoints(tmp_path: Path) -> None:
    from provision.job.managed.checks import check_resume
    from provision.job.managed.supervisor import checkpoints_url
    from provision.model.errors import UserInputError
    from remote.store import open_store

    url = f"file://{tmp_path}"
    assert str(checkpoints_url(parse_url(url), "c1", "3")) == (
        f"{url}/c1/data/jobs/3/checkpoints")
    open_store(url).put_bytes("c1/data/jobs/1/checkpoints/step_000009.pt", b"x")
    open_store(url).put_bytes("c1/jobs/1/spec.json", b"{}")
    open_store(url).put_bytes("c1/jobs/2/events/000001.json", b"{}")
    fresh = build_job_spec({}, {"script": EXAMPLE})
    check_resume("c1", url, fresh)  # nothing asked: nothing checked
    check_resume("c1", url, build_job_spec({}, {"script": EXAMPLE,
                                                "env": {"MGPU_RESUME_FROM": "1"}}))
    with pytest.raises(UserInputError, match="job 2 of 'c1' has no checkpoints") as err:
        check_resume("c1", url, build_job_spec({}, {"script": EXAMPLE,
                                                    "env": {"MGPU_RESUME_FROM": "2"}}))
    assert "jobs there: 1, 2" in (err.value.hint or "")
    with pytest.raises(UserInputError, match="not a plain name"):
        check_resume("c1", url, build_job_spec({}, {"script": EXAMPLE,
                                                    "env": {"MGPU_RESUME_FROM": "../../x"}}))


def test_down_asks_a_live_managed_job_to_stop_and_never_hangs_on_a_silent_controller(
        tmp_path: Path) -> None:
    from provision.job.managed.records import JobLog, JobView, claim_job_id
    from provision.job.managed.stopping import stop_before_down
    from provision.model.keys import ensure_records_key
    from remote.store import open_store

    url = f"file://{tmp_path}/store"
    (tmp_path / "store").mkdir()
    inv = _inv(tmp_path)
    inv.spec = build_cluster_spec({}, {"name": "c1", "store": url})
    notes: list[str] = []
    store = open_store(url)
    here = InventoryStore(tmp_path / "home")
    key = ensure_records_key(here.keys_dir("c1"))
    stop_before_down(inv, here, notes.append)  # no controller: nothing
    inv.controller = NodeRecord(name="controller", rank=-1, address="127.0.0.1", port=9,
                                private_address="controller", host_key="ssh-ed25519 AAAA")
    jl = JobLog(store, "c1", claim_job_id(store, "c1", b"{}", key), key=key)
    jl.record("submitted", "x")
    jl.record("finished", "done", exit_code=0)
    stop_before_down(inv, here, notes.append)  # ended: nothing
    assert notes == [] and JobView(store, "c1", "1").records()[-1].event == "finished"
    jl = JobLog(store, "c1", claim_job_id(store, "c1", b"{}", key), key=key)
    jl.record("started", "running")
    stop_before_down(inv, here, notes.append, deadline_s=0.5)
    assert store.get_bytes("c1/jobs/2/control/cancel") is not None  # asked through the store
    assert "managed job 2 is running: its controller stops it" in notes[0]
    assert "did not end job 2 within 0 s; removing it first" in notes[-1], notes
