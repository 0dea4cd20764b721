"""templates/node/sitecustomize.py for real: every job process loads it (first on PYTHONPATH).

At exit it destroys a default process group the script left initialised, after the script's
own exit handlers and before the interpreter's shutdown (where gloo's threads abort a finished
rank, pytorch/pytorch#179291). tests/integration/test_first_use.py shows the effect on docker
nodes; benchmarks/exit_abort_rate.py measures it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NODE_TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "node"

# A script that leaves its group initialised, as most users' scripts do. It records every
# destroy_process_group call, and what its own exit handler (registered after the
# sitecustomize's, so run before it) saw.
SCRIPT = """\
import atexit, sys
import torch.distributed as dist

real = dist.destroy_process_group
def recording(*a, **k):
    print("destroyed at exit", flush=True)
    return real(*a, **k)
dist.destroy_process_group = recording
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
atexit.register(lambda: print("own handler saw initialised:", dist.is_initialized(), flush=True))
print("work done", flush=True)
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(store=tmp_path / "store"))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(NODE_TEMPLATES), **env})


def test_a_group_left_initialised_is_destroyed_at_exit_after_the_scripts_handlers(
        tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    res = run(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["work done", "own handler saw initialised: True",
                                       "destroyed at exit"], res.stdout


def test_it_can_be_turned_off_and_leaves_other_processes_alone(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    res = run(tmp_path, MGPU_EXIT_DESTROY_PG="0")
    assert res.returncode == 0, res.stderr
    assert "destroyed at exit" not in res.stdout
    plain = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(NODE_TEMPLATES)})
    assert plain.stdout.strip() == "False", "the hook must not import torch itself"


# A line waits in the text stream until its newline: a raw write issued half-way through a
# print shows up BEFORE the line, which stays whole (unbuffered, it lands in the middle).
LINES = """\
import os
print("rank", 3, "omp", end="")
os.write(1, b"<raw>")
print("", 1)
"""


def test_a_line_is_written_whole_although_the_job_runs_unbuffered(tmp_path: Path) -> None:
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    whole = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, env={**env, "PYTHONPATH": str(NODE_TEMPLATES)})
    assert whole.stdout == "<raw>rank 3 omp 1\n", whole.stdout
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=60, env=env)  # without the sitecustomize: split
    assert plain.stdout == "rank 3 omp<raw> 1\n", plain.stdout


# Cyclic garbage with a finaliser, left for the interpreter's shutdown: the shutdown's
# collection finalises it, unless the objects were handed to the permanent generation.
CYCLE = """\
import gc, os
gc.disable()
class Finalised:
    def __del__(self):
        os.write(1, b"finalised\\n")
cycle = Finalised(); cycle.me = cycle; del cycle
os.write(1, b"exiting\\n")
"""


def _exit_of(tmp_path: Path, program: str, **env: str) -> list[str]:
    script = tmp_path / program
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(CYCLE)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(NODE_TEMPLATES), **env}
                          ).stdout.splitlines()


@pytest.mark.parametrize("program", ["torchrun", "accelerate", "deepspeed",
                                     "site-packages/torch/distributed/run.py",
                                     "site-packages/deepspeed/launcher/launch.py"])
def test_a_launchers_process_skips_the_shutdown_collection(tmp_path: Path, program: str) -> None:
    assert _exit_of(tmp_path, program) == ["exiting"]
    assert _exit_of(tmp_path, program, MGPU_EXIT_FREEZE="0") == ["exiting", "finalised"]


@pytest.mark.parametrize("program", ["train.py", "torchrun.py", "mytorchrun"])
def test_a_users_script_keeps_its_shutdown_collection(tmp_path: Path, program: str) -> None:
    assert _exit_of(tmp_path, program) == ["exiting", "finalised"]


# --- issue 44: the node package is importable by a job (remote.resident) -----------------------
def test_the_node_package_beside_it_is_importable_after_the_jobs_own_modules(
        tmp_path: Path) -> None:
    from provision.nodes.bootstrap import remote_zipapp

    root = tmp_path / "root"  # the tool's folder on a node: py/sitecustomize.py, remote.pyz
    (root / "py").mkdir(parents=True)
    (root / "py" / "sitecustomize.py").write_bytes((NODE_TEMPLATES / "sitecustomize.py").read_bytes())
    (root / "remote.pyz").write_bytes(remote_zipapp())
    job = tmp_path / "job"
    job.mkdir()
    (job / "probe.py").write_text("import remote.resident as r; print(r.__file__)\n")

    bare = Path("/usr/bin/python3")  # as on a node: no mgpu-cloud installed (this venv's has)
    if not bare.exists():
        pytest.skip("no /usr/bin/python3 without mgpu-cloud")

    def probe() -> str:
        res = subprocess.run([str(bare), "probe.py"], capture_output=True, text=True,
                             timeout=60, cwd=job,
                             env={**os.environ, "PYTHONPATH": str(root / "py")})
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    # its bytecode where that python is this one's (remote_zipapp), else its source
    assert probe() in {str(root / "remote.pyz" / "remote" / f"resident.{ext}")
                       for ext in ("py", "pyc")}
    (job / "remote").mkdir()  # the job's own package of that name comes first
    (job / "remote" / "__init__.py").write_text("")
    (job / "remote" / "resident.py").write_text("")
    assert probe() == str(job / "remote" / "resident.py")


# --- torchrun's agent that forks the ranks: torchrun imported with the collector off, frozen ----
FORKED_RANK = """import gc, os, sys
before = all(m in sys.modules for m in ("torch", "torch._dynamo", "xml.dom.minidom"))
print("rank", os.environ["RANK"], "torch before the script:", before,
      "frozen:", gc.get_freeze_count() > 10000, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_a_forking_agents_torch_is_frozen_for_its_ranks(tmp_path: Path, fork: bool) -> None:
    """Forked (`--run_path --start_method fork`, the tool's torchrun): the ranks start with
    torch, torch._dynamo and the job's MGPU_WARM_IMPORTS imported and frozen by their agent,
    so their collections (and remote/script.py's at their end) skip them; spawned ranks are
    new interpreters, nothing imported or frozen."""
    pytest.importorskip("torch.distributed")
    (tmp_path / "rank.py").write_text(FORKED_RANK)
    root = NODE_TEMPLATES.parents[1]
    program = (["--run_path", "--start_method", "fork", str(root / "remote" / "__main__.py"),
                "script", "--"] if fork else [])
    torchrun = str(Path(sys.executable).parent / "torchrun")  # its program name, as on a node
    res = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", *program, "rank.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MGPU_WARM_IMPORTS": "xml.dom.minidom,no_such",
             "PYTHONPATH": f"{NODE_TEMPLATES}{os.pathsep}{root}"})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} torch before the script: {fork} frozen: {fork}" in res.stdout, \
            res.stdout
