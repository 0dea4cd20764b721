"""The AWS controller instance (issue 18) under moto: made with its identity at the first
managed hand-off (recorded as each id exists), deleted by `down`, rolled back, found by `gc`;
the teardown from inside leaves only the controller and its identity, its removal revokes
the role; every call a replacement, the teardown from inside and the removal make is allowed
by the policy as SENT (aws_policy_guard), and the policy obeys iam_rules."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import aws_iam_rules as iam_rules
import pytest
import yaml
from aws_policy_guard import Ec2State, PolicyGuard

from provision.cluster.providers import get_provider
from provision.cluster.providers.aws import clients
from provision.cluster.providers.aws.controller_vm import is_controller, remove_self
from provision.cluster.providers.contract import Supervising
from provision.cluster.providers.controller_boot import READY, packages
from provision.model.inventory import Inventory

REGION = "us-east-1"  # conftest.REGION
ACCOUNT = "123456789012"  # moto's
STORE = "s3://ckpt-bucket/runs"


def _up(up_cluster, spec_for, **aws) -> Inventory:
    inv = up_cluster(spec_for(instance_type="g6.xlarge", max_hours=2, **aws))
    inv.spec = inv.spec.model_copy(update={"store": STORE})
    return inv


def _controller_run(fakes) -> dict:
    (run,) = [p for p in fakes.calls("RunInstances") if p.get("IamInstanceProfile")]
    return run


def _policy(fakes) -> dict:
    (sent,) = fakes.calls("PutRolePolicy")
    return json.loads(sent["PolicyDocument"])


def _user_data(run: dict) -> str:
    raw = run["UserData"]
    return raw if raw.startswith("#cloud-config") else base64.b64decode(raw).decode()


def test_the_controller_is_a_small_instance_beside_the_nodes_with_its_identity(
        fakes, spec_for, store, up_cluster, moto_ec2) -> None:
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    assert isinstance(provider, Supervising)
    ctl = provider.create_controller(inv, store)

    run = _controller_run(fakes)
    node_run = next(p for p in fakes.calls("RunInstances") if not p.get("IamInstanceProfile"))
    assert run["InstanceType"] == "t3.small" and run["MinCount"] == run["MaxCount"] == 1
    assert run["IamInstanceProfile"] == {"Name": "mgpu-ctl-c1"}
    assert "GroupName" not in run["Placement"]  # never in the placement group
    assert run["Placement"]["AvailabilityZone"] == inv.nodes[0].zone
    assert run["ImageId"] != node_run["ImageId"] and "KeyName" not in run  # its own image
    # and login key (test_aws_controller_boot.py)
    sg = next(r.id for r in inv.resources_of("security-group"))
    (iface,) = run["NetworkInterfaces"]
    assert iface["Groups"] == [sg] and iface["AssociatePublicIpAddress"] is True
    assert run["InstanceInitiatedShutdownBehavior"] == "terminate"
    # recorded: identity first, then the instance (role=controller), in the saved inventory
    saved = store.load("c1")
    kinds = [r.kind for r in saved.resources if r.kind.startswith("iam") or is_controller(r)]
    assert kinds == ["iam-role", "iam-instance-profile", "instance"]
    rec = next(r for r in saved.resources if is_controller(r))
    assert rec.id == ctl.resource_id and rec.extra["ready_file"] == READY
    # its own host key, read from ITS console; reached at its public address
    assert ctl.host_key == fakes.host_key(ctl.resource_id)
    (inst,) = moto_ec2.describe_instances(InstanceIds=[ctl.resource_id])["Reservations"][0][
        "Instances"]
    assert ctl.address == inst["PublicIpAddress"]
    assert ctl.private_address == inst["PrivateIpAddress"] and ctl.user == "ubuntu"
    assert "PRIVATE KEY" not in _user_data(run)
    policy = _policy(fakes)
    assert iam_rules.check_policy("c1", policy, "runs/c1") == []
    subnet = inv.resources_of("instance")[0].extra["subnet"]
    assert f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/{subnet}" in json.dumps(policy)


def test_the_controller_type_is_overridable(fakes, spec_for, store, up_cluster) -> None:
    inv = _up(up_cluster, spec_for, controller_type="t3.medium")
    get_provider("aws").create_controller(inv, store)
    assert _controller_run(fakes)["InstanceType"] == "t3.medium"


def test_its_boot_installs_what_the_supervisor_imports(fakes, spec_for, store,
                                                       up_cluster) -> None:
    inv = _up(up_cluster, spec_for)
    get_provider("aws").create_controller(inv, store)
    data = yaml.safe_load(_user_data(_controller_run(fakes)))
    assert data["ssh_deletekeys"] is True and data["ssh_genkeytypes"] == ["ed25519"]
    assert "--on-active=" in data["bootcmd"][0][2]  # dies with the cluster's --max-hours
    (script,) = [f["content"] for f in data["write_files"]
                 if f["path"] == "/usr/local/sbin/mgpu-cloud-controller-setup"]
    assert data["runcmd"][0][:2] == ["systemd-run", "--unit=mgpu-cloud-controller-setup"]
    import boto3
    import pydantic

    for pin in (f"boto3=={boto3.__version__}", f"pydantic=={pydantic.VERSION}"):
        assert pin in script  # the versions installed here, whose code the hand-off uploads
    assert "import pydantic, yaml, jinja2, tenacity, fabric, paramiko, boto3" in script
    assert READY in script
    if shutil.which("sh"):
        subprocess.run(["sh", "-n"], input=script.encode(), check=True)


def test_gcs_store_adds_its_client_to_the_packages() -> None:
    names = [p.split("==")[0] for p, _ in packages("aws", "gs")]
    assert "google-cloud-storage" in names and "boto3" in names
    assert len(names) == len(set(names))


def test_down_deletes_the_controller_and_its_identity(fakes, spec_for, store, up_cluster,
                                                      tagged) -> None:
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    provider.create_controller(inv, store)
    provider.destroy(inv, store)
    assert inv.resources == [] and tagged("c1") == {}
    iam = clients.make_client(clients.new_session(), "iam", REGION)
    assert iam.list_roles(PathPrefix="/mgpu-cloud/")["Roles"] == []
    assert iam.list_instance_profiles(PathPrefix="/mgpu-cloud/")["InstanceProfiles"] == []


def test_a_controller_that_cannot_launch_is_rolled_back(fakes, spec_for, store, up_cluster,
                                                        tagged) -> None:
    inv = _up(up_cluster, spec_for)
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", 500,
               when=lambda p: bool(p.get("IamInstanceProfile")))
    provider = get_provider("aws")
    with pytest.raises(Exception, match="InsufficientInstanceCapacity"):
        provider.create_controller(inv, store)
    kinds = {r.kind for r in store.load("c1").resources}
    assert {"iam-role", "iam-instance-profile"} <= kinds  # recorded before the launch
    provider.destroy(inv, store)  # what the hand-off's caller runs on failure (`down`)
    assert inv.resources == [] and tagged("c1") == {}


def test_gc_collects_a_controller_no_inventory_knows(fakes, spec_for, store, up_cluster,
                                                     tagged, moto_ec2) -> None:
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    ctl = provider.create_controller(inv, store)
    spec = spec_for(name="gc-scope")
    found = provider.orphans(spec, known=set())
    assert ("instance", ctl.resource_id) in {(r.kind, r.id) for r in found}
    assert {"iam-role", "iam-instance-profile"} <= {r.kind for r in found}
    provider.delete_orphans(spec, found)
    assert tagged() == {} and provider.orphans(spec, known=set()) == []


def _guard(fakes, moto_ec2) -> PolicyGuard:
    return PolicyGuard(_policy(fakes), REGION, ACCOUNT,
                       Ec2State(moto_ec2, fakes.placement_groups))


def test_a_replacement_makes_only_calls_the_policy_allows(fakes, spec_for, store,
                                                          up_cluster, moto_ec2) -> None:
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    provider.create_controller(inv, store)
    guard = _guard(fakes, moto_ec2)
    remove = clients.add_client_hook(guard.attach)
    try:
        provider.replace(inv, store, inv.nodes[1])
    finally:
        remove()
    assert {"RunInstances", "TerminateInstances", "GetConsoleOutput"} <= set(guard.checked)
    assert guard.violations == []


def test_the_guard_catches_a_policy_without_console_output(fakes, spec_for, store,
                                                           up_cluster, moto_ec2) -> None:
    """The audit's finding: without ec2:GetConsoleOutput a replacement cannot pin its key."""
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    provider.create_controller(inv, store)
    guard = _guard(fakes, moto_ec2)
    for st in guard.policy["Statement"]:
        if "ec2:GetConsoleOutput" in st["Action"]:
            st["Action"] = [a for a in st["Action"] if a != "ec2:GetConsoleOutput"]
    remove = clients.add_client_hook(guard.attach)
    try:
        provider.replace(inv, store, inv.nodes[1])
    finally:
        remove()
    assert any("ec2:GetConsoleOutput" in v for v in guard.violations), guard.violations


