"""Issue 42 (the mutation run): gcp's check before every deletion (`teardown.owner`: whether the
resource exists and the cluster Compute marks it for, read now) for every kind, in the
record's own project, and an API error while reading is a TeardownError naming what was being
read, never a deletion. Against the GCE fake over HTTP (the real client)."""

from __future__ import annotations

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute

from provision.cluster.providers.gcp import teardown
from provision.cluster.providers.gcp.clients import build_clients
from provision.model.errors import TeardownError
from provision.model.inventory import CLUSTER_TAG, ResourceRecord

OTHER = "other-proj"
REGION = "us-central1"
ZONE = "us-central1-a"
MARK = "mgpu-cloud-cluster=c1 made by mgpu-cloud"


def _described(fake: FakeCompute, project: str, description: str) -> None:
    fake.firewalls[(project, "fw")] = {"name": "fw", "description": description}
    fake.policies[(project, REGION, "pol")] = {"name": "pol", "description": description}
    fake.networks[(project, "net")] = {"name": "net", "description": description}
    fake.subnetworks[(project, REGION, "sub")] = {"name": "sub", "description": description,
                                                  "region": REGION}


def _records(project: str) -> dict[str, ResourceRecord]:
    return {"firewall": teardown.firewall_record(project, "fw"),
            "policy": teardown.policy_record(project, REGION, "pol"),
            "network": teardown.network_record(project, "net"),
            "subnetwork": teardown.subnetwork_record(project, REGION, "sub")}


@pytest.mark.parametrize("kind", ["firewall", "policy", "network", "subnetwork"])
def test_each_kind_is_read_in_its_own_project(fake: FakeCompute, kind: str) -> None:
    clients = build_clients(PROJECT)
    _described(fake, PROJECT, "mgpu-cloud-cluster=c2 made by mgpu-cloud")
    _described(fake, OTHER, MARK)  # the same names elsewhere: the record's project decides
    assert teardown.owner(clients, _records(OTHER)[kind]) == (True, "c1")
    assert teardown.owner(clients, _records(PROJECT)[kind]) == (True, "c2")
    _described(fake, PROJECT, "made by hand")
    assert teardown.owner(clients, _records(PROJECT)[kind]) == (True, None)
    assert teardown.owner(clients, _records("nowhere-proj")[kind]) == (False, None)


def test_an_instance_by_its_label(fake: FakeCompute) -> None:
    clients = build_clients(PROJECT)
    fake.instances[(PROJECT, ZONE, "vm")] = {"name": "vm", "labels": {CLUSTER_TAG: "c1"}}
    fake.instances[(OTHER, ZONE, "vm")] = {"name": "vm", "labels": {}}
    assert teardown.owner(clients, teardown.instance_record(PROJECT, ZONE, "vm")) == (True, "c1")
    assert teardown.owner(clients, teardown.instance_record(OTHER, ZONE, "vm")) == (True, None)
    assert teardown.owner(clients, teardown.instance_record(PROJECT, ZONE, "gone")) == (
        False, None)


@pytest.mark.parametrize(("kind", "path"), [
    ("firewall", "/firewalls/fw"), ("policy", "/resourcePolicies/pol"),
    ("network", "/networks/net"), ("subnetwork", "/subnetworks/sub"),
    ("instance", "/instances/vm")])
def test_an_error_while_reading_is_a_teardown_error_naming_it(
        fake: FakeCompute, kind: str, path: str) -> None:
    clients = build_clients(PROJECT)
    _described(fake, PROJECT, MARK)
    fake.instances[(PROJECT, ZONE, "vm")] = {"name": "vm", "labels": {CLUSTER_TAG: "c1"}}
    rec = (teardown.instance_record(PROJECT, ZONE, "vm") if kind == "instance"
           else _records(PROJECT)[kind])
    fake.fail("GET", path, 403, times=10)
    with pytest.raises(TeardownError) as err:
        teardown.owner(clients, rec)
    assert f"reading {rec.kind} {rec.id} before deleting it" in err.value.message


def test_a_description_mark_and_nothing_else() -> None:
    assert teardown.description_owner("mgpu-cloud-cluster=c1 made by mgpu-cloud") == "c1"
    assert teardown.description_owner("mgpu-cloud-cluster=") is None
    assert teardown.description_owner("mgpu-cloud-cluster= c1") is not None
    assert teardown.description_owner("made by hand mgpu-cloud-cluster=c1") is None


def test_a_record_without_its_project_is_read_in_the_clients_and_an_unknown_kind_refused(
        fake: FakeCompute) -> None:
    clients = build_clients(PROJECT)
    _described(fake, PROJECT, MARK)
    bare = ResourceRecord(kind="firewall", id=f"projects/{PROJECT}/global/firewalls/fw",
                          name="fw")  # an older inventory's record: no project in `extra`
    assert teardown.owner(clients, bare) == (True, "c1")
    with pytest.raises(TeardownError, match="bucket"):
        teardown.owner(clients, ResourceRecord(kind="bucket", id="b", name="b"))
