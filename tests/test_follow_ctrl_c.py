"""`logs --follow` and the one streaming fan-out under it: the first Ctrl-C stops following at
once, and what is said then is what the nodes tell (the job goes on, or it had finished)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_nodes import FakeConnector
from typer.testing import CliRunner

from provision.cli import app
from provision.job import jobs as jobrecords
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.spec import build_job_spec
from provision.nodes import fan_out

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv(name: str) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2) for r in range(2)]
    return Inventory(name=name, provider="docker", nodes=nodes, status="ready",
                     created_at="2025-06-01T12:34:56+00:00")


def test_a_ctrl_c_stops_a_streaming_fan_out_at_once() -> None:
    """The follow threads never end here; the Ctrl-C must come back before they are let go
    (a pool that waits for its threads swallows it until the job ends)."""
    started, release = threading.Barrier(3), threading.Event()
    let_go = threading.Timer(20, release.set)  # what ends the follow calls, if fan_out waits
    let_go.start()

    def follow(_: int) -> int:
        started.wait()
        release.wait()
        return 0

    def press_ctrl_c() -> None:
        started.wait()
        time.sleep(0.2)  # the caller is waiting in fan_out by now (or soon: it is a signal)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fan_out([1, 2], follow, streaming=True)
        assert not release.is_set(), "fan_out waited for the follow threads"
    finally:
        let_go.cancel()
        release.set()


@pytest.mark.parametrize(("state", "said"), [
    ({"state": "running"}, "it goes on (cancel it: mgpu-cloud cancel lg 1)"),
    ({"state": "exited", "exit_code": 0, "ended": 4e9}, "it had already finished: succeeded, exit code 0"),
])
def test_ctrl_c_on_logs_says_whether_the_job_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                     state: dict[str, Any], said: str) -> None:
    inv = _inv("lg")
    InventoryStore().create(inv)
    jobrecords.begin(inv, build_job_spec({}, {"script": EXAMPLE}), inv.nodes, detached=True)
    fake = FakeConnector()
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    fake.on(r"job status", stdout=json.dumps({"1": state}))
    fake.on(r"job follow", raises=KeyboardInterrupt())
    res = CliRunner().invoke(app, ["logs", "lg", "--follow"])
    assert res.exit_code == 130, res.output
    assert f"stopped following job 1; {said}" in res.output
