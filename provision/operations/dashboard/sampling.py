"""Live GPU/CPU samples of a cluster's nodes for the cluster page.

The source is the one `mgpu-cloud monitor` reads: `remote.pyz monitor --interval S` on every
node (remote/monitor.py), one JSON sample per line over one SSH channel per node. Unlike the
terminal monitor, each node has a thread of its own (a pool of 32 would leave nodes 33..64
without a stream) that starts the channel again RETRY_S after it breaks, so a node that comes
back shows again; a node that does not answer shows why, never a blank.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from provision.model.inventory import Inventory, NodeRecord
from provision.model.nodejson import monitor_sample
from provision.model.nodetext import split_lines
from provision.nodes import NodeGroup, describe_exception
from provision.nodes.preflight import parse_last_json
from provision.operations.dashboard.metrics import align, sample_values

RETRY_S = 5.0
HISTORY = 900  # samples kept per node (30 min at the default 2 s)
WAITING = "waiting for the first sample"


class JsonLines:
    """Writer for NodeConnection.run(out=...): every complete JSON object line to `sink`."""

    def __init__(self, sink: Callable[[dict[str, Any]], None]) -> None:
        self.buf, self.sink = "", sink

    def write(self, data: str) -> int:
        lines, self.buf = split_lines(self.buf + data)
        for line in lines:
            rec = monitor_sample(parse_last_json(line))  # typed (nodejson), or None
            if rec is not None:
                self.sink(rec)
        return len(data)

    def flush(self) -> None:
        pass


class ClusterWatch:
    """Streams samples from every node of `inv` until `close()`; thread-safe readers."""

    def __init__(self, inv: Inventory, interval: float = 2.0) -> None:
        self.inv, self.interval = inv, interval
        self.group = NodeGroup(inv)
        self.nodes = list(self.group.nodes)
        self.last_used = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, float] = {}  # node -> time of its last good sample
        self._errors: dict[str, str] = {}
        self._history: dict[str, deque[tuple[float, dict[str, float | None]]]] = {
            n.name: deque(maxlen=HISTORY) for n in self.nodes}

    def start(self) -> ClusterWatch:
        cmd = self.group.layout.remote_command("monitor", "--interval", f"{self.interval:g}")
        for node in self.nodes:
            threading.Thread(target=self._stream, args=(node, cmd), daemon=True,
                             name=f"dashboard-monitor-{node.name}").start()
        return self

    def _stream(self, node: NodeRecord, cmd: str) -> None:
        while not self._stop.is_set():
            try:
                conn = self.group.connection(node)
                code = conn.run(cmd, out=JsonLines(lambda s: self._add(node, s))).exit_code
                why = f"the node's monitor ended (exit {code})"
            except Exception as exc:  # noqa: BLE001 - shown on the page, then retried
                why = describe_exception(exc)
                with contextlib.suppress(Exception):
                    self.group.drop(node)
            if self._stop.is_set():
                return
            with self._lock:
                self._errors[node.name] = why
            self._stop.wait(RETRY_S)

    def _add(self, node: NodeRecord, sample: dict[str, Any]) -> None:
        now = time.time()
        with self._lock:
            self._latest[node.name] = sample
            self._seen[node.name] = now
            self._errors.pop(node.name, None)
            self._history[node.name].append((now, sample_values(sample)))

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def latest(self) -> list[dict[str, Any]]:
        """Every node in rank order: {"node", "rank", "answering": bool, "age_s", ...the
        latest sample, "values": sample_values(...)}; a node with no recent sample has
        "error" (why) instead, e.g. the SSH error or how long it has been silent."""
        now = time.time()
        stale_after = 3 * self.interval + 10
        out = []
        with self._lock:
            for n in self.nodes:
                entry: dict[str, Any] = {"node": n.name, "rank": n.rank, "answering": False}
                sample, seen = self._latest.get(n.name), self._seen.get(n.name)
                if sample is not None and seen is not None and now - seen <= stale_after:
                    entry.update(sample)
                    entry.update(answering=True, age_s=round(now - seen, 1),
                                 values=sample_values(sample))
                elif n.name in self._errors:
                    entry["error"] = f"not answering: {self._errors[n.name]}"
                elif seen is not None:
                    entry["error"] = f"not answering: no sample for {now - seen:.0f} s"
                else:
                    entry["error"] = WAITING
                out.append(entry)
        return out

    def series(self) -> dict[str, Any]:
        """Chart data: {"kind": "gpu" | "cpu", "nodes": [names], "util", "mem", "power": uPlot
        aligned data (power None without GPUs)}. Without GPUs on any node, util is CPU % and
        mem the host's memory."""
        with self._lock:
            hist = {name: list(points) for name, points in self._history.items()}
        names = [n.name for n in self.nodes]
        gpu = any(v["gpu_util"] is not None for pts in hist.values() for _, v in pts)
        util_key, mem_key = ("gpu_util", "gpu_mem_gib") if gpu else ("cpu_pct", "mem_gib")

        def data(key: str) -> list[list[Any]]:
            return align([[(t, v[key]) for t, v in hist[name]] for name in names],
                         self.interval)

        return {"kind": "gpu" if gpu else "cpu", "nodes": names, "util": data(util_key),
                "mem": data(mem_key), "power": data("power_w") if gpu else None}

    def close(self) -> None:
        self._stop.set()
        self.group.close()
