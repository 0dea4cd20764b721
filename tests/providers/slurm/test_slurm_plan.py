"""The slurm provider's plan from a recorded probe (plan.py): what it asks Slurm for, the
partition's limits, Slurm's own refusals quoted, the login target's syntax, and spares asked
for as more nodes of one allocation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from slurmkit import PROBE_OK, TARGET, plan_of, spec_of

from provision.cluster.providers.slurm.login import split_target
from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.plan import build_plan
from provision.cluster.providers.slurm.slurmcmd import sbatch_argv
from provision.model.errors import UserInputError

PROBE_NO_PARTITION = """::mgpu-cloud::version
slurm-wlm 22.05.8
::mgpu-cloud::user
user
::mgpu-cloud::partition
nope
Partition nope not found
::mgpu-cloud::nodes
::mgpu-cloud::test
sbatch: error: invalid partition specified: nope
allocation failure: Invalid partition name specified
exit=1
::mgpu-cloud::assoc
sacctmgr: You are not running a supported accounting_storage plugin
exit=1
::mgpu-cloud::runtime
"""


def test_plan_from_a_probe() -> None:
    plan = plan_of(PROBE_OK, account="research")
    assert plan.request.model_dump() == {
        "job_name": "mgpu-cloud-c1", "nodes": 2, "time_minutes": 60, "partition": None,
        "account": "research", "qos": None, "constraint": None, "reservation": None,
        "gpus_per_node": 2, "extra": []}
    assert plan.slots_per_node == 2 and plan.site.partition == "debug"
    assert plan.site.container_runtimes == ["pyxis"] and plan.site.accounting
    assert "only pyxis found, which mgpu-cloud does not drive yet" in plan.render()
    text = plan.render()
    assert "expected_start=2026-11-30T10:54:09" in text and "time=0-01:00:00 (default)" in text
    assert "partition debug: UP, 2 node(s) (1 idle, 1 allocated, 0 mixed, 0 other)" in text
    assert "your associations: account default QOS normal; account research QOS normal" in text


def test_plan_quotes_slurm_when_it_refuses() -> None:
    with pytest.raises(UserInputError) as err:
        plan_of(PROBE_NO_PARTITION, partition="nope")
    assert "sbatch: error: invalid partition specified: nope\n  allocation failure: Invalid " \
           "partition name specified" in err.value.message


@pytest.mark.parametrize(("change", "expected"), [
    ({"nodes": 3}, "partition debug has 2 node(s); --nodes 3 asked"),
    ({"gpus_per_node": 4}, "at most 2 GPU(s) per node; --gpus-per-node 4 asked"),
])
def test_plan_checks_partition_limits(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(expected)):
        plan_of(PROBE_OK, **change)


def test_plan_time_limit_and_cpu_partitions() -> None:
    limited = PROBE_OK.replace("MaxTime=UNLIMITED", "MaxTime=00:10:00") \
        .replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    with pytest.raises(UserInputError) as err:
        plan_of(limited, max_hours=1)
    assert "allows at most 1 node(s) per job" in err.value.message
    assert "allows at most 0-00:10:00 per job; --time 0-01:00:00 asked" in err.value.message
    cpu = plan_of(PROBE_OK.replace("gpu:2", "(null)"), gpus_per_node=4)
    assert cpu.request.gpus_per_node is None and cpu.slots_per_node == 4
    assert "the partition has no GPUs: 4 process(es) per node" in cpu.render()
    old = PROBE_OK.replace("22.05.8", "20.02.7")
    with pytest.raises(UserInputError, match="need Slurm 20.11 or newer"):
        plan_of(old)


def test_login_target_syntax() -> None:
    assert split_target("alice@login.hpc:2222", "--login") == ("alice", "login.hpc", 2222)
    assert split_target("hpc", "--login") == (None, "hpc", None)
    for bad in ("alice@", "host:port", "a,b"):
        with pytest.raises(UserInputError):
            split_target(bad, "--login")


def test_spares_ask_slurm_for_more_nodes_and_an_allocation_a_failed_node_does_not_end() -> None:
    """--spares 1 on 1 node: the plan is made for 2 (contract: the provider's own plan of
    N + K, the partition's limits checked for them all), and the allocation is submitted with
    --no-kill (Slurm otherwise ends a job one of whose nodes fails: the spare could never
    take the rank). 2 + 1 do not fit the partition's 2 nodes: refused in the plan."""
    from provision.cluster.providers import spares

    spec = spares.with_spares(spec_of().model_copy(update={"nodes": 1, "spares": 1}))
    plan = build_plan(spec, spec.options_as(SlurmOptions), TARGET, PROBE_OK, [])
    assert plan.request.nodes == 2
    assert "--no-kill" in sbatch_argv(plan.request)
    assert "--no-kill" not in sbatch_argv(plan_of(PROBE_OK).request)
    more = spares.with_spares(spec_of().model_copy(update={"spares": 1}))
    with pytest.raises(UserInputError, match="partition debug has 2 node\\(s\\); --nodes 3"):
        build_plan(more, more.options_as(SlurmOptions), TARGET, PROBE_OK, [])
