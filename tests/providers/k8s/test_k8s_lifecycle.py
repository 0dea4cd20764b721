"""The provider against the stand-in API server (pods marked Running, nothing run): plan,
create, destroy, gc, the queue, errors, through the real kubernetes client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from standin import OnLog, Standin

from provision.cluster.providers import get_provider
from provision.model.errors import (
    CapacityError,
    ClusterExistsError,
    ProviderUnavailableError,
    UserInputError,
)
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec


def kinds(s: Standin, cluster: str) -> list[str]:
    return sorted(x.split("/")[-3] if x.count("/") > 2 else x.split("/")[0]
                  for x in s.labelled(cluster))


def test_up_makes_a_labelled_jobset_and_down_deletes_by_label(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    inv = up(make_spec(nodes=3))
    assert [n.name for n in inv.nodes] == ["node-0", "node-1", "node-2"]
    assert all(n.address.startswith(f"c1-node-0-{n.rank}-") for n in inv.nodes)
    assert len({n.private_address for n in inv.nodes}) == 3 and inv.manage_etc_hosts
    assert inv.nccl_env == {"ACCELERATE_USE_CPU": "1"} and inv.fabric is None  # CPU pods
    assert inv.container_runtime == "none"  # a job's --image: refused, the pod is the container
    assert sorted(r.kind for r in inv.resources) == ["k8s-jobset", "k8s-secret"]
    js = standin.store.get("jobset.x-k8s.io/v1alpha2/jobsets", "default", "c1")
    assert js["metadata"]["labels"] == {"mgpu-cloud-cluster": "c1"}
    assert "suspend" not in js["spec"]
    pods = standin.store.list("pods", "default", "mgpu-cloud-cluster=c1")
    assert len(pods) == 3
    secret = standin.store.get("secrets", "default", "c1-login")
    assert sorted(secret["data"]) == ["authorized-keys", "host-key-0", "host-key-1", "host-key-2"]
    # an object of another cluster in the namespace: down leaves it alone
    standin.store.create("secrets", "default", {"metadata": {
        "name": "other", "labels": {"mgpu-cloud-cluster": "c2"}}})
    from provision.cluster import pipeline

    pipeline.down("c1", store=store, log=lambda m: None)
    assert standin.labelled("c1") == []
    assert standin.labelled("c2") == ["secrets/default/other"]
    deletes = [r.path for r in standin.api.requests if r.method == "DELETE"]
    assert "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/c1" in deletes


def test_plain_pods_and_a_headless_service_without_the_jobset_api(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    s = Standin(tmp_path, groups=("kueue.x-k8s.io",))
    try:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        plan = get_provider("k8s").plan(make_spec())
        assert "plain pods + a headless Service" in plan.render()
        inv = up(make_spec())
        assert [n.address for n in inv.nodes] == ["c1-node-0-0", "c1-node-0-1"]
        svc = s.store.get("services", "default", "c1")
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"] == {"mgpu-cloud-cluster": "c1"}
        pod = s.store.get("pods", "default", "c1-node-0-1")
        assert pod["spec"]["hostname"] == "c1-node-0-1" and pod["spec"]["subdomain"] == "c1"
        with pytest.raises(UserInputError, match="serves no jobset.x-k8s.io API .* --queue needs it"):
            get_provider("k8s").plan(make_spec(name="c9", k8s={"queue": "q"}))
        assert s.api.violations == []
    finally:
        s.stop()


def test_dry_run_plan_shows_the_manifests(standin: Standin,
                                          make_spec: Callable[..., ClusterSpec]) -> None:
    plan = get_provider("k8s").plan(make_spec(max_hours=2, gpus_per_node=8))
    text = plan.render()
    assert "JobSet (jobset.x-k8s.io/v1alpha2)" in text
    assert "kind: JobSet" in text and "kind: Secret" in text
    assert "activeDeadlineSeconds: 7200" in text and "nvidia.com/gpu: '8'" in text
    assert "BEGIN OPENSSH" not in text  # keys are made by up, never printed
    assert not any(r.method in ("POST", "PATCH", "DELETE") for r in standin.api.requests)


def test_queue_waits_while_suspended_then_runs(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], caplog: pytest.LogCaptureFixture) -> None:
    """Quota for 1 pod of 2: held, with Kueue's reason; once `up` says it waits, the quota
    grows and it is admitted."""
    standin.add_queue("team-a")
    standin.kueue.quota_pods = 1
    with OnLog("waiting in queue", lambda m: standin.kueue.set_quota(4)) as waited, \
            caplog.at_level("INFO", logger="mgpu_cloud"):
        inv = up(make_spec(k8s={"queue": "team-a"}))
    assert len(inv.nodes) == 2
    assert waited.seen and "1 more needed" in waited.seen[0], waited.seen
    assert "admitted by queue team-a" in caplog.text
    posted = next(r.body for r in standin.api.requests if r.method == "POST"
                  and r.path.endswith("/jobsets"))
    assert posted["spec"]["suspend"] is True
    assert posted["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_a_queue_that_never_admits_ends_with_capacity_and_rolls_back(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.add_queue("team-a")
    standin.kueue.quota_pods = 0
    with pytest.raises(CapacityError, match="did not admit"):
        up(make_spec(k8s={"queue": "team-a", "queue_timeout_s": 0.3}))
    assert standin.labelled("c1") == []


def test_plan_refuses_bad_input_before_anything_is_made(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    prov = get_provider("k8s")
    with pytest.raises(UserInputError, match="no Kueue LocalQueue 'nope'"):
        prov.plan(make_spec(k8s={"queue": "nope"}))
    with pytest.raises(UserInputError, match="needs --queue"):
        prov.plan(make_spec(k8s={"topology": "rack"}))
    with pytest.raises(UserInputError, match="a pod is already the container"):
        prov.plan(make_spec(image="pytorch/pytorch:2.5"))
    unset = prov.plan(make_spec(k8s={"image": ""}))  # a dry run shows it, unresolved
    assert any("image is not set" in u for u in unset.unresolved)
    with pytest.raises(UserInputError, match="image is not set"):
        prov.creatable(unset)
    standin.store.create("pods", "default", {"metadata": {
        "name": "stray", "labels": {"mgpu-cloud-cluster": "c1"}},
        "spec": {"containers": [{"name": "x", "image": "x"}]}})
    with pytest.raises(ClusterExistsError, match="pod/stray"):
        prov.plan(make_spec())
    assert not any(r.method == "POST" for r in standin.api.requests)


def test_gc_lists_labelled_objects_no_inventory_knows_and_deletes_them(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    up(make_spec())
    standin.store.create("secrets", "default", {"metadata": {
        "name": "old-login", "labels": {"mgpu-cloud-cluster": "gone"}}})
    prov = get_provider("k8s")
    spec = make_spec(name="gc-scope")
    found = prov.orphans(spec, {"c1"})
    assert [(r.kind, r.name, r.extra["cluster"]) for r in found] == [
        ("k8s-secret", "old-login", "gone")]
    prov.delete_orphans(spec, found)
    assert standin.labelled("gone") == [] and standin.labelled("c1") != []


def test_unreachable_api_and_bad_credentials_are_clear(
        standin: Standin, make_spec: Callable[..., ClusterSpec], tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text(standin.kubeconfig.read_text().replace("standin-token", "wrong"))
    monkeypatch.setenv("KUBECONFIG", str(bad))
    plan = get_provider("k8s").plan(make_spec())
    assert plan.unresolved and "credentials" in plan.unresolved[0]
    with pytest.raises(ProviderUnavailableError, match="cannot be created"):
        plan.refuse_unresolved()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    plan = get_provider("k8s").plan(make_spec())  # --dry-run still shows the manifests
    assert "kubeconfig" in plan.unresolved[0] and "kind: JobSet" in plan.render()


def test_context_picks_the_kubeconfig_entry(standin: Standin, tmp_path: Any,
                                            make_spec: Callable[..., ClusterSpec],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    config = yaml.safe_load(standin.kubeconfig.read_text())
    config["clusters"].append({"name": "far", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append({"name": "far", "context": {"cluster": "far", "user": "standin"}})
    path = tmp_path / "two-contexts"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    prov = get_provider("k8s")
    assert prov.plan(make_spec()).unresolved == []  # the current context: the stand-in
    far = prov.plan(make_spec(k8s={"context": "far"}))
    assert far.unresolved and "not reachable" in far.unresolved[0]
    missing = prov.plan(make_spec(k8s={"context": "nope"}))
    assert "no usable kubeconfig context 'nope'" in missing.unresolved[0]


def test_cli_dry_run_and_gc(standin: Standin, make_spec: Callable[..., ClusterSpec],
                            up: Callable[[ClusterSpec], Inventory], tmp_path: Any) -> None:
    from kit import cli

    env = standin.env()
    dry = cli("up", "--provider", "k8s", "--nodes", "2", "--name", "dry", "--dry-run",
              "--queue", "q", "--k8s-api", "pods", home=tmp_path, env=env)
    assert dry.returncode != 0 and "--queue needs the JobSet API" in dry.stderr
    dry = cli("up", "--provider", "k8s", "--nodes", "2", "--name", "dry", "--dry-run",
              "--gpus-per-node", "8", "--fabric", "efa", "--namespace", "default",
              home=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "manifests (JobSet (jobset.x-k8s.io/v1alpha2)" in dry.stderr
    assert "vpc.amazonaws.com/efa: '4'" in dry.stderr and "not priced" in dry.stderr
    assert "dry run: nothing was created" in dry.stderr
    up(make_spec())  # made under the test's own home: another home's gc does not know it
    res = cli("gc", "--provider", "k8s", "--namespace", "default", home=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert "k8s-jobset" in res.stdout and "4 orphaned resource(s)" in res.stderr  # + 2 pods
    res = cli("gc", "--provider", "k8s", "--delete", home=tmp_path, env=env)
    assert res.returncode == 0 and "deleted 4 resource(s)" in res.stderr, res.stderr
    assert standin.labelled("c1") == []
