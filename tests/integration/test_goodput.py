"""Goodput on real docker nodes (issue 36): a run with two failures accounts for every
node-second, and a restart that ignored its checkpoint is flagged at its first step."""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import runkit
from runkit import Run

from provision.job.ledger import young_daly
from provision.model.jobstore import JobStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from runkit.cluster_name("gp-", request)


def test_two_failures_every_node_second_accounted_and_a_silent_restart_flagged(
        tmp_path: Path, cluster_name: str) -> None:
    """Attempt 1 crashes at step 12; attempt 2 ignores its checkpoint (flagged: `resume
    regression`) and loses node-1; attempt 3 (flagged again) finishes. The ledger's buckets
    sum to wall time x 2 nodes, each failure's lost work is `redone`, and the advice is
    Young/Daly's formula on the measured save cost and time between failures."""
    began = time.time()
    run = Run(cluster_name, ["--nodes", "2", "--max-restarts", "2", EXAMPLE, "--steps", "50",
                             "--save-every", "5", "--sleep", "0.2", "--fail-once-at-step", "12",
                             "--ignore-checkpoint"], tmp_path)
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
    assert seen_at - began - 10 <= led["wall_s"] <= seen_at - began, (led, seen_at - began)
    assert led["failures"] == 2
    for bucket in ("provisioning", "setup", "training", "checkpoint", "redone", "recovery"):
        assert secs[bucket] > 0, (bucket, led)
    expected = young_daly(led["save_cost_s"], led["wall_s"] / 2)  # both as rounded in the record
    assert abs(led["advice_s"] - expected) <= 0.1, (led, expected)
    assert "Young/Daly" in out and "redone" in out
