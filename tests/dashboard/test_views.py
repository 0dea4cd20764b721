"""The dashboard's data layer on synthetic state: views, metrics from log lines, chart series."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from dash_synthetic import T0, iso, make_big_cluster, make_removed_cluster, train_log

from provision.job.jobrecords import summary_of
from provision.model.jobstore import JobStore
from provision.operations.dashboard import metrics, views
from provision.operations.dashboard.joblogs import MAX_LINES, NodeLog


@pytest.mark.parametrize(("line", "expected"), [
    ("step 10 loss 0.1234", {"loss": 0.1234}),
    ("throughput: samples/s=1234.5 (global batch 256, 49 timed steps)", {"samples/s": 1234.5}),
    ("{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}",
     {"loss": 0.5, "grad_norm": 1.2, "learning_rate": 5e-05}),
    ("iter 5: train_loss=nan lr=3e-4 tokens/s: 1.2e5", {"lr": 3e-4, "tokens/s": 1.2e5}),
    ("val/acc=0.91, eval_loss: 2", {"val/acc": 0.91, "eval_loss": 2.0}),
    ("rank 0/4 on node-0: local_rank=0 backend=gloo", {}),  # not a metric anyone charts
    ("loss=inf", {}),
])
def test_metrics_people_print_are_found(line: str, expected: dict[str, float]) -> None:
    assert metrics.parse_metrics(line) == expected


def test_points_are_placed_at_the_step_last_printed() -> None:
    p = metrics.LogParser("node-0", live=False)
    for line in train_log(steps=30, every=10):
        p.feed(line)
    assert p.series["loss"].x == [0.0, 10.0, 20.0]
    assert p.series["samples/s"].x == [20.0] and p.series["samples/s"].y == [18234.5]
    q = metrics.LogParser("node-0")
    for v in (3.0, 2.0):
        q.feed(f"loss={v}")
    assert q.series["loss"].x == [0.0, 1.0], "no step printed: the point's index"


def test_each_metric_comes_from_the_lowest_rank_that_prints_it() -> None:
    r0, r1 = metrics.LogParser("node-0"), metrics.LogParser("node-1")
    r1.feed("step 1 loss 9.0 lr=0.1")
    r0.feed("step 1 loss 1.0")
    merged = metrics.merged_metrics([(1, r1), (0, r0)])
    assert merged["loss"] == {"node": "node-0", "x": [1.0], "y": [1.0]}
    assert merged["lr"]["node"] == "node-1"


def test_long_series_are_thinned_not_cut() -> None:
    s = metrics.Series()
    for i in range(metrics.MAX_POINTS + 1):
        s.add(float(i), float(i))
    assert len(s.x) <= metrics.MAX_POINTS and s.x[0] == 0.0
    assert s.x[-1] == float(metrics.MAX_POINTS), "the newest point is kept"


def test_preemption_events_from_the_log() -> None:
    p = metrics.LogParser("node-1", live=False)
    p.feed('MGPU-EVENT {"event": "preemption", "action": "terminate", '
           '"time": "2026-03-01T10:00:00Z", "source": "aws", "signal": "SIGUSR1"}')
    p.feed("MGPU-EVENT {not json")
    [ev, bad] = p.events  # an unreadable one is an event of its own, named (nodejson.py)
    assert bad["event"] == "unreadable" and bad["detail"].startswith("node-1 sent an unread")
    assert ev["event"] == "preemption" and ev["node"] == "node-1"
    assert ev["t"] == dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC).timestamp()
    assert "action=terminate" in ev["detail"] and "signal=SIGUSR1" in ev["detail"]


def test_monitor_samples_become_aligned_series() -> None:
    gpu = {"cpu_pct": 5.0, "mem_used_mib": 2048, "gpus": [
        {"util_pct": 90, "mem_used_mib": 40960, "power_w": 300.0},
        {"util_pct": 70, "mem_used_mib": 20480, "power_w": 250.0}]}
    v = metrics.sample_values(gpu)
    assert (v["gpu_util"], v["gpu_mem_gib"], v["power_w"], v["mem_gib"]) == (80.0, 60.0, 550.0,
                                                                               2.0)
    cpu = metrics.sample_values({"cpu_pct": 12.5, "mem_used_mib": 512, "gpus": []})
    assert cpu["gpu_util"] is None and cpu["cpu_pct"] == 12.5
    data = metrics.align([[(10.1, 1.0), (12.0, 2.0)], [(10.0, 5.0)]], 2.0)
    assert data == [[10.0, 12.0], [1.0, 2.0], [5.0, None]]


def test_node_log_numbers_lines_and_drops_the_oldest() -> None:
    log = NodeLog("node-0", 0, live=True)
    log.write("[node-0] a\n[node-0] b\n[node-0] par")
    assert log.read(0)["lines"] == ["a", "b"]
    log.write("tial\n")
    got = log.read(2)
    assert got["lines"] == ["partial"] and got["next"] == 3 and not got["done"]
    log.restart()  # a re-follow after a broken channel sends the log again from its start
    log.write("[node-0] a\n[node-0] b\n[node-0] partial\n[node-0] new\n")
    assert log.read(3)["lines"] == ["new"] and log.total == 4
    for i in range(MAX_LINES):
        log.add(f"line {i}")
    got = log.read(0, limit=2)
    assert got["missed"] == 4 and got["from"] == 4 and got["lines"] == ["line 0", "line 1"]


def test_cluster_views_of_64_nodes(mgpu_home: Path) -> None:
    make_big_cluster(mgpu_home)
    make_removed_cluster(mgpu_home)
    listing = views.clusters_view()
    [row] = listing["clusters"]
    assert (row["name"], row["nodes"], row["state"], row["gate_verdict"]) == ("big", 64, "ready",
                                                                              "fail")
    # 12 h, made at T0 (2 h before this module was imported: a long run of the suite comes
    # later, so what is left is counted from T0, not from "2 h ago")
    left = 12 - (dt.datetime.now(dt.UTC) - T0).total_seconds() / 3600
    assert row["cost_usd"] > 0 and row["hours_left"] == pytest.approx(left, abs=0.01)
    assert [r["cluster"] for r in listing["removed"]] == ["old-run"]
    assert listing["removed"][0]["jobs"] == 1
    view = views.cluster_view("big")
    assert len(view["nodes"]) == 64 and [j["id"] for j in view["jobs"]] == ["3", "2", "1"]
    m = view["gate"]["matrix"]
    assert len(m["nodes"]) == 64 and all(len(r) == 64 for r in m["cells"])
    assert m["cells"][1][2] == m["cells"][2][1] and m["cells"][1][2]["verdict"] == "slow"
    assert m["cells"][0][0] is None and m["cells"][0][1]["ratio"] == pytest.approx(11.2 / 11.6,
                                                                                   abs=1e-3)
    assert view["replacements"][0]["new"] == "node-3b"
    assert view["bringup"] == [] and view["runs"] == []
    removed = views.cluster_view("old-run")
    assert removed["exists"] is False and removed["jobs"][0]["state"] == "removed"


def test_unknown_names_are_not_found(mgpu_home: Path) -> None:
    make_big_cluster(mgpu_home, nodes=1)
    with pytest.raises(views.NotFound, match="no cluster named 'nope'"):
        views.cluster_view("nope")
    with pytest.raises(views.NotFound, match="is not a cluster name"):
        views.cluster_view("../etc")
    with pytest.raises(views.NotFound, match=r"has no job '7' \(jobs: 1, 2, 3\)") as err:
        views.load_job("big", "7")
    assert err.value.back == "/clusters/big"
    with pytest.raises(views.NotFound):
        views.load_job("big", "1x")


def test_exit_codes_stay_short_on_many_nodes() -> None:
    assert views.exit_summary([0, 1]) == "0,1" and views.exit_summary([]) == "-"
    assert views.exit_summary([0] * 62 + [1, None]) == "0 x62, 1 x1, - x1"


def test_recovery_events_keep_to_the_job_window(mgpu_home: Path) -> None:
    inv = make_big_cluster(mgpu_home, nodes=4)  # node-3 replaced at minute 95
    done, failed = (summary_of(JobStore().load("big", i), inv) for i in ("1", "2"))  # 5..90, 91..96
    assert [e["kind"] for e in views.recovery_events(done, inv)] == ["start", "end"]
    events = views.recovery_events(failed, inv, [{"event": "preemption", "node": "node-2",
                                                 "t": views.epoch(iso(93)), "detail": "x"}])
    assert [e["kind"] for e in events] == ["start", "preemption", "replaced", "end"]
    assert "node-3 -> node-3b (node lost)" in events[2]["detail"]


def test_cost_series_is_exact_at_every_start_and_stop() -> None:
    rows = [{"created": "2026-01-01T00:00:00+00:00", "removed": "2026-01-01T02:00:00+00:00",
             "hourly_cost_usd": 10.0},
            {"created": "2026-01-01T01:00:00+00:00", "removed": None, "hourly_cost_usd": 4.0}]
    now = dt.datetime(2026, 1, 1, 3, tzinfo=dt.UTC)
    s = views.cost_series(rows, now)
    hours = [(t - s["t"][0]) / 3600 for t in s["t"]]
    assert hours == [0.0, 1.0, 2.0, 3.0]
    assert s["usd"] == [0.0, 10.0, 24.0, 28.0]
    assert views.cost_series([], now) == {"t": [], "usd": []}


def test_managed_runs_come_from_their_store(mgpu_home: Path, tmp_path: Path) -> None:
    from provision.job.managed.client import remember
    from provision.job.managed.records import JobLog, next_job_id
    from remote.store import open_store

    make_big_cluster(mgpu_home, nodes=2)
    assert views.cluster_view("big")["runs"] == [], "no store: no managed runs"
    url = f"file://{tmp_path / 'store'}"
    store = open_store(url)
    jl = JobLog(store, "big", next_job_id(store, "big"))
    jl.record("submitted", "handed over")
    jl.record("started", "running on 2 node(s)")
    jl.record("node_lost", "node lost (node-1)", nodes=["node-1"])
    jl.restarts = 1
    jl.record("resumed", "restart 1 of 2")
    jl.close()
    remember("big", url)  # as `attach --store URL big` does
    [run] = views.cluster_view("big")["runs"]
    assert (run["id"], run["state"], run["restarts"]) == ("1", "running", 1)
    assert run["detail"].endswith("started → node_lost → resumed")
    assert views.cluster_view("big", runs=False)["runs"] == []
    remember("big", "ftp://nowhere")  # a store that cannot be read: one row saying why
    [bad] = views.cluster_view("big")["runs"]
    assert bad["state"] == "unknown" and "could not be read" in bad["detail"]


def test_a_jobs_goodput_and_ledger_are_shown() -> None:
    from provision.job.jobrecords import summary_of
    from provision.model.jobstore import JobRecord
    from provision.operations.dashboard.views import job_row

    rec = JobRecord(id="3", cluster="c1", cluster_created_at="x", command="train.py",
                    launcher="torchrun", state="succeeded")
    assert job_row(summary_of(rec))["goodput"] is None
    rec.ledger = {"node_seconds": {"training": 90.0, "redone": 10.0}, "goodput": 0.9,
                  "failures": 1, "wall_s": 50.0, "save_cost_s": 0.5, "advice_s": 7.1}
    row = job_row(summary_of(rec))
    assert row["goodput"] == 0.9
    assert "training 0.03 (90%)" in row["ledger_text"] and "~7.1 s" in row["ledger_text"]
