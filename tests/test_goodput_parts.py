"""The parts of issue 36 that are plain arithmetic over what a run saw: the goodput ledger,
the resume check and the straggler watch (their wiring into runs is tested on docker)."""

from __future__ import annotations

import math
import random
import time

import pytest

from provision.job.ledger import BUCKETS, Ledger, availability_interval, render, young_daly
from provision.job.resumecheck import ResumeCheck, step_in
from provision.job.stragglers import WINDOW, StragglerWatch, compute_s


def test_the_ledger_sums_to_wall_time_times_nodes_through_two_failures() -> None:
    led = Ledger(started=100.0, nodes=2)
    led.switch("setup", 130.0)  # 30 s provisioning
    led.switch("gate", 150.0)
    led.switch("training", 155.0)
    led.save_line("[node-0] checkpoint saved: step 50 -> /x/step_000050.pt (1.5 s)", 180.0)
    led.failed(lost_training_s=12.0, at=200.0)  # first failure: 12 s since the save redone
    led.resize(1, 205.0)  # a node lost: one left while the replacement comes
    led.resize(2, 230.0)
    led.switch("setup", 231.0)  # restore
    led.switch("training", 235.0)
    led.saved(2.5, 260.0)
    led.failed(lost_training_s=7.0, at=270.0)
    led.switch("training", 290.0)
    led.switch("idle", 330.0)
    got = led.close(340.0)
    node_seconds = (205 - 100) * 2 + (230 - 205) * 1 + (340 - 230) * 2
    assert math.isclose(sum(got.values()), node_seconds, rel_tol=0.01)
    assert math.isclose(sum(got.values()), node_seconds, abs_tol=1e-6)  # exact, in fact
    assert got["provisioning"] == 60 and got["gate"] == 10
    assert got["checkpoint"] == pytest.approx((1.5 + 2.5) * 2)
    assert got["redone"] == pytest.approx((12 + 7) * 2)
    assert got["recovery"] == pytest.approx(5 * 2 + 25 * 1 + 1 * 2 + 20 * 2)
    assert set(got) == set(BUCKETS)
    data = led.to_json()
    assert data["failures"] == 2 and data["save_cost_s"] == 2.0
    # recoveries: 200 -> 235 and 270 -> 290 (failure seen -> training again): Tr 27.5 s
    assert data["recovery_s"] == 27.5
    # Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2) with Ts 2.0 (the median save), Tf 120 (240 s of
    # wall time / 2 failures), Tr 27.5: 2 + sqrt(590 + 4) = 26.37...
    assert data["advice_s"] == 26.4 == round(availability_interval(2.0, 120.0, 27.5), 1)
    assert math.isclose(young_daly(2.0, 120.0), math.sqrt(2 * 2.0 * 120.0))
    text = render(data)
    assert "node-hours:" in text and "arXiv 2410.18124" in text and "redone" in text
    assert "recovery Tr 27.5 s" in text


def test_the_advice_counts_the_recovery_time_and_is_young_daly_without_it() -> None:
    """Tr moves the interval (Tf + Tr is the time from one failure to the next: a slower
    recovery spaces the saves further apart); with Tr = 0 and a save small against Tf it is
    Young/Daly's sqrt(2 Ts Tf) plus the save itself."""
    assert availability_interval(2.0, 120.0, 0.0) == pytest.approx(2 + math.sqrt(480 + 4))
    assert availability_interval(2.0, 120.0, 60.0) > availability_interval(2.0, 120.0, 0.0)
    tiny = availability_interval(0.01, 3600.0, 0.0)
    assert tiny == pytest.approx(young_daly(0.01, 3600.0), rel=0.01)


def test_spares_are_their_own_bucket_in_every_phase_and_count_in_the_total() -> None:
    """2 nodes + 1 spare: the spare accrues whatever the ranks do (setup, training,
    recovery), the sum is wall x (nodes + spares), and goodput counts what was paid for."""
    led = Ledger(started=0.0, nodes=2, spares=1)
    led.switch("setup", 10.0)
    led.switch("training", 20.0)
    led.failed(lost_training_s=5.0, at=60.0)
    led.resize(2, 62.0, spares=1)  # the spare took the rank; a new one was ordered
    led.switch("training", 64.0)
    got = led.close(100.0)
    assert got["spare"] == 100.0  # 1 spare x 100 s, none of it in another bucket
    assert sum(got.values()) == 100.0 * 3
    assert got["recovery"] == 4.0 * 2 and got["training"] == (40.0 - 5.0 + 36.0) * 2
    data = led.to_json()
    assert data["spares"] == 1 and data["goodput"] == round(got["training"] / 300.0, 4)
    assert "spare, idle 0.03 (33%)" in render(data)
    led.resize(2, 100.0, spares=0)
    with pytest.raises(ValueError, match="no ledger phase 'spare'"):
        led.switch("spare", 101.0)


