"""A warm spare's launcher (remote/warm.py): torch imported before the word, then torchrun
run in the same process with the word's words and variables; a word is taken only when it is
a torchrun line of text words, and `promote` writes nothing where no launcher waits."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote import warm

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
SCRIPT = """
import os, sys
print("child of", os.getppid(), "word", os.environ.get("MGPU_WORD_VALUE"),
      "torch before the script:", "torch" in sys.modules,
      "preloaded:", "torch._dynamo" in sys.modules, "wave" in sys.modules, flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("word", [
    {"argv": ["python3", "x.py"]},  # not torchrun
    {"argv": ["torchrun", 3]},  # a word that is not text
    {"argv": "torchrun x.py"},  # not a list
    {"argv": ["torchrun"], "env": {"A": 1}},  # a value that is not text
    {"argv": ["torchrun"], "env": ["A=1"]},
    ["torchrun"],
])
def test_a_word_that_is_not_a_torchrun_line_of_text_is_not_taken(tmp_path: Path,
                                                                  word: object) -> None:
    path = tmp_path / "warm.json"
    path.write_text(json.dumps(word))
    assert warm.read_word(str(path)) is None
    path.write_text('{"argv": ["torchrun"')  # cut short
    assert warm.read_word(str(path)) is None


def test_promote_writes_nothing_where_no_launcher_waits(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing there, or a launcher that ended: exit 3, no word; the ended launcher's job
    folder (its log) moved aside, so that a cold start under the same job id finds none."""
    job = tmp_path / "jobs" / "1"
    word = job / "warm.json"
    assert warm.main("warm", ["promote", "--word", str(word), "--", "torchrun", "x.py"]) == 3
    assert not word.exists()
    job.mkdir(parents=True)
    (job / "job.log").write_text("ImportError: no torch here\n")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (job / "warm.json.pid").write_text(gone)  # a launcher that ended
    assert warm.main("warm", ["promote", "--word", str(word), "--", "torchrun", "x.py"]) == 3
    assert not job.exists() and not (tmp_path / "jobs" / "1.warm" / "warm.json").exists()
    assert (tmp_path / "jobs" / "1.warm" / "job.log").read_text().startswith("ImportError")
    assert '"promoted": false' in capsys.readouterr().out


def test_promote_writes_the_word_for_a_live_launcher_private_to_its_user(tmp_path: Path) -> None:
    word = tmp_path / "warm.json"
    (tmp_path / "warm.json.pid").write_text(str(os.getpid()))  # alive: nothing set aside
    assert warm.main("warm", ["promote", "--word", str(word), "--", "python3", "x.py"]) == 2
    assert not word.exists()
    assert warm.main("warm", ["promote", "--word", str(word), "--env", "MGPU_RESIDENT_GEN=1",
                              "--env", "B=x=y", "--", "torchrun", "--node_rank", "1"]) == 0
    assert json.loads(word.read_text()) == {
        "argv": ["torchrun", "--node_rank", "1"], "env": {"MGPU_RESIDENT_GEN": "1", "B": "x=y"}}
    assert stat.S_IMODE(word.stat().st_mode) == 0o600


def _launcher(tmp_path: Path) -> subprocess.Popen[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    return subprocess.Popen([sys.executable, "-m", "remote", "warm", "wait", "--word",
                             str(tmp_path / "warm.json")], cwd=tmp_path,
                            env={**os.environ, **ENV,
                                 "MGPU_WARM_IMPORTS": "wave, no_such_module_here,bad name"},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _ready(proc: subprocess.Popen[str]) -> tuple[dict[str, object], str]:
    """The launcher's ready event, and what it said before it."""
    assert proc.stdout is not None
    before = ""
    while not (line := proc.stdout.readline()).startswith(warm.EVENT_PREFIX):
        assert line, before
        before += line
    return dict(json.loads(line[len(warm.EVENT_PREFIX):])), before


@pytest.mark.parametrize("exit_with", [0, 3])
def test_the_launcher_runs_torchrun_in_its_own_process_with_the_words_variables(
        tmp_path: Path, exit_with: int) -> None:
    """The workers are forked from the launcher that imported torch before the word came (so
    torch is there before the script's first line), the word's variables are theirs, and
    torchrun's exit status is the launcher's (a failed worker: 1, as the console script)."""
    proc = _launcher(tmp_path)
    ready, before = _ready(proc)
    assert ready["event"] == "warm" and ready["phase"] == "ready" and ready["pid"] == proc.pid
    time.sleep(0.3)  # it polls: the word comes while it waits
    assert warm.main("warm", [
        "promote", "--word", str(tmp_path / "warm.json"), "--env", "MGPU_WORD_VALUE=seen",
        "--env", f"EXIT_WITH={exit_with}", "--", "torchrun", "--standalone", "--nnodes", "1",
        "--nproc_per_node", "1", "--master_port", str(_free_port()), "--run_path",
        "--start_method", "fork", str(tmp_path / "train.py")]) == 0
    out, _ = proc.communicate(timeout=120)
    assert f"child of {proc.pid} word seen torch before the script: True preloaded: True " \
           "True" in out, out
    assert "could not import no_such_module_here" in before, before  # said, and it goes on
    assert proc.returncode == (0 if exit_with == 0 else 1), out


def test_a_launcher_stopped_before_its_word_ends_and_takes_no_word(tmp_path: Path) -> None:
    proc = _launcher(tmp_path)
    _ready(proc)
    proc.terminate()
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    (tmp_path / "job").mkdir()
    os.replace(tmp_path / "warm.json.pid", tmp_path / "job" / "warm.json.pid")
    assert warm.main("warm", ["promote", "--word", str(tmp_path / "job" / "warm.json"), "--",
                              "torchrun", "x.py"]) == warm.NOT_WAITING
    assert (tmp_path / "job.warm" / "warm.json.pid").exists()


def test_preloads_are_dynamo_and_the_jobs_module_names_nothing_else() -> None:
    assert warm.preloads({}) == ["torch._dynamo"]
    assert warm.preloads({"MGPU_WARM_IMPORTS": " transformers, datasets.load ,,os;rm -rf,a b"}) \
        == ["torch._dynamo", "transformers", "datasets.load"]
