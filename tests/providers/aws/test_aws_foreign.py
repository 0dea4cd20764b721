"""`down`, the controller's teardown from inside and `gc --delete` delete only what carries the
cluster's own tag at that moment (issue 34), under moto: an inventory (say, adopted from a
store a node could write) that names another cluster's instance, security group or role, or an
untagged one, ends in a refusal naming each; those survive, everything of the cluster goes,
and `down` stays safe to repeat."""

from __future__ import annotations

import pytest

from provision.cluster.providers import get_provider
from provision.cluster.providers.aws import clients
from provision.cluster.providers.aws.controller import controller_policy, create_identity
from provision.model.errors import TeardownError
from provision.model.inventory import ResourceRecord

REGION = "us-east-1"  # conftest.REGION


def _live(moto_ec2, iid: str) -> str:
    (inst,) = moto_ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    return str(inst["State"]["Name"])


def _untagged_instance(moto_ec2, fakes) -> str:
    (inst,) = moto_ec2.run_instances(ImageId=fakes.dlami, InstanceType="t3.small", MinCount=1,
                                     MaxCount=1)["Instances"]
    return str(inst["InstanceId"])


def _record(inv, kind: str, rid: str) -> None:
    inv.resources.append(ResourceRecord(kind=kind, id=rid, name=rid, region=REGION))


def test_down_refuses_what_another_cluster_or_nobody_tagged(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2) -> None:
    other = up_cluster(spec_for(name="c2", instance_type="g6.xlarge"))
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge"))
    theirs = {r.kind: r.id for r in other.resources}
    stray = _untagged_instance(moto_ec2, fakes)
    loose_sg = moto_ec2.create_security_group(GroupName="loose", Description="not ours")[
        "GroupId"]
    for kind in ("instance", "security-group", "key-pair"):
        _record(inv, kind, theirs[kind])
    _record(inv, "instance", stray)
    _record(inv, "security-group", loose_sg)
    store.save(inv)
    before = tagged("c2")

    with pytest.raises(TeardownError) as err:
        get_provider("aws").destroy(inv, store)
    for rid in (theirs["instance"], theirs["security-group"], theirs["key-pair"], stray,
                loose_sg):
        assert rid in err.value.message
    assert "mgpu-cloud-cluster=c2" in err.value.message and "without the" in err.value.message
    assert tagged("c2") == before and tagged("c1") == {}  # theirs survive, ours are gone
    assert _live(moto_ec2, theirs["instance"]) == "running" and _live(moto_ec2, stray) == "running"
    assert moto_ec2.describe_security_groups(GroupIds=[loose_sg])["SecurityGroups"]
    assert {w for w in fakes.writes()} >= {"TerminateInstances"}
    terminated = [i for p in fakes.calls("TerminateInstances") for i in p["InstanceIds"]]
    assert theirs["instance"] not in terminated and stray not in terminated
    deleted = [p["GroupId"] for p in fakes.calls("DeleteSecurityGroup")]
    assert theirs["security-group"] not in deleted and loose_sg not in deleted
    # the refused records are dropped: `down` again finishes, and still deletes nothing of c2
    get_provider("aws").destroy(inv, store)
    assert inv.resources == [] and tagged("c2") == before


def test_the_teardown_from_inside_refuses_them_too(fakes, spec_for, store, up_cluster, tagged,
                                                   moto_ec2) -> None:
    other = up_cluster(spec_for(name="c2", instance_type="g6.xlarge"))
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge", max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": "s3://ckpt-bucket/runs"})
    provider = get_provider("aws")
    provider.create_controller(inv, store)
    theirs = next(r.id for r in other.resources if r.kind == "instance")
    _record(inv, "instance", theirs)
    before = tagged("c2")
    with pytest.raises(TeardownError, match=theirs):
        provider.teardown_from_controller(inv, store)
    assert tagged("c2") == before and _live(moto_ec2, theirs) == "running"


def test_gc_delete_checks_the_tag_again_at_deletion(fakes, spec_for, store, up_cluster, tagged,
                                                    moto_ec2) -> None:
    """What `gc` listed is deleted only if it still carries that cluster's tag."""
    up_cluster(spec_for(name="lost", instance_type="g6.xlarge"))
    store.delete("lost")
    provider = get_provider("aws")
    spec = spec_for(name="gc-scope")
    found = provider.orphans(spec, known=set())
    retagged = next(r.id for r in found if r.kind == "instance")
    moto_ec2.create_tags(Resources=[retagged], Tags=[{"Key": "mgpu-cloud-cluster",
                                                      "Value": "c9"}])
    with pytest.raises(TeardownError, match=retagged):
        provider.delete_orphans(spec, found)
    assert _live(moto_ec2, retagged) == "running"
    # the rest of `lost` is gone, but what the surviving instance still holds: its root
    # volume (tagged `lost` at launch) and its placement group (in use)
    assert set(tagged("lost")) <= {"volume", "placement-group"} and "instance" not in tagged(
        "lost")


def test_down_refuses_another_clusters_controller_identity(fakes, spec_for, store,
                                                           up_cluster) -> None:
    iam = clients.make_client(clients.new_session(), "iam", REGION)
    create_identity(iam, "c2", controller_policy("c2", REGION, "123456789012", None),
                    lambda rec: None, account="123456789012")
    iam.create_role(RoleName="admin", AssumeRolePolicyDocument="{}")
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge"))
    inv.resources += [ResourceRecord(kind="iam-role", id="mgpu-ctl-c2", name="c1"),
                      ResourceRecord(kind="iam-instance-profile", id="mgpu-ctl-c2", name="c1"),
                      ResourceRecord(kind="iam-role", id="admin", name="c1")]
    with pytest.raises(TeardownError) as err:
        get_provider("aws").destroy(inv, store)
    assert "role mgpu-ctl-c2" in err.value.message and "role admin" in err.value.message
    assert {r["RoleName"] for r in iam.list_roles()["Roles"]} >= {"mgpu-ctl-c2", "admin"}
    assert iam.get_instance_profile(InstanceProfileName="mgpu-ctl-c2")["InstanceProfile"]
    get_provider("aws").destroy(inv, store)  # refused records dropped: it finishes
    assert inv.resources == []
