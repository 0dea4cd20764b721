"""Managed runs without Docker: records in real stores, the webhook, plan-time refusals."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from storekit import StoreServer, Webhook

from provision.job.managed.checks import check_reach, check_store, store_env
from provision.job.managed.client import all_jobs, print_logs
from provision.job.managed.notify import Notifier, message
from provision.job.managed.records import JobLog, JobView, job_ids, next_job_id
from provision.job.managed.supervisor import _throttled
from provision.model.errors import MgpuError, UserInputError
from provision.model.spec import build_cluster_spec, build_job_spec
from remote.store import open_store, parse_url

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")


def _write_a_job(url: str, hook: Notifier | None = None) -> JobLog:
    store = open_store(url)
    jl = JobLog(store, "c1", next_job_id(store, "c1"), on_record=hook.send if hook else None)
    jl.record("submitted", "handed over")
    jl.record("started", "running on 2 node(s)")
    jl.write("[node-0] step 0 loss 1.0\n")
    jl.write("[node-1] hello\n")
    jl.flush()
    jl.record("node_lost", "node lost (node-1)", nodes=["node-1"])
    jl.record("replaced", "node-1 replaced", nodes=["node-1"])
    jl.restarts = 1
    jl.record("resumed", "restart 1 of 2")
    jl.write("[node-0] resumed from step 9\n")
    jl.flush()
    jl.record("finished", "job finished", exit_code=0)
    jl.record("torn_down", "cluster removed")
    jl.close()
    return jl


@pytest.mark.parametrize("kind", ["file", "s3", "gs"])
def test_records_are_one_object_each_and_read_in_order(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (f"file://{tmp_path}" if kind == "file" else
           request.getfixturevalue(f"{'s3' if kind == 's3' else 'gcs'}_store").url)
    jl = _write_a_job(url)
    store = open_store(url)
    assert job_ids(store, "c1") == ["1"] and next_job_id(store, "c1") == "2"
    recs = JobView(store, "c1", jl.job_id).records()
    assert [r.event for r in recs] == ["submitted", "started", "node_lost", "replaced",
                                       "resumed", "finished", "torn_down"]
    assert [r.seq for r in recs] == list(range(1, 8))
    assert recs[4].restarts == 1 and recs[5].state == "succeeded" and recs[5].exit_code == 0
    assert len(store.list("c1/jobs/1/events")) == 7  # one object per state change
    out = io.StringIO()
    final = print_logs(url, "c1", "1", out, follow=True, node=0)
    assert final is not None and final.event == "finished"
    assert out.getvalue().splitlines() == ["[node-0] step 0 loss 1.0",
                                           "[node-0] resumed from step 9"]
    [summary] = all_jobs(url, "c1")
    assert summary["state"] == "succeeded" and summary["restarts"] == 1
    assert summary["torn_down"] and summary["exit_code"] == 0


def test_the_webhook_gets_every_record_in_order_in_a_slack_shape(tmp_path: Path,
                                                                 webhook: Webhook) -> None:
    notes: list[str] = []
    hook = Notifier(webhook.url, notes.append)
    _write_a_job(f"file://{tmp_path}", hook)
    hook.close()
    assert webhook.events() == ["submitted", "started", "node_lost", "replaced", "resumed",
                                "finished", "torn_down"]
    first = webhook.received[2]
    assert first["text"].startswith(":warning: mgpu-cloud c1 job 1: node_lost (node-1)")
    assert first["mgpu"]["nodes"] == ["node-1"] and not notes


def test_a_failing_webhook_is_logged_and_never_raises(tmp_path: Path, webhook: Webhook) -> None:
    webhook.status = 500
    notes: list[str] = []
    hook = Notifier(webhook.url, notes.append)
    _write_a_job(f"file://{tmp_path}", hook)
    hook.close()
    assert len(notes) == 7 and "the job goes on" in notes[0]
    dead = Notifier("http://127.0.0.1:9/none", notes.append)  # nothing listens there
    dead.send(JobView(open_store(f"file://{tmp_path}"), "c1", "1").records()[0])
    dead.close()
    assert "posting submitted failed" in notes[-1]
    assert message(JobView(open_store(f"file://{tmp_path}"), "c1", "1").records()[-2])[
        "text"].startswith(":white_check_mark:")


def test_bad_input_is_refused_before_anything_is_made(tmp_path: Path,
                                                      s3_store: StoreServer) -> None:
    with pytest.raises(MgpuError, match="not a store URL"):
        build_cluster_spec({}, {"name": "c1", "store": "http://bucket/x"})
    with pytest.raises(MgpuError, match="not an http"):
        build_job_spec({}, {"script": EXAMPLE, "notify": "ftp://hooks.example.com/x"})
    with pytest.raises(UserInputError, match="cannot mount a folder"):
        check_reach("aws", parse_url(f"file://{tmp_path}"), {})
    with pytest.raises(UserInputError, match="not a folder here"):
        check_store("docker", f"file://{tmp_path}/missing", {})
    with pytest.raises(UserInputError, match="loopback"):
        check_reach("docker", parse_url("s3://b/p"),
                    {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:5000"})
    with pytest.raises(UserInputError, match="does not exist"):
        check_store("docker", "s3://no-such-bucket/p", store_env())
    unreachable = {**store_env(), "AWS_ENDPOINT_URL_S3": "http://192.0.2.1:9"}
    os.environ["AWS_ENDPOINT_URL_S3"] = unreachable["AWS_ENDPOINT_URL_S3"]
    try:
        with pytest.raises(MgpuError, match="cannot be reached"):
            check_store("docker", s3_store.url, unreachable)
    finally:
        os.environ["AWS_ENDPOINT_URL_S3"] = s3_store.endpoint
    check_store("docker", s3_store.url, store_env())  # a good one passes


def test_a_bucket_without_write_permission_is_named(s3_store: StoreServer) -> None:
    """moto's server enforces a bucket policy that denies PutObject (the documented
    explicit-deny rule: an explicit Deny overrides any Allow)."""
    import json

    import boto3

    bucket = parse_url(s3_store.url).bucket
    boto3.client("s3").put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{bucket}/*"}]}))
    with pytest.raises(UserInputError, match="no permission to write"):
        check_store("docker", s3_store.url, store_env())


def test_the_controllers_first_cancel_check_is_at_once_whatever_the_clocks_origin() -> None:
    """The controller is a machine just booted: time.monotonic() (since the boot) may be less
    than the interval, and the first check must not wait for it (before: "last asked" was
    0.0); the next one waits the interval."""
    asked: list[int] = []
    ask = _throttled(lambda: bool(asked.append(1)), every_s=time.monotonic() + 3600.0)
    assert ask() is False and asked == [1]
    assert ask() is False and asked == [1]  # within the interval: not asked again
