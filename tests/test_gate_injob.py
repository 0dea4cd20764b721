"""provision/job/gate/injob.py: the fabric gate in the job's own launch, controller side. A fake
transport streams what the nodes print (remote.pyz injob's lines: the gate's JSON records and
real captured NCCL logs, then the MGPU-GATE line, then the job's own lines); run_job must keep
the gate's lines, print the verdict before the job's lines, and the record must come from the
same judge as on the nodes. (The node side runs for real in tests/remote/test_injob.py.)
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from fake_nodes import FakeConnector
from test_gate import EXAMPLE, captured, inventory, pair, raw, saved, summary

from provision.cluster.providers.aws.catalog import fabric_expectation as expectation_for
from provision.job.gate.fabric import FIXES
from provision.job.gate.injob import InJobGate, entry_words
from provision.job.gate.judge import FabricGateError
from provision.job.gate.step import placement
from provision.job.launch import run_job
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import JobSpec, build_job_spec
from provision.nodes import NodeGroup
from remote.injob import MARKER


def marker(node: int, verdict: str = "pass") -> str:
    return MARKER + json.dumps({"node": node, "seconds": 2.5, "verdict": verdict})


def verdict_line(verdict: str, seconds: float = 2.5) -> dict[str, object]:
    return {"verdict": verdict, "seconds": seconds, "import_s": 1.0}  # SYNTHETIC, as injob's


@pytest.fixture
def store(mgpu_home: Path) -> InventoryStore:
    return InventoryStore()


def launch(inv: Inventory, job: JobSpec, outputs: dict[str, str], store: InventoryStore,
           code: int = 0) -> tuple[InJobGate, FakeConnector, int, str, list[str]]:
    fake = FakeConnector()
    for node, text in outputs.items():
        fake.on(r"injob", node=node, stream=text, exit_code=code)
    logged: list[str] = []
    gate = InJobGate(inv, job, store, logged.append)
    out = io.StringIO()
    got = run_job(inv, job, log=logged.append, out=out, gate=gate,
                  group=NodeGroup(inv, connector=fake))
    return gate, fake, got, out.getvalue(), logged


def test_placement_and_entry_words(tmp_path: Path) -> None:
    docker = inventory(3)
    on = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on"})
    assert placement(docker, on) == ("in-job", "")
    assert placement(docker, build_job_spec({}, {"script": EXAMPLE}))[0] is None  # auto
    assert placement(inventory(1), on)[0] is None  # one node: nothing between nodes
    pdsh = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on", "launcher": "deepspeed"})
    assert placement(docker, pdsh) == ("separate",
                                       "DeepSpeed's pdsh mode starts every node from node 0")
    no_ssh = pdsh.model_copy(update={"deepspeed_launcher": "no_ssh"})
    assert placement(docker, no_ssh)[0] == "in-job"
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/bash\necho hi\n")
    assert placement(docker, build_job_spec({}, {"script": str(shell), "fabric_check": "on"})
                     ) == ("separate", "train.sh is not a Python script")
    py = tmp_path / "train"
    py.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert placement(docker, build_job_spec({}, {"script": str(py), "fabric_check": "on"})
                     )[0] == "in-job"
    debug_file = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on",
                                     "env": {"NCCL_DEBUG_FILE": "/x/%h"}})
    assert placement(docker, debug_file)[0] == "separate"
    p4d = inventory(2, expectation_for("p4d.24xlarge"), slots=8)
    words = entry_words(p4d, build_job_spec({}, {"script": EXAMPLE, "allow_slow_network": True}))
    assert words[:2] == ["@root/remote.pyz", "injob"] and words[-1] == "--"
    assert words[words.index("--busbw-below") + 1] == "38.675"
    assert words[words.index("--expect-transport") + 1] == "efa" and "--allow-slow" in words
    assert "--expect-transport" not in entry_words(docker, on)  # any transport will do


def test_a_passing_gate_is_judged_then_the_job_output_streams(store: InventoryStore) -> None:
    inv = saved(inventory(3), store)
    job = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on", "args": ["--steps", "2"]})
    node0 = raw(summary(1.0, 3), pair(0, 1, 1.0, 0), pair(0, 2, 0.9, 1),
                verdict_line("pass"), marker(0), "job line from rank 0")
    outputs = {"node-0": node0, "node-1": raw(pair(1, 2, 1.1, 2), marker(1), "job line 1"),
               "node-2": raw(marker(2), "job line 2")}
    gate, fake, code, out, logged = launch(inv, job, outputs, store)
    assert code == 0
    # only the job's own lines are printed; the gate's are kept
    assert sorted(out.splitlines()) == ["[node-0] job line from rank 0", "[node-1] job line 1",
                                        "[node-2] job line 2"]
    assert gate.finish(0).verdict == "pass"
    passed = next(m for m in logged if m.startswith("fabric gate: pass"))
    assert "3 pairs in 3 rounds (2.5 s)" in passed
    assert store.load(inv.name).fabric_gate.verdict == "pass"  # type: ignore[union-attr]
    # the launcher runs the entry, then the job's script and args, on every node
    for rank in range(3):
        command = fake.assert_ran(f"node-{rank}", r"torchrun")
        assert f"MGPU_NODE_RANK={rank} " in command
        assert "remote.pyz injob --pair-rounds 16 --pair-fraction 0.5 -- train_ddp.py " \
               "--steps 2" in command


def test_a_failed_gate_prints_the_table_and_no_job_line(store: InventoryStore) -> None:
    inv = saved(inventory(2, expectation_for("p4d.24xlarge"), slots=8), store)
    job = build_job_spec({}, {"script": EXAMPLE})  # auto: p4d has an expectation
    socket = captured("nccl-efa-fallback-socket-p4d.log").splitlines()
    outputs = {"node-0": raw(*socket, summary(4.13, 16, "nccl", pairwise=True),
                             pair(0, 1, 4.13, 0), verdict_line("fail"), marker(0, "fail"),
                             "torchrun: ChildFailedError exitcode 8"),
               "node-1": raw(*socket, marker(1, "fail"))}
    gate, _, code, out, logged = launch(inv, job, outputs, store, code=8)
    assert code == 8 and out == ""  # nothing of the job, not even the launcher's report
    assert not any("stopping the other nodes" in m for m in logged)
    with pytest.raises(FabricGateError) as err:
        gate.finish(code)
    assert "socket instead of efa on node-0, node-1" in err.value.message
    assert err.value.exit_code == 8
    assert any("wrong transport" in m and FIXES["efa"] in m for m in logged)
    kept = store.load(inv.name).fabric_gate
    assert kept is not None and kept.verdict == "fail" and not kept.overridden


def test_allow_slow_network_warns_and_the_job_runs(store: InventoryStore) -> None:
    inv = saved(inventory(2, expectation_for("p4d.24xlarge"), slots=8), store)
    job = build_job_spec({}, {"script": EXAMPLE, "allow_slow_network": True})
    socket = captured("nccl-efa-fallback-socket-p4d.log").splitlines()
    outputs = {"node-0": raw(*socket, summary(4.13, 16, "nccl"), verdict_line("fail"),
                             marker(0, "fail"), "training anyway"),
               "node-1": raw(*socket, marker(1, "fail"), "training anyway")}
    gate, fake, code, out, logged = launch(inv, job, outputs, store)
    assert code == 0 and out.count("training anyway") == 2
    assert "--allow-slow --" in fake.assert_ran("node-0", "injob")
    record = gate.finish(code)
    assert record.verdict == "fail" and record.overridden
    warning = next(i for i, m in enumerate(logged) if m.startswith("warning: the fabric gate"))
    assert warning > next(i for i, m in enumerate(logged) if "wrong transport" in m)


def test_a_gate_that_never_finished_stops_with_its_error(store: InventoryStore) -> None:
    inv = saved(inventory(2), store)
    job = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on"})
    outputs = {"node-0": raw({"error": "RuntimeError: Connection closed by peer", "rank": "0"}),
               "node-1": raw("Traceback (most recent call last):")}
    gate, _, code, out, _ = launch(inv, job, outputs, store, code=1)
    assert code == 1 and out == ""
    with pytest.raises(FabricGateError) as err:
        gate.finish(code)
    assert "did not finish (RuntimeError: Connection closed by peer)" in err.value.message


def test_in_a_container_the_entry_is_the_mounted_copy_and_the_node_rank_is_passed() -> None:
    """Container mode (docker and apptainer): the launcher inside the image runs the tool's
    folder as mounted there (/mgpu), and each node's rank reaches its processes."""
    import shlex

    from provision.job.launch import node_command

    job = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on"})
    for runtime in ("docker", "apptainer"):
        inv = inventory(2).model_copy(update={"container_image": "img:1",
                                              "container_runtime": runtime})
        words = shlex.split(node_command(inv, job, inv.nodes[1], entry=entry_words(inv, job))
                            .replace('"$HOME"', "/h"))
        after = words[words.index("torchrun"):]
        entry = after.index("/mgpu/remote.pyz")
        assert after[entry + 1] == "injob" and after[after.index("--", entry) + 1] == \
            "train_ddp.py"
        assert "MGPU_NODE_RANK=1" in words


