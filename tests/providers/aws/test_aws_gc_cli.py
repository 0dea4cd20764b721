"""`gc` finds what no inventory knows; the CLI drives up/down end to end under moto."""

from __future__ import annotations

from typer.testing import CliRunner

from provision.cli import app
from provision.providers import get_provider


def test_gc_finds_and_deletes_resources_whose_inventory_was_deleted(fakes, spec_for, store,
                                                                    up_cluster, tagged):
    up_cluster(spec_for(name="kept"))
    up_cluster(spec_for(name="lost"))
    store.path("lost").unlink()  # the inventory is gone, the cloud resources are not
    provider = get_provider("aws")
    spec = spec_for(name="gc-scope")
    found = provider.orphans(spec, set(store.names()))
    assert {r.name for r in found} == {"lost"}
    assert {r.kind for r in found} == {"instance", "elastic-ip", "placement-group",
                                       "security-group", "key-pair"}
    assert all(r.region == "us-east-1" for r in found)
    provider.delete_orphans(spec, found)
    assert tagged("lost") == {}
    assert tagged("kept") != {}
    assert provider.orphans(spec, set(store.names())) == []


def test_cli_up_dry_run_creates_nothing(fakes):
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--nodes", "2", "--name", "c1", "--region", "us-east-1",
        "--dry-run",
    ])
    assert result.exit_code == 0, result.output
    assert "placement-group" in result.output and "cost:" in result.output
    assert "dry run: nothing was created" in result.output
    assert fakes.writes() == []


def test_cli_up_then_down_then_gc(fakes, tagged):
    runner = CliRunner()
    result = runner.invoke(app, [
        "up", "--provider", "aws", "--nodes", "2", "--name", "c1", "--region", "us-east-1",
        "--ssh-cidr", "198.51.100.0/24", "--max-hours", "2", "--yes", "--no-bootstrap",
    ])
    assert result.exit_code == 0, result.output
    assert "cluster 'c1' is up: 2 node(s)" in result.output
    assert set(tagged("c1")) >= {"instance", "security-group", "placement-group"}
    sent = fakes.calls("AuthorizeSecurityGroupIngress")[0]["IpPermissions"][0]
    assert sent["IpRanges"][0]["CidrIp"] == "198.51.100.0/24"

    result = runner.invoke(app, ["gc", "--provider", "aws", "--region", "us-east-1"])
    assert result.exit_code == 0 and "0 orphaned resource(s)" in result.output

    result = runner.invoke(app, ["down", "c1"])
    assert result.exit_code == 0, result.output
    assert tagged() == {}


def test_cli_gc_delete(fakes, spec_for, store, up_cluster, tagged):
    up_cluster(spec_for(name="lost"))
    store.path("lost").unlink()
    runner = CliRunner()
    result = runner.invoke(app, ["gc", "--provider", "aws", "--region", "us-east-1"])
    assert result.exit_code == 0 and "security-group" in result.output and "lost" in result.output
    result = runner.invoke(app, ["gc", "--provider", "aws", "--region", "us-east-1", "--delete"])
    assert result.exit_code == 0, result.output
    assert tagged() == {}


def test_cli_bad_input_exit_codes(fakes):
    runner = CliRunner()
    bad_cidr = runner.invoke(app, ["up", "--provider", "aws", "--ssh-cidr", "not-a-cidr", "--yes"])
    assert bad_cidr.exit_code == 2 and "not a CIDR" in bad_cidr.output
    no_gpu = runner.invoke(app, ["up", "--provider", "aws", "--instance-type", "m5.large",
                                 "--region", "us-east-1", "--yes"])
    assert no_gpu.exit_code == 2 and "has no GPUs" in no_gpu.output
    assert fakes.writes() == []
