"""A node's preflight report is read through nodejson.PreflightReport before nodes/checks.py
judges it (nodes/preflight.report_of): any JSON object a node sends is either judged or is
"node-R sent an unreadable preflight report", never a crash of `up`, `check` or the spares'
fitness check. Before, `{"gpus": "abc"}` or `{"torch": [1]}` raised AttributeError there."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provision.nodes import checks
from provision.nodes.preflight import report_of
from remote import preflight as remote_preflight

KEYS = ["error", "torch", "torch_error", "gpus", "gpu_error", "topology", "disk",
        "master_port", "name", "driver_version", "summary", "nvlink_min", "free_bytes",
        "addr", "port", "status", "reachable", "bindable", "cuda", "nccl"]
scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(
    max_size=5)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(KEYS), inner, max_size=4), max_leaves=12)
reports = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def _judged(report: dict[str, Any]) -> None:
    """Everything that reads a report: the rules, the table, the interconnect guess."""
    all_nodes = {"node-0": report, "node-1": report}
    checks.compare_preflights(all_nodes, 8)
    checks.compare_preflights(all_nodes, None)
    checks.preflight_rows(all_nodes)
    checks.guess_interconnect(report, 1)


@settings(max_examples=400, deadline=None)
@given(reports)
def test_any_object_is_judged_or_said_unreadable(value: dict[str, Any]) -> None:
    report = report_of("node-1", value)
    if "gpus" not in report and str(report.get("error", "")).startswith(
            "node-1 sent an unreadable preflight report ("):
        findings = checks.compare_preflights({"node-1": report}, None)
        assert findings[0].check == "preflight" and "unreadable preflight" in findings[0].message
        return
    _judged(report)


@pytest.mark.parametrize("value", [
    {"gpus": "abc"}, {"gpus": [1, 2]}, {"torch": [1]}, {"torch": {"torch": {"x": 1}}},
    {"disk": {"free_bytes": "lots"}}, {"disk": {"free_bytes": -1}},
    {"topology": "nvlink"}, {"topology": {"nvlink_min": "many"}},
    {"master_port": {"port": 1, "reachable": "no"}}, {"master_port": [1]},
    {"gpus": [{"name": "A100"}] * 4097},
])
def test_what_crashed_the_rules_is_an_unreadable_report(value: dict[str, Any]) -> None:
    report = report_of("node-1", value)
    assert set(report) == {"error"} and report["error"].startswith(
        "node-1 sent an unreadable preflight report ("), report
    [finding] = checks.compare_preflights({"node-1": report}, None)
    assert finding.message.startswith("preflight did not run: node-1 sent an unreadable")


def test_a_real_report_reads_as_itself() -> None:
    """What remote/preflight.py collects on this machine passes unchanged: every key kept,
    none added (a missing `reachable` must stay missing: checks reads it with a default)."""
    real = json.loads(json.dumps(remote_preflight.collect(
        ".", master_addr="127.0.0.1", master_port=1, timeout=2.0)))
    assert report_of("node-0", real) == real
    partial = {"gpus": [], "master_port": {"addr": "10.0.0.1", "port": 29500,
                                           "status": "timeout"}}
    assert report_of("node-0", partial) == partial


# --- monitor samples (`top`, the dashboard's charts): nodejson.MonitorSample -------------

SAMPLE_KEYS = ["cpus", "cpu_pct", "mem_used_mib", "mem_total_mib", "load", "gpus", "error",
               "index", "name", "util_pct", "sm_active", "power_w", "temp_c"]
samples = st.dictionaries(st.sampled_from(SAMPLE_KEYS), st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(SAMPLE_KEYS), inner, max_size=4), max_leaves=12), max_size=8)


@settings(max_examples=400, deadline=None)
@given(samples)
def test_any_sample_is_drawn_or_is_no_sample(value: dict[str, Any]) -> None:
    from provision.model.nodejson import monitor_sample
    from provision.operations.dashboard.metrics import sample_values
    from provision.operations.monitor import table_rows

    sample = monitor_sample(value)
    if sample is None:
        return
    table_rows([{"node": "node-0", "rank": 0, **sample}])
    sample_values(sample)


@pytest.mark.parametrize("value", [
    {"cpu_pct": "x"}, {"gpus": "ab"}, {"load": [None]}, {"gpus": [{"index": 0, "power_w": "hot"}]},
    {"gpus": [{"util_pct": "high"}]}, {"mem_used_mib": [1]}, {"load": None},
    {"gpus": [{}]},  # found by the property test below in a suite run: top's KeyError 'index'
])
def test_what_crashed_top_is_no_sample(value: dict[str, Any]) -> None:
    from provision.model.nodejson import monitor_sample
    from provision.operations.monitor import table_rows

    assert monitor_sample(value) is None
    with pytest.raises((TypeError, ValueError, AttributeError, KeyError)):  # `top` before
        table_rows([{"node": "node-0", "rank": 0, **value, "gpus": value.get("gpus", [])}])


def test_a_real_sample_reads_as_itself() -> None:
    from provision.model.nodejson import monitor_sample
    from remote import monitor as remote_monitor

    real = json.loads(json.dumps(remote_monitor.sample((0, 0))[0]))
    assert monitor_sample(real) == real
