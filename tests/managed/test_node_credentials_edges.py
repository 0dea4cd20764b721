"""Issue 42 (the mutation run): the nodes' store credentials (managed/nodecreds.py) at their
edges, through a scripted STS that records what it is asked (the requests as boto3 would
send them): the exact session policy, which call narrows which keys, the names and
durations STS limits, the resumed run's folder, renewal at its boundary, and the STS client
built from the variables given (not this process's)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from provision.job.managed.nodecreds import (
    RENEW_S,
    ROLE_VAR,
    NodeCredentials,
    broad,
    for_job,
    session_policy,
    sts_client,
)
from remote.store import parse_url

URL = parse_url("s3://b/runs")
NAIVE = dt.datetime(2031, 1, 2, 3, 4, 5)  # what botocore may hand back: no tzinfo


class ScriptedSts:
    def __init__(self, expires: Any = NAIVE) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.expires = expires

    def _creds(self) -> dict[str, Any]:
        n = len(self.calls)
        return {"Credentials": {"AccessKeyId": f"ASIA{n}", "SecretAccessKey": f"s{n}",
                                "SessionToken": f"t{n}", "Expiration": self.expires}}

    def get_federation_token(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("federation", kw))
        return self._creds()

    def assume_role(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("assume", kw))
        return self._creds()


def test_the_session_policy_is_exactly_this_document() -> None:
    bucket = "arn:aws:s3:::b"
    actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
               "s3:ListMultipartUploadParts"]
    assert session_policy(URL, ["/c1/data/jobs/7/"], ["c1/data/jobs/3"]) == {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": actions,
             "Resource": [f"{bucket}/runs/c1/data/jobs/7/*"]},
            {"Effect": "Allow", "Action": ["s3:GetObject"],
             "Resource": [f"{bucket}/runs/c1/data/jobs/3/*"]},
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket],
             "Condition": {"StringLike": {"s3:prefix": ["runs/c1/data/jobs/7/*",
                                                         "runs/c1/data/jobs/3/*"]}}}]}
    assert session_policy(parse_url("s3://b"), ["c1/data/checkpoints"], [])["Statement"][0][
        "Resource"] == ["arn:aws:s3:::b/c1/data/checkpoints/*"]


def test_user_keys_are_federated_and_temporary_ones_assume_the_role() -> None:
    sts = ScriptedSts()
    user = NodeCredentials(URL, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"},
                           write=["c1/data/jobs/7"], name="n" * 40, duration_s=10**6, sts=sts)
    got = user()
    kind, sent = sts.calls[0]
    assert kind == "federation" and sent["Name"] == "n" * 32
    assert sent["DurationSeconds"] == 129600  # GetFederationToken's most
    assert sent["Policy"] == json.dumps(session_policy(URL, ["c1/data/jobs/7"], []),
                                        separators=(",", ":"))
    assert got["MGPU_STORE_EXPIRES"] == "2031-01-02T03:04:05+00:00"  # a naive time is UTC
    assert got["AWS_SESSION_TOKEN"] == "t1" and "AKIA" not in got.values()
    role = {"AWS_ACCESS_KEY_ID": "ASIA", "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_SESSION_TOKEN": "tok", ROLE_VAR: "arn:aws:iam::1:role/r"}
    NodeCredentials(URL, role, write=["c1/data/jobs/7"], name="r" * 70, duration_s=10**6,
                    sts=sts)()
    kind, sent = sts.calls[1]
    assert kind == "assume" and sent["RoleSessionName"] == "r" * 64
    assert sent["RoleArn"] == "arn:aws:iam::1:role/r" and sent["DurationSeconds"] == 3600
    NodeCredentials(URL, role, write=["x"], duration_s=60, sts=sts)()
    assert sts.calls[2][1]["DurationSeconds"] == 900 and sts.calls[2][1][
        "RoleSessionName"] == "mgpu-node"


def test_a_managed_run_may_read_the_run_it_resumes_and_is_named_for_its_job() -> None:
    sts = ScriptedSts(expires="2031-01-02T03:04:05Z")
    notes: list[str] = []
    creds = for_job(URL, "c1", "7", {"AWS_ACCESS_KEY_ID": "AKIA",
                                     "AWS_SECRET_ACCESS_KEY": "s"},
                    resume_from="3", duration_s=5000, note=notes.append)
    creds._sts = sts
    assert creds()["MGPU_STORE_EXPIRES"] == "2031-01-02T03:04:05+00:00"
    sent = sts.calls[0][1]
    assert sent["Name"] == "mgpu-c1-7" and sent["DurationSeconds"] == 5000
    assert json.loads(sent["Policy"]) == session_policy(URL, ["c1/data/jobs/7"],
                                                        ["c1/data/jobs/3"])
    fresh = for_job(URL, "c1", "8", {}, note=notes.append)
    assert fresh.read == [] and fresh.write == ["c1/data/jobs/8"]
    broad_ones = for_job(URL, "c1", "9", {"AWS_ACCESS_KEY_ID": "A", "AWS_SESSION_TOKEN": "t"},
                         note=notes.append)
    broad_ones()
    assert notes and "this shell's own AWS keys" in notes[0]


@pytest.mark.parametrize(("left_s", "renewed"), [(RENEW_S - 30, True), (RENEW_S + 60, False)])
def test_renewal_at_its_boundary(left_s: float, renewed: bool) -> None:
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left_s)).isoformat()
    sts = ScriptedSts()
    creds = NodeCredentials(URL, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"},
                            write=["w"], minted={"MGPU_STORE_EXPIRES": until, "K": "v"},
                            sts=sts)
    got = creds()
    assert bool(sts.calls) is renewed
    assert (got.get("K") == "v") is not renewed


def test_a_bundle_without_an_expiry_is_used_as_it_is() -> None:
    sts = ScriptedSts()
    creds = NodeCredentials(URL, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"},
                            write=["w"], minted={"K": "v"}, sts=sts)
    assert creds() == {"K": "v"} and sts.calls == []


def test_the_sts_client_is_built_from_the_variables_given() -> None:
    client = sts_client({"AWS_ACCESS_KEY_ID": "AKIAX", "AWS_SECRET_ACCESS_KEY": "sx",
                         "AWS_SESSION_TOKEN": "tx", "AWS_DEFAULT_REGION": "eu-west-3",
                         "AWS_ENDPOINT_URL_STS": "http://sts.example:9000"})
    creds = client._request_signer._credentials
    assert (creds.access_key, creds.secret_key, creds.token) == ("AKIAX", "sx", "tx")
    assert client.meta.region_name == "eu-west-3"
    assert client.meta.endpoint_url == "http://sts.example:9000"
    assert sts_client({"AWS_REGION": "ap-south-1", "AWS_DEFAULT_REGION": "eu-west-3",
                       "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
                      ).meta.region_name == "ap-south-1"
    assert sts_client({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
                      ).meta.region_name == "us-east-1"


def test_why_keys_cannot_be_narrowed_is_said_exactly() -> None:
    assert broad(URL, {"AWS_ACCESS_KEY_ID": "A", "AWS_ENDPOINT_URL_S3": "http://m:9"}) == (
        "the store's endpoint http://m:9 has no STS endpoint set (AWS_ENDPOINT_URL_STS) to "
        "narrow the nodes' keys with")
    assert broad(URL, {"AWS_ACCESS_KEY_ID": "A", "AWS_SESSION_TOKEN": "t"}) == (
        "this shell's AWS keys are temporary (a session token) and no MGPU_STORE_ROLE_ARN "
        "names a role to narrow them with")


def test_an_expiry_with_its_own_offset_keeps_it() -> None:
    paris = dt.timezone(dt.timedelta(hours=2))
    sts = ScriptedSts(expires=dt.datetime(2031, 1, 2, 5, 4, 5, tzinfo=paris))
    got = NodeCredentials(URL, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"},
                          write=["w"], sts=sts)()
    assert got["MGPU_STORE_EXPIRES"] == "2031-01-02T05:04:05+02:00"
