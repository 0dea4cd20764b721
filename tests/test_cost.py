"""cost: the history of clusters made here (also removed ones), and what each cost."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from provision.cluster import cost
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import build_cluster_spec


def _inv(name: str, created: str, hourly: float, **spec: object) -> Inventory:
    s = build_cluster_spec({}, {"name": name, **spec})
    return Inventory(name=name, provider=s.provider, spec=s, created_at=created,
                     hourly_cost_usd=hourly)


def test_removed_clusters_stay_in_the_report(mgpu_home: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    a = _inv("a", "2025-01-01T00:00:00+00:00", 32.0, provider="aws", nodes=2, spot=True,
             aws={"instance_type": "p4d.24xlarge"})
    cost.record_up(a)
    monkeypatch.setattr(cost, "_now",
                        lambda: dt.datetime(2025, 1, 1, 1, 30, tzinfo=dt.UTC))
    cost.record_down(a)
    b = _inv("b", "2025-01-01T01:00:00+00:00", 0.0, nodes=3)
    cost.record_up(b)
    InventoryStore().create(b)  # still up
    rep = cost.report()
    [ra, rb] = rep["clusters"]
    assert (ra["cluster"], ra["provider"], ra["type"], ra["nodes"], ra["spot"]) == (
        "a", "aws", "p4d.24xlarge", 2, True)
    assert ra["removed"] == "2025-01-01T01:30:00+00:00"
    assert (ra["hours"], ra["node_hours"], ra["cost_usd"]) == (1.5, 3.0, 48.0)
    assert rb["removed"] is None and rb["type"] is None and rb["hours"] == 0.5
    assert rep["total_usd"] == 48.0
    assert [r["cluster"] for r in cost.report("b")["clusters"]] == ["b"]


def test_a_reused_name_is_another_cluster_and_old_inventories_count(mgpu_home: Path) -> None:
    old = _inv("x", "2025-01-01T00:00:00+00:00", 1.0)
    cost.record_up(old)
    cost.record_down(old)
    new = _inv("x", "2025-02-01T00:00:00+00:00", 1.0)
    cost.record_up(new)
    legacy = _inv("legacy", "2025-03-01T00:00:00+00:00", 2.0)  # made before the history
    InventoryStore().create(legacy)
    rows = cost.report()["clusters"]
    assert [(r["cluster"], r["created"][:7]) for r in rows] == [
        ("x", "2025-01"), ("x", "2025-02"), ("legacy", "2025-03")]


def test_a_torn_line_is_skipped(mgpu_home: Path) -> None:
    cost.record_up(_inv("a", "2025-01-01T00:00:00+00:00", 1.0))
    with cost.history_path().open("a") as fh:
        fh.write('{"event": "up", "clus')
    assert [r["cluster"] for r in cost.report()["clusters"]] == ["a"]
    lines = cost.history_path().read_text().splitlines()
    assert json.loads(lines[0])["event"] == "up"


def test_describe_for_the_end_of_run() -> None:
    line = cost.describe(30.0, "2025-01-01T00:00:00+00:00", "2025-01-01T00:30:00+00:00", True)
    assert line == "cost: 30.0 min x $30.00/h (spot catalog price) = $15.00"


def test_a_runs_goodput_is_shown_beside_its_cost(mgpu_home: Path) -> None:
    from typer.testing import CliRunner

    from provision.cli.app import app

    a = _inv("g", "2025-01-01T00:00:00+00:00", 4.0, nodes=2)
    cost.record_up(a)
    assert cost.report()["clusters"][0]["goodput"] is None
    cost.record_goodput(a, {"goodput": 0.83, "node_seconds": {"training": 83.0, "idle": 17.0}})
    assert cost.report()["clusters"][0]["goodput"] == 0.83
    res = CliRunner().invoke(app, ["cost"], env={"COLUMNS": "160"})
    assert res.exit_code == 0 and "GOODPUT" in res.output and " 83% " in res.output, res.output
