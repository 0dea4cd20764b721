"""`down`, the controller's teardown from inside and `gc --delete` delete only what Compute (and
IAM) show marked for the cluster at that moment (issue 34), against the fakes: an inventory
(say, adopted from a store a node could write) naming another cluster's VM, firewall rule or
service account, or an unmarked one, ends in a refusal naming each; those survive, everything
of the cluster goes, and `down` stays safe to repeat."""

from __future__ import annotations

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute
from fake_iam import FakeIam

from provision.cluster.providers import get_provider
from provision.cluster.providers.gcp import teardown
from provision.cluster.providers.gcp.controller import IamApi, create_identity
from provision.model.errors import TeardownError
from provision.model.inventory import CLUSTER_TAG

ZONE = "us-central1-a"


def _stray_vm(fake: FakeCompute, name: str) -> None:
    """A VM without the cluster label (someone else's, made by hand)."""
    model = dict(fake.instances[(PROJECT, ZONE, "c2-node-0")], name=name, labels={},
                 resourcePolicies=[])
    fake.instances[(PROJECT, ZONE, name)] = model


def test_down_refuses_what_another_cluster_or_nobody_marked(fake: FakeCompute, up, make_spec,
                                                            store) -> None:
    up(make_spec(name="c2"))
    inv = up(make_spec(name="c1"))
    _stray_vm(fake, "prod-db")
    fake.firewalls[(PROJECT, "default-allow-ssh")] = {"name": "default-allow-ssh",
                                                      "description": ""}
    inv.resources += [teardown.instance_record(PROJECT, ZONE, "c2-node-0"),
                      teardown.instance_record(PROJECT, ZONE, "prod-db"),
                      teardown.firewall_record(PROJECT, "c2-ssh"),
                      teardown.firewall_record(PROJECT, "default-allow-ssh")]
    store.save(inv)
    with pytest.raises(TeardownError) as err:
        get_provider("gcp").destroy(inv, store)
    for rid in ("instances/c2-node-0", "instances/prod-db", "firewalls/c2-ssh",
                "firewalls/default-allow-ssh"):
        assert rid in err.value.message
    assert f"{CLUSTER_TAG}=c2" in err.value.message and "no mgpu-cloud-cluster mark" in \
        err.value.message
    left = fake.all_resources()
    assert not [r for r in left if "c1-" in r]
    for survivor in (f"instance {ZONE}/c2-node-0", f"instance {ZONE}/prod-db",
                     "firewall c2-ssh", "firewall default-allow-ssh", "policy us-central1/c2-compact"):
        assert survivor in left
    assert not [r for r in fake.requests if r.method == "DELETE" and (
        "c2-" in r.path or "prod-db" in r.path or "default-allow" in r.path)]
    get_provider("gcp").destroy(inv, store)  # the refused records are dropped: it finishes
    assert inv.resources == [] and f"instance {ZONE}/c2-node-1" in fake.all_resources()


def test_the_teardown_from_inside_refuses_them_too(fake: FakeCompute, iam: FakeIam, up,
                                                   make_spec, store) -> None:
    up(make_spec(name="c2"))
    inv = up(make_spec(name="c1", max_hours=2))
    inv.spec = inv.spec.model_copy(update={"store": "gs://ckpt/runs"})
    provider = get_provider("gcp")
    provider.create_controller(inv, store)
    inv.resources.append(teardown.instance_record(PROJECT, ZONE, "c2-node-1"))
    with pytest.raises(TeardownError, match="c2-node-1"):
        provider.teardown_from_controller(inv, store)
    assert f"instance {ZONE}/c2-node-1" in fake.all_resources()


def test_gc_delete_checks_the_mark_again_at_deletion(fake: FakeCompute, up, make_spec,
                                                     store) -> None:
    up(make_spec(name="lost"))
    store.delete("lost")
    provider = get_provider("gcp")
    spec = make_spec(name="gc-scope")
    found = provider.orphans(spec, known=set())
    fake.instances[(PROJECT, ZONE, "lost-node-1")]["labels"] = {CLUSTER_TAG: "c9"}
    with pytest.raises(TeardownError, match="lost-node-1"):
        provider.delete_orphans(spec, found)
    assert f"instance {ZONE}/lost-node-1" in fake.all_resources()
    assert f"instance {ZONE}/lost-node-0" not in fake.all_resources()


def test_down_refuses_another_clusters_service_account(fake: FakeCompute, iam: FakeIam, up,
                                                       make_spec, store) -> None:
    theirs: list = []
    create_identity(IamApi(), PROJECT, ZONE, "c2", None, theirs.append)
    inv = up(make_spec(name="c1"))
    for rec in theirs:
        inv.resources.append(rec.model_copy(update={"name": "c1"}))
    with pytest.raises(TeardownError) as err:
        get_provider("gcp").destroy(inv, store)
    email = next(r.id for r in theirs if r.kind == "service-account")
    assert email in err.value.message and f"{CLUSTER_TAG}=c2" in err.value.message
    assert email in iam.accounts
    assert any(f"serviceAccount:{email}" in b["members"] for b in iam.policy["bindings"])
    assert not any(r.get("deleted") for r in iam.roles.values())
    get_provider("gcp").destroy(inv, store)
    assert inv.resources == []
