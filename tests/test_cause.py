"""provision/job/cause.py: the rank that failed first, and only the hints that apply."""

from __future__ import annotations

from pathlib import Path

from provision.job.cause import explain, first_failure, rank_failures
from provision.job.diagnose import diagnose

LOGS = Path(__file__).resolve().parent / "data" / "logs"
CRASH = (LOGS / "rank-crash-2x2.log").read_text().splitlines()  # real, [node-i]-prefixed


def test_the_real_crash_names_rank_2_not_the_peers_that_lost_it() -> None:
    failures = rank_failures(CRASH)
    assert (failures[0].rank, failures[0].node, failures[0].exc_type) == (2, "node-1",
                                                                          "ValueError")
    by_rank = {f.rank: f for f in failures}
    assert {r: (f.node, f.exc_type, f.consequence) for r, f in by_rank.items()} == {
        2: ("node-1", "ValueError", False), 3: ("node-1", "RuntimeError", True),
        0: ("node-0", "RuntimeError", True), 1: ("node-0", "RuntimeError", True)}
    assert first_failure(failures) is failures[0] and failures[0].exit_code == 1  # Root Cause
    assert by_rank[3].exit_code == -15  # torchrun's Failures block: it SIGTERMed rank 3


def test_explain_leads_with_the_cause_and_drops_the_consequences_hints() -> None:
    assert diagnose(CRASH)[0].signature == "gloo-reset"  # what the output used to end with
    lines = explain(CRASH)
    assert lines == [
        "first failure: rank 2 (node-1), exit 1: ValueError: bad batch at step 3 (fail3.py:8)",
        '  File "/root/.mgpu-cloud/work/fail3.py", line 8, in <module>',
        '    raise ValueError(f"bad batch at step {step}")',
        "  then ranks 0, 1, 3 failed because of it: consequences, not causes",
    ]
    assert all(len(line) <= 88 for line in lines)


def test_a_cause_torchrun_stopped_as_it_ended_says_so() -> None:
    """torchrun ends every local rank once it sees one end, then records the codes of those it
    signalled (torch elastic SubprocessContext._poll). On a loaded node rank 2, still tearing
    down after its traceback, read -15 because rank 3 (which it broke) ended first: the same
    run as CRASH with node-1's Failures block as torchrun then prints it (seen in suite runs;
    reproduced with a rank whose exit is slow)."""
    text = "\n".join(CRASH)
    swapped = (text.replace("rank      : 3 (local_rank: 1)", "rank      : @2")
               .replace("rank      : 2 (local_rank: 0)", "rank      : 3 (local_rank: 1)")
               .replace("rank      : @2", "rank      : 2 (local_rank: 0)"))
    assert swapped != text
    lines = explain(swapped.splitlines())
    assert lines[0] == ("first failure: rank 2 (node-1), exit -15 (SIGTERM): ValueError: bad "
                        "batch at step 3 (fail3.py:8)")
    assert lines[3] == ("  it was ending with this exception when torchrun on node-1 stopped it "
                        "(SIGTERM): rank 3 ended first")
    assert lines[4].startswith("  then ranks 0, 1, 3 failed because of it")
    assert explain(CRASH)[0].endswith("exit 1: ValueError: bad batch at step 3 (fail3.py:8)")
    assert not any("stopped it" in line for line in explain(CRASH))


def _traceback(node: int, rank: int, frames: list[tuple[str, int, str]], last: str) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for path, line, code in frames:
        out += [f'  File "{path}", line {line}, in f', f"    {code}"]
    return [f"[node-{node}] [rank{rank}]: {line}" for line in [*out, last]]


def test_a_library_error_shows_the_users_frame_and_the_innermost_and_its_hint() -> None:
    lines = [
        "[node-0] [rank0]: step 1",  # not an exception line: lower-case words
        *_traceback(1, 3, [("/work/train.py", 40, "loss = model(x)"),
                           ("/opt/venv/lib/python3.11/site-packages/torch/nn/x.py", 9, "f()")],
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        *_traceback(0, 0, [("/work/train.py", 41, "loss.backward()")],
                    "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by "
                    "peer [10.0.0.2]:1234"),
    ]
    out = explain(lines, {"node-1": 1})
    assert out[0] == ("first failure: rank 3 (node-1), exit 1: torch.OutOfMemoryError: CUDA out "
                      "of memory. Tried to allocate 2.00 GiB (train.py:40)")
    assert out[1:5] == ['  File "/work/train.py", line 40, in f', "    loss = model(x)",
                        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/x.py", line 9, '
                        "in f", "    f()"]
    hints = [line for line in out if line.startswith("likely cause")]
    assert len(hints) == 1 and "GPU ran out of memory" in hints[0]  # not the Gloo one


def test_a_chained_exception_counts_once_from_where_it_started() -> None:
    lines = [*_traceback(0, 1, [("/w/t.py", 3, "open(p)")], "FileNotFoundError: data.bin"),
             "[node-0] [rank1]: ",
             "[node-0] [rank1]: During handling of the above exception, another exception occurred:",
             *_traceback(0, 1, [("/w/t.py", 5, "raise")], "RuntimeError: no data")]
    failures = rank_failures(lines)
    assert [(f.exc_type, f.position) for f in failures] == [("RuntimeError", 0)]


def test_without_a_traceback_the_signatures_still_speak() -> None:
    lines = [f"[node-1] {line}" for line in (LOGS / "child-failed.log").read_text().splitlines()]
    out = explain(lines)
    assert out and out[0].startswith("likely cause (node-1): A worker was killed with SIGKILL")


def test_only_consequences_keep_the_network_hint() -> None:
    lines = _traceback(0, 0, [("/w/t.py", 9, "dist.barrier()")],
                       "RuntimeError: [pair.cc:534] Connection reset by peer [10.0.0.2]:1")
    out = explain(lines)
    assert out[0].startswith("first failure: rank 0 (node-0): RuntimeError")
    assert any("Gloo peer dropped its connection" in line for line in out)


def test_a_traceback_before_init_takes_its_rank_from_torchruns_root_cause() -> None:
    lines = [f"[node-1] {line}" for line in (
        "Traceback (most recent call last):",
        '  File "/root/.mgpu-cloud/work/oom.py", line 1, in <module>',
        "    raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')",
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "Failures:", "  rank      : 3 (local_rank: 1)", "  exitcode  : -15 (pid: 4)",
        "Root Cause (first observed failure):", "  rank      : 2 (local_rank: 0)",
        "  exitcode  : 1 (pid: 3)")]
    out = explain(lines)
    assert out[0] == ("first failure: rank 2 (node-1), exit 1: RuntimeError: CUDA out of memory. "
                      "Tried to allocate 2.00 GiB (oom.py:1)")
    assert any(line.startswith("likely cause (node-1): A GPU ran out of memory") for line in out)


def test_a_peers_dropped_connection_printed_before_the_cause_is_no_hint() -> None:
    """On a busy machine node-0's ranks can print the Gloo error of the dropped connection
    before node-1's traceback is through (seen in a full suite run): still a consequence."""
    cause_at = next(i for i, line in enumerate(CRASH) if line.startswith("[node-1]")
                    and "Traceback" in line)
    peers = [line for line in CRASH[cause_at:] if line.startswith("[node-0]")]
    assert any("gloo" in line.lower() for line in peers)  # node-0's Gloo errors, after it
    reordered = CRASH[:cause_at] + peers + [ln for ln in CRASH[cause_at:] if ln not in peers]
    lines = explain(reordered)
    assert lines[0].startswith("first failure: rank 2 (node-1)")
    assert not any("likely cause" in line for line in lines), lines
