"""A Plan: what `up` would create and what it would cost. Built without any write call.

Each provider returns its own subclass carrying its TYPED request (what its `create` consumes,
e.g. AwsPlan.launch); `resources`, `notes` and the cost are the rendering for people, and
`model_dump(mode="json")` the one for `--json`. Nothing is parsed back from strings.

Two ways a plan can be incomplete, both shown instead of refused:
- `unpriced`: parts without a known price ("price unknown"; `up` asks before creating it);
- `unresolved`: parts a provider could not look up (e.g. `--dry-run` without credentials);
  such a plan is printed but never created.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

P = TypeVar("P", bound="Plan")


class PlannedResource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    name: str
    details: dict[str, str] = Field(default_factory=dict)


class Plan(BaseModel):
    """Printable, comparable (golden files) description of a cluster to be created."""

    model_config = ConfigDict(extra="forbid")

    provider: str
    cluster: str
    nodes: int
    slots_per_node: int
    resources: list[PlannedResource] = Field(default_factory=list)
    hourly_cost_usd: float = 0.0
    upfront_usd: float = Field(
        0.0, description="the part of the cost paid at once when `up` creates the cluster, "
        "whatever the nodes then run, not refundable (an AWS Capacity Block); hourly_cost_usd "
        "includes it spread over max_hours")
    max_hours: float | None = None
    price_source: str | None = None
    notes: list[str] = Field(default_factory=list)
    unpriced: list[str] = Field(
        default_factory=list, description="what has no known price; hourly_cost_usd is then "
        "only the known part")
    unresolved: list[str] = Field(
        default_factory=list, description="what could not be looked up, and why; a plan with "
        "unresolved parts is printed, never created")
    # issue 44: warm spares (cluster/providers/spares.py); `nodes` counts them too
    spares: int = Field(0, description="of `nodes`, how many are warm spares (not ranks)")
    node_hourly_usd: float | None = Field(
        None, description="one node's price per hour (what a spare costs); None: unknown")
    spares_text: list[str] = Field(default_factory=list, description="what the spares cost "
                                   "and save, for people")

    def refuse_unresolved(self) -> None:
        """A plan made without the provider's answers (e.g. `--dry-run` without credentials)
        is printed, never created: ProviderUnavailableError before anything is written."""
        if self.unresolved:
            from provision.model.errors import ProviderUnavailableError

            raise ProviderUnavailableError(
                "this plan cannot be created: " + "; ".join(self.unresolved),
                hint="make the provider's credentials available, or add --dry-run to only "
                "print the plan",
            )

    def expect(self, cls: type[P]) -> P:
        """This plan as the provider's own subclass (a provider's `create` starts with it)."""
        if not isinstance(self, cls):
            raise TypeError(f"a {cls.__name__} is needed, not a {type(self).__name__}")
        return self

    @property
    def max_cost_usd(self) -> float | None:
        if self.max_hours is None:
            return None
        return round(self.hourly_cost_usd * self.max_hours, 2)

    def _upfront_lines(self) -> list[str]:
        """The cost of a plan paid up front: that price is the cost (it is paid whatever the
        nodes run), plus what runs by the hour on top."""
        lines = [f"  cost: ${self.upfront_usd:,.2f} paid up front by `up`, not "
                 "refundable (whatever the nodes then run)"]
        rest = self.hourly_cost_usd - (self.upfront_usd / self.max_hours if self.max_hours
                                       else 0.0)
        if rest >= 0.005:
            lines.append(f"  plus ${rest:,.2f}/hour while the nodes run")
        if self.max_cost_usd is not None:
            lines.append(f"  in all at most ${max(self.max_cost_usd, self.upfront_usd):,.2f} "
                         f"({self.max_hours:g} h of nodes, then they shut themselves down)")
        if self.price_source:
            lines.append(f"  prices: {self.price_source}")
        return lines

    def render(self) -> str:
        spares = f" + {self.spares} warm spare(s)" if self.spares else ""
        lines = [f"Plan for cluster {self.cluster!r} on {self.provider}: "
                 f"{self.nodes - self.spares} node(s){spares} x {self.slots_per_node} "
                 "slot(s)"]
        for res in self.resources:
            extra = ", ".join(f"{k}={v}" for k, v in sorted(res.details.items()))
            lines.append(f"  + {res.kind:<18} {res.name}" + (f"  ({extra})" if extra else ""))
        if self.unpriced:
            lines.append("  cost: price unknown (" + "; ".join(self.unpriced) + ")")
            if self.hourly_cost_usd:
                lines.append(f"  known part: ${self.hourly_cost_usd:,.2f}/hour")
            if self.price_source:
                lines.append(f"  prices: {self.price_source}")
        elif self.upfront_usd:
            lines.extend(self._upfront_lines())
        elif self.hourly_cost_usd:
            lines.append(f"  cost: ${self.hourly_cost_usd:,.2f}/hour for the whole cluster")
            if self.max_cost_usd is not None:
                lines.append(
                    f"  at most ${self.max_cost_usd:,.2f} ({self.max_hours:g} h, then the nodes "
                    "shut themselves down)"
                )
            if self.price_source:
                lines.append(f"  prices: {self.price_source}")
        else:
            lines.append("  cost: $0.00 (local)")
        lines.extend(f"  spares: {n}" for n in self.spares_text)
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  unresolved: {u}" for u in self.unresolved)
        return "\n".join(lines)
