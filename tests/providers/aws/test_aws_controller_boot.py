"""What the AWS controller is booted with (issues 38 and 34), under moto: an image whose
python3 runs the supervisor (fake_boot.py runs the set-up exactly as sent, with the image's
python standing in), a set-up that refuses an older python by name, and a login that only the
controller's own key opens (the nodes hold the cluster key)."""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path

import yaml
from fake_boot import boot, python_of, supports

from provision.cluster.providers import get_provider
from provision.cluster.providers.controller_boot import MIN_PYTHON, VENV, setup_script
from provision.model.inventory import Inventory

REGION = "us-east-1"  # conftest.REGION
ROOT = Path(__file__).resolve().parents[3]


def _up(up_cluster, spec_for, **aws) -> Inventory:
    inv = up_cluster(spec_for(instance_type="g6.xlarge", max_hours=2, **aws))
    inv.spec = inv.spec.model_copy(update={"store": "s3://ckpt-bucket/runs"})
    return inv


def _controller_run(fakes) -> dict:
    (run,) = [p for p in fakes.calls("RunInstances") if p.get("IamInstanceProfile")]
    return run


def _user_data(run: dict) -> dict:
    raw = run["UserData"]
    text = raw if raw.startswith("#cloud-config") else base64.b64decode(raw).decode()
    return dict(yaml.safe_load(text))


def _setup(data: dict) -> str:
    (script,) = [f["content"] for f in data["write_files"]
                 if f["path"] == "/usr/local/sbin/mgpu-cloud-controller-setup"]
    return str(script)


def _image_name(moto_ec2, ami: str) -> str:
    (image,) = moto_ec2.describe_images(ImageIds=[ami])["Images"]
    return str(image["Name"])


def test_the_controller_boots_a_python_the_supervisor_runs_on(
        fakes, spec_for, store, up_cluster, moto_ec2, tmp_path) -> None:
    """Before: the controller booted the nodes' AMI (the Ubuntu 22.04 DLAMI, python3.10) and
    its set-up said READY; the supervisor's first record then raised (datetime.UTC)."""
    inv = _up(up_cluster, spec_for)
    get_provider("aws").create_controller(inv, store)
    run = _controller_run(fakes)
    python = python_of(_image_name(moto_ec2, run["ImageId"]))
    booted = boot(_setup(_user_data(run)), python, tmp_path)
    assert supports(booted.python, MIN_PYTHON), f"the controller's image has python {python}"
    assert booted.ready and booted.failed == ""
    # SSH sessions (the hand-off's `python3 -m provision.job.managed.supervisor`) find the
    # venv's python first
    assert booted.path.startswith(f'PATH="{tmp_path}{VENV}/bin:')
    assert "boto3==" in booted.pip and "paramiko==" in booted.pip
    node_run = next(p for p in fakes.calls("RunInstances") if not p.get("IamInstanceProfile"))
    assert run["ImageId"] != node_run["ImageId"]  # an image of its own, not the nodes' DLAMI
    assert run["ImageId"] == fakes.ubuntu[(REGION, "amd64")]


def test_a_graviton_controller_gets_the_arm64_image(fakes, spec_for, store,
                                                   up_cluster) -> None:
    inv = _up(up_cluster, spec_for, controller_type="t4g.small")
    get_provider("aws").create_controller(inv, store)
    run = _controller_run(fakes)
    assert run["InstanceType"] == "t4g.small"
    assert run["ImageId"] == fakes.ubuntu[(REGION, "arm64")]


def test_a_set_up_on_an_older_python_fails_naming_it(tmp_path) -> None:
    """READY only when the venv's python is one the code supports: an image with python3.10
    ends in FAILED saying so, before anything is installed."""
    booted = boot(setup_script("c1", "aws", "s3"), "3.10.12", tmp_path)
    assert not booted.ready
    assert "3.10.12" in booted.failed and "Python >= 3.11" in booted.failed
    assert booted.pip == ""  # nothing installed into a venv that cannot run the code


def test_the_minimum_python_is_the_packages() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["requires-python"] == ">=" + ".".join(map(str, MIN_PYTHON))


def test_the_controller_authorizes_its_own_key_not_the_cluster_key(
        fakes, spec_for, store, up_cluster) -> None:
    """Issue 34: every node holds the cluster's private key; a controller that authorized it
    (the cluster's EC2 key pair) could be logged in to from any node."""
    inv = _up(up_cluster, spec_for)
    get_provider("aws").create_controller(inv, store)
    run = _controller_run(fakes)
    keys = store.keys_dir("c1")
    own = (keys / "controller_ed25519.pub").read_text().strip()
    cluster = (keys / "id_ed25519.pub").read_text().strip()
    data = _user_data(run)
    assert "KeyName" not in run  # an EC2 key pair is the cluster key, authorized by cloud-init
    assert data["ssh_authorized_keys"] == [own]
    assert cluster.split()[1] not in yaml.safe_dump(data)
    node_run = next(p for p in fakes.calls("RunInstances") if not p.get("IamInstanceProfile"))
    assert node_run["KeyName"]  # the nodes keep the cluster key
    (pair,) = fakes.calls("ImportKeyPair")
    assert pair["PublicKeyMaterial"].decode().strip() == cluster
