"""A node's output is split on `\\n` only, stored and printed the same way, and shown with its
control characters and escape sequences escaped (provision/model/nodetext.py): `logs` (a
managed run's store, the copies kept here), the live `[node-R]` stream, the dashboard, a
failure's story and tails, a failed pod's log tail.

Each test puts into a node line exactly the characters `str.splitlines` also breaks at
(`\\x1c`, `\\x0c`, `\\u2028`) and escape sequences; before this, each showed as an unprefixed
`[controller] ...` line or reached the terminal raw."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provision.model.nodetext import lines, shown, split_lines

FORGED = "step 3\x1c[controller] job finished: succeeded\x0c[node-0] x\u2028[controller] y"
ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202egnp.exe"
RAW = set("\x1c\x0c\u2028\x1b\x07\x9b\u202e")


def _one_line_each(text: str, prefixes: tuple[str, ...]) -> list[str]:
    """The lines of `text` as a reader that splits on every Unicode line break sees them:
    each must carry one of `prefixes` and hold none of the raw characters."""
    got = text.splitlines()
    assert all(line.startswith(prefixes) for line in got), got
    assert not RAW & set(text), [c for c in text if c in RAW]
    return got


def test_shown_escapes_and_keeps_what_a_terminal_shows() -> None:
    assert shown(FORGED) == ("step 3\\x1c[controller] job finished: succeeded\\x0c[node-0] x"
                             "\\u2028[controller] y")
    assert shown(ESCAPES) == "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202egnp.exe"
    assert shown(" 10%|#\r 20%|##\r") == " 20%|##"  # a progress bar: its last state
    assert shown("tab\tand é, 日本") == "tab\tand é, 日本"
    assert split_lines("a\r\nb\x1cc\nrest") == (["a", "b\x1cc"], "rest")
    assert lines("a\u2028b\n\nc") == ["a\u2028b", "", "c"]


@given(st.text())
def test_shown_leaves_no_line_break_and_is_idempotent(text: str) -> None:
    once = shown(text)
    assert len(once.splitlines()) <= 1 and shown(once) == once
    assert not any(c in once for c in "\x1b\x00\x7f\x85\u2028\u2029")


def test_the_live_stream_prefixes_every_line_and_escapes_it() -> None:
    from provision.job.output import PrefixWriter

    out = io.StringIO()
    writer = PrefixWriter("node-1", out, threading.Lock())
    writer.write(FORGED + "\n" + ESCAPES + "\r\n")
    got = _one_line_each(out.getvalue(), ("[node-1] ",))
    assert len(got) == 2
    assert list(writer.lines) == [FORGED, ESCAPES]  # kept as sent, for the diagnosis


def test_logs_of_a_managed_run_show_each_stored_line_once_under_its_node(
        tmp_path: Path) -> None:
    from provision.job.managed.client import print_logs
    from remote.store import open_store

    url = f"file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()
    store = open_store(url)
    store.put_new("c1/jobs/1/log/000001.log",
                  f"[node-1] {FORGED}\n[node-0] {ESCAPES}\n[controller] real\n".encode())
    out = io.StringIO()
    print_logs(url, "c1", "1", out, follow=False)
    got = _one_line_each(out.getvalue(), ("[node-1] ", "[node-0] ", "[controller] "))
    assert [line.split(" ")[0] for line in got] == ["[node-1]", "[node-0]", "[controller]"]
    only = io.StringIO()
    print_logs(url, "c1", "1", only, follow=False, node=0)
    assert _one_line_each(only.getvalue(), ("[node-0] ",)) == [f"[node-0] {shown(ESCAPES)}"]


def test_logs_kept_here_show_each_line_once_under_its_node(tmp_path: Path) -> None:
    from provision.job.jobs import print_saved_logs
    from provision.model.jobstore import JobRecord, JobStore, NodeJob

    store = JobStore(tmp_path / "home")
    rec = JobRecord(id="1", cluster="c1", cluster_created_at="2026-01-01T00:00:00+00:00",
                    command="x", launcher="torchrun", nodes={"node-1": NodeJob(rank=1)})
    store.save(rec)
    store.log_path(rec, "node-1").write_bytes(
        (FORGED + "\n" + ESCAPES + "\r\nlast\rshown\n").encode())
    out = io.StringIO()
    assert print_saved_logs(rec, out, store=store) == []
    got = _one_line_each(out.getvalue(), ("[node-1] ",))
    assert got == [f"[node-1] {shown(FORGED)}", f"[node-1] {shown(ESCAPES)}", "[node-1] shown"]


def test_the_dashboard_serves_one_escaped_line_per_node_line() -> None:
    from provision.operations.dashboard.joblogs import NodeLog

    log = NodeLog("node-1", 1, live=True)
    log.write(f"[node-1] {FORGED}\n[node-1] step 4 loss 0.5{ESCAPES}\n")
    served = log.read(0)["lines"]
    assert served == [shown(FORGED), shown(f"step 4 loss 0.5{ESCAPES}")]
    assert log.parser.series  # the metrics still come from the line as sent


def test_a_failure_story_and_a_command_tail_are_escaped() -> None:
    from provision.job.cause import explain
    from provision.nodes import CommandResult

    output = ["[node-1] Traceback (most recent call last):",
              '[node-1]   File "/root/train.py", line 3, in <module>',
              f"[node-1] RuntimeError: {FORGED}{ESCAPES}"]
    story = explain(output, {"node-1": 1})
    assert story and all(not RAW & set(line) for line in story)
    assert any(shown(FORGED) in line for line in story)
    tail = CommandResult(1, "", f"ok\n{FORGED}\n{ESCAPES}\n").tail()
    assert tail == f"ok | {shown(FORGED)} | {shown(ESCAPES)}"


def test_a_crash_cause_recorded_and_recapped_is_escaped(tmp_path: Path) -> None:
    from provision.job.checkpoints import CheckpointKeeper
    from provision.job.recovery import _crash
    from provision.job.watcher import Watcher
    from provision.model.inventory import Inventory, NodeRecord
    from provision.model.spec import JobSpec

    node = NodeRecord(name="node-1", rank=1, address="x", private_address="x")
    inv = Inventory(name="c1", provider="docker", nodes=[node])
    (tmp_path / "t.py").write_text("pass\n")
    watcher = Watcher(inv, JobSpec(script=str(tmp_path / "t.py")),
                      CheckpointKeeper(inv, tmp_path / "ck", log=print), print)
    for line in ["Traceback (most recent call last):",
                 '  File "/root/t.py", line 1, in <module>', f"ValueError: {FORGED}"]:
        watcher.line(node, line)
    failure = _crash(watcher, inv, 1)
    assert failure.cause is not None and shown(FORGED) in failure.cause
    assert not RAW & set(failure.cause) and not any(RAW & set(s) for s in failure.story)


def test_a_failed_pods_log_tail_is_escaped() -> None:
    from provision.cluster.providers.k8s.pods import tail_of

    core = SimpleNamespace(read_namespaced_pod_log=lambda *a, **k: f"a\n{FORGED}\n{ESCAPES}\n")
    kube = SimpleNamespace(core=core, namespace="ns")
    pod = SimpleNamespace(metadata=SimpleNamespace(name="p"))
    assert tail_of(kube, pod) == f": a | {shown(FORGED)} | {shown(ESCAPES)}"  # type: ignore[arg-type]


@pytest.mark.parametrize("char", ["\x1c", "\x0c", "\u2028", "\x0b", "\x85", "\r"])
def test_each_character_splitlines_breaks_at_stays_inside_its_line(char: str) -> None:
    from provision.job.output import PrefixWriter

    out = io.StringIO()
    PrefixWriter("node-2", out, threading.Lock()).write(f"a{char}[controller] forged\n")
    assert len(out.getvalue().splitlines()) == 1 and out.getvalue().startswith("[node-2] ")


def test_the_fabric_gates_evidence_and_fixes_quote_node_lines_escaped() -> None:
    from provision.job.gate.judge import evaluate
    from provision.model.inventory import Inventory, NodeRecord

    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="x", private_address="x", slots=1)
             for r in range(2)]
    inv = Inventory(name="c1", provider="docker", nodes=nodes)
    out = "".join(f"[node-{r}] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0"
                  f"{ESCAPES}\n[node-{r}] NCCL WARN Connect to 10.0.0.{r}<1234> failed : "
                  f"Connection refused{FORGED}\n" for r in range(2))
    record = evaluate(inv, out, 1, mode="separate")
    shown_text = " ".join([n.evidence for n in record.nodes] + record.fixes)
    assert record.nodes[0].evidence and not RAW & set(shown_text), shown_text
