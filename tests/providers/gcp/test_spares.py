"""Warm spares against the Compute fake (issue 44): planned and priced with the cluster,
made by the same bulkInsert under the compact policy (its vmCount counts them), a spare
taking a rank, the lost VM deleted first, a new spare inserted under the policy, and `down`
leaving nothing. The rules layer checks every request and the policy's VM count."""

from __future__ import annotations

from collections.abc import Callable

from conftest import PROJECT
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers import get_provider, spares
from provision.cluster.providers.contract import KeepsSpares
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

BULK = r"zones/us-central1-a/instances/bulkInsert$"
INSERT = r"zones/us-central1-a/instances$"


def test_spares_come_with_the_cluster_and_a_new_one_is_made_under_the_same_policy(
        fake: FakeCompute, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        gcp_rules_layer: object) -> None:
    spec = make_spec(max_hours=2, spares=1)
    provider = get_provider("gcp")
    assert isinstance(provider, KeepsSpares)
    plan = provider.plan(spec)
    assert (plan.nodes, plan.spares) == (3, 1) and plan.node_hourly_usd
    assert "2 node(s) + 1 warm spare(s)" in plan.render()
    assert f"spares: 1 x ${plan.node_hourly_usd:,.2f}/h" in plan.render()
    inv = up(spec)
    (bulk,) = (r.body for r in fake.sent("POST", BULK))
    assert int(bulk["count"]) == int(bulk["minCount"]) == 3  # one all-or-nothing call
    assert [n.name for n in inv.nodes] == ["node-0", "node-1"]
    assert [(s.name, s.resource_id) for s in inv.spares] == [("node-2", "c1-node-2")]
    lost, spare = inv.nodes[1], inv.spares[0]
    provider.promote(inv, store, spare, lost)
    start = len(fake.requests)
    provider.retire(inv, store, lost)
    made = provider.make_spare(inv, store, spares.next_spare(inv, lost))
    writes = [(r.method, r.path) for r in fake.requests[start:]
              if r.method in ("POST", "DELETE") and not r.path.endswith("/wait")]
    assert writes == [("DELETE", f"projects/{PROJECT}/zones/us-central1-a/instances/c1-node-1"),
                      ("POST", f"projects/{PROJECT}/zones/us-central1-a/instances")]
    (again,) = (r.body for r in fake.sent("POST", INSERT))
    assert again["name"] == "c1-node-3"
    assert again["resourcePolicies"] == ["regions/us-central1/resourcePolicies/c1-compact"]
    assert (made.name, made.rank, made.resource_id) == ("node-3", 3, "c1-node-3")
    assert made.host_key == fake.host_keys[(PROJECT, "us-central1-a", "c1-node-3")][
        "ssh-ed25519"]
    assert [n.resource_id for n in inv.nodes] == ["c1-node-0", "c1-node-2"]
    assert sorted(k[2] for k in fake.instances) == ["c1-node-0", "c1-node-2", "c1-node-3"]
    gcp_rules_layer.after_create()  # type: ignore[attr-defined]  # vmCount holds again
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == [] and not store.exists("c1")
