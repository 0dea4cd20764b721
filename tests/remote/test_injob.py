"""remote/injob.py: the fabric gate inside the job's own processes, then the script in them.

Real torch, real launchers on this machine: torchrun agents stand in for nodes (GROUP_RANK),
and plain processes with the variables DeepSpeed's per-node launcher sets (no agent: rank 0
serves the rendezvous store) stand in for `deepspeed --no_ssh`. The script calls
init_process_group itself, after the gate's group is gone, and must see the whole world.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from storekit import free_port

from remote.injob import EXIT_GATE_FAILED, MARKER, split_argv

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = '''import os, sys
import torch, torch.distributed as dist
here = os.path.dirname(os.path.abspath(__file__))
def say(*words):  # ONE write per line: two ranks of a node share the pipe (print writes twice)
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()
say("script", __name__, sys.argv[1:], sys.path[0] == here)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
say(f"ran rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g}")
dist.barrier()
dist.destroy_process_group()
import gc
say("torch's import frozen:", gc.get_freeze_count() > 10000)
'''
ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def test_split_argv_hands_launcher_words_to_the_script() -> None:
    assert split_argv(["--allow-slow", "--", "t.py", "--a", "1"]) == (
        ["--allow-slow"], ["t.py", "--a", "1"])
    # DeepSpeed: python -u PROGRAM --local_rank=N ARGS (remote/cli.py puts them first)
    assert split_argv(["--local_rank=1", "--pair-rounds", "3", "--", "t.py", "x"]) == (
        ["--pair-rounds", "3"], ["t.py", "--local_rank=1", "x"])
    assert split_argv(["--pair-rounds", "3"]) == (["--pair-rounds", "3"], [])


def test_cli_moves_deepspeed_local_rank_into_injob(monkeypatch: pytest.MonkeyPatch) -> None:
    from remote import cli, injob

    seen: list[list[str]] = []
    monkeypatch.setattr(injob, "main", lambda cmd, argv: seen.append(argv) or 0)
    assert cli.main(["--local_rank=3", "injob", "--", "t.py", "a"]) == 0
    assert split_argv(seen[0]) == ([], ["t.py", "--local_rank=3", "a"])


def _torchrun(tmp_path: Path, nodes: int, nproc: int, port: int, *gate: str,
              script: str = SCRIPT, fork: bool = False) -> list[subprocess.CompletedProcess[str]]:
    """`fork`: the workers forked from the agent, as provision/job/launchers/torchrun.py asks
    with the gate (`--run_path --start_method fork`, the program a path: remote/__main__.py)."""
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / "train.py").write_text(script)
    program = (["--run_path", "--start_method", "fork", str(ROOT / "remote" / "__main__.py")]
               if fork else ["-m", "remote"])
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank",
         str(rank), "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
         "--master_port", str(port), *program, "injob", *gate, "--",
         "job/train.py", "--steps", "2"],
        env={**os.environ, **ENV}, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for rank in range(nodes)]
    done = []
    for rank, agent in enumerate(agents):
        out, err = agent.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
        assert "Traceback" not in out, (rank, out)
    return done


@pytest.mark.slow
def test_torchrun_gate_passes_then_the_script_runs_in_the_same_processes(
        tmp_path: Path) -> None:
    nodes = _torchrun(tmp_path, 3, 2, free_port("127.0.0.1"))
    for rank, node in enumerate(nodes):
        assert node.returncode == 0, node.stderr[-3000:]
        lines = node.stdout.splitlines()
        marker = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
        assert len(marker) == 1, node.stdout  # one marker per node, before any job line
        assert json.loads(lines[marker[0]][len(MARKER):])["verdict"] == "pass"
        job = [line for line in lines[marker[0] + 1:] if line.startswith(("script", "ran"))]
        assert sorted(job) == sorted(
            ["script __main__ ['--steps', '2'] True"] * 2
            + [f"ran rank {r}/6 sum 6" for r in (2 * rank, 2 * rank + 1)])
        assert not any(line.startswith(("script", "ran")) for line in lines[:marker[0]])
    records = [json.loads(line) for node in nodes for line in node.stdout.splitlines()
               if line.startswith("{")]  # a pair's line is printed on its lower node
    summary = next(r for r in records if r.get("summary"))
    assert summary["world_size"] == 3 and summary["node_ranks"] == [0, 1, 2]  # one per CPU node
    assert sorted(tuple(r["pair"]) for r in records if "pair" in r and not r["confirm"]) == [
        (0, 1), (0, 2), (1, 2)]
    verdict = next(r for r in records if "verdict" in r)
    assert verdict["verdict"] == "pass" and verdict["transports"] == {
        "0": "socket", "1": "socket", "2": "socket"}


FORKED = "import sys\nSTART_MODULES = set(sys.modules)\n" + SCRIPT + '''import atexit, pathlib, signal, time
say("torch was there before the script:", "torch" in START_MODULES)
say("signals as new:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
    signal.getsignal(signal.SIGINT) is signal.default_int_handler)
import multiprocessing as mp
say("the main process:", mp.current_process().name, mp.parent_process() is None)
rank = os.environ["RANK"]
def ended():
    say("exit handler ran")
    pathlib.Path(f"ended-{rank}").touch()
atexit.register(ended)
if rank in ("1", "2"):  # they fail once ranks 0 and 3 have ended (else they'd be stopped)
    deadline = time.monotonic() + 120
    while not all(pathlib.Path(f"ended-{r}").exists() for r in (0, 3)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if rank == "1":
        raise ValueError("rank 1 fails on purpose")
    sys.exit(3)
'''


@pytest.mark.slow
def test_forked_from_the_agent_the_script_starts_as_a_new_interpreter_would(
        tmp_path: Path) -> None:
    """The gate's launch: torchrun forks the workers from its agent, which has torch loaded.
    The script sees torch already there, the signal handlers of a new interpreter (not
    elastic's, which would turn SIGTERM into an exception in it), and ends as a new
    interpreter would: its exit handlers run, an exception's traceback is on its stderr and
    the exit code is 1, sys.exit(3)'s is 3."""
    nodes = _torchrun(tmp_path, 2, 2, free_port("127.0.0.1"), script=FORKED, fork=True)
    out = "".join(node.stdout for node in nodes)
    assert out.count(MARKER) == 2 and out.count("ran rank") == 4, out
    assert out.count("torch was there before the script: True") == 4, out
    assert out.count("signals as new: True True") == 4, out
    assert out.count("the main process: MainProcess True") == 4, out
    assert out.count("exit handler ran") == 4, out  # rank 1 and rank 2 too, before their ends
    assert "Traceback (most recent call last)" in nodes[0].stderr
    assert "ValueError: rank 1 fails on purpose" in nodes[0].stderr
    assert nodes[0].returncode != 0 and "exitcode  : 1" in nodes[0].stderr, nodes[0].stderr
    assert nodes[1].returncode != 0 and "exitcode  : 3" in nodes[1].stderr, nodes[1].stderr


@pytest.mark.slow
def test_a_failed_gate_exits_8_and_never_starts_the_script(tmp_path: Path) -> None:
    # gloo is TCP: a gate that expects EFA fails on every node (wrong transport)
    nodes = _torchrun(tmp_path, 2, 1, free_port("127.0.0.1"), "--expect-transport", "efa")
    for node in nodes:
        assert node.returncode != 0
        assert "exitcode  : 8" in node.stderr or f"exitcode: {EXIT_GATE_FAILED}" in node.stderr
        assert "script" not in node.stdout and "ran rank" not in node.stdout
        assert f'{MARKER}{{"node"' in node.stdout and '"verdict": "fail"' in node.stdout
    verdict = next(json.loads(line) for line in nodes[0].stdout.splitlines()
                   if line.startswith('{"below_threshold"'))
    assert verdict["wrong_transport"] == [0, 1]


@pytest.mark.slow
def test_without_an_agent_rank_0_serves_the_store_to_the_gate_and_the_job(
        tmp_path: Path) -> None:
    """DeepSpeed's per-node launcher: plain processes, RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*,
    and `--local_rank=N` between the program and its arguments."""
    (tmp_path / "train.py").write_text(SCRIPT)
    port = str(free_port("127.0.0.1"))  # one for all four ranks
    procs = [subprocess.Popen(
        [sys.executable, "-u", "-m", "remote", f"--local_rank={r % 2}", "injob", "--",
         "train.py", "--x"],
        env={**os.environ, **ENV, "RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "4",
             "MGPU_NODE_RANK": str(r // 2), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port},
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(4)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (proc, out) in enumerate(zip(procs, outs, strict=True)):
        assert proc.returncode == 0, out[-3000:]
        assert f"script __main__ ['--local_rank={r % 2}', '--x'] True" in out
        assert f"ran rank {r}/4 sum 4" in out
        assert "torch's import frozen: True" in out  # the collector no longer walks it
    assert sum(out.count(MARKER) for out in outs) == 2  # the lowest rank of each node
