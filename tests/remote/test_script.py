"""`remote.pyz script -- SCRIPT ARGS` (remote/script.py): how torchrun's ranks start where its
agent forks them. A forked worker ends with os._exit, so what a new interpreter's shutdown
does for the script's files has to be done by us: a file a module of the job keeps open,
unflushed when the script ends, must hold what was written, as when the same script runs as a
new interpreter (whose shutdown clears the modules). (A file held only by a cycle of objects
is no such promise: Python's collector may finalize its buffer before its text layer.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
KEEPER = "import os\nLOG = open(f\"module-{os.environ['RANK']}.txt\", 'w')\n"
SCRIPT = """import os, keeper
keeper.LOG.write("kept by a module\\n")
print("rank", os.environ["RANK"], "wrote", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_a_ranks_unflushed_files_are_written_when_it_ends(tmp_path: Path, fork: bool) -> None:
    (tmp_path / "keeper.py").write_text(KEEPER)
    (tmp_path / "train.py").write_text(SCRIPT)
    program = (["--run_path", "--start_method", "fork", str(ROOT / "remote" / "__main__.py")]
               if fork else ["-m", "remote"])
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         *program, "script", "--", "train.py"],
        env={**os.environ, **ENV}, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(" wrote") == 2, res.stdout
    for rank in (0, 1):
        assert (tmp_path / f"module-{rank}.txt").read_text() == "kept by a module\n"


def test_no_script_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from remote import script

    assert script.main("script", ["--"]) == 2
    assert "no script after `--`" in capsys.readouterr().err
