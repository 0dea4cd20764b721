"""`monitor`: one JSON line per sample of this node's GPUs, CPU, memory and load.

    python3 remote.pyz monitor [--interval S] [--count N]

Each line: {"host", "time", "cpu_pct", "mem_used_mib", "mem_total_mib", "load": [1, 5, 15],
"gpus": [{index, name, util_pct, mem_used_mib, mem_total_mib, power_w, temp_c, sm_active}],
"gpu_source": "nvidia-smi" | "nvidia-smi+dcgm" | null, "gpu_error": str | null}.

GPUs come from `nvidia-smi --query-gpu` (every sample); when `dcgmi` is installed, DCGM's
SM activity (SMACT, which nvidia-smi does not have) is added. A node without GPUs still
reports CPU % (from /proc/stat between two samples), memory (/proc/meminfo) and load, so the
monitor is real on docker nodes. It runs until killed (the controller closing the channel)
or `--count` samples; the first sample comes after a short CPU measuring window.
Stdlib only; the parsers are pure and tested on captured outputs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from remote.preflight import _field_key, _text

GPU_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw",
              "temperature.gpu")
GPU_ARGS = [f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
# DCGM field ids: 203 GPU utilisation, 252 framebuffer used, 155 power, 150 temperature,
# 1002 SM active (a profiling field; DCGM prints it as SMACT).
DCGM_ARGS = ["dmon", "-e", "203,252,155,150,1002", "-c", "1"]
FIRST_WINDOW_S = 0.5


def _float(value: str | None) -> float | None:
    """'17.42 W' / '61' -> float; N/A, '-' and garbage -> None."""
    if value is None:
        return None
    text = _text(value)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_gpu_query(csv_text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=...` in GPU_FIELDS order (noheader) or with a header naming
    its columns (any order; units and N/A accepted). Absent values are None."""
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    if not lines:
        return []
    rows = list(csv.reader(lines, skipinitialspace=True))
    fields: list[str] = list(GPU_FIELDS)
    first = [_field_key(c) for c in rows[0]]
    if any(cell in ("index", "name", "memory.total", "utilization.gpu") for cell in first):
        fields, rows = first, rows[1:]
    gpus = []
    for position, row in enumerate(rows):
        cells = dict(zip(fields, (c.strip() for c in row), strict=False))
        index = _float(cells.get("index"))
        used, total = _float(cells.get("memory.used")), _float(cells.get("memory.total"))
        gpus.append({
            "index": position if index is None else int(index),
            "name": _text(cells.get("name")),
            "util_pct": _float(cells.get("utilization.gpu")),
            "mem_used_mib": None if used is None else int(used),
            "mem_total_mib": None if total is None else int(total),
            "power_w": _float(cells.get("power.draw")),
            "temp_c": _float(cells.get("temperature.gpu")),
            "sm_active": None,
        })
    return gpus


def parse_dcgm_dmon(text: str) -> dict[int, dict[str, float | None]]:
    """`dcgmi dmon -e ...` -> GPU index -> {short column name: value}, the last row of each
    GPU winning. Columns are found by the header's names (`#Entity GPUTL SMACT ...`); a units
    line (`ID  W  C`) and N/A values are skipped."""
    header: list[str] = []
    out: dict[int, dict[str, float | None]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            header = [w.lstrip("#") for w in words]  # "#Entity" then the field names
            continue
        if words[0] != "GPU" or len(words) < 2 or not header:
            continue
        try:
            index = int(words[1])
        except ValueError:
            continue
        names = header[1:]  # "Entity" covers the two words "GPU N"
        out[index] = {name: _float(value) for name, value in zip(names, words[2:], strict=False)}
    return out


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(busy, total) jiffies of the `cpu` line of /proc/stat."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            total = sum(values[:8])  # guest time is already part of user
            return total - idle, total
    return 0, 0


def parse_meminfo(text: str) -> tuple[int, int]:
    """(used, total) MiB: total - MemAvailable (what `free` calls used + cache pressure)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0])
    total = values.get("MemTotal", 0)
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return (total - available) // 1024, total // 1024


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _run(argv: list[str], timeout: float = 10.0) -> tuple[int, str]:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return res.returncode, res.stdout if res.returncode == 0 else (res.stderr or res.stdout)


def gpu_sample() -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(gpus, source, error)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None, "nvidia-smi not found"
    code, out = _run([smi, *GPU_ARGS])
    if code != 0:
        return [], None, f"nvidia-smi failed: {out.strip()[-200:]}"
    gpus, source = parse_gpu_query(out), "nvidia-smi"
    dcgmi = shutil.which("dcgmi")
    if dcgmi is not None:
        code, out = _run([dcgmi, *DCGM_ARGS])
        if code == 0:
            dmon = parse_dcgm_dmon(out)
            for gpu in gpus:
                gpu["sm_active"] = dmon.get(gpu["index"], {}).get("SMACT")
            source = "nvidia-smi+dcgm"
    return gpus, source, None


def sample(prev_cpu: tuple[int, int]) -> tuple[dict[str, Any], tuple[int, int]]:
    cpu = parse_proc_stat(_read("/proc/stat"))
    busy, total = cpu[0] - prev_cpu[0], cpu[1] - prev_cpu[1]
    used, mem_total = parse_meminfo(_read("/proc/meminfo"))
    gpus, source, error = gpu_sample()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "host": socket.gethostname(), "time": round(time.time(), 3),
        "cpu_pct": round(100.0 * busy / total, 1) if total > 0 else None,
        "cpus": os.cpu_count(), "mem_used_mib": used, "mem_total_mib": mem_total,
        "load": load, "gpus": gpus, "gpu_source": source, "gpu_error": error,
    }, cpu


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=0, help="samples, then exit (0: forever)")
    args = parser.parse_args(argv)
    cpu = parse_proc_stat(_read("/proc/stat"))
    time.sleep(min(FIRST_WINDOW_S, args.interval))
    n = 0
    while True:
        record, cpu = sample(cpu)
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
        n += 1
        if args.count and n >= args.count:
            return 0
        time.sleep(args.interval)
