"""remote/monitor.py: parsers on captured outputs (tests/data/), and one real sample of this
machine (no GPU here: CPU %, memory and load must still be there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from remote.monitor import (
    parse_dcgm_dmon,
    parse_gpu_query,
    parse_meminfo,
    parse_proc_stat,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def test_query_with_header_any_column_order() -> None:
    [gpu] = parse_gpu_query((DATA / "nvidia-smi" / "query-util-mem-name-last-rtx4090.csv").read_text())
    assert gpu == {"index": 0, "name": "NVIDIA GeForce RTX 4090", "util_pct": 0.0,
                   "mem_used_mib": 678, "mem_total_mib": 49140, "power_w": None,
                   "temp_c": None, "sm_active": None}
    [gpu] = parse_gpu_query((DATA / "nvidia-smi" / "query-util-mem-6gb.csv").read_text())
    assert (gpu["util_pct"], gpu["mem_used_mib"], gpu["mem_total_mib"]) == (95.0, 745, 6144)


def test_query_power_and_temperature_with_units() -> None:
    [gpu] = parse_gpu_query((DATA / "nvidia-smi" / "query-rtx3090-extra-columns.csv").read_text())
    assert (gpu["power_w"], gpu["temp_c"], gpu["mem_total_mib"]) == (17.42, 33.0, 24576)


def test_query_noheader_in_the_monitor_order() -> None:
    text = "0, NVIDIA H200, 87, 100000, 143771, 512.30, 61\n1, NVIDIA H200, [N/A], 0, 143771, [N/A], 40\n"
    a, b = parse_gpu_query(text)
    assert (a["index"], a["util_pct"], a["power_w"], a["temp_c"]) == (0, 87.0, 512.3, 61.0)
    assert (b["index"], b["util_pct"], b["power_w"]) == (1, None, None)


def test_dcgm_dmon_by_column_name() -> None:
    samples = parse_dcgm_dmon((DATA / "dcgmi" / "dmon-gputl-smact-t4.txt").read_text())
    assert samples == {0: {"GPUTL": 100.0, "SMACT": 0.576}}  # the last sample wins
    with_units = parse_dcgm_dmon((DATA / "dcgmi" / "dmon-units-row.txt").read_text())
    assert with_units[0]["POWER"] == 185.3 and with_units[0]["FBUSD"] == 28456.0
    assert "ID" not in str(with_units)


def test_proc_parsers() -> None:
    busy, total = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert (busy, total) == (150, 1000)
    used, total_mib = parse_meminfo("MemTotal:  2048000 kB\nMemFree: 1 kB\nMemAvailable: 1024000 kB\n")
    assert (used, total_mib) == (1000, 2000)


def test_one_real_sample_of_this_machine() -> None:
    res = subprocess.run([sys.executable, "-m", "remote", "monitor", "--count", "1",
                          "--interval", "0.2"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    sample = json.loads(res.stdout)
    assert sample["mem_total_mib"] > 0 and 0 <= sample["cpu_pct"] <= 100
    assert len(sample["load"]) == 3 and sample["cpus"] >= 1
    assert isinstance(sample["gpus"], list)
