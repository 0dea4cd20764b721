"""Warm spares' launchers, the controller's side (provision/job/warmspares.py; the node's side
is tests/remote/test_warm.py, both together on docker nodes tests/integration/test_resident.py):
which jobs can wait warm, what a promotion says to the node, and how a session's output is
held until the spare takes a rank."""

from __future__ import annotations

import subprocess
import threading
from collections import deque
from io import StringIO
from pathlib import Path

import pytest

from provision.job.launch import Join, can_warm, node_command, promote_command
from provision.job.output import PrefixWriter
from provision.job.warmspares import HELD_BYTES, Relay, WarmSpares
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec
from provision.nodes import CommandResult

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_resident.py")


def _node(rank: int, name: str | None = None) -> NodeRecord:
    return NodeRecord(name=name or f"node-{rank}", rank=rank, address="127.0.0.1",
                      port=4000 + rank, private_address=f"10.0.0.{rank + 1}", slots=2)


def _inv(**kw: object) -> Inventory:
    return Inventory(name="demo", provider="docker", nodes=[_node(0), _node(1)],
                     spares=[_node(2)], status="ready", **kw)


def _job(**kw: object):  # type: ignore[no-untyped-def]
    return build_job_spec({}, {"script": EXAMPLE, **kw})


@pytest.mark.parametrize(("kw", "why"), [
    ({}, None),
    ({"rdzv": True}, "the torchrun launcher with --rdzv has no warm start"),
    ({"launcher": "deepspeed"}, "the deepspeed launcher has no warm start"),
    ({"nproc_per_node": "gpu"}, "--nproc-per-node gpu: the launcher would ask CUDA"),
    ({"image": "nvcr.io/nvidia/pytorch:24.05-py3"}, "the job runs in a container"),
])
def test_only_a_static_torchrun_on_the_node_itself_waits_warm(kw: dict[str, object],
                                                              why: str | None) -> None:
    got = can_warm(_inv(), _job(**kw))
    assert (got is None) if why is None else (got is not None and got.startswith(why)), got


def _as_the_node_sees(line: str, lead: str) -> list[str]:
    """The words of `line` after `lead`, as a node's shell (HOME=/h) expands them."""
    assert line.startswith(lead), line
    done = subprocess.run(["bash", "-c", "printf '%s\\n' " + line[len(lead):]],
                          env={"HOME": "/h"}, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_spares_launcher_is_the_jobs_part_there_and_the_word_names_the_newcomer() -> None:
    inv, job = _inv(), _job(args=["--steps", "60"])
    words = _as_the_node_sees(node_command(inv, job, inv.spares[0], job_id="7", warm=True),
                              "exec env ")
    # under the job's supervisor, attached (it ends with the controller), with the job's
    # variables and not a newcomer's (those come with the word)
    assert words[words.index("job"):] == [
        "job", "start", "--dir", "/h/.mgpu-cloud/jobs/7", "--pidfile", "/h/.mgpu-cloud/job.pid",
        "--cwd", "/h/.mgpu-cloud/work", "--attach", "--", "python3", "/h/.mgpu-cloud/remote.pyz",
        "warm", "wait", "--word", "/h/.mgpu-cloud/jobs/7/warm.json"]
    assert "MGPU_RESIDENT_DIR=/h/.mgpu-cloud/jobs/7" in words
    assert not [w for w in words if w.startswith(("MGPU_RESIDENT_GEN=", "MGPU_NODE_RANK="))]
    promoted = inv.spares[0].model_copy(update={"name": "node-1", "rank": 1})
    said = _as_the_node_sees(promote_command(inv, job, promoted, job_id="7", restart_count=2,
                                             join=Join(1, "10.0.0.1", 2, 4, False)), "python3 ")
    # absolute paths in the word: the launcher reads them in its own working folder
    assert said == [
        "/h/.mgpu-cloud/remote.pyz", "warm", "promote", "--word", "/h/.mgpu-cloud/jobs/7/warm.json",
        "--env", "MGPU_RESIDENT_GEN=1", "--env", "MGPU_RESIDENT_MASTER=10.0.0.1",
        "--env", "MGPU_RESIDENT_BASE=2", "--env", "MGPU_RESIDENT_WORLD=4",
        "--env", "MGPU_RESTART_COUNT=2", "--",
        "torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "--run_path", "--start_method",
        "fork", "/h/.mgpu-cloud/remote.pyz", "script", "--", "train_resident.py",
        "--steps", "60"]
    alone = _as_the_node_sees(promote_command(inv, job, promoted, job_id="7", restart_count=2,
                                              join=Join(1, "10.0.0.2", 0, 4, True)), "python3 ")
    assert alone[alone.index("--") + 1:][:4] == ["torchrun", "--standalone", "--nnodes", "1"]


def _writer(name: str, out: StringIO) -> PrefixWriter:
    return PrefixWriter(name, out, threading.Lock(), journal=deque())


def test_a_relay_holds_the_last_bytes_until_bound_then_writes_through() -> None:
    relay, out = Relay(), StringIO()
    relay.write("x" * HELD_BYTES + "\n")
    relay.write("ready\npart")
    assert out.getvalue() == "" and len(relay.held) == HELD_BYTES
    relay.bind(_writer("node-1", out))
    relay.write("ial line\n")
    assert out.getvalue().splitlines()[-2:] == ["[node-1] ready", "[node-1] partial line"]


class _Spare:
    """A connection whose command runs until released; it says one line first."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.commands: list[str] = []

    def run(self, command: str, out: object = None, **_: object) -> CommandResult:
        self.commands.append(command)
        if "warm promote" in command:
            return CommandResult(3, "", "no warm launcher waits here")
        if " stop --pidfile " in command:
            return CommandResult(0)
        assert out is not None
        out.write('MGPU-EVENT {"event": "warm", "phase": "ready"}\n')  # type: ignore[attr-defined]
        self.release.wait(30)
        return CommandResult(137, "", "")

    def close(self) -> None:
        self.release.set()


def test_a_launcher_that_cannot_take_the_rank_is_stopped_and_the_newcomer_starts_cold() -> None:
    inv, spare, logged = _inv(), _Spare(), []
    warm = WarmSpares(inv, lambda node: f"start warm on {node.name}", lambda i, n: spare,
                      {"node-1": _writer("node-1", StringIO())}, log=logged.append)
    warm.keep()
    warm.keep()  # one launcher per spare, however often it is kept
    promoted = inv.spares[0].model_copy(update={"name": "node-1", "rank": 1})
    assert warm.take(promoted, "python3 remote.pyz warm promote ...") is None
    assert any("did not take the rank" in line and "starting it cold" in line for line in logged)
    assert any(" stop --pidfile " in c for c in spare.commands), spare.commands  # not left
    assert sum("start warm" in c for c in spare.commands) == 1
    warm.close()
