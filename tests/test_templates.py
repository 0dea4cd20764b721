"""Rendered templates against golden files. Regenerate with UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provision.model.inventory import NodeRecord
from provision.model.render import parse_env_file, render

GOLDEN = Path(__file__).resolve().parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Compare with the golden file. UPDATE_GOLDEN=1 rewrites a differing file and FAILS, so
    a run that regenerates never passes: review the diff, then run again without it."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") and (not path.exists() or path.read_text() != text):
        path.write_text(text)
        pytest.fail(f"golden file {path} rewritten: review `git diff`, then rerun without "
                    "UPDATE_GOLDEN")
    assert path.exists(), f"golden file {path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text()


def _nodes() -> list[NodeRecord]:
    return [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=40000 + r,
                       private_address=f"node-{r}", slots=8) for r in range(3)]


def test_hostfile_golden() -> None:
    check_golden("hostfile", render("hostfile.j2", nodes=_nodes()))


def test_hostfile_parses_with_deepspeeds_rules() -> None:
    # DeepSpeed's fetch_hostfile: ^(\S+)\s+slots=(\d+), no duplicate hosts.
    import re

    lines = [ln for ln in render("hostfile.j2", nodes=_nodes()).splitlines() if ln]
    hosts = [re.match(r"^(\S+)\s+slots=(\d+)$", ln) for ln in lines]
    assert all(hosts)
    assert len({m.group(1) for m in hosts if m}) == len(lines) == 3


def test_ssh_config_golden() -> None:
    check_golden("ssh_config", render("ssh_config.j2", cluster="demo",
                                      hosts=["node-0", "node-1", "10.0.0.2"]))


def test_strict_undefined() -> None:
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render("hostfile.j2")


def test_parse_env_file() -> None:
    assert parse_env_file("# c\nA=1\n\nB = x=y\n") == {"A": "1", "B": "x=y"}


def test_docker_preset() -> None:
    cpu = parse_env_file(render("nccl/docker.env.j2", gpus=False))
    assert cpu == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0",
                   "NCCL_IB_DISABLE": "1", "ACCELERATE_USE_CPU": "1"}
    assert "ACCELERATE_USE_CPU" not in parse_env_file(render("nccl/docker.env.j2", gpus=True))


def test_tcp_preset() -> None:
    assert parse_env_file(render("nccl/tcp.env.j2"))["NCCL_SOCKET_IFNAME"] == "^lo,docker"


def test_deepspeed_config_template_is_valid_json() -> None:
    import json

    cfg = json.loads(render("deepspeed/ds_config.json.j2", micro_batch=8, grad_accum=2, lr=3e-4,
                            zero_stage=2, bf16=True, torch_adam=False))
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["bf16"]["enabled"] is True
    assert cfg["train_micro_batch_size_per_gpu"] == 8


@pytest.mark.parametrize("gpus", [False, True])
def test_the_shipped_deepspeed_config_asks_for_torchs_adamw_only_without_gpus(
        gpus: bool, tmp_path: Path) -> None:
    """CPU nodes: torch's AdamW, not DeepSpeed's FusedAdam (whose op every rank JIT-loads at
    its start there); GPU nodes: FusedAdam's kernel. A user's own config is sent as it is."""
    import json

    from provision.job.launchers.deepspeed import config_bytes
    from provision.model.spec import JobSpec

    script = Path(__file__).resolve().parents[1] / "examples" / "train_deepspeed.py"
    cfg = json.loads(config_bytes(JobSpec(script=str(script), launcher="deepspeed"), gpus=gpus))
    params = cfg["optimizer"]["params"]
    assert cfg["optimizer"]["type"] == "AdamW" and params["lr"] == 1e-3
    assert params["torch_adam"] is (not gpus)
    assert cfg["bf16"]["enabled"] is gpus
    own = tmp_path / "ds.json"
    own.write_bytes(b'{"optimizer": {"type": "Adam"},\n "train_batch_size": 4}')
    job = JobSpec(script=str(script), launcher="deepspeed", deepspeed_config=str(own))
    assert config_bytes(job, gpus=gpus) == own.read_bytes()  # byte for byte, whatever the node
