"""scale: sizes, the throughput metric, speedup / efficiency / $ per job, table and chart."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit import IN_CI

from provision.model.errors import UserInputError
from provision.operations.scale import SizeRun, analyse, parse_sizes, plot, table, throughput_in


def test_sizes() -> None:
    assert parse_sizes("4, 1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "one"):
        with pytest.raises(UserInputError):
            parse_sizes(bad)


def test_the_last_metric_wins() -> None:
    lines = ["[node-0] samples/s=10", "noise", "[node-0] throughput: samples/s=1.5e3 (x)"]
    assert throughput_in(lines) == 1500.0
    assert throughput_in(["samples/s: 42.5"]) == 42.5
    assert throughput_in(["no metric here"]) is None


def test_speedup_efficiency_and_cost_per_job() -> None:
    runs = [SizeRun(1, 8, 100.0, 0, 1000.0), SizeRun(2, 16, 60.0, 0, 1800.0),
            SizeRun(4, 32, 40.0, 1, None)]
    rows = analyse(runs, hourly_per_node=36.0)
    assert (rows[0]["speedup"], rows[0]["efficiency"]) == (1.0, 1.0)
    assert (rows[1]["speedup"], rows[1]["efficiency"]) == (1.8, 0.9)
    assert rows[1]["cost_per_job_usd"] == pytest.approx(36.0 * 2 * 60 / 3600)
    assert rows[2]["speedup"] is None, "a failed size has no ratios"
    text = table({"rows": rows})
    assert text[0][0] == "NODES" and text[2][4:6] == ("1.80x", "90%")
    assert text[3][2] == "exit 1"


def test_wall_time_when_no_metric() -> None:
    rows = analyse([SizeRun(1, 2, 30.0, 0, None), SizeRun(2, 4, 20.0, 0, None)], 0.0)
    assert (rows[1]["speedup"], rows[1]["efficiency"]) == (1.5, 0.75)


def test_plot(tmp_path: Path) -> None:
    if not IN_CI:  # in CI the test extra installs matplotlib: the chart must be drawn there
        pytest.importorskip("matplotlib")
    rows = analyse([SizeRun(1, 2, 30.0, 0, 100.0), SizeRun(2, 4, 20.0, 0, 180.0)], 0.0)
    out = tmp_path / "scale.png"
    plot({"cluster": "demo", "provider": "docker", "rows": rows}, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
