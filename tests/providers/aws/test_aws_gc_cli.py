"""`gc` finds what no inventory knows; the CLI drives up/down end to end under moto."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster.providers import get_provider


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


class _Body:
    """The raw stream botocore reads an HTTP body from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: object):
        yield self.data


@pytest.mark.parametrize(("status", "body"), [
    (500, b"<html><body><h1>500 Internal Server Error</h1></body></html>"),  # botocore: code "500"
    (502, b"<!DOCTYPE html><html><body>Bad gateway</body></html>"),  # no error code at all
    (200, b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"),  # parsed into {}
    (200, b"<html><body>maintenance<br></body></html>"),  # not XML: ResponseParserError
])
def test_gc_with_an_unparseable_answer_is_an_error_from_the_tree(fakes, monkeypatch, status, body):
    """A proxy's HTML page instead of EC2's XML: `gc` says so (exit 4), no traceback."""
    from botocore.awsrequest import AWSResponse

    from provision.cluster.providers.aws import clients

    def html(request, **_):
        return AWSResponse(request.url, status, {"Content-Type": "text/html"}, _Body(body))

    remove = clients.add_client_hook(
        lambda c: c.meta.events.register_first("before-send.ec2.DescribeInstances", html))
    try:
        result = CliRunner().invoke(app, ["gc", "--provider", "aws", "--region", "us-east-1"])
    finally:
        remove()
    assert result.exit_code == 4, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "not an EC2 response" in result.output and "Traceback" not in result.output
    assert "proxy" in result.output  # the hint


def _no_credentials(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)


def test_cli_dry_run_without_credentials_prints_the_plan_and_its_cost(fakes, monkeypatch):
    _no_credentials(monkeypatch)
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--nodes", "2", "--name", "c1", "--instance-type",
        "p5en.48xlarge", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "cost: $126.60/hour" in result.output  # 2 x 63.296 + 2 Elastic IPs
    assert "unresolved: AMI" in result.output and "unresolved: zones and subnets" in result.output
    assert "dry run: nothing was created" in result.output
    assert fakes.sent == []


def test_cli_up_without_credentials_refuses_the_unresolved_plan(fakes, monkeypatch, store):
    _no_credentials(monkeypatch)
    result = CliRunner().invoke(app, ["up", "--provider", "aws", "--nodes", "2", "--name", "c1",
                                      "--yes"])
    assert result.exit_code == 4, result.output
    assert "this plan cannot be created" in result.output and "--dry-run" in result.output
    assert fakes.sent == [] and not store.exists("c1")


def test_cli_price_unknown_needs_confirmation(fakes):
    args = ["up", "--provider", "aws", "--nodes", "2", "--name", "c1", "--region", "us-east-2",
            "--instance-type", "p5e.48xlarge", "--no-bootstrap"]
    refused = CliRunner().invoke(app, args)  # no terminal, no --yes
    assert refused.exit_code == 2 and "price of this plan is unknown" in refused.output
    assert "cost: price unknown" in refused.output and fakes.writes() == []
    accepted = CliRunner().invoke(app, [*args, "--yes"])
    assert accepted.exit_code == 0, accepted.output
    assert CliRunner().invoke(app, ["down", "c1"]).exit_code == 0


def test_gc_finds_and_deletes_a_lost_nat_egress(fakes, spec_for, store, up_cluster, tagged):
    """--private-ips makes a NAT gateway, its Elastic IP, a subnet and a route table: all are
    found by their tag when the inventory is lost, and deleted."""
    up_cluster(spec_for(name="lost", private_ips=True))
    store.path("lost").unlink()
    provider = get_provider("aws")
    spec = spec_for(name="gc-scope")
    found = provider.orphans(spec, set(store.names()))
    assert {r.kind for r in found} >= {"nat-gateway", "elastic-ip", "subnet", "route-table",
                                       "instance", "security-group"}
    provider.delete_orphans(spec, found)
    assert tagged("lost") == {}
