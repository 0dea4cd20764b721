"""The bring-up timeline (provision/model/timeline.py): what is recorded, how the slowest phase
is named, that inventories written before timelines still load, and `status --timeline`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from provision.model import timeline
from provision.model.inventory import Inventory, InventoryStore
from provision.operations.dashboard.views import bringup_phases


def test_an_inventory_written_before_timelines_loads(mgpu_home: Path) -> None:
    store = InventoryStore()
    store.save(Inventory(name="old", provider="docker"))
    data = yaml.safe_load(store.path("old").read_text())
    del data["timelines"]
    store.path("old").write_text(yaml.safe_dump(data))
    assert store.load("old").timelines == []


def _recorded() -> Inventory:
    """An `up` whose phases are placed by hand (no clock in the assertions)."""
    inv = Inventory(name="c1", provider="aws")
    tl = timeline.Timeline(command="up", started_at=1000.0)
    timeline.begin(inv, "up", tl)
    tl.add("plan", since=1000.0, at=1000.5)
    tl.add("create call", since=1000.5, at=1030.0)
    tl.add("nodes running", since=1000.5, at=1020.0, part_of="create call", detail="2 node(s)")
    tl.add("bootstrap", since=1030.0, at=1100.0)
    tl.add("ssh answers", since=1030.0, at=1035.0, part_of="bootstrap")
    tl.add("image present", since=1030.0, at=1095.0, part_of="bootstrap")
    return inv


def test_the_slowest_phase_is_a_top_level_one_with_its_slowest_part() -> None:
    inv = _recorded()
    (tl,) = inv.timelines
    assert tl.summary() == ("up timeline: 100.0 s to image present; slowest phase: bootstrap "
                            "70.0 s (image present 65.0 s of it)")
    assert bringup_phases(inv)[2] == {"phase": "create call: nodes running", "start_s": 0.5,
                                      "seconds": 19.5, "detail": "2 node(s)"}


def test_open_phases_parts_and_no_open_timeline() -> None:
    inv = Inventory(name="c1", provider="docker")
    timeline.mark(inv, "gate", since=0.0)  # no timeline: nothing, and no error
    timeline.reached(inv, "nodes running", part_of="create call")
    assert inv.timelines == []
    timeline.begin(inv, "run")
    with timeline.timed(inv, "create call"):
        timeline.reached(inv, "nodes running", part_of="create call")
    timeline.reached(inv, "late", part_of="create call")  # its parent closed: not recorded
    try:
        with timeline.timed(inv, "bootstrap"):
            raise OSError("boom")
    except OSError:
        pass
    tl = timeline.finish(inv)
    assert tl is not None and tl.ended
    assert [(p.phase, p.part_of) for p in tl.phases] == [
        ("create call", ""), ("nodes running", "create call"), ("bootstrap", "")]
    assert tl.phases[1].start_s == tl.phases[0].start_s  # a part starts with its phase
    assert all(p.seconds is not None for p in tl.phases) and tl.phases[2].detail == "failed"
    timeline.mark(inv, "first output line", since=tl.started_at)  # closed: not recorded
    assert len(tl.phases) == 3
    for _ in range(timeline.KEPT + 2):
        timeline.begin(inv, "launch")
    assert len(inv.timelines) == timeline.KEPT


def test_status_timeline_shows_the_phases(mgpu_home: Path) -> None:
    InventoryStore().save(_recorded())
    run = [sys.executable, "-m", "provision.cli", "status", "c1", "--timeline"]
    env = {**os.environ, "MGPU_CLOUD_HOME": str(mgpu_home)}
    out = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("c1: up at ") and lines[0].endswith("(aws)")
    assert lines[1].split() == ["PHASE", "START", "SECONDS", "DETAIL"]
    assert lines[4].split() == ["nodes", "running", "0.50", "19.50", "2", "node(s)"]
    assert lines[4].startswith("    nodes running")  # a part, under its phase
    assert "slowest phase: bootstrap 70.0 s (image present 65.0 s of it)" in lines[-1]
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, env=env,
                                     check=True).stdout)
    (tl,) = data["c1"]
    assert tl["slowest"] == "bootstrap" and tl["command"] == "up"
    assert [p["phase"] for p in tl["phases"]] == ["plan", "create call", "nodes running",
                                                  "bootstrap", "ssh answers", "image present"]


def test_a_commands_clock_can_start_with_its_process() -> None:
    """`run`'s clock (and so its ledger) starts when the CLI's process did: the interpreter's
    start and the imports are waited for too. Read from /proc: never in the future, and a
    process started a second ago is found to be."""
    import subprocess
    import sys

    from provision.model.timeline import process_started_at

    code = ("import time; time.sleep(1.2); from provision.model.timeline import "
            "process_started_at as p; print(time.time() - p())")
    waited = float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                  text=True, check=True).stdout)
    assert 1.2 <= waited <= 60.0, waited  # it slept 1.2 s after it started
    assert process_started_at() <= time.time()
