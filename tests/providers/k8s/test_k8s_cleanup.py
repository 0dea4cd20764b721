"""Issue 42: `down` deletes only what the API labels with the cluster AT deletion time. An
object listed with the label that loses it before its delete is left alone and named, in
both windows: between the listing and the read that checks it, and between that read and
the delete (the delete's uid and resourceVersion preconditions: the API refuses with 409,
the object is read again). An object that only changed otherwise is still deleted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as kube
from standin import Standin

from provision.cluster import pipeline
from provision.cluster.providers.k8s import cleanup
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

SECRET = "c1-login"


@pytest.fixture(autouse=True)
def _bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`down` waits for the pods to go: a few seconds here, not minutes (a cleanup that
    deletes nothing fails fast)."""
    monkeypatch.setattr(cleanup, "GONE_TIMEOUT_S", 5.0)


def _relabel(standin: Standin) -> None:
    standin.store.update("secrets", "default", SECRET,
                         lambda o: o["metadata"].update(labels={"team": "other"}))


def _down(store: InventoryStore, caplog: pytest.LogCaptureFixture) -> str:
    with caplog.at_level("INFO", logger="mgpu_cloud"):
        pipeline.down("c1", store=store, log=lambda m: None)
    return caplog.text


def test_a_label_taken_off_after_the_listing_is_seen(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    listing = cleanup.labelled

    def listed_then_relabelled(*args: Any, **kwargs: Any) -> list[cleanup.Found]:
        found = listing(*args, **kwargs)
        if any(f.name == SECRET for f in found):
            _relabel(standin)  # someone else takes the object over now
        return found

    monkeypatch.setattr(cleanup, "labelled", listed_then_relabelled)
    text = _down(store, caplog)
    assert f"k8s-secret {SECRET} is not labelled mgpu-cloud-cluster=c1: left as it is" in text
    assert standin.store.get("secrets", "default", SECRET)  # still there
    assert standin.labelled("c1") == []  # the rest went


def test_a_label_taken_off_between_the_check_and_the_delete_is_seen(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    reading = cleanup.read
    reads: list[str] = []

    def read_then_relabelled(k: Any, kind: str, name: str) -> Any:
        got = reading(k, kind, name)
        reads.append(name)
        if name == SECRET and reads.count(SECRET) == 1:
            _relabel(standin)  # after the label was checked, before the delete
        return got

    monkeypatch.setattr(cleanup, "read", read_then_relabelled)
    text = _down(store, caplog)
    assert reads.count(SECRET) == 2  # the API refused the delete: read again
    assert f"k8s-secret {SECRET} is not labelled mgpu-cloud-cluster=c1: left as it is" in text
    assert standin.store.get("secrets", "default", SECRET)
    assert standin.labelled("c1") == []
    refused = [r for r in standin.api.requests if r.method == "DELETE" and SECRET in r.path]
    assert len(refused) == 1 and refused[0].body["preconditions"]["resourceVersion"]


def test_an_object_that_changed_but_kept_its_label_is_deleted(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    reading = cleanup.read
    touched: list[str] = []

    def read_then_touched(k: Any, kind: str, name: str) -> Any:
        got = reading(k, kind, name)
        if name == SECRET and not touched:
            touched.append(name)  # a new resourceVersion, the label as it was
            standin.store.update("secrets", "default", SECRET,
                                 lambda o: o["metadata"].setdefault("annotations", {}).update(
                                     {"seen": "yes"}))
        return got

    monkeypatch.setattr(cleanup, "read", read_then_touched)
    text = _down(store, caplog)
    assert "left as it is" not in text
    assert standin.labelled() == [] and touched == [SECRET]


def test_the_stand_in_refuses_a_delete_whose_preconditions_fail(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """The stand-in is as strict as the API server here (standin_delete.py)."""
    up(make_spec())
    from provision.cluster.providers.k8s.client import kube as client_for

    api = client_for("default", None).core  # the stand-in's, through its KUBECONFIG
    current = api.read_namespaced_secret(SECRET, "default")
    for wrong in (kube.V1Preconditions(uid="someone-else"),
                  kube.V1Preconditions(resource_version="1")):
        with pytest.raises(kube.ApiException) as err:
            api.delete_namespaced_secret(SECRET, "default",
                                         body=kube.V1DeleteOptions(preconditions=wrong))
        assert err.value.status == 409 and "Precondition failed" in str(err.value.body)
    api.delete_namespaced_secret(SECRET, "default", body=kube.V1DeleteOptions(
        preconditions=kube.V1Preconditions(uid=current.metadata.uid,
                                           resource_version=current.metadata.resource_version)))
    with pytest.raises(kube.ApiException):
        api.read_namespaced_secret(SECRET, "default")


JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"


def test_a_jobset_that_loses_its_label_between_the_check_and_the_delete_stays(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec(k8s={"api": "jobset"}))
    [name] = [o["metadata"]["name"] for o in standin.store.list(JOBSETS, "default", "")]
    reading = cleanup.read

    def read_then_relabelled(k: Any, kind: str, obj: str) -> Any:
        got = reading(k, kind, obj)
        if kind == "k8s-jobset" and got is not None and got[1]:
            standin.store.update(JOBSETS, "default", name,
                                 lambda o: o["metadata"].update(labels={"team": "other"}))
        return got

    monkeypatch.setattr(cleanup, "read", read_then_relabelled)
    with pytest.raises(TeardownError) as err:  # its pods come back while it stays
        _down(store, caplog)
    assert f"k8s-jobset {name} is not labelled mgpu-cloud-cluster=c1: left as it is" in \
        err.value.message
    assert standin.store.get(JOBSETS, "default", name)


def test_an_object_gone_between_the_check_and_the_delete_is_done(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    reading = cleanup.read

    def read_then_gone(k: Any, kind: str, name: str) -> Any:
        got = reading(k, kind, name)
        if name == SECRET and got is not None:
            standin.store.remove("secrets", "default", SECRET)  # someone else deleted it
        return got

    monkeypatch.setattr(cleanup, "read", read_then_gone)
    text = _down(store, caplog)  # no failure: gone is what down wanted
    assert "HTTP 404" not in text and "left as it is" not in text
    assert standin.labelled() == []


def test_the_stand_in_refuses_an_unknown_propagation_policy(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    from provision.cluster.providers.k8s.client import kube as client_for

    up(make_spec())
    api = client_for("default", None).core
    with pytest.raises(kube.ApiException) as err:
        api.delete_namespaced_secret(SECRET, "default", body=kube.V1DeleteOptions(
            propagation_policy="background"))
    assert err.value.status == 422 and "Unsupported value" in str(err.value.body)


def test_down_of_one_cluster_reads_only_its_own_objects(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec(name="c2"))
    theirs = sorted(standin.labelled("c2"))
    up(make_spec())
    text = _down(store, caplog)
    assert "left as it is" not in text  # c2's objects were never even candidates
    assert sorted(standin.labelled("c2")) == theirs and standin.labelled("c1") == []


def test_a_recorded_object_without_the_label_is_refused_by_kind_and_name(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        caplog: pytest.LogCaptureFixture) -> None:
    up(make_spec())
    _relabel(standin)  # before the listing: only the inventory still names it
    text = _down(store, caplog)
    assert f"k8s-secret {SECRET} is not labelled mgpu-cloud-cluster=c1: left as it is" in text
    assert standin.store.get("secrets", "default", SECRET)


def test_a_delete_that_fails_is_named_with_what_the_api_said(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    from standin_store import ApiError

    up(make_spec())
    standin.api.faults.append(("DELETE", f"/secrets/{SECRET}",
                               ApiError(500, "InternalError", "etcd is unwell")))
    with pytest.raises(TeardownError) as err:
        pipeline.down("c1", store=store, log=lambda m: None)
    assert f"k8s-secret {SECRET}: HTTP 500 InternalError etcd is unwell" in err.value.message


def test_an_object_that_changes_under_every_delete_is_named(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    up(make_spec())
    reading = cleanup.read

    def read_then_touched(k: Any, kind: str, name: str) -> Any:
        got = reading(k, kind, name)
        if name == SECRET:  # a new resourceVersion after every read
            standin.store.update("secrets", "default", SECRET,
                                 lambda o: o["metadata"].setdefault("annotations", {}).update(
                                     {"n": str(len(o["metadata"]["annotations"]))}))
        return got

    monkeypatch.setattr(cleanup, "read", read_then_touched)
    with pytest.raises(TeardownError) as err:
        pipeline.down("c1", store=store, log=lambda m: None)
    assert (f"k8s-secret {SECRET}: k8s-secret {SECRET} changed under every one of "
            f"{cleanup.ATTEMPTS} deletes") in err.value.message
    assert standin.store.get("secrets", "default", SECRET)


def test_every_delete_sent_names_the_object_read_and_how_its_dependents_go(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """What `down` SENDS: each DELETE carries the uid and resourceVersion it read as
    preconditions; a JobSet goes in the foreground (its pods before it), the rest in the
    background."""
    up(make_spec(k8s={"api": "jobset"}))
    uids = {o["metadata"]["name"]: o["metadata"]["uid"]
            for res in (JOBSETS, "secrets", "services", "pods")
            for o in standin.store.list(res, "default", "mgpu-cloud-cluster=c1")}
    pipeline.down("c1", store=store, log=lambda m: None)
    sent = [r for r in standin.api.requests if r.method == "DELETE" and r.who == "user"]
    assert sent and standin.labelled("c1") == []
    for r in sent:
        name = r.path.rsplit("/", 1)[-1]
        assert r.body["preconditions"]["uid"] == uids[name], r
        assert r.body["preconditions"]["resourceVersion"], r
        assert r.body["propagationPolicy"] == (
            "Foreground" if "/jobsets/" in r.path else "Background"), r
    assert any("/jobsets/" in r.path for r in sent) and any("/secrets/" in r.path for r in sent)
