"""Issue 42 (the mutation run): aws's check at deletion time (`teardown.Teardown.owned` and
`refuse`) says exactly whose a refused resource is, and a recorded resource EC2 no longer has
is dropped quietly, never a failure; under moto."""

from __future__ import annotations

import pytest

from provision.cluster.providers import get_provider
from provision.model.errors import TeardownError
from provision.model.inventory import ResourceRecord

REGION = "us-east-1"


def test_a_refusal_says_whose_it_is_and_a_gone_record_is_dropped(
        fakes, spec_for, store, up_cluster, moto_ec2) -> None:
    other = up_cluster(spec_for(name="c2", instance_type="g6.xlarge"))
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge"))
    theirs = next(r.id for r in other.resources if r.kind == "security-group")
    loose = moto_ec2.create_security_group(GroupName="loose", Description="x")["GroupId"]
    gone = moto_ec2.create_security_group(GroupName="gone", Description="x")["GroupId"]
    moto_ec2.delete_security_group(GroupId=gone)
    inv.resources += [ResourceRecord(kind="security-group", id=i, name=i, region=REGION)
                      for i in (theirs, loose, gone)]
    store.save(inv)
    with pytest.raises(TeardownError) as err:
        get_provider("aws").destroy(inv, store)
    said = err.value.message
    assert (f"refused to delete security-group {theirs}: it is tagged mgpu-cloud-cluster=c2, "
            "not mgpu-cloud-cluster=c1 (left alone; dropped from the inventory)") in said
    assert (f"refused to delete security-group {loose}: it is without the mgpu-cloud-cluster "
            "tag, not mgpu-cloud-cluster=c1 (left alone; dropped from the inventory)") in said
    assert gone not in said  # gone already: forgotten, not a problem
    assert not [r for r in inv.resources if r.id in (theirs, loose, gone)]
    get_provider("aws").destroy(inv, store)  # nothing of it left to refuse: it finishes
