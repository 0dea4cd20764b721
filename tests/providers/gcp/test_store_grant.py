"""The GCP controller's store grant (issue 38): roles/storage.objectAdmin under a condition
that allows the store's objects under PREFIX/NAME/ and LISTING them, checked by the rules'
evaluator (gcp_iam_rules.storage_allows, sources there). Before, the condition named object
names only, and storage.objects.list (checked on the bucket) was never allowed: the
controller could not list its job's records or checkpoints."""

from __future__ import annotations

import gcp_iam_rules as iam_rules
import pytest

from provision.cluster.providers.gcp.controller import bindings
from remote.store import parse_url

STORE = parse_url("gs://ckpt/runs")


def _cond() -> str:
    (_, store) = bindings("p", "us-central1-a", "c1", "serviceAccount:x@p.iam", "r", STORE)
    return str(store["condition"]["expression"])


@pytest.mark.parametrize(("permission", "name", "prefix", "allowed"), [
    ("storage.objects.get", "runs/c1/jobs/1/events/000001.json", "", True),
    ("storage.objects.create", "runs/c1/data/ckpt/x.pt", "", True),
    ("storage.objects.list", "", "runs/c1/jobs/1/events/", True),
    ("storage.objects.list", "", "runs/c1/", True),
    ("storage.objects.get", "runs/c2/jobs/1/events/000001.json", "", False),
    ("storage.objects.list", "", "runs/c2/", False),
    ("storage.objects.list", "", "runs/", False),
    ("storage.objects.list", "", "", False),
    ("storage.objects.get", "elsewhere/c1/x", "", False),
])
def test_the_store_grant_allows_the_clusters_folder_and_listing_it(permission, name, prefix,
                                                                   allowed) -> None:
    assert iam_rules.storage_allows(_cond(), permission, "ckpt", name, prefix) is allowed


def test_another_bucket_is_refused() -> None:
    assert not iam_rules.storage_allows(_cond(), "storage.objects.list", "other", "", "runs/c1/")
    assert not iam_rules.storage_allows(_cond(), "storage.objects.get", "other",
                                        "runs/c1/x", "")