def test_torchrun_forks_the_workers_from_its_agent_where_it_can() -> None:
    """torchrun's agent forks the workers (its `import torch` is theirs), gated or not: each
    starts through its entry (the gate's `injob`, else `script`); not where the agent asks CUDA
    for the count ("gpu"), nor under a launcher that has no agent forking (DeepSpeed,
    accelerate: the script is theirs as given). Only the gate's ranks learn their node rank."""
    import shlex

    from provision.job.launch import node_command

    def launch_words(options: dict[str, object], gated: bool) -> list[str]:
        job = build_job_spec({}, {"script": EXAMPLE, "fabric_check": "on", **options})
        inv = inventory(2)
        line = node_command(inv, job, inv.nodes[1], entry=entry_words(inv, job) if gated
                            else None).replace('"$HOME"', "/h")
        return shlex.split(line)

    nvml = "PYTORCH_NVML_BASED_CUDA_CHECK=1"  # else the agent's CUDA check poisons the fork
    for gated, entry in ((True, "injob"), (False, "script")):
        forked = launch_words({"nproc_per_node": 2}, gated=gated)
        start = forked.index("--run_path")
        assert forked[start:start + 5] == ["--run_path", "--start_method", "fork",
                                           "/h/.mgpu-cloud/remote.pyz", entry], forked
        assert nvml in forked[:forked.index("torchrun")]
        assert ("MGPU_NODE_RANK=1" in forked) is gated
    for words in (launch_words({"nproc_per_node": "gpu"}, gated=True),
                  launch_words({"nproc_per_node": "gpu"}, gated=False)):
        assert "--run_path" not in words and nvml not in words
    assert "remote.pyz script" not in " ".join(launch_words({"nproc_per_node": "gpu"}, False))
    for launcher in ("deepspeed", "accelerate"):
        words = launch_words({"nproc_per_node": 2, "launcher": launcher}, gated=False)
        assert "remote.pyz script" not in " ".join(words) and nvml not in words, words
        assert "--run_path" not in words and EXAMPLE.rsplit("/", 1)[-1] in " ".join(words)
    own = launch_words({"nproc_per_node": 2, "env": {"PYTORCH_NVML_BASED_CUDA_CHECK": "0"}},
                       gated=True)
    assert "PYTORCH_NVML_BASED_CUDA_CHECK=0" in own and nvml not in own  # the job's own value
