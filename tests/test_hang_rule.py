"""The hang rule (job/watcher.py): no output and no checkpoint for --stall-timeout s is a hang,
but from a launch to its first line or checkpoint (torch's import, the rendezvous, data
loading) the start's limit applies: --start-timeout, by default the larger of --stall-timeout
and 300 s. CI's first launch of a busy machine took 27 s to its first line (stop 53): with
--stall-timeout 15 that was called a hang. The clock here is the test's own."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from provision.job import checkpoints as keeping
from provision.job import watcher as watching
from provision.job.checkpoints import CheckpointKeeper
from provision.job.watcher import START_TIMEOUT_S, Watcher
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import JobSpec

NODE = NodeRecord(name="node-0", rank=0, address="x", private_address="x")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(watching, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    return clock


def _watcher(tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch, clock: Clock,
             **timeouts: float) -> Watcher:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    inv = Inventory(name="c1", provider="docker", nodes=[NODE])
    keeper = CheckpointKeeper(inv, tmp_path / "ckpt", log=said.append)
    keeper.last_change = 0.0  # long before the launch (an earlier attempt's save)
    monkeypatch.setattr(watching, "dump_stacks", lambda *_: said.append("stacks dumped"))
    return Watcher(inv, JobSpec(script=str(script), **timeouts), keeper, said.append,
                   last_output=clock.now, launched=clock.now)  # made at the launch


def _quiet_for(watcher: Watcher, clock: Clock, seconds: float, since: float) -> str | None:
    clock.now = since + seconds
    return watcher.poll()


def test_a_slow_start_is_not_a_hang_under_the_stall_timeout(tmp_path: Path, clock: Clock,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=15)
    launched = clock.now
    assert _quiet_for(watcher, clock, 27, launched) is None  # CI's import: not a hang
    assert _quiet_for(watcher, clock, START_TIMEOUT_S - 1, launched) is None and said == []
    assert (_quiet_for(watcher, clock, START_TIMEOUT_S + 1, launched) or "").startswith("hang")
    assert said[0] == ("no output and no checkpoint for 301 s (since the launch, "
                       "--start-timeout's default 300): the job looks hung; dumping every "
                       "rank's stack") and said[1] == "stacks dumped"


def test_after_the_first_line_the_stall_timeout_counts(tmp_path: Path, clock: Clock,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=15)
    clock.now += 40
    watcher.line(NODE, "step 1 loss 0.5")
    heard = clock.now
    assert _quiet_for(watcher, clock, 14, heard) is None
    assert _quiet_for(watcher, clock, 16, heard) == "hang: no progress for 16 s"
    assert "(--stall-timeout 15)" in said[0], said


def test_a_checkpoint_before_any_line_ends_the_start(tmp_path: Path, clock: Clock,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=15)
    clock.now += 4
    watcher.keeper.last_change = clock.now  # a job that saves and prints nothing
    assert _quiet_for(watcher, clock, 16, watcher.keeper.last_change) is not None
    assert "(--stall-timeout 15)" in said[0], said


def test_the_keepers_first_look_at_a_node_is_no_progress(tmp_path: Path, clock: Clock,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """CI, stop 53: the keeper's first pass found no checkpoint on a node yet; that "none"
    differed from "never looked", so it counted as a checkpoint and ended the start: the
    ranks' 20 s import under load was a hang by --stall-timeout 15. A first look is the
    node's baseline (here an earlier job's file); only a change from it is progress."""
    monkeypatch.setattr(keeping, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=15)
    watcher.keeper.settle_s = 1e9  # nothing is copied here: only what the nodes hold counts
    launched = clock.now
    clock.now += 2
    watcher.keeper.sync(known={NODE.name: ({"step_000004.pt": [10.0, 5.0]}, 7.0)})
    assert _quiet_for(watcher, clock, 27, launched) is None and said == []
    watcher.keeper.sync(known={NODE.name: ({"step_000004.pt": [10.0, 5.0],
                                            "step_000009.pt": [10.0, 30.0]}, 32.0)})
    saved = clock.now
    assert _quiet_for(watcher, clock, 16, saved) == "hang: no progress for 16 s"
    assert "(--stall-timeout 15)" in said[0], said


def test_an_explicit_start_timeout_is_the_start_limit(tmp_path: Path, clock: Clock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=15, start_timeout=30)
    launched = clock.now
    assert _quiet_for(watcher, clock, 29, launched) is None
    assert _quiet_for(watcher, clock, 31, launched) is not None
    assert "(--start-timeout 30)" in said[0], said


def test_the_start_limit_is_never_below_the_stall_timeout(tmp_path: Path, clock: Clock,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, stall_timeout=START_TIMEOUT_S + 100)
    launched = clock.now
    assert _quiet_for(watcher, clock, START_TIMEOUT_S + 99, launched) is None
    assert _quiet_for(watcher, clock, START_TIMEOUT_S + 101, launched) is not None


def test_a_start_timeout_alone_watches_only_the_start(tmp_path: Path, clock: Clock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock, start_timeout=60)
    launched = clock.now
    assert _quiet_for(watcher, clock, 59, launched) is None
    watcher.line(NODE, "loading data")
    assert _quiet_for(watcher, clock, 10_000, clock.now) is None and said == []
    silent = _watcher(tmp_path, said, monkeypatch, clock, start_timeout=60)
    assert _quiet_for(silent, clock, 61, clock.now) is not None


def test_without_either_flag_nothing_is_a_hang(tmp_path: Path, clock: Clock,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    watcher = _watcher(tmp_path, said, monkeypatch, clock)
    assert _quiet_for(watcher, clock, 1e6, clock.now) is None and said == []


def test_a_start_timeout_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start_timeout"):
        JobSpec(script=str(tmp_path / "t.py"), start_timeout=0)
