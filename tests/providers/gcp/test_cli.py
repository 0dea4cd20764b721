"""`mgpu-cloud up/down --provider gcp` end to end against the fake (no bootstrap)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import PROJECT, writes
from fake_compute import FakeCompute
from typer.testing import CliRunner

from provision.cli import app
from provision.model.inventory import InventoryStore

FLAGS = ["--provider", "gcp", "--nodes", "2", "--project", PROJECT, "--zone", "us-central1-c",
         "--machine-type", "a2-ultragpu-8g", "--spot", "--ssh-cidr", "192.0.2.0/28",
         "--max-hours", "2.5", "--image-family", "pytorch-latest-gpu", "--disk-gb", "300"]


def check_sent(fake: FakeCompute) -> None:
    (bulk,) = [r.body for r in fake.sent("POST", r"zones/us-central1-c/instances/bulkInsert$")]
    assert bulk["count"] == bulk["minCount"] == "2"
    props = bulk["instanceProperties"]
    assert props["scheduling"]["provisioningModel"] == "SPOT"
    assert props["scheduling"]["maxRunDuration"] == {"seconds": "9000"}
    params = props["disks"][0]["initializeParams"]
    assert params["diskSizeGb"] == "300"
    assert params["sourceImage"].endswith("/images/pytorch-latest-gpu-v20260804")
    (ssh_fw, _) = [r.body for r in fake.sent("POST", r"global/firewalls$")]
    assert ssh_fw["sourceRanges"] == ["192.0.2.0/28"]


def test_up_and_down_from_flags(fake: FakeCompute, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["up", *FLAGS, "--name", "c1", "--yes", "--no-bootstrap"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "c1"
    assert "Plan for cluster 'c1' on gcp" in res.stderr
    check_sent(fake)
    inv = InventoryStore().load("c1")
    assert inv.status == "ready" and len(inv.nodes) == 2

    res = runner.invoke(app, ["down", "c1"])
    assert res.exit_code == 0, res.output
    assert fake.all_resources() == []
    assert not InventoryStore().exists("c1")
    res = runner.invoke(app, ["down", "c1"])  # idempotent
    assert res.exit_code == 0 and "nothing to remove" in res.stderr


def test_up_from_yaml_sends_the_same(fake: FakeCompute, tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({
        "provider": "gcp", "name": "c1", "nodes": 2, "spot": True, "ssh_cidr": "192.0.2.0/28",
        "max_hours": 2.5,
        "gcp": {"project": PROJECT, "zone": "us-central1-c", "machine_type": "a2-ultragpu-8g",
                "image_family": "pytorch-latest-gpu", "disk_gb": 300},
    }))
    res = CliRunner().invoke(app, ["up", "--config", str(config), "--yes", "--no-bootstrap"])
    assert res.exit_code == 0, res.output
    check_sent(fake)


def test_dry_run_prints_the_plan_and_writes_nothing(fake: FakeCompute) -> None:
    res = CliRunner().invoke(app, ["up", *FLAGS, "--name", "c1", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "dry run: nothing was created" in res.stderr
    assert "COLLOCATED" in res.stderr and "/hour" in res.stderr
    assert writes(fake) == []
    assert not InventoryStore().exists("c1")


def test_paid_plan_needs_yes_without_a_terminal(fake: FakeCompute) -> None:
    res = CliRunner().invoke(app, ["up", *FLAGS, "--name", "c1"])
    assert res.exit_code == 2
    assert "--yes" in res.stderr
    assert writes(fake) == []


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--ssh-cidr", "not-a-cidr"], 2, "not a CIDR"),
        (["--machine-type", "a2-nonexistent-8g"], 2, "does not exist in zone"),
        (["--zone", "us-central1-q"], 2, "unknown zone"),
    ],
)
def test_bad_input_exits_before_any_write(
    fake: FakeCompute, args: list[str], code: int, words: str
) -> None:
    res = CliRunner().invoke(app, ["up", *FLAGS, *args, "--name", "c1", "--yes"])
    assert res.exit_code == code, res.output
    assert words in res.stderr
    assert writes(fake) == []


def test_missing_credentials_exits_4(fake: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    res = CliRunner().invoke(app, ["up", *FLAGS, "--name", "c1", "--yes"])
    assert res.exit_code == 4, res.output
    assert "gcloud auth application-default login" in res.stderr
    assert fake.requests == []


def test_capacity_error_exits_5_and_leaves_nothing(fake: FakeCompute) -> None:
    fake.stockout("us-central1-a", "us-central1-c", "us-central1-f")
    res = CliRunner().invoke(app, ["up", *FLAGS, "--name", "c1", "--yes", "--no-bootstrap"])
    assert res.exit_code == 5, res.output
    assert "no zone had capacity" in res.stderr
    assert fake.all_resources() == []
    assert not InventoryStore().exists("c1")


def test_dry_run_without_credentials_prints_the_plan_and_its_cost(
    fake: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    res = CliRunner().invoke(app, ["up", "--provider", "gcp", "--nodes", "2", "--name", "c1",
                                   "--machine-type", "a3-ultragpu-8g", "--flex-start",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "known part: $173.5" in res.stderr  # 2 x (86.76 + address)
    assert "price unknown (boot disk (hyperdisk-balanced)" in res.stderr
    assert "FLEX_START" in res.stderr and "hyperdisk-balanced" in res.stderr
    assert "unresolved: project (pass --project)" in res.stderr
    assert "unresolved: boot image" in res.stderr
    assert fake.requests == []


@pytest.mark.parametrize(("status", "code", "words"), [
    (200, 4, "not a Compute Engine response"),  # read as JSON: not Compute's answer
    (502, 6, "HTTP 502"),  # api_core turns the HTML error page into an HTTP error
])
def test_an_html_answer_is_an_error_from_the_tree(fake: FakeCompute, status: int, code: int,
                                                  words: str) -> None:
    """A proxy's HTML page instead of Compute's JSON: a message and an exit code, no traceback."""
    fake.html("GET", r"aggregated/instances$", status, times=99)
    res = CliRunner().invoke(app, ["gc", "--provider", "gcp", "--project", PROJECT])
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output and "error:" in res.stderr
    assert res.exit_code == code and words in res.stderr, res.output


def test_the_capacity_flags_reach_the_plan(fake: FakeCompute) -> None:
    """--flex-start, --regions and --reservation are CLI flags of the gcp provider."""
    res = CliRunner().invoke(app, ["up", "--provider", "gcp", "--nodes", "2", "--name", "c1",
                                   "--project", PROJECT, "--machine-type", "a2-ultragpu-8g",
                                   "--flex-start", "--regions", "any", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "provisioning=FLEX_START" in res.stderr and "--regions: regions tried" in res.stderr
    fake.add_reservation(PROJECT, "us-central1-a", "r1", "a2-ultragpu-8g", count=1)
    res = CliRunner().invoke(app, ["up", "--provider", "gcp", "--nodes", "2", "--name", "c1",
                                   "--project", PROJECT, "--reservation", "r1", "--dry-run"])
    assert res.exit_code == 2 and "has 1 of 1 VMs free; 2 needed" in res.stderr, res.output
    assert writes(fake) == []
