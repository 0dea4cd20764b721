"""remote/allreduce.py: size parsing, the nccl-tests formulas, the pairwise schedule, a real
2-process gloo run under torchrun on CPU, and the gate mode's pairwise rounds across three
torchrun agents on this machine."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from storekit import free_port

from remote.allreduce import (
    bus_bandwidth,
    disjoint_rounds,
    main,
    pair_reference,
    parse_size,
    resolve,
    round_robin,
    sizes,
    slow_pairs,
)

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


def _gate_args(**given: object) -> argparse.Namespace:
    unset = dict.fromkeys(("min_bytes", "max_bytes", "factor", "iters", "warmup", "budget_s",
                           "timeout_s"))
    return argparse.Namespace(**{"gate": True, **unset, **given})


def test_gate_sizes_by_backend() -> None:
    """The gate's defaults fill only what is unset; gloo stops at 2 MiB (GATE_SIZES)."""
    gloo, nccl, given = _gate_args(), _gate_args(), _gate_args(max_bytes=16 * 2**20)
    resolve(gloo, "gloo")
    resolve(nccl, "nccl")
    resolve(given, "gloo")
    assert sizes(gloo.min_bytes, gloo.max_bytes, gloo.factor) == [2**18, 2**21]
    assert sizes(nccl.min_bytes, nccl.max_bytes, nccl.factor) == [2**26, 2**28, 2**30]
    assert (gloo.iters, gloo.warmup, gloo.budget_s) == (4, 1, 4.0)
    assert given.max_bytes == 16 * 2**20


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


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("n", range(2, 14))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n: int) -> None:
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)  # O(n) rounds
    for pairs in rounds:
        nodes = [x for p in pairs for x in p]
        assert len(nodes) == len(set(nodes))  # disjoint: a node is in one pair per round
        assert len(pairs) == n // 2
    met = sorted(p for pairs in rounds for p in pairs)
    assert met == list(itertools.combinations(range(n), 2))


def test_round_robin_cap_and_small_n() -> None:
    assert round_robin(1) == [] and round_robin(0) == []
    assert round_robin(2) == [[(0, 1)]]
    capped = round_robin(40, 16)
    assert len(capped) == 16
    partners = {x: set() for x in range(40)}  # type: dict[int, set[int]]
    for pairs in capped:
        for a, b in pairs:
            partners[a].add(b)
            partners[b].add(a)
    assert all(len(p) == 16 for p in partners.values())


def test_pair_reference_is_robust_to_one_slow_node_of_three() -> None:
    pairs = {(0, 1): 1.0, (0, 2): 0.01, (1, 2): 0.01}  # 2 of 3 pairs touch the slow node
    assert pair_reference(pairs) == pytest.approx(1.0)
    assert slow_pairs(pairs, 0.5) == [(0, 2), (1, 2)]
    assert disjoint_rounds([(0, 2), (1, 2), (3, 4)]) == [[(0, 2), (3, 4)], [(1, 2)]]
    assert pair_reference({}) == 0.0


@pytest.mark.slow
def test_gate_mode_measures_every_pair_across_three_torchrun_agents(tmp_path: Path) -> None:
    """Three torchrun agents on this machine stand in for three nodes (GROUP_RANK 0..2);
    --pair-fraction 4 (2 on gloo: gatejudge.pair_fraction) makes every pair a suspect, so
    the confirmation round runs too."""
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    port = str(free_port("127.0.0.1"))  # two suites on one machine never share it
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--node_rank",
             str(rank), "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
             port, "-m", "remote", "allreduce", "--gate",
             "--pairwise-below", "inf", "--pair-fraction", "4"],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(3)
    ]
    outputs = []
    for agent in agents:
        out, err = agent.communicate(timeout=180)
        assert agent.returncode == 0, err[-3000:]
        outputs.append(out)
    records = [json.loads(line) for out in outputs for line in out.splitlines()
               if line.startswith("{")]
    summary = next(r for r in records if r.get("summary"))
    assert summary["pairwise"] is True and summary["node_ranks"] == [0, 1, 2]
    assert [r["size_bytes"] for r in records if "size_bytes" in r] == [262144, 2097152]
    assert {r["largest_bytes"] for r in records if "pair" in r} == {2097152}
    first = sorted(tuple(r["pair"]) for r in records if "pair" in r and not r["confirm"])
    again = sorted(tuple(r["pair"]) for r in records if "pair" in r and r["confirm"])
    assert first == again == [(0, 1), (0, 2), (1, 2)]
    assert all(r["busbw_gbps"] > 0 and r["world_size"] == 2 for r in records if "pair" in r)
