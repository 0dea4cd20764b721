"""What a failed or interrupted `run` ends with, on real docker nodes and real torchrun: the
rank that failed first and its exception in the last lines (not a Gloo hint for a peer that
only lost its connection), and after a Ctrl-C one line instead of every rank's traceback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import runkit
from runkit import Run

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from runkit.cluster_name("fs-", request)

FAILING = """\
import time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 100):
    if rank == 2 and step == 3:
        raise ValueError(f"bad batch at step {step}")
    dist.barrier()
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.3)
"""


def test_the_first_failing_rank_ends_the_output(tmp_path: Path, cluster_name: str) -> None:
    (tmp_path / "fail3.py").write_text(FAILING)
    run = Run(cluster_name, ["--nodes", "2", "--nproc-per-node", "2", "fail3.py"], tmp_path)
    code = run.finish()
    out = run.output
    assert code != 0, out
    tail = "\n".join(out.splitlines()[-12:])  # the cause's lines, the recap, the teardown
    # rank 2 is node-1's first process (2 per node); the other three died of its crash
    # its exit code is node-1's torchrun's word: 1, or -15 when rank 3 (which it broke) ended
    # first while rank 2 was still tearing down: torchrun then stops it and records the signal
    # (tests/test_cause.py has that block); the output says so in the line after the frames
    m = re.search(r"first failure: rank 2 \(node-1\), exit (1|-15 \(SIGTERM\)): ValueError: "
                  r"bad batch at step 3 \(fail3\.py:8\)", tail)
    assert m, tail
    stopped = "when torchrun on node-1 stopped it (SIGTERM): rank 3 ended first"
    assert (stopped in tail) == (m.group(1) != "1"), tail
    assert 'raise ValueError(f"bad batch at step {step}")' in tail, tail
    # the ranks whose own error came are named: a rank its torchrun stopped (SIGTERM) before
    # its collective failed prints none and is not (run 73: rank 3 on a busy machine); each
    # node has a rank whose collective failed first (node-0's are stopped 3 s later)
    after = re.search(r"then ranks? ([\d, ]+) failed because of it: consequences", tail)
    assert after, tail
    named = {int(r) for r in after.group(1).split(", ")}
    assert named <= {0, 1, 3} and named & {0, 1}, tail
    # the peers' dropped connections and torchrun's SIGTERMs are consequences, not causes
    assert "GLOO_SOCKET_IFNAME" not in out and "likely cause" not in out, out
    assert "failure: rank crash (node-1)" in tail, tail


def test_ctrl_c_during_run_says_one_line_not_every_rank(tmp_path: Path,
                                                         cluster_name: str) -> None:
    (tmp_path / "slow.py").write_text(FAILING.replace("rank == 2", "rank == 99"))
    run = Run(cluster_name, ["--nodes", "2", "--nproc-per-node", "2", "slow.py"], tmp_path)
    run.wait_for(r"\[node-1\] rank \d step 2\b")
    run.interrupt()
    code = run.finish()
    out = run.output
    assert code == 130, out
    after = out.split("stopped by you (Ctrl-C)", 1)
    assert len(after) == 2, out
    assert f"(its logs: mgpu-cloud logs {cluster_name} 1)" in after[1], out
    shown = [line for line in after[1].splitlines() if line.startswith("[node-")]
    assert shown == [], "\n".join(shown)  # no SignalException tracebacks of the ranks
    assert f"cluster '{cluster_name}' removed" in after[1], out
