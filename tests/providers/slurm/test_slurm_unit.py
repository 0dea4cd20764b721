"""The slurm provider without a cluster: its teardown when the login node is unreachable, the
CLI's flags, container images on the nodes' runtime, the example cluster file. Its command
lines: test_slurm_commands.py; its plan: test_slurm_plan.py; a scripted login node:
test_slurm_transport.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurmkit import TARGET, node, spec_of
from typer.testing import CliRunner

from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.provider import SlurmProvider
from provision.cluster.providers.slurm.transport import JOB_KIND, LOGIN_KIND
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore, ResourceRecord
from provision.model.spec import build_cluster_spec


def test_destroy_keeps_the_inventory_when_the_login_node_is_unreachable(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = TARGET.model_copy(update={"login": TARGET.login.model_copy(update={"port": port})})
    store = InventoryStore()
    inv = Inventory(name="c1", provider="slurm", spec=spec_of())
    store.create(inv)
    store.record(inv, ResourceRecord(kind=LOGIN_KIND, id="x",
                                     extra={"target": target.model_dump_json()}))
    store.record(inv, ResourceRecord(kind=JOB_KIND, id="77", name="mgpu-cloud-c1"))
    with pytest.raises(TeardownError) as err:
        SlurmProvider().destroy(inv, store)
    assert "cancel allocation(s) 77" in err.value.message and "scancel 77" in (err.value.hint or "")
    assert [r.id for r in store.load("c1").resources_of(JOB_KIND)] == ["77"]


def test_cli_flags_and_spec() -> None:
    from provision.cli import app

    runner = CliRunner()
    help_text = runner.invoke(app, ["up", "--help"]).output
    for flag in ("--login", "--partition", "--account", "--qos", "--constraint",
                 "--node-access", "--queue-timeout"):
        assert flag in help_text
    wrong = runner.invoke(app, ["up", "--provider", "docker", "--partition", "gpu", "--dry-run"])
    assert wrong.exit_code == 2 and "setting of provider slurm" in wrong.output
    bad = runner.invoke(app, ["up", "--provider", "slurm", "--login", "h",
                              "--node-access", "rsh", "--dry-run"])
    assert bad.exit_code == 2 and "slurm.node_access" in bad.output
    missing = runner.invoke(app, ["up", "--provider", "slurm", "--dry-run"])
    assert missing.exit_code == 2 and "needs the login node" in missing.output
    gc_help = runner.invoke(app, ["gc", "--help"]).output
    assert "--login" in gc_help


def test_images_run_with_the_runtime_the_nodes_have() -> None:
    """--image on Slurm: `apptainer exec` (no Docker there), or a clear refusal."""
    from provision.job.launch import node_command
    from provision.model.errors import LaunchError
    from provision.model.spec import build_job_spec

    example = str(Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py")
    inv = Inventory(name="c1", provider="slurm", remote_root=".mgpu-cloud/slurm/c1",
                    nodes=[node("node1")], container_runtime="apptainer",
                    container_args=["--nv"])
    job = build_job_spec({}, {"script": example, "image": "nvcr.io/nvidia/pytorch:24.06-py3",
                              "env": {"A": "x,y"}})
    line = node_command(inv, job, inv.nodes[0], job_id="7")
    assert (" -- env MGPU_CLUSTER=c1 MGPU_OUTPUT_DIR=/mgpu/outputs "
            "MGPU_CHECKPOINT_DIR=/mgpu/checkpoints MGPU_RESTART_COUNT=0 PYTHONPATH=/mgpu/py "
            "PYTHONUNBUFFERED=1 A=x,y MGPU_RESIDENT_DIR=/mgpu/jobs/7 MGPU_RESIDENT_PORT=29501 "
            "PYTORCH_NVML_BASED_CUDA_CHECK=1 apptainer exec --bind \"$HOME\"/.mgpu-cloud/slurm/c1:/mgpu --pwd /mgpu/work --nv "
            "docker://nvcr.io/nvidia/pytorch:24.06-py3 torchrun ") in line, line
    assert line.endswith(" --run_path --start_method fork /mgpu/remote.pyz script -- train_ddp.py")
    assert "docker run" not in line and "sudo" not in line
    assert "--container" not in line  # apptainer's processes are the supervisor's own
    inv.container_runtime = "none"
    with pytest.raises(LaunchError, match="cannot run container images"):
        node_command(inv, job, inv.nodes[0])


def test_the_example_cluster_yaml_is_valid() -> None:
    from provision.model.spec import load_config_file

    path = Path(__file__).resolve().parents[3] / "inventories" / "slurm.example.yaml"
    spec = build_cluster_spec(load_config_file(path), {})
    opts = spec.options_as(SlurmOptions)
    assert spec.provider == "slurm" and spec.nodes == 4 and spec.max_hours == 6
    assert opts.login == "alice@login.hpc.example.org" and opts.partition == "gpu"
    assert opts.setup and opts.node_access == "srun"
