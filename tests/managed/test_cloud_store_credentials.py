"""Store credentials of managed runs on aws/gcp (issue 18): the nodes push with this shell's
store variables, so a profile/SSO login (which stays here) is refused at plan time, before
anything is created; the controller's own process runs as its cluster-scoped identity, never
with the user's keys."""

from __future__ import annotations

import pytest

from provision.job.managed.checks import check_node_credentials, check_store, controller_env
from provision.model.errors import UserInputError
from remote.store import parse_url

KEYS = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
        "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_profile_login_is_refused_before_anything_is_made(provider: str) -> None:
    with pytest.raises(UserInputError, match="AWS_PROFILE / SSO") as err:
        check_store(provider, "s3://b/runs", {"AWS_DEFAULT_REGION": "us-east-1"})
    assert "export-credentials" in (err.value.hint or "")


def test_exported_keys_pass_and_other_providers_are_not_asked() -> None:
    check_node_credentials("aws", parse_url("s3://b/runs"), KEYS)
    check_node_credentials("docker", parse_url("s3://b/runs"), {})
    check_node_credentials("ssh", parse_url("gs://b/runs"), {})


def test_gcs_from_cloud_nodes_is_refused_unless_emulated() -> None:
    with pytest.raises(UserInputError, match="Cloud Storage credentials"):
        check_node_credentials("gcp", parse_url("gs://b/runs"), {})
    check_node_credentials("gcp", parse_url("gs://b/runs"), {"STORAGE_EMULATOR_HOST": "h:1"})


def test_the_aws_controller_never_runs_with_the_users_keys() -> None:
    own = controller_env("aws", KEYS)
    assert own == {"AWS_DEFAULT_REGION": "us-east-1"}
    # an S3-compatible store elsewhere: its keys are not the profile's business
    minio = {**KEYS, "AWS_ENDPOINT_URL_S3": "https://minio.example"}
    assert controller_env("aws", minio) == minio
    # a gcp controller's service account does not cover an s3:// store: it keeps the keys
    assert controller_env("gcp", KEYS) == KEYS
    assert controller_env("docker", KEYS) == KEYS  # its one credential is the engine's socket
