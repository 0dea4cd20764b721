"""Numbers for the charts: metrics a training script prints, and `monitor` samples.

Metrics come from a job's log lines. A line gives a metric for each `KEY=NUMBER`,
`KEY: NUMBER` or `'KEY': NUMBER` (a printed Python dict, as Hugging Face's Trainer logs) whose
KEY names something people chart (CHARTED: losses, accuracies, learning rate, gradient norm,
perplexity, MFU, and every rate `.../s` such as `samples/s`), and for `loss NUMBER`
(`step 10 loss 0.1234`). The x of a point is the step (`step N` on the line, else the last
step that node printed), or the point's index when no step was ever printed.

`MGPU-EVENT {json}` lines (remote/supervise.py: a preemption notice) become events for the
job's time axis. Pure code: no I/O, tested on captured lines.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from typing import Any

from provision.model.nodejson import NodeEvent, Unreadable, read, unreadable
from provision.model.nodetext import shown

NUM = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
PAIR_RE = re.compile(
    rf"""(?<![\w/.])['"]?(?P<key>[A-Za-z][\w./-]*?)['"]?\s*[=:]\s*(?P<val>{NUM})(?![\w.])""")
LOSS_RE = re.compile(rf"\b(?P<key>loss)\s+(?P<val>{NUM})(?![\w.])", re.I)
STEP_RE = re.compile(r"\b(?:global_)?step[\s=:]+(\d{1,15})\b", re.I)  # int() of 5000 digits raises
CHARTED = re.compile(r"(^|[_/.-])(loss|acc|accuracy|lr|learning_rate|grad_norm|ppl|perplexity"
                     r"|mfu|throughput)($|[_/.-])|/s$", re.I)
EVENT_PREFIX = "MGPU-EVENT "  # as remote/supervise.py prints it
MAX_POINTS = 5000  # per series; older points are thinned (every other one kept) beyond this


def parse_metrics(line: str) -> dict[str, float]:
    """The charted metrics on one line (finite values only), keys as printed."""
    out: dict[str, float] = {}
    for m in (*PAIR_RE.finditer(line), *LOSS_RE.finditer(line)):
        key = m.group("key")
        if not CHARTED.search(key) or key in out:
            continue
        value = float(m.group("val"))
        if math.isfinite(value):
            out[key] = value
    return out


def parse_step(line: str) -> int | None:
    m = STEP_RE.search(line)
    return int(m.group(1)) if m else None


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_event(line: str, node: str, seen_at: float | None) -> dict[str, Any] | None:
    """An MGPU-EVENT line as an event {"event", "node", "t", "detail"}; `t` is the time the
    notice names, else `seen_at` (when the line was read live), else None."""
    text = line.strip()
    if not text.startswith(EVENT_PREFIX):
        return None
    try:
        data = read(NodeEvent, text[len(EVENT_PREFIX):]).fields()
    except Unreadable as exc:
        return {"event": "unreadable", "node": node, "t": seen_at,
                "detail": unreadable(node, "event", exc)}
    detail = " ".join(f"{k}={data[k]}" for k in ("action", "source", "signal", "processes")
                      if k in data)
    return {"event": shown(data["event"]), "node": node,
            "t": _epoch(data.get("time")) or seen_at, "detail": detail}


class Series:
    """One metric's points; thinned to at most MAX_POINTS (every other point kept)."""

    def __init__(self) -> None:
        self.x: list[float] = []
        self.y: list[float] = []

    def add(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > MAX_POINTS:
            self.x, self.y = self.x[::2], self.y[::2]


class LogParser:
    """Metrics and events of ONE node's log, fed line by line (not thread-safe: the caller
    holds its own lock)."""

    def __init__(self, node: str, live: bool = True) -> None:
        self.node, self.live = node, live
        self.step: int | None = None
        self.series: dict[str, Series] = {}
        self.events: list[dict[str, Any]] = []

    def feed(self, line: str) -> None:
        if line.startswith(EVENT_PREFIX):
            event = parse_event(line, self.node, time.time() if self.live else None)
            if event is not None:
                self.events.append(event)
            return
        step = parse_step(line)
        if step is not None:
            self.step = step
        for key, value in parse_metrics(line).items():
            s = self.series.setdefault(key, Series())
            x = float(self.step) if self.step is not None else float(len(s.x))
            s.add(x, value)


def merged_metrics(parsers: list[tuple[int, LogParser]]) -> dict[str, dict[str, Any]]:
    """{key: {"node", "x": [...], "y": [...]}} over nodes given as (rank, parser): each metric
    from the lowest-rank node that printed it (rank 0 usually logs; ranks repeat it)."""
    out: dict[str, dict[str, Any]] = {}
    for _rank, p in sorted(parsers, key=lambda rp: rp[0]):
        for key, s in p.series.items():
            if key not in out and s.x:
                out[key] = {"node": p.node, "x": list(s.x), "y": list(s.y)}
    return out


# --- monitor samples -> aligned chart series ----------------------------------------------
def sample_values(sample: dict[str, Any]) -> dict[str, float | None]:
    """One remote/monitor.py sample as the cluster page charts it: GPU utilisation (mean over
    the node's GPUs), GPU memory used (GiB, sum), power (W, sum); CPU % and host memory (GiB)
    for nodes without GPUs."""
    gpus = sample.get("gpus") or []

    def total(key: str, scale: float = 1.0) -> float | None:
        vals = [g[key] for g in gpus if isinstance(g.get(key), int | float)]
        return round(sum(vals) / scale, 3) if vals else None

    utils = [g["util_pct"] for g in gpus if isinstance(g.get("util_pct"), int | float)]
    mem = sample.get("mem_used_mib")
    return {
        "gpu_util": round(sum(utils) / len(utils), 2) if utils else None,
        "gpu_mem_gib": total("mem_used_mib", 1024.0),
        "power_w": total("power_w"),
        "cpu_pct": sample.get("cpu_pct"),
        "mem_gib": round(mem / 1024, 3) if isinstance(mem, int | float) else None,
    }


def align(history: list[list[tuple[float, float | None]]], step: float) -> list[list[Any]]:
    """Per-node (time, value) lists -> uPlot's aligned data [xs, ys_node0, ys_node1, ...]:
    times rounded to `step` (nodes sample at slightly different moments), None where a node
    has no value at that time."""
    step = max(step, 1e-3)
    keyed = [{round(t / step) * step: v for t, v in points} for points in history]
    xs = sorted({x for k in keyed for x in k})
    return [xs, *[[k.get(x) for x in xs] for k in keyed]]
