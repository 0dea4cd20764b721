"""remote/allreduce.py: size parsing, the nccl-tests formulas, and a real 2-process gloo run
under torchrun on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote.allreduce import bus_bandwidth, main, parse_size, sizes

ROOT = Path(__file__).resolve().parents[2]


def test_parse_size() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64K") == 65536
    assert parse_size("1M") == 2**20
    assert parse_size("1G") == 2**30
    assert parse_size("1MiB") == 2**20


def test_sizes_double_or_quadruple() -> None:
    assert sizes(2**20, 2**30, 2)[0] == 2**20 and sizes(2**20, 2**30, 2)[-1] == 2**30
    assert len(sizes(2**20, 2**30, 2)) == 11
    assert sizes(2**20, 2**30, 4) == [2**20, 2**22, 2**24, 2**26, 2**28, 2**30]
    with pytest.raises(ValueError):
        sizes(2**20, 2**10, 2)


def test_busbw_formula_matches_nccl_tests() -> None:
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all_reduce
    assert bus_bandwidth(100.0, 8) == pytest.approx(175.0)
    assert bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert bus_bandwidth(10.0, 1) == 0.0


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("allreduce", ["--min-bytes", "1M", "--max-bytes", "1K"]) == 2
    assert main("allreduce", ["--factor", "3"]) == 2


@pytest.mark.slow
def test_two_rank_gloo_run_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "remote", "allreduce",
        "--min-bytes", "4K", "--max-bytes", "64K", "--iters", "3", "--warmup", "1",
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    per_size, summary = records[:-1], records[-1]
    assert [r["size_bytes"] for r in per_size] == [4096, 8192, 16384, 32768, 65536]
    for r in per_size:
        assert r["backend"] == "gloo" and r["world_size"] == 2
        assert r["count"] == r["size_bytes"] // 4
        assert len(r["rank_time_us"]) == 2 and r["time_us"] == max(r["rank_time_us"])
        assert r["algbw_gbps"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"], rel=0.01)  # 2(n-1)/n = 1 for n=2
    assert summary["summary"] is True and len(summary["hosts"]) == 2
    assert summary["max_busbw_gbps"] >= summary["avg_busbw_gbps"] > 0