def test_a_wait_for_the_queue_is_its_own_bucket_taken_from_recovery() -> None:
    """Kueue preempted the run (issue 43): of its recovery, the seconds the replacement
    waited for the queue's admission are "queued"; the sum is still wall time x nodes."""
    from provision.job.ledger import queued_in
    from provision.model.timeline import Phase, Timeline

    led = Ledger(started=0.0, nodes=2)
    led.switch("training", 10.0)
    led.failed(lost_training_s=3.0, at=40.0)
    led.resize(2, 100.0)  # back: 60 s of recovery on 2 nodes
    tl = Timeline(command="recovery", started_at=40.0, phases=[
        Phase(phase="replacement", start_s=0.0, seconds=55.0),
        Phase(phase="queued", start_s=1.0, seconds=45.0, part_of="replacement")])
    assert queued_in(tl) == 45.0 and queued_in(None) == 0.0
    led.queued(queued_in(tl) * led.nodes)
    led.switch("training", 100.0)
    got = led.close(120.0)
    assert got["queued"] == 90.0 and got["recovery"] == 30.0
    assert sum(got.values()) == 240.0
    assert "queued 0.03 (" in render(led.to_json())


def test_a_bring_up_that_waited_in_a_queue_counts_it_as_queued() -> None:
    from provision.job.ledger import from_timeline
    from provision.model.timeline import Phase, Timeline

    tl = Timeline(command="run", started_at=1000.0, phases=[
        Phase(phase="plan", start_s=0.0, seconds=2.0),
        Phase(phase="create call", start_s=2.0, seconds=50.0),
        Phase(phase="queued", start_s=3.0, seconds=40.0, part_of="create call")])
    led = from_timeline(tl, nodes=2, now=1060.0)
    got = led.close(1060.0)
    assert got["queued"] == 80.0 and got["provisioning"] == (2.0 + 50.0 - 40.0) * 2
    assert sum(got.values()) == 120.0


def test_no_advice_without_a_save_and_a_failure() -> None:
    led = Ledger(started=0.0, nodes=4)
    led.switch("training", 1.0)
    led.close(11.0)
    assert led.to_json()["advice_s"] is None
    assert led.total() == 44.0


def test_a_job_that_started_over_is_flagged_at_its_first_step() -> None:
    assert step_in("[node-0] step 310 loss 0.1234") == 310
    assert step_in("global_step=42 lr=3e-4") == 42
    assert step_in("[node-0] checkpoint saved: step 300 -> x") is None
    assert step_in("steps/s 12") is None
    flags: list[str] = []
    ok = ResumeCheck(300, flags.append)
    for line in ("loading...", "[node-0] resumed from step 300 (x), restart 1",
                 "[node-0] step 0 loss 1.0"):
        ok.feed(line)
    assert not flags and not ok.regressed and ok.first == 300
    bad = ResumeCheck(300, flags.append)
    for line in ("[node-0] rank 0/4 on node-0", "[node-0] step 0 loss 2.3", "step 10"):
        bad.feed(line)
    assert bad.regressed and flags == [
        "resume regression: saved 300, restarted at 0 (the job did not load its checkpoint: "
        "its work since then is redone)"]
    ResumeCheck(None, flags.append).feed("step 0")  # nothing restored: nothing to check
    assert len(flags) == 1


def test_a_slow_node_is_named_within_a_bounded_number_of_reports() -> None:
    assert compute_s("step 10 compute=0.031") == pytest.approx(0.031)
    assert compute_s("compute_ms=31.5") == pytest.approx(0.0315)
    rng = random.Random(7)
    named = []
    watch = StragglerWatch(["node-0", "node-1", "node-2"], fraction=0.5, patience=3,
                           on_slow=named.append)
    for step in range(40):
        for node in ("node-0", "node-1", "node-2"):
            base = 0.10 if node != "node-2" or step < 20 else 0.25  # node-2 slowed at step 20
            watch.feed(node, f"step {step} compute={base * rng.uniform(0.9, 1.1):.4f}")
        if named:
            break
    assert [s.node for s in named] == ["node-2"]
    assert 20 <= step <= 20 + WINDOW // 2 + 3  # the window's median catching up + patience
    assert "node-2 is slow" in str(named[0])
    watch.forget("node-2")
    assert watch.named == []


def test_noise_alone_names_nobody() -> None:
    rng = random.Random(3)
    watch = StragglerWatch(["node-0", "node-1"], fraction=0.5, patience=3)
    for _ in range(200):
        for node in ("node-0", "node-1"):
            watch.feed(node, f"compute={0.1 * rng.uniform(0.7, 1.3):.4f}")
    assert watch.named == []


def test_the_advice_is_said_even_for_saves_that_take_no_time() -> None:
    led = Ledger(started=0.0, nodes=2)
    led.switch("training", 1.0)
    led.saved(0.0002, 5.0)  # a tiny model: the save rounds to nothing
    led.failed(lost_training_s=1.0, at=9.0)
    led.close(20.0)
    data = led.to_json()
    assert data["advice_s"] is not None and "arXiv 2410.18124" in render(data)


def test_each_node_that_comes_back_waits_for_a_checkpoint_copied_after_it() -> None:
    from typing import Any, cast

    from provision.job.elastic import Grower, Missing
    from provision.model.inventory import NodeRecord

    none = cast(Any, None)
    grower = Grower(none, none, none, none, log=lambda msg: None)
    first, second = (NodeRecord(name=f"node-{r}", rank=r, address=f"10.0.0.{r}",
                                private_address=f"10.0.0.{r}", slots=1)
                     for r in (1, 2))
    for node in (first, second):
        grower.missing.append(item := Missing(node))
        before = time.monotonic()  # a checkpoint copied now is older than the node's return
        grower.made(item, node)
        assert not grower.due(last_copy=before)
        assert grower.due(last_copy=grower.ready_at + 1)
        assert grower.take() == [node] and not grower.missing
