"""The fabric gate's judgement: from the nodes' output alone (pure), whether the network
between the nodes delivers what it should, and if not, the node(s) to blame and the likely fix.

    should_run(inv, mode)                          whether the gate runs at all, and why not
    evaluate(inv, output, code, mode=...)          judge the nodes' output -> GateRecord
    render_table(record)                           node | transport | busbw | expected | verdict
    gate_error(record)                             the FabricGateError that stops the job

The nodes measure (provision/job/gate/separate.py: one torchrun of `remote.pyz allreduce
--gate` before the job; provision/job/gate/injob.py: the same in the job's own processes), with
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET, in one process group:
  1. a short all-reduce sweep over every rank (bounded: a few sizes, a time budget);
  2. when its peak busbw is below the threshold (always, when the fabric has no expected
     figure: docker, ssh, unmeasured types), node pairs in parallel rounds: a round-robin
     schedule, n - 1 rounds of n/2 disjoint pairs (n rounds for odd n), at most
     MAX_PAIR_ROUNDS; pairs below PAIR_SLOW_FRACTION of the reference are measured again.
Then, from the output alone:
  - transport: each node's NCCL INFO lines -> provision.job.gate.fabric.transport_of, compared
    with Inventory.fabric.transport;
  - bandwidth: the peak busbw against BUSBW_FAIL_FRACTION x Inventory.fabric.busbw_gbps;
  - slow pair: below PAIR_SLOW_FRACTION of the reference (the median over nodes of each node's
    best pair; half of it on gloo) in both of its measurements;
  - slow node: every pair it is in is slow (even its best one), so it is the node;
  - slow link: a slow pair whose two nodes are fine with other partners.
Failure -> one table, the problems, the likely fixes (provision.job.gate.fabric's per-fabric
fixes and the provision.job.diagnose signatures found in the output), FabricGateError before
the job; with --allow-slow-network a warning instead. The result is kept in
Inventory.fabric_gate.

Modes (JobSpec.fabric_check): `auto` runs for multi-node clusters whose provider set
Inventory.fabric (aws, gcp); `on` runs for every multi-node cluster; `off` never.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from provision.job.gate.fabric import UNKNOWN, Transport, transport_of
from provision.job.gate.words import add_diagnosis, describe
from provision.job.programs import json_lines
from provision.model import nodetext
from provision.model.errors import LaunchError
from provision.model.gate_record import GateNode, GatePair, GateRecord
from provision.model.inventory import Inventory
from provision.model.logsink import Log
from remote.gatejudge import Pair, PairFigure, judge, merge_pairs, pair_fraction

# A cluster whose peak all-reduce busbw is below half the type's published nccl-tests figure
# fails. The published figures are at 1-2 GB messages and the gate stops at 1 GiB with few
# calls, so a healthy fabric measures ~80-95% of them; a socket fallback measures 5-30% (p4d:
# 4.13 vs 77.35 GB/s; a3-high without TCPX: ~20 vs 66-88; p5: < 25 vs 444).
BUSBW_FAIL_FRACTION = 0.5
# A node whose best pair (or a pair) is below half the reference pair is slow. A node with a
# broken fabric NIC is at 5-30% of its peers; a busy moment on a shared link rarely halves a
# figure twice in a row (slow pairs are measured again before being judged). On gloo (CPU
# nodes) a quarter: a busy CPU does halve a figure twice (remote.gatejudge.pair_fraction).
PAIR_SLOW_FRACTION = 0.5
# Every pair up to 17 nodes; beyond, each node still meets 16 partners (enough to tell a slow
# node from its partners; links are then sampled, not all measured).
MAX_PAIR_ROUNDS = 16


class FabricGateError(LaunchError):
    """The fabric gate failed: the job was not started."""


# ------------------------------------------------------------------------------- deciding
def should_run(inv: Inventory, mode: str) -> tuple[bool, str]:
    """(whether the gate runs, why not)."""
    if mode == "off":
        return False, "--fabric-check off"
    if len(inv.nodes) < 2:
        return False, "a single node: no network between nodes to check"
    if mode == "auto" and inv.fabric is None:
        return False, (f"provider {inv.provider} gives no fabric expectation; "
                       "--fabric-check on runs the gate anyway")
    return True, ""


def threshold_gbps(inv: Inventory) -> float | None:
    """The cluster busbw below which the gate fails (None: no published figure to judge by)."""
    if inv.fabric is None or inv.fabric.busbw_gbps is None:
        return None
    return BUSBW_FAIL_FRACTION * inv.fabric.busbw_gbps


def gate_error(record: GateRecord) -> FabricGateError:
    first = record.problems[:3] or ["failed"]
    return FabricGateError(
        "fabric gate failed, the job was not started: " + "; ".join(first),
        hint=(record.fixes[0] + "\n  " if record.fixes else "")
        + "to run anyway: --allow-slow-network; to skip the gate: --fabric-check off",
    )


def pass_line(record: GateRecord) -> str:
    transports = sorted({n.transport for n in record.nodes})
    pairs = f", {len(record.pairs)} pairs in {record.rounds} rounds" if record.pairs else ""
    bw = f"{record.busbw_gbps:.3g}" if record.busbw_gbps is not None else "?"
    return (f"pass: busbw {bw} GB/s over {len(record.nodes)} nodes, transport "
            f"{'/'.join(transports)}{pairs} ({record.seconds:.1f} s)")


def announce(record: GateRecord, allow_slow_network: bool, log: Log) -> None:
    """Say the verdict (a line on a pass, the table otherwise) and mark a failure the user
    chose to run through (--allow-slow-network: a warning, and the job goes on)."""
    record.overridden = record.verdict == "fail" and allow_slow_network
    if record.verdict == "pass":
        log(f"fabric gate: {pass_line(record)}")
        return
    log(render_table(record))
    if allow_slow_network:
        log("warning: the fabric gate failed; --allow-slow-network: running the job anyway, "
            "at the speed measured above")


# ------------------------------------------------------------------------------- judging
def split_output(output: str, names: list[str]) -> dict[str, list[str]]:
    """`[node] line` output -> node -> its lines (prefix removed)."""
    prefixes = {f"[{name}] ": name for name in names}
    lines: dict[str, list[str]] = {name: [] for name in names}
    for line in nodetext.lines(output):
        head = line[: line.find("] ") + 2] if line.startswith("[") else ""
        name = prefixes.get(head)
        if name is not None:
            lines[name].append(line[len(head):])
    return lines


def _pair_figures(records: list[dict[str, Any]], names: dict[int, str]
                  ) -> tuple[dict[Pair, PairFigure], dict[Pair, int]]:
    """Pair lines (first measurements and confirmations, node ranks) -> each pair's better
    figure, and the round it was first measured in. Pairs of unknown nodes are dropped."""
    measured: list[tuple[Pair, float]] = []
    first_round: dict[Pair, int] = {}
    for r in records:
        a, b = (int(x) for x in r["pair"])
        if a in names and b in names:
            measured.append(((a, b), float(r.get("busbw_gbps", 0.0))))
            first_round.setdefault((a, b), int(r["round"]))
    return merge_pairs(measured), first_round


def evaluate(inv: Inventory, output: str, code: int, *, mode: str,
             seconds: float = 0.0) -> GateRecord:
    """Judge the gate's output (every node's `[node] `-prefixed lines, as run_job streams
    them) and exit code. Pure; the same function judges a live run and a captured log, and
    the verdict is remote.gatejudge's, as on the nodes of an in-job gate."""
    ordered = sorted(inv.nodes, key=lambda n: n.rank)
    names = {n.rank: n.name for n in ordered}
    lines = split_output(output, list(names.values()))
    summary = next((r for r in json_lines(output, inv.master.name) if r.get("summary")), None)
    records = [r for name in names.values() for r in json_lines(output, name)]
    fabric, limit = inv.fabric, threshold_gbps(inv)
    backend = str(summary.get("backend")) if summary else None
    record = GateRecord(
        verdict="pass", mode=mode, seconds=round(seconds, 2), backend=backend,
        world_size=int(summary["world_size"]) if summary else None,
        checked_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        busbw_gbps=float(summary["max_busbw_gbps"]) if summary else None,
        expected_transport=fabric.transport if fabric else None,
        expected_busbw_gbps=fabric.busbw_gbps if fabric else None, threshold_gbps=limit)
    rows = {rank: GateNode(node=name, transport=UNKNOWN, busbw_gbps=record.busbw_gbps)
            for rank, name in names.items()}
    for row in rows.values():
        found = (Transport("socket", "gloo backend: CPU tensors over TCP (no GPU / NCCL)")
                 if backend == "gloo" else transport_of(lines[row.node]))
        row.transport, row.evidence = found.name, nodetext.shown(found.evidence[-200:])
    pairs, first_round = _pair_figures([r for r in records if "pair" in r], names)
    verdict = judge(
        finished=code == 0 and summary is not None, peak_gbps=record.busbw_gbps,
        threshold_gbps=limit, expected_transport=fabric.transport if fabric else None,
        transports={rank: row.transport for rank, row in rows.items()} if summary else {},
        pairs=pairs, fraction=PAIR_SLOW_FRACTION, backend=backend)
    describe(record, verdict, rows, names, pairs,
              (fabric.nominal or fabric.transport) if fabric else "", code, summary,
              [str(r["error"]) for r in records if "error" in r])
    record.pairs = [GatePair(nodes=(names[a], names[b]), round=first_round[(a, b)],
                             busbw_gbps=f.busbw_gbps, measurements=f.measurements,
                             verdict="slow" if (a, b) in verdict.slow_pairs else "ok")
                    for (a, b), f in sorted(pairs.items())]
    record.rounds = len(set(first_round.values()))
    if verdict.reference is not None:
        record.pair_reference_gbps = round(verdict.reference, 6)
    elif summary is not None and summary.get("pairwise"):
        record.notes.append("the pairwise rounds printed nothing")
    if len(names) == 2 and pairs:
        record.notes.append("with 2 nodes there is one pair: a slow node cannot be told from "
                            "its partner")
    if record.problems:
        add_diagnosis(record, names, lines, code)
    record.nodes = [rows[rank] for rank in names]
    record.verdict = "pass" if verdict.passed else "fail"
    return record


