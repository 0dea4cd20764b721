"""What the slurm provider's unit tests share: a pinned login target, the script inside a line,
and a probe's output recorded on the emulated Slurm 22.05 of test_slurm_cluster.py with the
spec and plan made from it."""

from __future__ import annotations

import base64
import re
from typing import Any

from provision.cluster.providers.slurm.login import Hop, LoginTarget
from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.plan import build_plan
from provision.model.inventory import NodeRecord
from provision.model.spec import build_cluster_spec

TARGET = LoginTarget(login=Hop(user="user", address="127.0.0.1", port=2222,
                               host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinned"),
                     identity_file="/keys/id_ed25519")


def script_of(line: str) -> str:
    """The bash script inside a line made by shell() or srun_line()."""
    found = re.search(r"printf %s (\S+) \| base64 -d", line)
    assert found, line
    return base64.b64decode(found.group(1)).decode()


PARTITION = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
             "Default=YES QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=UNLIMITED "
             "MinNodes=0 Nodes=node[1-2] State=UP TotalCPUs=4 TotalNodes=2 "
             "TRES=cpu=4,mem=48210M,node=2,billing=4")
PROBE_OK = f"""::mgpu-cloud::version
slurm-wlm 22.05.8
::mgpu-cloud::user
user
::mgpu-cloud::partition
debug
{PARTITION}
::mgpu-cloud::nodes
node1|idle|2|24105|gpu:2|(null)
node2|alloc|2|24105|gpu:2|(null)
::mgpu-cloud::test
sbatch: Job 1 to start at 2026-11-30T10:54:09 using 4 processors on nodes node[1-2] in partition debug
exit=0
::mgpu-cloud::assoc
default||normal|||
research||normal|||
exit=0
::mgpu-cloud::runtime
pyxis
"""


def spec_of(**slurm: Any) -> Any:
    top = {k: slurm.pop(k) for k in ("nodes", "gpus_per_node", "max_hours") if k in slurm}
    return build_cluster_spec({}, {"provider": "slurm", "name": "c1", "nodes": 2, **top,
                                   "slurm": {"login": "user@127.0.0.1:2222", **slurm}})


def plan_of(output: str, **slurm: Any) -> Any:
    spec = spec_of(**slurm)
    return build_plan(spec, spec.options_as(SlurmOptions), TARGET, output, [])


def node(name: str, rank: int = 0) -> NodeRecord:
    return NodeRecord(name=name, rank=rank, address=name, private_address=name, user="user")
