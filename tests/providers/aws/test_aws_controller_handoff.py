"""The hand-off of a managed run to an AWS controller, up to where the supervisor starts: the
controller is made (moto), then over the fake transport (tests/fake_nodes.py) the hand-off
waits for the controller's set-up BEFORE uploading, uploads once, writes the job's spec to the
store and starts the supervisor; a failed set-up stops it with the set-up's own words."""

from __future__ import annotations

import sys
from pathlib import Path

import boto3
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fake_nodes import FakeConnector  # noqa: E402

from provision.cluster.providers import get_provider  # noqa: E402
from provision.cluster.providers.controller_boot import READY  # noqa: E402
from provision.job.managed import handoff  # noqa: E402
from provision.model.errors import LaunchError, UserInputError  # noqa: E402
from provision.model.spec import build_job_spec  # noqa: E402

EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py")
STORE = "s3://ckpt-bucket/runs"


@pytest.fixture
def cluster(fakes, spec_for, store, up_cluster, monkeypatch):
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt-bucket")
    inv = up_cluster(spec_for(instance_type="g6.xlarge", max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": STORE})
    store.save(inv)
    fake = FakeConnector()
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    started: list[str] = []
    monkeypatch.setattr(handoff, "wait_started", lambda view, *a, **k: started.append(
        view.job_id))
    return inv, fake, started


def _job():
    return build_job_spec({}, {"script": EXAMPLE, "max_restarts": 1})


def test_the_hand_off_waits_for_the_set_up_then_uploads_and_starts(cluster, store) -> None:
    inv, fake, started = cluster
    job_id = handoff.hand_off(get_provider("aws"), inv, store, _job(), {}, teardown=True,
                              log=lambda m: None)
    assert inv.controller is not None and store.load("c1").controller == inv.controller
    commands = fake.commands("controller")
    wait = next(i for i, c in enumerate(commands) if READY in c)
    upload = next(i for i, c in enumerate(commands) if "tar -xzf -" in c)
    start = next(i for i, c in enumerate(commands) if "provision.job.managed.supervisor" in c)
    assert wait < upload < start
    assert "--teardown" in commands[start] and STORE in commands[start]
    assert started == [job_id]
    spec = boto3.client("s3", region_name="us-east-1").get_object(
        Bucket="ckpt-bucket", Key=f"runs/c1/jobs/{job_id}/spec.json")
    assert b"train_ddp.py" in spec["Body"].read()
    # a second hand-off reuses the controller
    handoff.hand_off(get_provider("aws"), inv, store, _job(), {}, teardown=False,
                     log=lambda m: None)
    assert len([r for r in store.load("c1").resources if r.extra.get("role") == "controller"]) == 1


def test_a_failed_set_up_stops_the_hand_off_before_the_upload(cluster, store) -> None:
    inv, fake, _ = cluster
    fake.on(READY, exit_code=1, stdout="E: Unable to locate package python3-venv")
    with pytest.raises(LaunchError, match="python3-venv"):
        handoff.hand_off(get_provider("aws"), inv, store, _job(), {}, teardown=True,
                         log=lambda m: None)
    assert not any("tar -xzf -" in c for c in fake.commands("controller"))


@pytest.mark.parametrize(("provider", "words"), [
    ("ssh", "restarts the job on the same hosts"), ("slurm", "inside the allocation")])
def test_ssh_and_slurm_say_what_works_instead(provider, words) -> None:
    with pytest.raises(UserInputError) as err:
        handoff.refuse_unsupervised(get_provider(provider), provider)
    assert words in (err.value.hint or "") and "--detach" in err.value.message


def test_nodes_without_the_store_sdk_are_named_before_the_job_starts(cluster) -> None:
    inv, fake, _ = cluster
    fake.on(r"^python3 -c 'import boto3'$", node="node-1", exit_code=1,
            stderr="ModuleNotFoundError: No module named 'boto3'")
    from provision.nodes import NodeGroup

    with NodeGroup(inv) as group, pytest.raises(LaunchError) as err:
        handoff.check_node_sdk(inv, group)
    assert "node-1" in err.value.message and "node-0:" not in err.value.message
    assert "pip install boto3" in (err.value.hint or "")
    with NodeGroup(inv) as group:  # once it is there, nothing to say
        fake.rules.clear()
        handoff.check_node_sdk(inv, group)