# ------------------------------------------------------------------------------- showing
def table_rows(record: GateRecord) -> list[tuple[str, str, str, str, str]]:
    """Header + one row per node: node, transport, busbw, expected, verdict."""
    expected_t = record.expected_transport or "any"
    if record.pair_reference_gbps is not None:
        share = pair_fraction(PAIR_SLOW_FRACTION, record.backend)
        expect_bw = f">= {share * record.pair_reference_gbps:.3g} ({share:.0%} of median pair)"
    elif record.threshold_gbps is not None:
        expect_bw = f">= {record.threshold_gbps:.3g}"
    else:
        expect_bw = "-"
    rows = [("node", "transport", "busbw GB/s", "expected", "verdict")]
    for n in record.nodes:
        bw = f"{n.busbw_gbps:.3g}" if n.busbw_gbps is not None else "-"
        verdict = n.verdict + (f": {n.detail}" if n.detail else "")
        rows.append((n.node, n.transport, bw, f"{expected_t}, {expect_bw}", verdict))
    return rows


def render_table(record: GateRecord) -> str:
    """The gate's table and, for a failure, the problems and likely fixes, as plain text."""
    rows = table_rows(record)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"fabric gate: {record.verdict.upper()}"
           + (f" (busbw {record.busbw_gbps:.3g} GB/s" if record.busbw_gbps is not None else " (")
           + (f", expected {record.expected_busbw_gbps:g}" if record.expected_busbw_gbps else "")
           + f", {record.rounds} pairwise rounds, {record.seconds:.1f} s)"]
    for r in rows:
        out.append(("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
                   .rstrip())
    out += [f"  problem: {p}" for p in record.problems]
    out += [f"  note: {n}" for n in record.notes]
    out += [f"  likely fix: {f}" for f in record.fixes]
    return "\n".join(out)
