"""`monitor`: every node's GPUs (or CPU, memory and load on nodes without GPUs), live.

One SSH channel per node stays open for the whole session, running `remote.pyz monitor
--interval S` (remote/monitor.py), which prints one JSON sample per interval; the table is
redrawn from the latest sample of each node. `snapshot` takes one sample of every node
(`--once`). Rendering is plain data here (`table_rows`); the CLI draws it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from provision.model.inventory import Inventory, NodeRecord
from provision.model.nodejson import monitor_sample
from provision.model.nodetext import split_lines
from provision.nodes import NodeConnection, NodeGroup
from provision.nodes.preflight import parse_last_json

HEADER = ("NODE", "DEVICE", "UTIL %", "MEMORY", "POWER", "TEMP", "LOAD")


def shared_note(inv: Inventory) -> str:
    """What the table cannot show by itself: that its numbers are not each node's own (the
    provider's ProviderInfo.monitor_note, e.g. docker's containers on one kernel); "" else."""
    from provision.model.registry import provider_info

    return provider_info(inv.provider).monitor_note


def snapshot(group: NodeGroup) -> list[dict[str, Any]]:
    """One sample of every node, in rank order: {"node", "rank", ...sample} or
    {"node", "rank", "error"} for a node that could not answer."""
    cmd = group.layout.remote_command("monitor", "--count", "1", "--interval", "0.5")
    out = []
    for name, res in group.run(cmd, timeout=60).items():
        entry: dict[str, Any] = {"node": name, "rank": res.node.rank}
        if res.ok and res.value is not None:
            sample = monitor_sample(parse_last_json(res.value.stdout))  # typed, or None
            if sample is not None:
                entry.update({k: v for k, v in sample.items() if k not in ("node", "rank")})
            else:
                entry["error"] = f"unreadable sample: {res.value.stdout[-200:]!r}"
        else:
            entry["error"] = res.why()
        out.append(entry)
    return out


class _Lines:
    """Writer (NodeConnection.run `out=`) that hands every complete JSON line to `sink`."""

    def __init__(self, sink: Any) -> None:
        self.buf, self.sink = "", sink

    def write(self, data: str) -> int:
        lines, self.buf = split_lines(self.buf + data)
        for line in lines:
            sample = monitor_sample(parse_last_json(line)) if line.strip() else None
            if sample is not None:  # a stray line (e.g. a login banner) is not a sample
                self.sink(sample)
        return len(data)

    def flush(self) -> None:
        pass


class LiveMonitor:
    """Streams samples from every node over one channel each; `latest()` is what the table
    shows. `close()` ends the channels (the remote monitors stop on the broken pipe)."""

    def __init__(self, inv: Inventory, interval: float, group: NodeGroup | None = None) -> None:
        self.group = group or NodeGroup(inv)
        self.interval = interval
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._futures: dict[Future[int], NodeRecord] = {}

    def start(self) -> None:
        cmd = self.group.layout.remote_command("monitor", "--interval", f"{self.interval:g}")

        def stream(conn: NodeConnection, node: NodeRecord) -> int:
            def sink(rec: dict[str, Any]) -> None:
                with self._lock:
                    self._latest[node.name] = {"node": node.name, "rank": node.rank, **rec}

            return conn.run(cmd, out=_Lines(sink)).exit_code

        self._futures = self.group.submit(stream)

    def latest(self) -> list[dict[str, Any]]:
        with self._lock:
            got = dict(self._latest)
        out = []
        for fut, node in sorted(self._futures.items(), key=lambda kv: kv[1].rank):
            entry = got.get(node.name, {"node": node.name, "rank": node.rank,
                                        "error": "waiting for the first sample"})
            if fut.done() and node.name not in got:
                exc = fut.exception()
                entry = {"node": node.name, "rank": node.rank,
                         "error": f"monitor ended: {exc or f'exit {fut.result()}'}"}
            out.append(entry)
        return out

    def close(self) -> None:
        self.group.close()


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def table_rows(samples: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per GPU, plus one `cpu` row per node (the only row on GPU-less nodes)."""
    rows: list[tuple[str, ...]] = []
    for s in samples:
        node = s["node"]
        if "error" in s:
            rows.append((node, "-", "-", "-", "-", "-", s["error"]))
            continue
        load = " ".join(f"{x:.2f}" for x in s.get("load", [])) or "-"
        cpu = "-" if s.get("cpu_pct") is None else f"{s['cpu_pct']:.0f}"
        rows.append((node, f"cpu x{s.get('cpus') or '?'}", cpu,
                     f"{_gib(s.get('mem_used_mib'))}/{_gib(s.get('mem_total_mib'))} GiB",
                     "-", "-", load))
        for g in s.get("gpus", []):
            util = "-" if g.get("util_pct") is None else f"{g['util_pct']:.0f}"
            if g.get("sm_active") is not None:
                util += f" (sm {100 * g['sm_active']:.0f})"
            power = "-" if g.get("power_w") is None else f"{g['power_w']:.0f} W"
            temp = "-" if g.get("temp_c") is None else f"{g['temp_c']:.0f} C"
            rows.append((node, f"gpu{g['index']} {g.get('name') or ''}".strip(), util,
                         f"{_gib(g.get('mem_used_mib'))}/{_gib(g.get('mem_total_mib'))} GiB",
                         power, temp, ""))
    return rows
