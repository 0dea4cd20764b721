"""plan / --dry-run: read-only, complete, priced; bad input refused before any write call."""

from __future__ import annotations

import pytest

from provision.errors import ProviderUnavailableError, SpecError, UserInputError
from provision.providers import get_provider
from provision.providers.aws.catalog import price_table


def test_plan_lists_every_resource_and_the_cost(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(nodes=4, max_hours=3))
    kinds = [r.kind for r in plan.resources]
    assert kinds == ["key-pair", "security-group", "placement-group", "instances", "elastic-ip"]
    inst = {r.kind: r.details for r in plan.resources}["instances"]
    assert inst["instance_type"] == "p4d.24xlarge"
    assert inst["efa_interfaces"] == "4"
    assert inst["gpus"] == "8 x NVIDIA A100 40 GiB"
    assert inst["ami"] == fakes.dlami
    assert inst["zones"].startswith("us-east-1a=subnet-")
    price = price_table()["regions"]["us-east-1"]["p4d.24xlarge"]
    assert plan.hourly_cost_usd == pytest.approx(4 * price)
    assert plan.max_cost_usd == pytest.approx(round(4 * price * 3, 2))
    assert price_table()["date"] in plan.price_source and "aws.amazon.com" in plan.price_source
    text = plan.render()
    assert "security-group" in text and "203.0.113.7/32" in text and "/hour" in text
    assert fakes.writes() == []


def test_default_max_hours_is_stated(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for())
    assert plan.max_hours == 8
    assert any("8 h (default" in n for n in plan.notes)


def test_plan_uses_explicit_ami_without_ssm(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(ami=fakes.dlami))
    assert "GetParameter" not in fakes.operations()
    assert {r.kind: r.details for r in plan.resources}["instances"]["ami"] == fakes.dlami


def test_private_ips_plan_has_no_elastic_ip(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(private_ips=True))
    assert "elastic-ip" not in [r.kind for r in plan.resources]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"region": "mars-north-1"}, "unknown AWS region 'mars-north-1'"),
        ({"instance_type": "m5.large"}, "has no GPUs"),
        ({"instance_type": "zz9.huge"}, "unknown instance type 'zz9.huge'"),
        ({"zone": "us-east-1e"}, "zone 'us-east-1e' does not offer p4d.24xlarge"),
        ({"nodes": 257}, "do not fit one cluster placement group"),
        ({"ami": "ami-0123456789abcdef0"}, "ami-0123456789abcdef0"),
    ],
)
def test_bad_input_is_refused_before_any_write(fakes, spec_for, overrides, message):
    nodes = overrides.pop("nodes", 2)
    with pytest.raises(UserInputError) as err:
        get_provider("aws").plan(spec_for(nodes=nodes, **overrides))
    assert message in str(err.value)
    assert fakes.writes() == []


def test_a_cidr_that_is_not_a_cidr_is_a_spec_error(aws_env, spec_for):
    with pytest.raises(SpecError, match="is not a CIDR range"):
        spec_for(ssh_cidr="10.0.0.300/8")


def test_missing_credentials_is_a_clear_error(fakes, spec_for, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)
    with pytest.raises(ProviderUnavailableError, match="no AWS credentials"):
        get_provider("aws").plan(spec_for())
    assert fakes.sent == []


def test_unknown_caller_address_asks_for_ssh_cidr(fakes, spec_for, monkeypatch):
    monkeypatch.setenv("MGPU_CLOUD_CALLER_IP", "not-an-address")
    with pytest.raises(UserInputError) as err:
        get_provider("aws").plan(spec_for())
    assert "--ssh-cidr" in str(err.value)
    assert fakes.sent == []


def test_world_open_ssh_only_when_written(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(ssh_cidr="0.0.0.0/0"))
    assert {r.kind: r.details for r in plan.resources}["security-group"]["ssh_from"] == "0.0.0.0/0"


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, provision.providers.aws; print('boto3' in sys.modules or 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
