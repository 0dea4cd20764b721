"""plan / --dry-run: read-only, complete, priced; bad input refused before any write call."""

from __future__ import annotations

import pytest

from provision.cluster.providers import get_provider
from provision.cluster.providers.aws.catalog import catalog
from provision.model.errors import ProviderUnavailableError, SpecError, UserInputError


def test_plan_lists_every_resource_and_the_cost(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(nodes=4, max_hours=3))
    kinds = [r.kind for r in plan.resources]
    assert kinds == ["key-pair", "security-group", "placement-group", "instances", "elastic-ips"]
    inst = {r.kind: r.details for r in plan.resources}["instances"]
    assert inst["instance_type"] == "p4d.24xlarge"
    assert inst["efa_interfaces"] == "4"
    assert inst["gpus"] == "8 x NVIDIA A100 40 GiB"
    assert inst["ami"] == fakes.dlami
    assert inst["zones"].startswith("us-east-1a=subnet-")
    assert inst["root_device"] == "/dev/sda1"
    price = catalog()["types"]["p4d.24xlarge"]["on_demand"]["us-east-1"]
    ipv4 = catalog()["network"]["public_ipv4_hour"]
    assert plan.hourly_cost_usd == pytest.approx(4 * price + 4 * ipv4)  # nodes + their EIPs
    assert plan.max_cost_usd == pytest.approx(round((4 * price + 4 * ipv4) * 3, 2))
    assert "2025-06-05" in plan.price_source and "aws.amazon.com" in plan.price_source
    assert "vpc/pricing" in plan.price_source
    assert plan.unpriced == [] and plan.unresolved == []
    eips = {r.kind: r.details for r in plan.resources}["elastic-ips"]
    assert eips["region_quota"] == "0 of 5 in use"
    text = plan.render()
    assert "security-group" in text and "203.0.113.7/32" in text and "/hour" in text
    assert "internet: each node has an Elastic IP (4)" in text
    assert fakes.writes() == []


def test_default_max_hours_is_stated(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for())
    assert plan.max_hours == 8
    assert any("8 h (default" in n for n in plan.notes)


def test_plan_uses_explicit_ami_without_ssm(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(ami=fakes.dlami))
    assert "GetParameter" not in fakes.operations()
    assert {r.kind: r.details for r in plan.resources}["instances"]["ami"] == fakes.dlami


def test_private_ips_plan_has_a_nat_gateway_and_its_cost(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(private_ips=True))
    kinds = [r.kind for r in plan.resources]
    assert kinds[-4:] == ["route-table", "subnet", "nat-gateway", "elastic-ip"]
    assert "elastic-ips" not in kinds
    net = catalog()["network"]
    price = catalog()["types"]["p4d.24xlarge"]["on_demand"]["us-east-1"]
    assert plan.hourly_cost_usd == pytest.approx(
        2 * price + net["nat_gateway_hour"] + net["public_ipv4_hour"])
    text = plan.render()
    assert "through the cluster's NAT gateway" in text and "per GB through the NAT" in text


def test_one_interface_types_need_no_elastic_ip(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(instance_type="g6.xlarge"))
    assert plan.launch.egress.mode == "public-ip" and plan.launch.egress.elastic_ips == 0
    assert "DescribeAccountAttributes" not in fakes.operations()


@pytest.mark.parametrize(("in_use", "quota", "nodes"), [(0, 5, 5), (3, 64, 61)])
def test_elastic_ips_that_fit_the_quota_are_planned(fakes, spec_for, moto_ec2, in_use, quota,
                                                    nodes):
    fakes.eip_quota = quota
    for _ in range(in_use):
        moto_ec2.allocate_address(Domain="vpc")
    egress = get_provider("aws").plan(spec_for(nodes=nodes)).launch.egress
    assert (egress.eip_quota, egress.eips_in_use, egress.elastic_ips) == (quota, in_use, nodes)


@pytest.mark.parametrize(("in_use", "quota", "nodes"), [(1, 5, 5), (4, 64, 61)])
def test_elastic_ips_beyond_the_quota_are_refused_at_plan_time(fakes, spec_for, moto_ec2,
                                                               in_use, quota, nodes):
    fakes.eip_quota = quota
    for _ in range(in_use):
        moto_ec2.allocate_address(Domain="vpc")
    with pytest.raises(UserInputError) as err:
        get_provider("aws").plan(spec_for(nodes=nodes))
    assert f"needs {nodes} Elastic IP(s)" in err.value.message
    assert "L-0263D0A3" in err.value.hint and "--private-ips" in err.value.hint
    assert fakes.writes() == []


def test_nat_needs_one_free_elastic_ip(fakes, spec_for, moto_ec2):
    for _ in range(5):
        moto_ec2.allocate_address(Domain="vpc")
    with pytest.raises(UserInputError, match="needs 1 Elastic IP"):
        get_provider("aws").plan(spec_for(private_ips=True))


