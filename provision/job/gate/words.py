"""The fabric gate's judgement in words (provision/job/gate/judge.py judges; this says it): each
node row's verdict, the problems, the likely fixes and the failure signatures found in the
output. The fractions quoted come from the record and the judgement themselves."""

from __future__ import annotations

from typing import Any

from provision.job.gate.fabric import fix_for
from provision.model.gate_record import GateNode, GateRecord
from provision.model.nodetext import shown
from remote.gatejudge import Judgement, Pair, PairFigure

SLOW_NODE_FIX = (
    "Look at the named node's network: `ip -s link` (errors, drops), `tc qdisc show` (shaping "
    "left on the interface), another job using the link; for a cloud node whose fabric NIC "
    "is degraded, replace the node (down, then up again) rather than train at its speed."
)
SLOW_LINK_FIX = (
    "The two nodes are fine with other partners: the path between them is slow (a congested "
    "or misrouted switch port, a placement outside the cluster's placement group). Recreate "
    "the cluster in one placement group / compact placement policy, or report the pair."
)
SLOW_FABRIC_FIX = (
    "Every pair is about equally slow: the fabric itself is not in use or misconfigured. Check "
    "the transport column above, NCCL_SOCKET_IFNAME / NCCL_NET in the job's environment, and "
    "the provider's network settings (EFA interfaces, placement group, MTU)."
)



def describe(record: GateRecord, verdict: Judgement, rows: dict[int, GateNode],
              names: dict[int, str], pairs: dict[Pair, PairFigure], nominal: str, code: int,
              summary: dict[str, Any] | None, errors: list[str]) -> None:
    """The rows' verdicts, the problems and the fixes, in words, from `verdict`."""
    problems, notes, fabric = record.problems, record.notes, record.expected_transport
    if not verdict.finished:  # 1. did it run at all?
        why = errors[0][:200] if errors else f"exit {code}"
        problems.append(f"the gate's all-reduce did not finish ({why})")
        if summary is None:
            for row in rows.values():
                row.verdict, row.busbw_gbps = "not measured", None
    for rank in verdict.wrong_transport:  # 2. the transport each node's NCCL chose
        rows[rank].verdict = "wrong transport"
        rows[rank].detail = f"NCCL used {rows[rank].transport}, not {fabric}"
    if verdict.wrong_transport and fabric is not None:
        first = rows[verdict.wrong_transport[0]].transport
        problems.append(f"NCCL used {first} instead of {fabric} on "
                        + ", ".join(names[r] for r in verdict.wrong_transport))
        _add_fix(record, fix_for(fabric, first))
    for rank in verdict.unknown_transport:
        rows[rank].verdict = "unknown transport"
        notes.append(f"{names[rank]}: no NCCL line named the network in use")
    if verdict.below_threshold:  # 3. the cluster's bandwidth against the published figure
        assert record.busbw_gbps is not None and record.expected_busbw_gbps is not None
        problems.append(
            f"all-reduce busbw {record.busbw_gbps:.3g} GB/s is "
            f"{pct(record.busbw_gbps / record.expected_busbw_gbps)} of the "
            f"{record.expected_busbw_gbps:g} GB/s published for {nominal} (fails "
            f"below {(record.threshold_gbps or 0) / record.expected_busbw_gbps:.0%})")
    _describe_pairs(record, verdict, rows, names, pairs, summary is not None)
    if verdict.below_threshold and not any(
            r.verdict in ("slow", "slow link", "wrong transport") for r in rows.values()):
        _add_fix(record, SLOW_FABRIC_FIX)


def _describe_pairs(record: GateRecord, verdict: Judgement, rows: dict[int, GateNode],
                    names: dict[int, str], pairs: dict[Pair, PairFigure],
                    measured: bool) -> None:
    """4. node pairs: each node's best pair in its row, slow nodes and slow links named."""
    if verdict.reference is None or verdict.floor is None:
        return
    reference, floor = verdict.reference, verdict.floor
    if measured:
        for rank, bw in verdict.best.items():
            rows[rank].busbw_gbps = bw
    for rank in verdict.slow_nodes:
        rows[rank].verdict = "slow"
        rows[rank].detail = (f"its best pair {verdict.best[rank]:.3g} GB/s is "
                             f"{pct(verdict.best[rank] / reference)} of the median pair")
    for a, b in verdict.slow_links:
        for rank, other in ((a, b), (b, a)):
            if rows[rank].verdict == "ok":
                rows[rank].verdict = "slow link"
                rows[rank].detail = f"slow link to {names[other]}"
    if verdict.slow_nodes:
        record.problems.append(
            f"slow node{'s' if len(verdict.slow_nodes) > 1 else ''}: " + ", ".join(
                f"{names[n]} (best pair {verdict.best[n]:.3g} GB/s, {floor / reference:.0%} "
                f"of the median pair is {floor:.3g})" for n in verdict.slow_nodes))
        _add_fix(record, SLOW_NODE_FIX)
    if verdict.slow_links:
        record.problems.append(
            "slow link" + ("s" if len(verdict.slow_links) > 1 else "") + ": " + ", ".join(
                f"{names[a]} <-> {names[b]} ({pairs[(a, b)].busbw_gbps:.3g} GB/s, below "
                f"{floor:.3g})" for a, b in verdict.slow_links))
        _add_fix(record, SLOW_LINK_FIX)


def _add_fix(record: GateRecord, text: str) -> None:
    if text not in record.fixes:
        record.fixes.append(text)


def add_diagnosis(record: GateRecord, names: dict[int, str], lines: dict[str, list[str]],
                   code: int) -> None:
    """The known failure signatures in the output (NCCL WARN lines, connection errors, ...)
    as fixes."""
    from provision.job.diagnose import diagnose

    prefixed = [f"[{name}] {line}" for name in names.values() for line in lines[name]]
    for d in diagnose(prefixed):
        _add_fix(record, f"{d.fix} (seen on {', '.join(d.nodes) or 'a node'}: "
                         f"{shown(d.line[:160])})")
    if code != 0 and not record.fixes:
        _add_fix(record, "run `mgpu-cloud check NAME --bandwidth` and read the output of the "
                         "nodes")


def pct(fraction: float) -> str:
    """45%, 7.5%, 0.3%: small fractions keep a digit (a throttled link is 0.3%, not 0%)."""
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction:.1%}"
