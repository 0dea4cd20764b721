"""tests/rewritelock.py: a worker that misses a test module's rewritten copy while another
rewrites it waits for that one's copy instead of rewriting it too; the wait is bounded."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rewritelock
from _pytest.assertion import rewrite

TESTS = Path(__file__).resolve().parent
CONFTEST = f"""import sys
sys.path.insert(0, {str(TESTS)!r})
sys.dont_write_bytecode = False
import rewritelock
rewritelock.install()
"""


def _collect(project: Path, log: Path, *extra: str,
             env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q",
                             "-p", "no:cacheprovider", f"--debug={log}", *extra],
                            cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)


def _opened(pid: int, path: Path) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False


def test_a_worker_waits_for_the_copy_another_is_writing_and_rewrites_nothing(
        tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    module = tmp_path / "test_mod.py"
    module.write_text("def test_a():\n    assert 1\n")
    pyc = rewrite.get_cache_dir(module) / (module.name[:-3] + rewrite.PYC_TAIL)
    pyc.parent.mkdir()
    lock = Path(f"{pyc}.lock")
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another worker" is rewriting test_mod.py
    waiting = _collect(tmp_path, tmp_path / "waiting.log")
    try:
        deadline = time.monotonic() + 120
        while not _opened(waiting.pid, lock):  # it missed the copy and waits for the lock
            assert waiting.poll() is None, "it finished without waiting for the lock"
            assert time.monotonic() < deadline, "it never asked for the lock"
            time.sleep(0.05)
        # the other worker's copy (pytest without this conftest, bytecode written)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        assert _collect(tmp_path, tmp_path / "writer.log", "--noconftest", env=env).wait() == 0
        assert pyc.is_file()
    finally:
        os.close(held)
    assert waiting.wait(timeout=120) == 0
    log = (tmp_path / "waiting.log").read_text()
    assert f"found cached rewritten pyc for {module}" in log, log
    assert f"rewriting {module!r}" not in log, log


def test_the_wait_is_bounded_then_the_worker_rewrites_for_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewritelock, "WAIT_S", 0.2)
    pyc = tmp_path / "test_mod.pyc"
    held = os.open(f"{pyc}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert rewritelock._lock(pyc) is None
    finally:
        os.close(held)
    fd = rewritelock._lock(pyc)
    assert fd is not None
    os.close(fd)
    assert rewritelock._lock(tmp_path / "gone" / "test_mod.pyc") is None  # no folder for it
