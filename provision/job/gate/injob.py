"""The fabric gate inside the job's own launch (the controller's half of remote/injob.py).

    gate = InJobGate(inv, job, store, log) one per launch attempt; run_job streams through it
    gate.entry                             the words before the job's script in its launcher
    gate.take(node, line)                  the node's gate lines are kept, not printed
    gate.finish(code) -> GateRecord        after the launch: the record (saved), and
                                           FabricGateError when the job was not started

The job's launcher starts `remote.pyz injob [gate options] -- SCRIPT ARGS` in every process;
rank 0 judges there (remote.gatejudge) and the script starts only on a pass. Each node's
output up to its `MGPU-GATE` line is the gate's: it is kept for provision.job.gate.judge.evaluate
(the same rules, from the same lines) and for the node log, not printed. Job lines that arrive
before every node has passed wait, so the pass line (or the failed gate's table) comes first.
Where it runs instead of the separate gate: provision/job/gate/step.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from provision.job.gate.judge import (
    MAX_PAIR_ROUNDS,
    PAIR_SLOW_FRACTION,
    announce,
    evaluate,
    gate_error,
    threshold_gbps,
)
from provision.model.gate_record import GateRecord
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.model.timeline import mark
from remote.injob import MARKER

PrintLine = Callable[[str, str], None]  # (node, line): print it as the job's output


def entry_words(inv: Inventory, job: JobSpec) -> list[str]:
    """`remote.pyz injob ... --`: what the launcher runs before the job's script and args."""
    words = ["@root/remote.pyz", "injob", "--pair-rounds", str(MAX_PAIR_ROUNDS),
             "--pair-fraction", f"{PAIR_SLOW_FRACTION:g}"]
    limit = threshold_gbps(inv)
    if limit is not None:
        words += ["--busbw-below", f"{limit:g}", "--pairwise-below", f"{limit:g}"]
    if inv.fabric is not None:
        words += ["--expect-transport", inv.fabric.transport]
    if job.allow_slow_network:
        words.append("--allow-slow")
    return [*words, "--"]


class InJobGate:
    """One launch attempt's gate: splits every node's stream at its MGPU-GATE line, judges
    once every node has reached it, and keeps the record. Thread-safe (one streaming thread
    per node)."""

    def __init__(self, inv: Inventory, job: JobSpec, store: InventoryStore, log: Log) -> None:
        self.inv, self.job, self.store, self.log = inv, job, store, log
        self.entry = entry_words(inv, job)
        self.nodes: set[str] = set()  # the nodes whose launchers stream (set by attach)
        self.lock = threading.Lock()
        self.output: list[str] = []  # the gate's lines, `[node] line`
        self.passed_nodes: set[str] = set()  # the nodes past their MGPU-GATE line
        self.failed_nodes: set[str] = set()  # ... whose line said the gate failed
        self.waiting: list[tuple[str, str]] = []  # job lines before the verdict
        self.record: GateRecord | None = None
        self.started = time.monotonic()
        self.started_at = time.time()  # the timeline's clock (provision/model/timeline.py)
        self.print_line: PrintLine = lambda node, line: None

    def attach(self, nodes: list[str], print_line: PrintLine) -> None:
        """run_job: the nodes it starts and how it prints a node's line."""
        self.nodes, self.print_line = set(nodes), print_line
        self.started, self.started_at = time.monotonic(), time.time()

    def take(self, node: str, line: str) -> bool:
        """Whether `line` of `node` is consumed here (the gate's, or a job line held until
        the verdict, or anything after a failed verdict); False: print it now."""
        with self.lock:
            if self.record is not None:
                return not self.started_job
            if node in self.passed_nodes:
                self.waiting.append((node, line))
                return True
            if line.startswith(MARKER):
                self.passed_nodes.add(node)
                if '"verdict": "pass"' not in line:
                    self.failed_nodes.add(node)
                if self.passed_nodes >= self.nodes:
                    self._conclude(0)
                return True
            self.output.append(f"[{node}] {line}")
            return True

    def stopped(self, node: str) -> bool:
        """Whether `node`'s processes ended because the gate failed (they exit by themselves;
        its exit code may arrive before the other nodes' lines do)."""
        with self.lock:
            if self.record is not None:
                return not self.started_job
            return node in self.failed_nodes and not self.job.allow_slow_network

    @property
    def started_job(self) -> bool:
        """Whether the job's script started after the gate (pass, or --allow-slow-network)."""
        return self.record is not None and (self.record.verdict == "pass"
                                            or self.job.allow_slow_network)

    def _conclude(self, code: int) -> None:
        """Judge what the nodes printed (caller holds the lock); say it; release held lines."""
        record = evaluate(self.inv, "\n".join(self.output), code, mode=self.job.fabric_check,
                          seconds=self._seconds())
        self.record = record
        mark(self.inv, "gate", since=self.started_at, detail=f"in the job's processes: "
             f"{record.verdict}")
        announce(record, self.job.allow_slow_network, self.log)
        if self.started_job:
            for node, line in self.waiting:
                self.print_line(node, line)
        self.waiting.clear()

    def _seconds(self) -> float:
        """The gate's time in the job's processes (rank 0's verdict line: from the entry to
        the verdict, torch's import included), else since the launch."""
        from provision.job.programs import json_lines

        for rec in json_lines("\n".join(self.output), self.inv.master.name):
            if "verdict" in rec and "seconds" in rec:
                return float(rec["seconds"])
        return time.monotonic() - self.started

    def finish(self, code: int) -> GateRecord:
        """After the launch ended with `code`: the record, kept in the inventory. Raises
        FabricGateError when the job did not start (a failed gate without
        --allow-slow-network, or a gate that never finished)."""
        with self.lock:
            if self.record is None:
                self._conclude(code if code != 0 else 1)
            record = self.record
            assert record is not None
        self.inv.fabric_gate = record
        self.store.save(self.inv)
        if not self.started_job:
            raise gate_error(record)
        return record
