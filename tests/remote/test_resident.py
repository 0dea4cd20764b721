"""remote/resident.py with real processes and gloo on this machine: one rank's process is
killed, the other keeps its process, waits for the word, and re-forms with a newcomer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remote import cli
from remote.resident import CONTROL, read_control

ROOT = Path(__file__).resolve().parents[2]
# a training function that all-reduces every step and says where it is
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from remote.resident import run
    BUILT = os.getpid()   # made once per process: a re-entered function sees the same one
    def train(world):
        print(f"enter gen={world.generation} rank={world.rank}/{world.size} pid={BUILT}",
              flush=True)
        steps = int(os.environ.get("STEPS", "60" if world.generation else "1000000"))
        for step in range(steps):
            t = torch.ones(1)
            dist.all_reduce(t)
            if world.rank == 0 and step % 20 == 0:
                print(f"step {step} sum={t.item():g}", flush=True)
            time.sleep(0.01)
        return "ok"
    print("result", run(train), flush=True)
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(tmp: Path, env: dict[str, str], name: str) -> subprocess.Popen[str]:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    full = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
            "LOCAL_RANK": "0", **env}
    return subprocess.Popen([sys.executable, str(script)], env=full, text=True,
                            stdout=open(tmp / f"{name}.log", "w"), stderr=subprocess.STDOUT)


def _wait_for(path: Path, text: str, deadline_s: float = 60.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path.name}:\n{got}")


def _events(log: str) -> list[dict[str, object]]:
    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines()
            if line.startswith("MGPU-EVENT ")]


def test_a_healthy_rank_keeps_its_process_and_reforms_with_a_newcomer(tmp_path: Path) -> None:
    port, control = _port(), tmp_path / "control"
    common = {"MGPU_RESIDENT_DIR": str(control), "MGPU_RESIDENT_PORT": str(port),
              "WORLD_SIZE": "2", "MASTER_PORT": str(_port())}
    zero = _rank(tmp_path, {**common, "RANK": "0"}, "r0")
    one = _rank(tmp_path, {**common, "RANK": "1"}, "r1")
    try:
        _wait_for(tmp_path / "r0.log", "step 40 sum=2")
        one.send_signal(signal.SIGKILL)  # its node is lost
        one.wait()
        log = _wait_for(tmp_path / "r0.log", '"phase": "interrupted"')
        assert zero.poll() is None, "rank 0 waits for the word, in the same process"
        time.sleep(0.5)
        assert "enter gen=1" not in (tmp_path / "r0.log").read_text(), "no word yet: it waits"
        assert cli.main(["resident", "reform", "--dir", str(control), "--gen", "1",
                         "--master", "127.0.0.1"]) == 0
        new = _rank(tmp_path, {**common, "MGPU_RESIDENT_GEN": "1",
                               "MGPU_RESIDENT_BASE": "1", "MGPU_RESIDENT_WORLD": "2",
                               "MGPU_RESIDENT_MASTER": "127.0.0.1"}, "new")
        log = _wait_for(tmp_path / "r0.log", "enter gen=1 rank=0/2")
        _wait_for(tmp_path / "new.log", "enter gen=1 rank=1/2")
        log = _wait_for(tmp_path / "r0.log", "step 20 sum=2")  # trains again, both ranks in
        pids = {line.split("pid=")[1] for line in log.splitlines() if line.startswith("enter")}
        assert pids == {str(zero.pid)}, "the same process entered generations 0 and 1"
        formed = [e for e in _events(log) if e["phase"] == "formed"]
        assert [(e["gen"], e["rank"], e["pid"]) for e in formed] == [(0, 0, zero.pid),
                                                                     (1, 0, zero.pid)]
        assert new.wait(timeout=60) == 0 and zero.wait(timeout=60) == 0
        log = (tmp_path / "r0.log").read_text()
        assert "result ok" in log and _events(log)[-1]["phase"] == "done"
    finally:
        for proc in (zero, one, *([new] if "new" in locals() else [])):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_no_word_in_time_raises_the_error_as_without_the_wrapper(tmp_path: Path) -> None:
    port = _port()
    common = {"MGPU_RESIDENT_DIR": str(tmp_path / "c"), "MGPU_RESIDENT_PORT": str(port),
              "WORLD_SIZE": "2", "MGPU_RESIDENT_WAIT_S": "1"}
    zero = _rank(tmp_path, {**common, "RANK": "0"}, "r0")
    one = _rank(tmp_path, {**common, "RANK": "1"}, "r1")
    try:
        _wait_for(tmp_path / "r0.log", "step 20 sum=2")
        one.kill()
        assert zero.wait(timeout=60) == 1
        log = (tmp_path / "r0.log").read_text()
        assert "Traceback" in log and "result ok" not in log
    finally:
        for proc in (zero, one):
            if proc.poll() is None:
                proc.kill()


def test_the_word_is_written_atomically_and_read_back(tmp_path: Path) -> None:
    assert read_control(str(tmp_path)) is None
    cli.main(["resident", "reform", "--dir", str(tmp_path), "--gen", "3", "--master", "10.0.0.5"])
    assert read_control(str(tmp_path)) == {"gen": 3, "master": "10.0.0.5"}
    (tmp_path / CONTROL).write_text('{"gen": "3", "master": "x"}')
    assert read_control(str(tmp_path)) is None, "a gen that is not a number is no word"


@pytest.mark.parametrize("env", [{}, {"MGPU_RESIDENT_DIR": ""}])
def test_outside_mgpu_cloud_the_function_runs_once(tmp_path: Path, env: dict[str, str]) -> None:
    port = _port()
    proc = _rank(tmp_path, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(port),
                            "STEPS": "3", **env}, "solo")
    assert proc.wait(timeout=60) == 0
    log = (tmp_path / "solo.log").read_text()
    assert "result ok" in log and "MGPU-EVENT" not in log


def test_a_silent_peer_is_cut_off_by_the_word(tmp_path: Path) -> None:
    """A peer that stops without closing its connections (SIGSTOP here; a powered-off host)
    leaves gloo's all-reduce waiting: abort/shutdown/destroy do not end it (torch 2.13). The
    word naming the lost host makes the rank's thread shut its connections to it: the
    collective fails at once, the rank waits for the next generation as after a kill."""
    port, control = _port(), tmp_path / "control"
    common = {"MGPU_RESIDENT_DIR": str(control), "MGPU_RESIDENT_PORT": str(port),
              "WORLD_SIZE": "2"}
    zero = _rank(tmp_path, {**common, "RANK": "0"}, "r0")
    one = _rank(tmp_path, {**common, "RANK": "1"}, "r1")
    try:
        _wait_for(tmp_path / "r0.log", "step 20 sum=2")
        one.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        assert '"phase": "interrupted"' not in (tmp_path / "r0.log").read_text(), \
            "without the word rank 0 waits in its all-reduce"
        cli.main(["resident", "reform", "--dir", str(control), "--gen", "0",
                  "--cut", "localhost"])  # a name: resolved on the node
        _wait_for(tmp_path / "r0.log", '"phase": "interrupted"', deadline_s=20)
        # the cutting thread says so after its shutdown, so maybe after the rank's own event
        _wait_for(tmp_path / "r0.log",
                  "generation 0 is over: 1 connection(s) of its group shut down", deadline_s=20)
        assert zero.poll() is None
        one.kill()
        cli.main(["resident", "reform", "--dir", str(control), "--gen", "1",
                  "--master", "127.0.0.1"])
        new = _rank(tmp_path, {**common, "MGPU_RESIDENT_GEN": "1", "MGPU_RESIDENT_BASE": "1",
                               "MGPU_RESIDENT_WORLD": "2", "MGPU_RESIDENT_MASTER": "127.0.0.1"},
                    "new")
        assert new.wait(timeout=90) == 0 and zero.wait(timeout=60) == 0
        assert "result ok" in (tmp_path / "r0.log").read_text()
    finally:
        for proc in (zero, one, *([new] if "new" in locals() else [])):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_kernels_addresses_read_as_text() -> None:
    from remote.resident import _remote_ip

    assert _remote_ip("0100007F:1F90") == "127.0.0.1"  # /proc/net/tcp, little-endian
    assert _remote_ip("0000000000000000FFFF00000300A8C0:0016") == "192.168.0.3"  # v4-mapped
    assert _remote_ip("00000000000000000000000001000000:0016") == "::1"
