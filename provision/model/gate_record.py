"""The fabric gate's result as the inventory keeps it (`Inventory.fabric_gate`).

Plain data, no logic: provision/job/gate/ fills it, `status` and `check` show it. Kept apart from
the gate so that inventory.py can import it without importing the gate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NodeVerdict = Literal["ok", "slow", "slow link", "wrong transport", "unknown transport",
                      "not measured"]


class GateNode(BaseModel):
    """One row of the gate's table."""

    model_config = ConfigDict(extra="forbid")

    node: str
    transport: str = Field(description="what NCCL chose on this node: efa | ib | tcpx | tcpxo "
                                       "| rdma | socket | unknown")
    evidence: str = Field("", description="the log line the transport was read from")
    busbw_gbps: float | None = Field(None, description="the node's best pair (pairwise), else "
                                     "the whole cluster's peak")
    verdict: NodeVerdict = "ok"
    detail: str = ""


class GatePair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: tuple[str, str]
    round: int
    busbw_gbps: float
    measurements: int = Field(1, description="2 when a suspiciously slow pair was measured "
                                             "again (the better figure is kept)")
    verdict: Literal["ok", "slow"] = "ok"


class GateRecord(BaseModel):
    """What the last gate measured and decided. `verdict` 'fail' with `overridden` means the
    job ran anyway (--allow-slow-network)."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["pass", "fail"]
    checked_at: str
    mode: str = Field(description="auto | on: how the gate was asked for")
    seconds: float = 0.0
    backend: str | None = None
    world_size: int | None = Field(None, description="ranks in the all-reduce (every GPU of "
                                   "every node; one per node without GPUs)")
    busbw_gbps: float | None = Field(None, description="peak all-reduce busbw over every GPU "
                                     "of every node, GB/s")
    expected_transport: str | None = None
    expected_busbw_gbps: float | None = None
    threshold_gbps: float | None = Field(None, description="fail below this cluster busbw")
    pair_reference_gbps: float | None = Field(None, description="median over nodes of each "
                                              "node's best pair; a node/pair is slow below "
                                              "PAIR_SLOW_FRACTION of it (half that on "
                                              "gloo)")
    rounds: int = 0
    nodes: list[GateNode] = Field(default_factory=list)
    pairs: list[GatePair] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    fixes: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    overridden: bool = False

    def summary(self) -> str:
        """One line for `status`: 'pass 1.2 GB/s', 'FAIL node-2 slow (overridden)'."""
        bw = f" {self.busbw_gbps:.3g} GB/s" if self.busbw_gbps is not None else ""
        if self.verdict == "pass":
            return f"pass{bw}"
        bad = [f"{n.node} {n.verdict}" for n in self.nodes if n.verdict not in ("ok",)]
        what = ", ".join(bad) or (self.problems[0] if self.problems else "failed")
        return f"FAIL {what}" + (" (ran anyway)" if self.overridden else "")
