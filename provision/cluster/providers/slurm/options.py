"""Options of the slurm provider (the `slurm:` section of a cluster YAML).

The allocation's size and length come from the core settings: `nodes` (sbatch -N),
`gpus_per_node` (sbatch --gpus-per-node, when the partition has GPUs) and `max_hours`
(sbatch --time, always set; DEFAULT_TIME_MINUTES when not given).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from provision.model.base import StrictModel

DEFAULT_TIME_MINUTES = 60


class SlurmOptions(StrictModel):
    login: str | None = Field(None, description="[user@]host[:port] of the login node, or an "
                              "alias from ~/.ssh/config")
    identity_file: str | None = Field(None, description="private key (default: ~/.ssh/config, "
                                      "then ~/.ssh/id_ed25519|id_ecdsa|id_rsa)")
    proxy_jump: str | None = Field(None, description="jump host to reach the login node")
    accept_new_host_keys: bool = False
    partition: str | None = Field(None, description="default: the site's default partition")
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    node_access: Literal["srun", "ssh"] = Field(
        "srun", description="srun: every node command is a job step started on the login node "
        "(works on every site); ssh: SSH to the nodes through the login node (where the site "
        "allows it; checked at `up`)")
    queue_timeout_minutes: float | None = Field(
        None, gt=0, description="give up (and cancel) when the allocation has not started by "
        "then; default: wait as long as Slurm says it may start")
    setup: str | None = Field(
        None, description="shell line run before every command on a node, e.g. "
        "'module load cuda/12.4 && source ~/venv/bin/activate'")
    node_dir: str | None = Field(
        None, description="node-local folder for the tool's files (default: $TMPDIR or /tmp "
        "of each node)")
    sbatch_args: list[str] = Field(
        default_factory=list, description="more sbatch options, e.g. ['--mem=0'] (YAML only)")
