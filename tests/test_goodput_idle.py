"""Issue 42: goodput is training over ALL the run's node-seconds, idle ones included (waiting,
collecting outputs, teardown are paid for like any other): a ledger with idle time present
says so in its figure."""

from __future__ import annotations

import pytest

from provision.job.ledger import Ledger


def test_idle_time_lowers_the_goodput() -> None:
    led = Ledger(started=0.0, nodes=2)
    led.switch("training", 10.0)  # 10 s provisioning
    led.switch("idle", 70.0)  # 60 s training
    led.close(100.0)  # 30 s idle
    data = led.to_json()
    assert data["node_seconds"]["idle"] == 60.0 and data["node_seconds"]["training"] == 120.0
    assert data["goodput"] == pytest.approx(120.0 / 200.0)  # 0.6, not 120 / 140


def test_goodput_counts_every_bucket() -> None:
    led = Ledger(started=0.0, nodes=1)
    for phase, at in (("setup", 5.0), ("gate", 7.0), ("training", 8.0), ("recovery", 48.0),
                      ("training", 58.0), ("idle", 88.0)):
        led.switch(phase, at)
    led.saved(2.0, 40.0)
    led.close(100.0)
    secs = led.to_json()["node_seconds"]
    assert sum(secs.values()) == pytest.approx(100.0)
    assert led.to_json()["goodput"] == pytest.approx(secs["training"] / 100.0)
    assert secs["training"] == pytest.approx(40.0 - 2.0 + 30.0)


def test_no_goodput_without_time() -> None:
    led = Ledger(started=5.0, nodes=3)
    led.close(5.0)
    assert led.to_json()["goodput"] is None
