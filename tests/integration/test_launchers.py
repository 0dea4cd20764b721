"""Every launcher for real across 2 docker nodes (CPU, gloo), on one cluster; then `check`.

Each run asserts the world size EVERY rank saw (accelerate on CPU silently runs each process
alone unless told otherwise: exit codes alone would not catch it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
NAME = "it-launch"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("launch-home")
    res = cli("up", "--nodes", "2", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        down = cli("down", NAME, home=home)
        assert down.returncode == 0, down.stderr


def ranks_seen(out: str, world: int) -> None:
    """Every global rank printed `rank R/WORLD` exactly once, and on the node it belongs to."""
    found = sorted(int(m.group(1)) for m in re.finditer(rf"rank (\d+)/{world} on node-\d", out))
    assert found == list(range(world)), out
    assert not re.search(r"rank \d+/1 on", out), "a process ran alone (world size 1)"


GATED = ["--fabric-check", "on"]
IN_JOB = "(the fabric gate first, in the same processes)"


@pytest.mark.parametrize(
    "args,script,gate",
    [
        (["--launcher", "torchrun"], "train_ddp.py", None),
        (["--launcher", "torchrun", "--rdzv", "--master-port", "29511", *GATED], "train_ddp.py",
         IN_JOB),
        (["--launcher", "accelerate", "--master-port", "29512", *GATED], "train_accelerate.py",
         IN_JOB),
        (["--launcher", "deepspeed", "--master-port", "29513", *GATED], "train_deepspeed.py",
         "fabric gate: a run of its own before the job (DeepSpeed's pdsh mode"),
        (["--launcher", "deepspeed", "--deepspeed-launcher", "no_ssh", "--master-port", "29514",
          *GATED], "train_deepspeed.py", IN_JOB),
    ],
    ids=["torchrun-static", "torchrun-c10d-gated", "accelerate-gated", "deepspeed-pdsh-gated",
         "deepspeed-no_ssh-gated"],
)
def test_launcher_trains_with_every_rank(cluster: Path, tmp_path: Path, args: list[str],
                                         script: str, gate: str | None) -> None:
    """Gated (--fabric-check on): the gate runs first, in the processes the launcher starts
    for the job where it can (then the script's own init_process_group must still see the
    whole world), as a run of its own for DeepSpeed's pdsh mode."""
    res = cli("launch", NAME, *args, "--", str(ROOT / "examples" / script), "--steps", "6",
              home=cluster, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    ranks_seen(out, 4)
    if gate is not None:
        assert gate in res.stderr and "fabric gate: pass" in res.stderr, res.stderr
        assert "MGPU-GATE" not in res.stdout  # the gate's own lines are not the job's output
    assert "done: world_size=4" in out
    fetched = [p for p in (tmp_path / "mgpu-outputs" / NAME).rglob("*") if p.is_file()]
    assert fetched, "rank 0's outputs were not copied back"


def test_check_reports_no_gpu_and_gloo_bandwidth(cluster: Path) -> None:
    res = cli("check", NAME, "--bandwidth", "--min-bytes", "64K", "--max-bytes", "1M",
              "--json", home=cluster)
    report = json.loads(res.stdout)
    assert res.returncode == 0, res.stderr
    for node in ("node-0", "node-1"):
        pre = report["preflight"][node]
        assert pre["gpus"] == [] and "nvidia-smi" in pre["gpu_error"]
        assert pre["torch"]["torch"].startswith("2.13.0")
    assert any(f["check"] == "no-gpu" and f["severity"] == "info" for f in report["findings"])
    sizes = [r for r in report["bandwidth"]["records"] if "busbw_gbps" in r]
    assert [r["size_bytes"] for r in sizes][0] == 64 * 1024
    assert all(r["busbw_gbps"] > 0 for r in sizes)


def test_failed_launch_is_diagnosed(cluster: Path, tmp_path: Path) -> None:
    bad = tmp_path / "oom.py"
    bad.write_text("raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n")
    res = cli("launch", NAME, "--nproc-per-node", "1", "--", str(bad), home=cluster, cwd=tmp_path)
    assert res.returncode != 0
    assert "likely cause" in res.stderr and "batch" in res.stderr.lower(), res.stderr
