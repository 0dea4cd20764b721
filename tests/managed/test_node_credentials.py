"""The nodes' store credentials: short-lived, narrowed to the run's data prefix (issue 34).

STS is moto's server (GetFederationToken / AssumeRole over HTTP, the real boto3); what the
credentials allow is read from the session policy as SENT, by the same IAM evaluator the AWS
controller's policy is checked with (tests/providers/aws/aws_policy_guard.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from storekit import StoreServer

from provision.job.managed.nodecreds import (
    NodeCredentials,
    broad,
    for_job,
    session_policy,
    sts_client,
)
from remote.store import open_store, parse_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "aws"))
from aws_policy_guard import allows  # noqa: E402 - after the path line above

ROOT = Path(__file__).resolve().parents[2]
OBJ = "arn:aws:s3:::b/runs/"


def test_the_session_policy_reaches_the_runs_data_only() -> None:
    url = parse_url("s3://b/runs")
    policy = session_policy(url, ["c1/data/jobs/7"], ["c1/data/jobs/3"])

    def can(action: str, key: str) -> bool:
        return allows(policy, action, OBJ + key, {})

    assert can("s3:PutObject", "c1/data/jobs/7/checkpoints/step_9.pt")
    assert can("s3:GetObject", "c1/data/jobs/7/outputs/metrics.json")
    assert can("s3:GetObject", "c1/data/jobs/3/checkpoints/step_5.pt")  # resumed from
    assert not can("s3:PutObject", "c1/data/jobs/3/checkpoints/step_5.pt")
    for key in ("c1/cluster.json", "c1/jobs/7/events/000009.json", "c1/jobs/7/spec.json",
                "c1/data/jobs/8/checkpoints/x", "c2/data/jobs/7/checkpoints/x",
                "c1/data/jobs/70/checkpoints/x"):
        assert not can("s3:PutObject", key) and not can("s3:GetObject", key), key
    listing = {"s3:prefix": "runs/c1/data/jobs/7/checkpoints/"}
    assert allows(policy, "s3:ListBucket", "arn:aws:s3:::b", listing)
    assert not allows(policy, "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "runs/c1/"})
    assert not allows(policy, "s3:DeleteBucket", "arn:aws:s3:::b", {})
    assert len(json.dumps(policy, separators=(",", ":"))) < 2048  # STS's packed-size limit


def _recorded(env: dict[str, str]) -> tuple[Any, list[dict[str, Any]]]:
    sts = sts_client(env)
    sent: list[dict[str, Any]] = []
    sts.meta.events.register("provide-client-params.sts.*",
                             lambda params, **_: sent.append(dict(params)))
    return sts, sent


def test_nodes_get_federated_keys_not_the_users(s3_store: StoreServer, tmp_path: Path) -> None:
    url = parse_url(s3_store.url)
    sts, sent = _recorded(s3_store.env)
    creds = NodeCredentials(url, s3_store.env, write=["c1/data/jobs/1"], name="mgpu-c1-1",
                            duration_s=7200, sts=sts)
    got = creds()
    assert got["AWS_ACCESS_KEY_ID"] != s3_store.env["AWS_ACCESS_KEY_ID"]
    assert got["AWS_SECRET_ACCESS_KEY"] != s3_store.env["AWS_SECRET_ACCESS_KEY"]
    assert got["AWS_SESSION_TOKEN"] and got["AWS_ENDPOINT_URL_S3"] == s3_store.endpoint
    assert len(sent) == 1 and sent[0]["DurationSeconds"] == 7200
    assert json.loads(sent[0]["Policy"]) == session_policy(url, ["c1/data/jobs/1"], [])
    assert creds() == got and len(sent) == 1  # reused until it nears its end
    # what a node runs with them: the push lands
    (tmp_path / "step_1.pt").write_bytes(b"w")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    dest = f"{s3_store.url}/c1/data/jobs/1/checkpoints"
    out = subprocess.run([sys.executable, "-m", "remote", "store", "push", "--url", dest,
                          "--root", str(tmp_path), "--env-stdin", "step_1.pt"],
                         input=json.dumps(got), capture_output=True, text=True, env=clean,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert open_store(dest).get_bytes("step_1.pt") == b"w"


def _soon(minutes: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)).isoformat()


def test_renewed_before_they_expire_where_this_side_can_mint(s3_store: StoreServer) -> None:
    url = parse_url(s3_store.url)
    old = {"AWS_ACCESS_KEY_ID": "OLD", "AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "t",
           "MGPU_STORE_EXPIRES": _soon(60)}
    sts, sent = _recorded(s3_store.env)
    fresh = for_job(url, "c1", "1", s3_store.env, minted=old)
    fresh._sts = sts
    assert fresh()["AWS_ACCESS_KEY_ID"] == "OLD" and not sent  # an hour left: kept
    near = for_job(url, "c1", "1", s3_store.env, minted={**old, "MGPU_STORE_EXPIRES": _soon(5)})
    near._sts = sts
    assert near()["AWS_ACCESS_KEY_ID"] != "OLD" and len(sent) == 1  # renewed
    # a controller that holds no minting identity uses what it was given to its end
    bare = {k: v for k, v in s3_store.env.items() if not k.startswith("AWS_ACCESS")
            and not k.startswith("AWS_SECRET")}
    kept = for_job(url, "c1", "1", bare, minted={**old, "MGPU_STORE_EXPIRES": _soon(5)})
    assert kept()["AWS_ACCESS_KEY_ID"] == "OLD"


def test_what_cannot_be_narrowed_is_said_once() -> None:
    url = parse_url("s3://b/runs")
    user = {"AWS_ACCESS_KEY_ID": "AKIAUSER", "AWS_SECRET_ACCESS_KEY": "s"}
    assert broad(url, user) is None
    assert "temporary" in (broad(url, {**user, "AWS_SESSION_TOKEN": "t"}) or "")
    assert broad(url, {**user, "AWS_SESSION_TOKEN": "t",
                       "MGPU_STORE_ROLE_ARN": "arn:aws:iam::1:role/r"}) is None
    minio = {**user, "AWS_ENDPOINT_URL_S3": "http://minio:9000"}
    assert "no STS endpoint" in (broad(url, minio) or "")
    notes: list[str] = []
    creds = NodeCredentials(url, minio, write=["c1/data/jobs/1"], note=notes.append)
    assert creds()["AWS_ACCESS_KEY_ID"] == "AKIAUSER"
    creds._bundle = None
    creds()
    assert len(notes) == 1 and "own AWS keys" in notes[0]
    assert broad(parse_url("file:///srv/x"), user) is None
    assert NodeCredentials(parse_url("file:///srv/x"), user, write=["c1/data"])() == {}


def test_the_aws_controller_is_handed_no_user_key(s3_store: StoreServer) -> None:
    """store-env.json of an aws controller: its own variables without the user's keys, and
    the nodes' first credentials, narrowed. A docker controller (this machine's engine)
    keeps the keys to renew the nodes' credentials itself."""
    from provision.job.managed.handoff import controller_state
    from provision.model.inventory import Inventory
    from provision.model.spec import build_cluster_spec, build_job_spec

    inv = Inventory(name="c1", provider="aws")
    inv.spec = build_cluster_spec({}, {"name": "c1", "store": s3_store.url, "max_hours": 2})
    job = build_job_spec({}, {"script": str(ROOT / "examples" / "train_ddp.py")})
    # the store on AWS itself (no S3 endpoint of another kind); STS answered by moto
    env = {k: v for k, v in s3_store.env.items() if k != "AWS_ENDPOINT_URL_S3"}
    state = controller_state(inv, parse_url(s3_store.url), "4", job, env, print)
    assert "AWS_ACCESS_KEY_ID" not in state["env"] and "AWS_SECRET_ACCESS_KEY" not in state["env"]
    assert state["nodes"]["AWS_ACCESS_KEY_ID"] != "testing"
    assert state["nodes"]["AWS_SECRET_ACCESS_KEY"] != "testing"
    docker = controller_state(inv.model_copy(update={"provider": "docker"}),
                              parse_url(s3_store.url), "4", job, env, print)
    assert docker["env"]["AWS_ACCESS_KEY_ID"] == "testing"
    assert docker["nodes"]["AWS_ACCESS_KEY_ID"] != "testing"


