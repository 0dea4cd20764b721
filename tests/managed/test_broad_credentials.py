"""Issue 42: a managed run whose nodes would get this shell's own AWS keys (nothing can narrow
them: temporary keys without MGPU_STORE_ROLE_ARN, an S3-compatible endpoint without STS) is
refused at plan time, saying why and what fixes it, unless --allow-broad-node-credentials."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit import cli
from storekit import StoreServer

from provision.job.managed.checks import refuse_broad
from provision.job.managed.nodecreds import ROLE_VAR, broad
from provision.model.errors import UserInputError
from remote.store import parse_url

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")
URL = parse_url("s3://bucket/runs")
USER = {"AWS_ACCESS_KEY_ID": "AKIAUSER", "AWS_SECRET_ACCESS_KEY": "secret"}
TEMPORARY = {**USER, "AWS_SESSION_TOKEN": "session"}
NO_STS = {**USER, "AWS_ENDPOINT_URL_S3": "https://minio.example:9000"}


@pytest.mark.parametrize(("env", "why", "fix"), [
    (TEMPORARY, "temporary (a session token) and no MGPU_STORE_ROLE_ARN", ROLE_VAR),
    (NO_STS, "has no STS endpoint set (AWS_ENDPOINT_URL_STS)", "AWS_ENDPOINT_URL_STS"),
])
def test_keys_nothing_can_narrow_are_refused_with_why_and_the_fix(
        env: dict[str, str], why: str, fix: str) -> None:
    said: list[str] = []
    with pytest.raises(UserInputError) as err:
        refuse_broad(URL, env, allowed=False, log=said.append)
    assert "the nodes would get this shell's own AWS keys" in err.value.message
    assert why in err.value.message
    assert fix in (err.value.hint or "")
    assert "--allow-broad-node-credentials" in (err.value.hint or "")
    assert said == []


@pytest.mark.parametrize("env", [TEMPORARY, NO_STS])
def test_allowed_on_purpose_it_goes_on_and_says_so(env: dict[str, str]) -> None:
    said: list[str] = []
    refuse_broad(URL, env, allowed=True, log=said.append)
    assert len(said) == 1 and "--allow-broad-node-credentials" in said[0]
    assert "this shell's own AWS keys" in said[0]


@pytest.mark.parametrize("env", [
    USER,  # long-lived IAM user keys: GetFederationToken narrows them
    {**TEMPORARY, ROLE_VAR: "arn:aws:iam::123456789012:role/store"},  # a role narrows them
    {**NO_STS, "AWS_ENDPOINT_URL_STS": "https://minio.example:9000"},
    {},  # no keys at all: the nodes get none
])
def test_what_can_be_narrowed_passes_quietly(env: dict[str, str]) -> None:
    said: list[str] = []
    assert broad(URL, env) is None
    refuse_broad(URL, env, allowed=False, log=said.append)
    assert said == []


def test_other_stores_are_not_asked() -> None:
    for url in ("gs://b/runs", "file:///srv/store"):
        refuse_broad(parse_url(url), TEMPORARY, allowed=False, log=lambda m: None)


def test_run_refuses_before_anything_is_made(s3_store: StoreServer, mgpu_home: Path) -> None:
    """Through the CLI, against a real S3 API: temporary keys and no role."""
    env = {**s3_store.env, "AWS_SESSION_TOKEN": "a-session-token"}
    env.pop(ROLE_VAR, None)
    words = ["run", "--detach", "--provider", "docker", "--nodes", "1", "--store",
             s3_store.url, "--dry-run"]
    res = cli(*words, EXAMPLE, home=mgpu_home, env=env)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "the nodes would get this shell's own AWS keys" in res.stderr, res.stderr
    assert "--allow-broad-node-credentials" in res.stderr
    allowed = cli(*words, "--allow-broad-node-credentials", EXAMPLE, home=mgpu_home, env=env)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "--allow-broad-node-credentials: the nodes get this shell's own AWS keys" in \
        allowed.stderr
