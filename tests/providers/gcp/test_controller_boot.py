"""What the GCP controller VM is booted with (issues 38 and 34), against the Compute fake: its
startup script, run by the fake boot (tests/providers/aws/fake_boot.py) with Debian 12's
python3, ends READY on a python the supervisor supports; its ssh-keys metadata authorizes the
controller's own key and not the cluster key the nodes hold."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fake_compute import FakeCompute
from fake_iam import FakeIam

from provision.cluster.providers import get_provider
from provision.cluster.providers.controller_boot import MIN_PYTHON
from provision.cluster.providers.gcp.controller_vm import IMAGE

# loaded by path: the aws folder's own modules (its conftest) stay off sys.path here
_spec = importlib.util.spec_from_file_location(
    "aws_fake_boot", Path(__file__).resolve().parents[1] / "aws" / "fake_boot.py")
assert _spec is not None and _spec.loader is not None
fake_boot = sys.modules["aws_fake_boot"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_boot)
boot, python_of, supports = fake_boot.boot, fake_boot.python_of, fake_boot.supports

INSERT = r"zones/us-central1-a/instances$"


def _controller(fake: FakeCompute, up, make_spec, store) -> dict:
    inv = up(make_spec(max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": "gs://ckpt/runs"})
    get_provider("gcp").create_controller(inv, store)
    (sent,) = fake.sent("POST", INSERT)
    return dict(sent.body)


def test_the_controller_vm_boots_a_python_the_supervisor_runs_on(
        fake: FakeCompute, iam: FakeIam, up, make_spec, store, tmp_path) -> None:
    body = _controller(fake, up, make_spec, store)
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert body["disks"][0]["initializeParams"]["sourceImage"] == IMAGE
    python = python_of(IMAGE)
    booted = boot(meta["startup-script"], python, tmp_path)
    assert supports(booted.python, MIN_PYTHON) and booted.ready, booted.failed


def test_the_controller_vm_authorizes_its_own_key_not_the_cluster_key(
        fake: FakeCompute, iam: FakeIam, up, make_spec, store) -> None:
    """Issue 34: every node holds the cluster's private key; a controller that authorized it
    could be logged in to from any node."""
    body = _controller(fake, up, make_spec, store)
    keys = store.keys_dir("c1")
    own = (keys / "controller_ed25519.pub").read_text().strip()
    cluster = (keys / "id_ed25519.pub").read_text().strip()
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["ssh-keys"] == f"mgpu:{own}"
    assert cluster.split()[1] not in str(body)
    nodes = fake.sent("POST", r"instances/bulkInsert$")[0].body
    node_meta = {i["key"]: i["value"] for i in nodes["instanceProperties"]["metadata"]["items"]}
    assert node_meta["ssh-keys"] == f"mgpu:{cluster}"  # the nodes keep the cluster key
