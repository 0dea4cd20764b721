"""Warm spares (issue 44): `--spares K` as every provider that makes nodes plans and keeps
them, and what the plan says they cost and save. Shared by the providers (contract.py), so
it imports none of them.

    plan      the provider plans N + K nodes (`with_spares`: one request, the same placement
              group / compact policy / allocation, its quotas checked for all of them); the
              plan counts N ranks + K spares and says what they cost and save (`describe`)
    create    the provider makes the N + K nodes as it makes any; the last K (ranks N..N+K-1)
              become the spares (`split`): Inventory.spares, recorded like any resource (so
              `down`, rollback and `gc` remove them), not in the hostfile, not in the world
              size. They are bootstrapped, their image pulled and their preflight judged with
              the cluster's (nodes/spares.py), then left idle.
    run       a lost, preempted or slow node's rank moves to a spare at once and a new spare
              is ordered in the background (job/sparepool.py); with none left, the provider's
              replacement, as without spares.

What a spare saves, as the plan says it, rests on an ASSUMED failure rate, named here:
NODE_FAILURES_PER_HOUR, from Llama 3's pre-training (FAILURE_RATE_SOURCE). A failure that a
spare absorbs saves the replacement's wait (the provider's `replacement_estimate`) on every
node of the cluster; the redone work since the last checkpoint is lost either way. So the
saving grows with N^2 and a spare's cost with K: spares pay off from about sqrt(K / (rate x
wait)) nodes, which the plan says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from provision.model.inventory import Inventory, NodeRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec

# ASSUMPTION (the failure rate a plan's saving is computed at): Llama 3 405B's pre-training
# saw 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs, servers of 8
# (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783, section 3.3.4 and its table 5;
# 78% of them hardware: GPUs, HBM, hosts, network). Counted per node: 1 per ~6,300 h.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_NODES = 419, 54, 16384 // 8
NODE_FAILURES_PER_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_NODES)
FAILURE_RATE_SOURCE = ("assumed: Llama 3's 419 unexpected interruptions in 54 days on 2,048 "
                       "nodes of 8 H100 (arXiv 2407.21783, section 3.3.4)")


@dataclass(frozen=True)
class Estimate:
    """How long a replacement node takes to be ready on a provider, and where that figure
    comes from (measured, configured or assumed: the plan says which)."""

    seconds: float
    source: str


def with_spares(spec: ClusterSpec) -> ClusterSpec:
    """The spec a provider plans and creates: N + K nodes (`spec` itself without spares)."""
    if not spec.spares:
        return spec
    return spec.model_copy(update={"nodes": spec.nodes + spec.spares})


def split(inv: Inventory, ranks: int) -> None:
    """After the provider made ranks + K nodes: the last K become the spares."""
    inv.spares = [n for n in inv.nodes if n.rank >= ranks]
    inv.nodes = [n for n in inv.nodes if n.rank < ranks]
    inv.spares_made = len(inv.spares)


def next_spare(inv: Inventory, like: NodeRecord) -> NodeRecord:
    """The record a new spare is made from (its name and number; no resource yet): numbered
    after every spare made so far, so its name is no container's, VM's or pod's of the
    cluster. The caller counts it in `inv.spares_made`."""
    number = (inv.spec.nodes if inv.spec is not None else len(inv.nodes)) + inv.spares_made
    return NodeRecord(name=f"node-{number}", rank=number, address="pending",
                      private_address="pending", user=like.user, slots=like.slots,
                      zone=like.zone, identity_file=like.identity_file,
                      proxy_jump=like.proxy_jump)


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def describe(plan: Plan, spec: ClusterSpec, estimate: Estimate | None,
             refills: bool = True) -> None:
    """`plan` (made for N + K nodes: `plan.nodes` stays the machines its provider makes) as
    N ranks + K spares, with what they cost and save."""
    k, n = spec.spares, spec.nodes
    plan.spares = k
    price = plan.node_hourly_usd
    cost = (f"{k} x {_usd(price)}/h = {_usd(k * price)}/h, in the cost above" if price
            else f"{k} x $0.00/h (local)" if price == 0 else f"{k} node(s), price unknown")
    every_h = 1 / (n * NODE_FAILURES_PER_HOUR)
    lines = [f"{cost}; idle while the job runs, not ranks (the hostfile and the world size "
             f"stay {n} node(s)); a lost node's rank moves to one at once, " +
             ("a new one is ordered meanwhile" if refills else "and a used one is not made "
              "again (the lost node stays until the end)"),
             f"failure rate {FAILURE_RATE_SOURCE}: 1 per {1 / NODE_FAILURES_PER_HOUR:,.0f} "
             f"node-hours, so {n} node(s) lose one about every {every_h:,.0f} h"]
    if estimate is None:
        lines.append(f"{plan.provider} cannot make a replacement node: without a spare a lost "
                     "node ends the run (or waits for the same host); with one it goes on")
    else:
        waited_h = n * estimate.seconds / 3600  # node-hours idle while a replacement comes
        saved = f"{waited_h:,.2f} node-hours"
        if price:
            per_h = waited_h * price / every_h
            saved += (f" ({_usd(waited_h * price)}); on average {_usd(per_h)}/h saved "
                      f"against {_usd(k * price)}/h for the spare(s)")
        even = math.sqrt(k / (NODE_FAILURES_PER_HOUR * estimate.seconds / 3600))
        wait = (f"{estimate.seconds / 60:.1f} min" if estimate.seconds >= 120
                else f"{estimate.seconds:.0f} s")
        lines.append(f"each failure a spare takes saves the replacement's ~{wait} on all "
                     f"{n} node(s) ({estimate.source}): "
                     f"{saved}; at this rate spares pay for themselves from ~{even:,.0f} "
                     "nodes (and keep a run going when no replacement can be had)")
    plan.spares_text = lines