def test_replacing_into_a_reservation_is_allowed_only_for_that_reservation(fakes) -> None:
    from aws_policy_guard import allows

    from provision.cluster.providers.aws.controller import controller_policy

    doc = controller_policy("c1", REGION, ACCOUNT, None, reservations=["cr-0abc"])
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/"
    assert allows(doc, "ec2:RunInstances", arn + "cr-0abc", {})
    assert not allows(doc, "ec2:RunInstances", arn + "cr-0other", {})
    assert iam_rules.check_policy("c1", doc, None) == []


def test_teardown_from_inside_leaves_only_the_controller_and_is_allowed(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2) -> None:
    inv = _up(up_cluster, spec_for)
    provider = get_provider("aws")
    ctl = provider.create_controller(inv, store)
    guard = _guard(fakes, moto_ec2)
    remove = clients.add_client_hook(guard.attach)
    try:
        provider.teardown_from_controller(inv, store)
    finally:
        remove()
    assert guard.violations == []
    assert {"TerminateInstances", "DeleteSecurityGroup", "DeleteKeyPair",
            "ModifyInstanceAttribute", "DeletePlacementGroup"} <= set(guard.checked)
    left = tagged("c1")
    assert left.get("instance") == [ctl.resource_id]
    assert "security-group" not in left and "key-pair" not in left
    inst = moto_ec2.describe_instances(InstanceIds=[ctl.resource_id])["Reservations"][0][
        "Instances"][0]
    (default,) = moto_ec2.describe_security_groups(Filters=[
        {"Name": "vpc-id", "Values": [inst["VpcId"]]},
        {"Name": "group-name", "Values": ["default"]}])["SecurityGroups"]
    assert [g["GroupId"] for g in inst["SecurityGroups"]] == [default["GroupId"]]
    kinds = sorted(r.kind for r in store.load("c1").resources)
    assert kinds == ["iam-instance-profile", "iam-role", "instance"]
    provider.teardown_from_controller(inv, store)  # idempotent


