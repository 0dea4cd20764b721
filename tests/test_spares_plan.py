"""What a plan says of warm spares (issue 44): their cost and what they save
(cluster/providers/spares.py), and the providers and jobs that refuse them, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest
from sparekit import MemoryCloud

from provision.cluster.providers import spares
from provision.cluster.providers.contract import Provider
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, InventoryStore, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec, build_cluster_spec


class Machines(Provider[Plan]):
    """Like the ssh provider: existing machines, no spares, no replacement."""

    name = "docker"
    spares_refused = "uses machines you already have: it cannot make one more"

    def plan_class(self) -> type[Plan]:
        return Plan

    def _plan(self, spec: ClusterSpec) -> Plan:
        raise AssertionError("refused before the provider is asked")

    def _create(self, spec: ClusterSpec, plan: Plan, inv: Inventory,
                store: InventoryStore) -> None:
        return None

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        return None

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None


def test_a_provider_without_spares_refuses_them_at_plan_time_saying_why() -> None:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 2, "spares": 1})
    with pytest.raises(UserInputError, match="--spares 1: the docker provider keeps no "
                                             "spares: it uses machines you already have"):
        Machines().plan(spec)


def test_the_plan_says_what_the_spares_cost_and_save_at_the_assumed_failure_rate() -> None:
    """64 nodes at $98.32/h with 2 spares, a replacement assumed to take 10 min: the plan
    counts 64 ranks + 2 spares, prices them (2 x $98.32/h, in the total), names the failure
    rate it assumes and its source, and says what a failure a spare takes saves."""
    cloud = MemoryCloud()
    cloud._plan = lambda spec: Plan(  # type: ignore[method-assign]
        provider="docker", cluster=spec.name, nodes=spec.nodes, slots_per_node=8,
        hourly_cost_usd=round(98.32 * spec.nodes, 2), node_hourly_usd=98.32)
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 64, "spares": 2})
    plan = cloud.plan(spec)
    assert (plan.nodes, plan.spares, plan.hourly_cost_usd) == (66, 2, round(98.32 * 66, 2))
    text = plan.render()
    assert "64 node(s) + 2 warm spare(s) x 8 slot(s)" in text
    assert "spares: 2 x $98.32/h = $196.64/h, in the cost above" in text
    assert "the hostfile and the world size stay 64 node(s)" in text
    rate = spares.NODE_FAILURES_PER_HOUR  # 419 / (54 days x 24 h x 2,048 nodes)
    assert rate == pytest.approx(419 / (54 * 24 * 2048))
    assert "Llama 3's 419 unexpected interruptions in 54 days" in text
    assert f"1 per {1 / rate:,.0f} node-hours" in text
    every_h = 1 / (64 * rate)
    assert f"64 node(s) lose one about every {every_h:,.0f} h" in text
    # a failure a spare takes: 10 min of 64 nodes waiting = 10.67 node-hours = $1,048.75
    assert "~10.0 min on all 64 node(s) (assumed for the test): 10.67 node-hours ($1,048.75)" \
        in text
    saved_per_h = 64 * 600 / 3600 * 98.32 / every_h
    assert f"on average ${saved_per_h:,.2f}/h saved against $196.64/h" in text
    even = (2 / (rate * 600 / 3600)) ** 0.5
    assert f"from ~{even:,.0f} nodes" in text


def test_a_free_provider_says_its_spares_cost_nothing_and_one_without_replacements_why(
        ) -> None:
    spec = build_cluster_spec({}, {"name": "sp", "provider": "docker", "nodes": 2, "spares": 1})
    plan = Plan(provider="slurm", cluster="sp", nodes=3, slots_per_node=1, node_hourly_usd=0.0)
    spares.describe(plan, spec, None)
    assert (plan.nodes, plan.spares) == (3, 1)  # the machines made; 1 of them a spare
    assert plan.spares_text[0].startswith("1 x $0.00/h (local)")
    assert "slurm cannot make a replacement node: without a spare a lost node ends the run" \
        in plan.spares_text[-1]
    unknown = Plan(provider="aws", cluster="sp", nodes=3, slots_per_node=1)
    spares.describe(unknown, spec, spares.Estimate(60.0, "x"))
    assert unknown.spares_text[0].startswith("1 node(s), price unknown")


@pytest.mark.parametrize(("provider", "why"), [
    ("ssh", "uses the machines you list and cannot make one more"),
    ("k8s", "needs the pod's index kept apart from the rank: not built yet")])
def test_providers_that_keep_no_spares_refuse_them_in_their_plan_saying_why(
        provider: str, why: str) -> None:
    from provision.cluster.providers import get_provider

    spec = build_cluster_spec({}, {"name": "sp", "provider": provider, "nodes": 2,
                                   "spares": 1})
    with pytest.raises(UserInputError, match=f"--spares 1: the {provider} provider keeps no "
                                             "spares") as err:
        get_provider(provider).plan(spec)  # before anything is asked of a host or a cluster
    assert why in err.value.message


def test_a_self_stopping_detached_run_refuses_spares_nobody_would_use() -> None:
    """`run --detach` without a store: no one supervises the job, so no rank would move to
    a spare, and an idle spare would not stop itself with the nodes: refused, saying what
    works; with a store (the controller) or attached it is fine."""
    from provision.job.attached import Attached
    from provision.job.detached import SelfStopping
    from provision.job.supervision import Target
    from provision.model.spec import build_job_spec

    example = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"
    job = build_job_spec({}, {"script": str(example)})
    target = Target("sp", MemoryCloud(), "docker", None, new=True, spares=1)
    with pytest.raises(UserInputError, match="--spares 1: a --detach job without --store") \
            as err:
        SelfStopping().check(job, target, print)
    assert "--store URL" in (err.value.hint or "")
    SelfStopping().check(job, Target("sp", MemoryCloud(), "docker", None, new=True), print)
    Attached().check(job, target, print)
