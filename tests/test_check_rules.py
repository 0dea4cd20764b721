"""provision/nodes/checks.py as a table of small rules (issue 20), and the master port column
saying that `refused` is the healthy state (issue 23)."""

from __future__ import annotations

from test_check import a100_node

from provision.nodes.checks import (
    PREFLIGHT_RULES,
    Nodes,
    compare_preflights,
    gpu_count,
    master_port_reachable,
    port_text,
    preflight_rows,
)


def test_each_rule_is_a_small_pure_function_of_the_nodes() -> None:
    healthy = Nodes({"node-0": a100_node(), "node-1": a100_node()}, 8, 1)
    assert all(rule(healthy) == [] for rule in PREFLIGHT_RULES)
    short = Nodes({"node-0": a100_node()}, 16, 1)
    assert [f.check for f in gpu_count(short)] == ["gpu-count"]
    blocked = Nodes({"node-1": a100_node("timeout")}, 8, 1)
    (finding,) = master_port_reachable(blocked)
    assert finding.nodes == ("node-1",) and "node-1=timeout" in finding.message


def test_findings_are_every_rule_s_errors_first() -> None:
    odd = a100_node("timeout")
    odd["disk"] = {"free_bytes": 5 * 2**30}
    found = compare_preflights({"node-0": a100_node(), "node-1": odd, "node-2": {"error": "x"}},
                               8)
    assert [(f.severity, f.check) for f in found] == [
        ("error", "preflight"), ("error", "master-port"), ("warning", "disk")]


def test_torch_missing_says_each_nodes_own_reason_escaped() -> None:
    slow, gone, broken = a100_node(), a100_node(), a100_node()
    slow.update(torch=None, torch_error="/opt/venv/bin/python3: timed out after 30s",
                torch_timed_out=True)
    gone.update(torch=None, torch_error="No module named 'torch'\x1b[2J")
    broken.update(torch=None, torch_error="/opt/venv/bin/python3: exit code 124",
                  torch_timed_out=False)  # the flag, not the words or the code, says slow
    error, warning = compare_preflights({"node-0": slow, "node-1": gone, "node-2": broken}, 8)
    assert (error.severity, error.check, error.nodes) == ("error", "torch", ("node-1", "node-2"))
    assert "node-1: No module named 'torch'\\x1b[2J" in error.message, error.message
    assert "timed out" not in error.message and "install torch" in (error.hint or "")
    # an import that did not finish in time is no sign of a missing torch (a busy node, a
    # cold disk): said, and `up` goes on (warnings do not stop it)
    assert (warning.severity, warning.check, warning.nodes) == ("warning", "torch", ("node-0",))
    assert "node-0: /opt/venv/bin/python3: timed out after 30s" in warning.message
    assert "install torch" not in (warning.hint or "")


def test_a_refused_master_port_reads_as_healthy() -> None:
    assert port_text({"status": "refused"}) == "refused (ok: reachable, free)"
    assert port_text({"status": "timeout"}) == "timeout"
    header, row = preflight_rows({"node-0": a100_node()})
    assert row[header.index("master port")] == "refused (ok: reachable, free)"