def test_an_aws_controller_renews_them_through_its_own_role(s3_store: StoreServer) -> None:
    """No user keys on an aws controller: it assumes the role its provider recorded (its own:
    aws/controller.py trusts itself), with the same session policy."""
    from provision.job.managed.supervisor import mint_identity
    from provision.model.inventory import Inventory, ResourceRecord

    arn = "arn:aws:iam::123456789012:role/mgpu-cloud/mgpu-ctl-c1"
    inv = Inventory(name="c1", provider="aws", resources=[
        ResourceRecord(kind="instance", id="i-1", extra={"role_arn": arn})])
    bare = {k: v for k, v in s3_store.env.items()
            if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env = {**bare, **mint_identity(inv, bare)}
    assert env["MGPU_STORE_ROLE_ARN"] == arn
    assert mint_identity(inv, s3_store.env) == {}  # user keys: federation, no role needed
    sts, sent = _recorded(s3_store.env)  # stands for the instance profile's credentials
    creds = for_job(parse_url(s3_store.url), "c1", "2", env)
    creds._sts = sts
    got = creds()
    assert got["AWS_SESSION_TOKEN"] and "MGPU_STORE_ROLE_ARN" not in got
    assert sent[0]["RoleArn"] == arn and sent[0]["DurationSeconds"] <= 3600
    assert json.loads(sent[0]["Policy"]) == session_policy(
        parse_url(s3_store.url), ["c1/data/jobs/2"], [])