def test_root_device_and_minimum_size_come_from_the_ami(fakes, spec_for):
    ami = "ami-0a1b2c3d4e5f60718"
    fakes.images[ami] = {
        "ImageId": ami, "Name": "al2023-like", "RootDeviceName": "/dev/xvda",
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 300}}]}
    with pytest.raises(UserInputError, match="at least 300 GB") as err:
        get_provider("aws").plan(spec_for(ami=ami))
    assert "--disk-gb 300" in err.value.hint
    plan = get_provider("aws").plan(spec_for(ami=ami, disk_gb=300))
    assert plan.launch.root_device == "/dev/xvda"


def test_a_type_without_a_price_is_planned_as_price_unknown(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(instance_type="p6-b300.48xlarge"))
    assert plan.unpriced and "p6-b300.48xlarge" in plan.unpriced[0]
    assert "no on-demand price" in plan.unpriced[0]
    eips = 2 * catalog()["network"]["public_ipv4_hour"]  # 17 interfaces: an Elastic IP each
    assert plan.hourly_cost_usd == pytest.approx(eips)
    text = plan.render()
    assert "cost: price unknown" in text and "known part: $0.01/hour" in text


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


def test_without_credentials_the_plan_is_offline_and_says_what_is_unresolved(
        fakes, spec_for, store, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)
    plan = get_provider("aws").plan(spec_for(nodes=3, instance_type="p5.48xlarge"))
    assert fakes.sent == []  # no AWS call at all
    price = catalog()["types"]["p5.48xlarge"]["on_demand"]["us-east-1"]
    assert plan.hourly_cost_usd == pytest.approx(3 * price + 3 * 0.005)
    unresolved = " | ".join(plan.unresolved)
    assert "AMI" in unresolved and "subnets" in unresolved and "Elastic IP quota" in unresolved
    assert "no AWS credentials" in unresolved
    inst = {r.kind: r.details for r in plan.resources}["instances"]
    assert inst["ami"] == "(unresolved)" and inst["efa_interfaces"] == "32"
    assert "unresolved: AMI" in plan.render()
    # such a plan is never created
    from provision.cluster import pipeline

    with pytest.raises(ProviderUnavailableError, match="this plan cannot be created"):
        pipeline.up(spec_for(nodes=3, instance_type="p5.48xlarge"), confirm=lambda p: True,
                    store=store, bootstrap=False, log=lambda m: None)
    assert fakes.writes() == [] and not store.exists("c1")


def test_offline_plan_of_an_unknown_type_names_the_known_ones(fakes, spec_for, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)
    with pytest.raises(UserInputError, match="not in the offline catalog") as err:
        get_provider("aws").plan(spec_for(instance_type="zz9.huge"))
    assert "p4d.24xlarge" in err.value.hint


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

    code = "import sys, provision.cluster.providers.aws; print('boto3' in sys.modules or 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_default_image_follows_the_gpu_architecture(fakes, spec_for, up_cluster):
    """p6-b200 (Blackwell) cannot run the CUDA 12.5 image: it gets a CUDA 12.8 one; the plan
    shows the image."""
    plan = get_provider("aws").plan(spec_for(instance_type="p6-b200.48xlarge"))
    assert plan.launch.image == "nvcr.io/nvidia/pytorch:25.01-py3"
    (inst,) = [r for r in plan.resources if r.kind == "instances"]
    assert inst.details["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    inv = up_cluster(spec_for(instance_type="p6-b200.48xlarge", nodes=1))
    assert inv.container_image == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert get_provider("aws").plan(spec_for()).launch.image == "nvcr.io/nvidia/pytorch:24.06-py3"


def test_an_image_too_old_for_blackwell_is_refused_at_plan_time(fakes, spec_for):
    with pytest.raises(UserInputError, match="need CUDA 12.8 or newer"):
        get_provider("aws").plan(spec_for(instance_type="p6-b200.48xlarge",
                                          image="nvcr.io/nvidia/pytorch:24.06-py3"))
    assert fakes.writes() == []


def test_up_takes_image_on_the_command_line_and_checks_it(fakes):
    """`up --image` (the YAML's `image:` before) is the nodes' training container, checked
    against the GPUs at plan time; in `run`, --image stays the job's own."""
    from typer.testing import CliRunner

    from provision.cli.app import app

    args = ["up", "--provider", "aws", "--instance-type", "p6-b200.48xlarge", "--nodes", "1",
            "--dry-run", "--image"]
    old = CliRunner().invoke(app, [*args, "nvcr.io/nvidia/pytorch:24.06-py3"])
    assert old.exit_code != 0 and "need CUDA 12.8 or newer" in old.output
    ok = CliRunner().invoke(app, [*args, "nvcr.io/nvidia/pytorch:25.09-py3"])
    assert ok.exit_code == 0, ok.output
    assert "image=nvcr.io/nvidia/pytorch:25.09-py3" in ok.output and fakes.writes() == []
    plain = CliRunner().invoke(app, args[:-1])
    assert "image=nvcr.io/nvidia/pytorch:25.01-py3" in plain.output  # without: the default