def test_the_controller_removes_its_profile_revokes_its_role_and_powers_off(
        fakes, spec_for, store, up_cluster, moto_ec2) -> None:
    inv = _up(up_cluster, spec_for)
    get_provider("aws").create_controller(inv, store)
    guard = _guard(fakes, moto_ec2)
    off: list[bool] = []
    remove = clients.add_client_hook(guard.attach)
    try:
        remove_self(inv, REGION, power_off=lambda: off.append(True))
    finally:
        remove()
    assert off == [True] and guard.violations == []
    iam = clients.make_client(clients.new_session(), "iam", REGION)
    assert iam.list_instance_profiles(PathPrefix="/mgpu-cloud/")["InstanceProfiles"] == []
    assert iam.list_role_policies(RoleName="mgpu-ctl-c1")["PolicyNames"] == []
    # what is left (the empty role) goes with the user's next `down` (or `gc`)
    get_provider("aws").destroy(inv, store)
    assert iam.list_roles(PathPrefix="/mgpu-cloud/")["Roles"] == []


def test_after_the_controller_removed_itself_the_next_jobs_runs_down(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2) -> None:
    """An IAM role cannot delete itself: the user's side finishes (client.forget_if_torn_down,
    run by `jobs`/`logs` once the job's records say torn_down)."""
    from provision.job.managed.client import forget_if_torn_down
    from provision.model.keys import ensure_records_key

    inv = _up(up_cluster, spec_for)
    ensure_records_key(store.keys_dir("c1"))  # the hand-off made it: records are checked
    provider = get_provider("aws")
    ctl = provider.create_controller(inv, store)
    store.save(inv)
    provider.teardown_from_controller(inv, store)
    remove_self(inv, REGION, power_off=lambda: moto_ec2.terminate_instances(
        InstanceIds=[ctl.resource_id]))
    assert forget_if_torn_down("c1", [{"torn_down": True}])
    assert not store.exists("c1") and tagged("c1") == {}
    iam = clients.make_client(clients.new_session(), "iam", REGION)
    assert iam.list_roles(PathPrefix="/mgpu-cloud/")["Roles"] == []


def test_a_profile_ec2_does_not_see_yet_is_waited_for(fakes, spec_for, store,
                                                      up_cluster) -> None:
    """IAM is eventually consistent: RunInstances may not know a just-made profile."""
    inv = _up(up_cluster, spec_for)
    fakes.fail("RunInstances", "InvalidParameterValue",
               when=lambda p: bool(p.get("IamInstanceProfile")), times=2)
    ctl = get_provider("aws").create_controller(inv, store)
    assert ctl.resource_id and len([p for p in fakes.calls("RunInstances")
                                    if p.get("IamInstanceProfile")]) == 3
