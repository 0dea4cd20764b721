"""The environment torchrun's processes get: OMP_NUM_THREADS where torchrun would set it
itself (then it also prints a 5-line banner on every node), the job's own value kept."""

from __future__ import annotations

from pathlib import Path

from provision.job.launch import node_command
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv(slots: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=slots) for r in range(2)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def test_torchrun_gets_omp_num_threads_as_it_would_set_it_without_its_banner() -> None:
    two = _inv(slots=2)
    job = build_job_spec({}, {"script": EXAMPLE})
    assert "OMP_NUM_THREADS=1" in node_command(two, job, two.nodes[0], "R")
    mine = build_job_spec({}, {"script": EXAMPLE, "env": {"OMP_NUM_THREADS": "6"}})
    cmd = node_command(two, mine, two.nodes[0], "R")
    assert "OMP_NUM_THREADS=6" in cmd and "OMP_NUM_THREADS=1" not in cmd
    one = build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "1"})
    assert "OMP_NUM_THREADS" not in node_command(two, one, two.nodes[0], "R")  # torchrun: none
    gpus = _inv(slots=1)  # 'gpu' on one-GPU nodes: one process, torchrun sets nothing
    by_gpu = build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "gpu"})
    assert "OMP_NUM_THREADS" not in node_command(gpus, by_gpu, gpus.nodes[0], "R")
