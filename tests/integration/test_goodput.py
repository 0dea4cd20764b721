"""Goodput on real docker nodes (issue 36): a run with two failures accounts for every
node-second, and a restart that ignored its checkpoint is flagged at its first step."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import runkit
from engine import LABEL, other_live_runs
from runkit import Run

from provision.job.ledger import availability_interval
from provision.model.inventory import InventoryStore
from provision.model.jobstore import JobStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from runkit.cluster_name("gp-", request)


def test_two_failures_every_node_second_accounted_and_a_silent_restart_flagged(
        tmp_path: Path, cluster_name: str) -> None:
    """Attempt 1 crashes at step 12; attempt 2 ignores its checkpoint (flagged: `resume
    regression`) and loses node-1; attempt 3 (flagged again) finishes. The ledger's buckets
    sum to wall time x 2 nodes, each failure's lost work is `redone`, and the advice is
    arXiv 2410.18124's interval on the measured save cost, time between failures and
    recovery time."""
    began = time.time()
    # the second attempt holds at its last step: the kill cannot come after its end, however
    # late the kept checkpoint is said (CI stop 53's resident test: it came after the end)
    run = Run(cluster_name, ["--nodes", "2", "--max-restarts", "2", EXAMPLE, "--steps", "70",
                             "--save-every", "5", "--sleep", "0.2", "--fail-once-at-step", "12",
                             "--ignore-checkpoint", "--hold-once-at-step", "69",
                             "--hold-in-restart", "1"], tmp_path)
    flagged = run.wait_for(r"resume regression: saved \d+, restarted at 0")
    assert int(re.search(r"saved (\d+)", flagged).group(1)) > 0  # type: ignore[union-attr]
    run.wait_for(r"kept checkpoint from node-0: .*step_0000(09|14)")
    subprocess.run(["docker", "kill", f"{cluster_name}-node-1"], check=True, capture_output=True)
    run.wait_for(r"node-hours: ")
    seen_at = time.time()
    code = run.finish()
    out = run.output
    assert code == 0, out
    assert out.count("resume regression: saved") == 2, out
    assert "failure: rank crash" in out and "failure: node lost (node-1)" in out, out
    led = JobStore().latest(cluster_name).ledger  # type: ignore[union-attr]
    assert led is not None, out
    secs = led["node_seconds"]
    assert math.isclose(sum(secs.values()), led["wall_s"] * 2, rel_tol=0.01), led
    # the run's clock starts with its process, known to the hundredth (/proc's clock ticks
    # and uptime, each cut to 0.01 s: timeline.process_started_at): 0.02 s either way
    assert seen_at - began - 10 <= led["wall_s"] <= seen_at - began + 0.02, \
        (led, seen_at - began)
    assert led["failures"] == 2
    for bucket in ("provisioning", "setup", "training", "checkpoint", "redone", "recovery"):
        assert secs[bucket] > 0, (bucket, led)
    assert led["recovery_s"] > 0, led  # two failures, each recovered
    expected = availability_interval(led["save_cost_s"], led["wall_s"] / 2,  # as rounded in
                                     led["recovery_s"])  # the record
    assert abs(led["advice_s"] - expected) <= 0.1, (led, expected)
    assert "arXiv 2410.18124" in out and "redone" in out, out[-2000:]


def _compute(lines: list[str], node: str) -> list[float]:
    return [float(m.group(1)) for line in lines if line.startswith(f"[{node}]")
            for m in [re.search(r"compute=([\d.]+)", line)] if m]


@pytest.mark.xdist_group("serial")  # one worker runs the serial tests (tests/conftest.py)
@pytest.mark.serial  # node-1's compute against node-0's: other tests' load would blur it
def test_a_slowed_node_is_named_then_swapped_and_the_run_speeds_up_again(
        tmp_path: Path, cluster_name: str) -> None:
    """node-1's CPU is cut to a tenth (docker update --cpus): its ranks' forward passes slow
    down ~10x; it is named within a bounded number of markers, and with --replace-slow the
    run saves, replaces it, resumes, and node-1's ranks are as fast as node-0's again. The
    host is remembered (blocklist.json) and named in the next plan."""
    import json
    import os

    # --slow-fraction 4 (named above 5x): the throttle makes node-1 12-20x slower (medians of
    # 12 markers: 0.10-0.20 s vs 0.008 s), while a healthy node's median on these 2 shared
    # cores was seen at 3.2x its peer's (a suite run: the fresh replacement named slow at
    # "0.017 s vs 0.005 s", the one restart used, exit 143). The rule is the product's; the
    # threshold sits above the machine's noise and far below the throttle.
    shared = other_live_runs()  # another suite's load (conftest's lock is per run)
    run = Run(cluster_name, ["--nodes", "2", "--max-restarts", "1", "--replace-slow",
                             "--slow-fraction", "4", EXAMPLE, "--steps", "260", "--batch-size",
                             "2048", "--hidden", "2048", "--compute-every", "5"], tmp_path)
    run.wait_for(r"\[node-0\] step 40 ")
    old = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", f"{cluster_name}-node-1"],
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["docker", "update", "--cpus", "0.1", f"{cluster_name}-node-1"], check=True,
                   capture_output=True)
    throttled_at = len(run.lines)
    named = run.wait_for(r"node-1 is slow: compute")
    slow1 = _compute(run.lines[throttled_at:], "node-1")  # the throttled node's markers
    reports = sum("[node-1]" in line and "compute=" in line for line in run.lines[throttled_at:])
    assert reports <= 2 * 40, f"named after {reports} of node-1's markers"  # 40 steps' worth
    code = run.finish(timeout=600)
    out = run.output
    assert code == 0, out
    assert "replacing it (--replace-slow)" in named
    assert "node-1: slow; every rank is asked to save now" in out, out
    assert "replacing node-1 (slow node)" in out and "resumed from step" in out, out
    after = run.output[run.output.index("resumed from step"):].splitlines()
    fast0, fast1 = _compute(after, "node-0"), _compute(after, "node-1")
    assert len(fast1) >= 6, out
    # the product did not name the replacement slow against node-0 in the same window (its
    # own rule; exit 0 above: the one restart was the swap)
    assert len(re.findall(r"node-1 is slow: compute", out)) == 1, out
    # the replacement is not the throttled node: its median is a fraction of what node-1's
    # was (the throttle: 12-20x). Not against node-0's at the same moment: two containers on
    # 2 shared cores differ by 3x at times while other tests run. Two windows' medians only
    # compare while this suite is the machine's only one: beside a second suite (run 92:
    # 0.18 s throttled, then 0.057 s replaced, node-0 meanwhile 0.06-0.45 s) the blocklist's
    # `old` below says which container was swapped out.
    med = sorted(fast1)[len(fast1) // 2]
    if not (shared or other_live_runs()):
        assert slow1 and med < sorted(slow1)[len(slow1) // 2] / 4, (slow1, fast1, fast0)
    kept = json.loads((Path(os.environ["MGPU_CLOUD_HOME"]) / "blocklist.json").read_text())
    assert any(h["resource"] == old and h["cluster"] == cluster_name for h in kept["docker"])
    plan = subprocess.run([sys.executable, "-m", "provision.cli", "up", "--provider", "docker",
                           "--nodes", "1", "--name", f"{cluster_name}-p", "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert "named slow and replaced before" in plan.stdout + plan.stderr, plan.stdout


def test_without_a_replacement_the_run_goes_on_smaller_and_grows_back(
        tmp_path: Path, cluster_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """--min-nodes 1 on 2 nodes: node-1 is lost and its replacement cannot be made (a
    container of someone else holds its name: the engine refuses the create), so the job goes
    on from its checkpoint on node-0 alone (world 2); once the name is free again, the
    replacement is made and the run grows back to 2 nodes (world 4) after a checkpoint."""
    monkeypatch.setenv("MGPU_GROW_EVERY_S", "3")
    run = Run(cluster_name, ["--nodes", "2", "--max-restarts", "2", "--min-nodes", "1", EXAMPLE,
                             "--steps", "160", "--save-every", "5", "--sleep", "0.2"], tmp_path)
    run.wait_for(r"kept checkpoint from node-0: .*step_0000(09|14)")
    image = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}}",
                            f"{cluster_name}-node-0"], capture_output=True, text=True,
                           check=True).stdout.strip()
    squatter = f"{cluster_name}-node-1"
    subprocess.run(["docker", "rm", "-f", squatter], check=True, capture_output=True)
    subprocess.run(["docker", "create", "--name", squatter, "--label", LABEL, image, "true"],
                   check=True,
                   capture_output=True)  # no cluster label: not the tool's to remove
    try:
        run.wait_for(r"node-1 cannot be replaced now")
        run.wait_for(r"rank 0/2 on ")  # the job again, on node-0's 2 ranks
    finally:
        subprocess.run(["docker", "rm", "-f", squatter], capture_output=True)
    run.wait_for(r"growing back to 2 node\(s\)")
    run.wait_for(r"rank 0/4 on ")
    grown_back = [r for r in InventoryStore().load(cluster_name).replacements
                  if r.reason == "grown back"]  # what a managed run's adopt counts
    assert [r.rank for r in grown_back] == [1], grown_back
    code = run.finish(timeout=600)
    out = run.output
    assert code == 0, out
    assert re.search(r"going on with 1 node\(s\) \(--min-nodes 1\)", out), out
    shrunk = out[out.index("node-1 cannot be replaced now"):out.index("growing back")]
    assert "resumed from step" in shrunk and "rank 1/2 on " in shrunk, shrunk
    assert "node-1 is back" in out
    grown = out[out.index("growing back"):]
    assert "resumed from step" in grown, grown
    assert re.search(r"attempt 1 \(job \S+\) on 2 node\(s\): node lost", out), out  # recap
    assert re.search(r"attempt 2 \(job \S+\) on 1 node\(s\)", out), out
    m = json.loads((tmp_path / "mgpu-outputs" / cluster_name / "metrics.json").read_text())
    assert m["world_size"] == 4 and m["steps"] == 160 and int(m["resumed_from"]) > 0, m
