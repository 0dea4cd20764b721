"""provision/job/recap.py: the recap that ends a run that restarted."""

from __future__ import annotations

from provision.job.recap import Recap, steps_of


def test_steps_of_reads_the_steps_a_job_prints() -> None:
    lines = ["[node-0] resumed from step 9 (/ckpt/step_000009.pt), restart 1",
             "[node-0] step 10 loss 2.1", "[node-1] rank 3 ready", "[node-0] step=30 loss 1.9"]
    assert steps_of(lines) == (9, 9, 30)
    assert steps_of(["[node-0] hello"]) == (None, None, None)


def test_a_recovered_run_is_recapped_whole() -> None:
    recap = Recap(hourly_usd=36.0)
    recap.begin("1", now=100.0)
    recap.end("node lost (node-1)", now=130.0,
              output=["[node-0] step 10 loss 2", "[node-0] step 14 loss 2"], kept_at=120.0)
    recap.recovered(6.0)
    recap.begin("2", now=136.0)
    recap.end("succeeded", now=170.0,
              output=["[node-0] resumed from step 9", "[node-0] step 19 loss 1"], kept_at=160.0)
    assert recap.lines(now=171.0) == [
        "recap: 1 restart(s), 71.0 s in all (every attempt and recovery); succeeded",
        "  attempt 1 (job 1): node lost (node-1) after 30.0 s, at step 14",
        "    lost: 10.0 s since the last kept checkpoint + 6.0 s recovery; 5 step(s) redone",
        "  attempt 2 (job 2): succeeded after 34.0 s, at step 19",
        "  time lost to failures: 16.0 s = $0.16 at $36.00/h",
    ]


def test_no_checkpoint_means_the_whole_attempt_is_lost_and_no_restart_no_recap() -> None:
    recap = Recap()
    recap.begin("4", now=0.0)
    assert recap.lines(now=5.0) == []  # never restarted: nothing to recap
    recap.end("rank crash (node-0)", now=20.0, output=[], kept_at=None)
    recap.begin("5", now=21.0)
    recap.end("rank crash (node-0)", now=30.0, output=[], kept_at=None)
    lines = recap.lines(now=30.0)
    assert lines[2] == "    lost: 20.0 s (no checkpoint kept) + 0.0 s recovery"
    assert lines[-1] == "  time lost to failures: 20.0 s (no catalog price)"


def test_attempts_on_fewer_nodes_say_how_many() -> None:
    recap = Recap()
    for job, nodes, start in (("1", 4, 0.0), ("2", 3, 20.0), ("3", 4, 40.0)):
        recap.begin(job, now=start, nodes=nodes)
        recap.end("node lost (node-1)" if job == "1" else "succeeded", now=start + 10.0,
                  output=[], kept_at=None)
    lines = recap.lines(now=50.0)
    assert [ln for ln in lines if ln.startswith("  attempt")] == [
        "  attempt 1 (job 1) on 4 node(s): node lost (node-1) after 10.0 s",
        "  attempt 2 (job 2) on 3 node(s): succeeded after 10.0 s",
        "  attempt 3 (job 3) on 4 node(s): succeeded after 10.0 s",
    ]
    same = Recap()
    for job, start in (("1", 0.0), ("2", 20.0)):
        same.begin(job, now=start, nodes=2)
        same.end("succeeded", now=start + 5.0, output=[], kept_at=None)
    assert "node(s)" not in same.lines(now=30.0)[1]  # one size throughout: not repeated
