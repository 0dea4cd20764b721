"""The AWS controller instance (issue 18; docs/ARCHITECTURE.md, managed runs): the machine that
supervises managed runs, made at the cluster's first managed hand-off.

    identity          controller.py: role + cluster-only inline policy + instance profile,
                      made first (the policy names the subnets, the parking group and the
                      reservations this cluster uses: `policy_for`)
    instance          ONE `AwsOptions.controller_type` (t3.small: 2 vCPUs and 2 GiB run the
                      supervisor's python, boto3 and an SSH fan-out to the nodes for ~$0.02/h),
                      from an image of its own: Ubuntu 24.04 LTS (Canonical's public SSM
                      parameter, amd64 or arm64 as the type's architecture), whose python3 is
                      3.12. Not the nodes' AMI: the Ubuntu 22.04 Deep Learning AMI has
                      python3.10, older than the code's 3.11 (datetime.UTC); its cloud-init
                      prints host keys on the console like the nodes'. In node-0's zone's
                      default subnet with a public address (the nodes' private subnet under
                      --private-ips would have to be deleted from inside while the controller
                      sits in it) and in the cluster's security group (SSH from the caller's
                      range; all traffic within the group reaches the nodes' private
                      addresses), NOT in the placement group, with the instance profile, a
                      power-off (= terminate) at the cluster's --max-hours and the set-up of
                      controller_boot.py in its user data; recorded (kind `instance`, extra
                      role=controller) the moment its id exists
    login             the controller's OWN key (keys.ensure_controller_key), authorized by its
                      user data alone: no key pair, so the cluster key the nodes hold does not
                      log in to it
    host key          read from its console and pinned, as the nodes' (hostkeys.py)

From inside (its own instance profile's credentials): `teardown_from_inside` deletes the cluster
but itself (teardown.Teardown with the controller kept; before the security group goes, the
controller moves to the VPC's default group: `park`), then `remove_self` deletes its instance
profile, revokes its role's policy and powers off (terminate on instance-initiated shutdown).
An IAM role cannot delete itself (its last policy is what would allow DeleteRole), so the empty
role is left to the user's side: the next `jobs`/`logs` of the cluster runs `down`
(client.forget_if_torn_down), and `gc` finds it by its path and tag.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.api import Ec2, client_token, tag_spec
from provision.cluster.providers.aws.controller import (
    POLICY_NAME,
    controller_policy,
    role_arn,
    role_name,
)
from provision.cluster.providers.aws.errors import error_code
from provision.cluster.providers.aws.request import NODE_USER
from provision.cluster.providers.controller_boot import READY
from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from remote.store import parse_url

ROLE = "controller"
# Canonical's public SSM parameters of the current Ubuntu 24.04 LTS server AMI ("Find Ubuntu
# images on AWS", Canonical's AWS documentation); ARCH is amd64 or arm64.
IMAGE_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
# RunInstances answers this while a just-made instance profile is not visible to EC2 yet (IAM
# is eventually consistent: "Troubleshoot IAM roles", IAM User Guide)
PROFILE_NOT_READY = "InvalidParameterValue"
PROFILE_WAIT_S = 60.0


def is_controller(rec: ResourceRecord) -> bool:
    return rec.kind == "instance" and rec.extra.get("role") == ROLE


def node_instances(inv: Inventory) -> list[ResourceRecord]:
    return [r for r in inv.resources_of("instance") if not is_controller(r)]


def _security_group(inv: Inventory) -> str:
    sg = next((r.id for r in inv.resources_of("security-group")), None)
    if sg is None:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory names no security group",
                             hint=f"recreate the cluster: mgpu-cloud down {inv.name}, then up")
    return sg


def _reservations(inv: Inventory) -> list[str]:
    found = {r.extra["reservation"] for r in node_instances(inv) if r.extra.get("reservation")}
    found |= {r.id for r in inv.resources_of("capacity-block")}
    return sorted(found)


def launch_site(ec2: Ec2, inv: Inventory) -> dict[str, str]:
    """Node-0's zone, that zone's default subnet and the VPC's default security group (where
    the controller parks at the end)."""
    nodes = node_instances(inv)
    first = next((r for r in nodes if r.extra.get("subnet") and r.zone), None)
    if first is None:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory does not say where its "
                             "nodes were launched (subnet, zone)")
    zone, node_subnet = str(first.zone), first.extra.get("subnet", "")
    (vpc,) = {s["VpcId"] for s in ec2.get("describe_subnets", "Subnets",
                                           SubnetIds=[node_subnet])}
    default = ec2.get("describe_subnets", "Subnets", Filters=[
        {"Name": "vpc-id", "Values": [vpc]}, {"Name": "availability-zone", "Values": [zone]},
        {"Name": "default-for-az", "Values": ["true"]}])
    park = ec2.get("describe_security_groups", "SecurityGroups", Filters=[
        {"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}])
    if not default or not park:
        raise ProvisionError(f"the VPC {vpc} of cluster {inv.name!r} has no default subnet in "
                             f"{zone} or no default security group for the controller")
    return {"zone": zone, "subnet": str(default[0]["SubnetId"]),
            "park": str(park[0]["GroupId"]),
            "node_subnets": ",".join(sorted({r.extra.get("subnet", "") for r in nodes} - {""}))}


def policy_for(inv: Inventory, ec2: Ec2, account: str, site: dict[str, str]) -> dict[str, Any]:
    store = parse_url(inv.spec.store) if inv.spec and inv.spec.store else None
    return controller_policy(inv.name, ec2.region, account, store,
                             subnets=site["node_subnets"].split(","), park_group=site["park"],
                             reservations=_reservations(inv))


def user_data(inv: Inventory, max_seconds: int, login_key: str) -> str:
    """Cloud-init user data: host keys printed on the console, the set-up, the power-off,
    and `login_key` (the controller's own public key) as the only authorized key."""
    from provision.cluster.providers.controller_boot import setup_script
    from provision.model.render import render

    scheme = parse_url(inv.spec.store).scheme if inv.spec and inv.spec.store else None
    max_seconds = max(60, max_seconds)
    return render("aws/controller-user-data.yaml.j2", cluster=inv.name,
                  max_hours=f"{max_seconds / 3600:g}", max_seconds=max_seconds,
                  max_minutes=max(1, max_seconds // 60), login_key=login_key,
                  setup=setup_script(inv.name, "aws", scheme))


def controller_image(ec2: Ec2, itype: str) -> str:
    """The current Ubuntu 24.04 AMI of the type's architecture (arm64 for Graviton)."""
    (info,) = ec2.get("describe_instance_types", "InstanceTypes", InstanceTypes=[itype])
    archs = (info.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    arch = "amd64" if "x86_64" in archs else "arm64" if "arm64" in archs else None
    if arch is None:
        raise ProvisionError(f"the controller type {itype} runs neither x86_64 nor arm64",
                             hint="pick another aws.controller_type (default t3.small)")
    return ec2.ssm_parameter(IMAGE_PARAMETER.format(arch=arch))


def run_params(inv: Inventory, site: dict[str, str], itype: str, sg: str, profile: str,
               data: str) -> dict[str, Any]:
    """No KeyName: the cluster's key pair is the nodes' login; the user data authorizes the
    controller's own key instead."""
    return {
        "ImageId": site["ami"], "InstanceType": itype, "MinCount": 1, "MaxCount": 1,
        "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": site["subnet"], "Groups": [sg],
                               "AssociatePublicIpAddress": True,
                               "DeleteOnTermination": True}],
        "Placement": {"AvailabilityZone": site["zone"]},  # no placement group
        "IamInstanceProfile": {"Name": profile},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": data,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": (tag_spec("instance", inv.name) + tag_spec("volume", inv.name)
                              + tag_spec("network-interface", inv.name)),
        # one per controller made: the transient retries of this call share it
        "ClientToken": client_token(inv.name, ROLE, uuid.uuid4().hex),
    }


def _run(ec2: Ec2, params: dict[str, Any]) -> dict[str, Any]:
    """RunInstances, retried while EC2 does not see the new instance profile yet."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + PROFILE_WAIT_S
    while True:
        try:
            (inst,) = ec2.get("run_instances", "Instances", **params)
            return dict(inst)
        except ClientError as exc:
            if error_code(exc) != PROFILE_NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(max(retry.policy().poll_interval_s, 0.0))


def _wait_running(ec2: Ec2, iid: str) -> dict[str, Any]:
    p = retry.policy()
    deadline = time.monotonic() + p.launch_timeout_s
    while True:
        (inst,) = ec2.instances([{"Name": "instance-id", "Values": [iid]}]) or [{}]
        state = (inst.get("State") or {}).get("Name")
        if state == "running":
            return inst
        if state in ("shutting-down", "terminated", "stopped") or time.monotonic() > deadline:
            raise ProvisionError(f"the controller {iid} did not start ({state})")
        time.sleep(p.poll_interval_s)


def create_controller(inv: Inventory, store: InventoryStore, region: str) -> NodeRecord:
    """Identity, then the instance (each recorded as it exists), then its pinned host key.
    Raises (botocore or ProvisionError) without cleaning up: `down` deletes the records."""
    from provision.cluster.providers.aws.clients import make_client
    from provision.cluster.providers.aws.controller import create_identity
    from provision.cluster.providers.aws.hostkeys import wait_host_keys
    from provision.cluster.providers.aws.options import AwsOptions
    from provision.cluster.providers.aws.plan import DEFAULT_MAX_HOURS
    from provision.cluster.providers.lifetime import remaining_seconds
    from provision.model.keys import ensure_controller_key

    assert inv.spec is not None
    ec2 = Ec2(region)
    site = launch_site(ec2, inv)
    itype = inv.spec.options_as(AwsOptions).controller_type
    site["ami"] = controller_image(ec2, itype)
    _, login_key = ensure_controller_key(store.keys_dir(inv.name))
    sg = _security_group(inv)
    account = str(make_client(ec2.session, "sts", region).get_caller_identity()["Account"])
    profile = create_identity(make_client(ec2.session, "iam", region), inv.name,
                              policy_for(inv, ec2, account, site),
                              lambda rec: store.record(inv, rec), account=account)
    left = remaining_seconds(inv, inv.spec.max_hours or DEFAULT_MAX_HOURS)
    inst = _run(ec2, run_params(inv, site, itype, sg, profile,
                                user_data(inv, left, login_key)))
    iid = str(inst["InstanceId"])
    store.record(inv, ResourceRecord(
        kind="instance", id=iid, name=f"{inv.name}-controller", region=region,
        zone=site["zone"], extra={"role": ROLE, "park": site["park"], "ready_file": READY,
                                  # the role it may assume to mint the nodes' store
                                  # credentials (nodecreds.py): its own
                                  "role_arn": role_arn(account, inv.name)}))
    inst = _wait_running(ec2, iid)
    host_key = wait_host_keys(ec2, {iid: "controller"})[iid]
    private = str(inst.get("PrivateIpAddress") or "")
    public = str(inst.get("PublicIpAddress") or "")
    opts = inv.spec.options_as(AwsOptions)
    address = private if opts.private_ips else public  # reached like the nodes are
    if not address or not private:
        raise ProvisionError(f"the controller {iid} has no address to reach it on")
    return NodeRecord(name="controller", rank=-1, address=address, private_address=private,
                      user=NODE_USER, slots=0, host_key=host_key, resource_id=iid,
                      zone=site["zone"])


def _own(inv: Inventory) -> ResourceRecord | None:
    me = inv.controller.resource_id if inv.controller is not None else None
    return next((r for r in inv.resources if is_controller(r) and r.id == me), None) or \
        next((r for r in inv.resources if is_controller(r)), None)


IDENTITY_KINDS = ("iam-role", "iam-instance-profile")


def teardown_from_inside(inv: Inventory, store: InventoryStore, region: str) -> None:
    """Everything of the cluster but the controller and its identity. Idempotent;
    TeardownError naming what is left."""
    from provision.cluster.providers.aws.teardown import Teardown

    own = _own(inv)
    ec2 = Ec2(region)
    keep = {own.id} if own is not None else set()
    records = [r for r in inv.resources if r.id not in keep and r.kind not in IDENTITY_KINDS]

    def forget(pairs: list[tuple[str, str]]) -> None:
        for kind, rid in pairs:
            store.forget(inv, kind, rid)

    def park() -> None:
        if own is not None and own.extra.get("park"):
            ec2.call("modify_instance_attribute", InstanceId=own.id,
                     Groups=[own.extra["park"]])

    Teardown(ec2, inv.name, records, forget, keep=keep, before_security_groups=park).run()


def remove_self(inv: Inventory, region: str,
                power_off: Callable[[], None] | None = None) -> None:
    """Delete the instance profile, revoke the role's policy (its own credentials then grant
    nothing), power off (= terminate). Best effort up to the power-off, which always runs."""
    from botocore.exceptions import ClientError

    from provision.cluster.providers.aws.clients import make_client, new_session

    name = role_name(inv.name)
    iam = make_client(new_session(), "iam", region)
    steps: list[Callable[[], Any]] = [
        lambda: iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name),
        lambda: iam.delete_instance_profile(InstanceProfileName=name),
        lambda: iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME),
    ]
    for step in steps:
        with contextlib.suppress(ClientError):
            step()
    (power_off or _power_off)()


def _power_off() -> None:
    subprocess.run(["sudo", "-n", "systemctl", "poweroff"], check=False)
