"""The k8s controller's identity (managed runs): its ServiceAccount, Role and pod as the
provider makes them, the Role equal to the one docs/kubernetes.md gives, and what the
controller does from inside (replace a pod, remove the cluster, remove itself) run AS that
ServiceAccount, the stand-in's RBAC judging every request by the Role the API holds."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rbac
import yaml
from kit import until
from standin import Standin

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.k8s import controller as ctl
from provision.cluster.providers.k8s.request import K8sRequest
from provision.job.managed.supervisor import inside_view
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

RBAC = "rbac.authorization.k8s.io/v1"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def request(mode: str, queue: str | None, efa_dra: bool = False) -> K8sRequest:
    return K8sRequest(cluster="c1", namespace="default", context=None, mode=mode,  # type: ignore[arg-type]
                      nodes=2, gpus=0, slots=2, image="img", cpu="2", memory="4Gi",
                      queue=queue, fabric="efa" if efa_dra else "none", efa_dra=efa_dra)


def expand(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str | None]]:
    return {(g, r, v, n) for rule in rules for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]
            for n in rule.get("resourceNames") or [None]}


def test_the_controllers_role_is_the_documented_one_and_no_more() -> None:
    """Every case's Role is allowed by the docs' Role of the controller, and together they
    are exactly it: the docs neither lag nor promise more."""
    doc = rbac.controller_role("c1")
    assert doc["metadata"]["name"] == "c1-controller"
    union: set[tuple[str, str, str, str | None]] = set()
    for mode in ("jobset", "pods"):
        for queue in (None, "q"):
            for dra in (False, True):
                rules = ctl.controller_rules(request(mode, queue, dra))
                assert all(rbac.allows(doc["rules"], *attrs) for attrs in expand(rules))
                union |= expand(rules)
    assert union == expand(doc["rules"])
    jobset = expand(ctl.controller_rules(request("jobset", None)))
    assert ("", "pods", "create", None) not in jobset  # its Job controller makes the pods
    assert not any(v in ("get", "list", "watch") for g, r, v, n in jobset if r == "secrets")


def test_the_documented_controller_role_and_cluster_role_are_valid() -> None:
    import k8s_schemas

    for doc in (rbac.controller_role("c1"), rbac.role(rbac.OPTIONAL)):
        for version in k8s_schemas.VERSIONS:
            validator = k8s_schemas.core_validator(version, doc["kind"], doc["apiVersion"])
            assert list(validator.iter_errors(doc)) == [], doc["kind"]
        assert not any("*" in r["verbs"] or "*" in r["resources"] for r in doc["rules"])


def kubeconfig(s: Standin, path: Path, token: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctl",
        "clusters": [{"name": "s", "cluster": {"server": s.api.url}}],
        "users": [{"name": "ctl", "user": {"token": token}}],
        "contexts": [{"name": "ctl", "context": {"cluster": "s", "user": "ctl"}}]}))
    return path


@pytest.fixture
def managed(standin: Standin, make_spec: Callable[..., ClusterSpec],
            up: Callable[[ClusterSpec], Inventory], store: InventoryStore
            ) -> Callable[..., Inventory]:
    def make(**spec: Any) -> Inventory:
        inv = up(make_spec(**spec))
        prov = get_provider("k8s")
        inv.controller = prov.create_controller(inv, store)  # type: ignore[attr-defined]
        store.save(inv)
        return inv

    return make


@pytest.fixture
def as_controller(standin: Standin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[Callable[[Inventory], None]]:
    """Switch this process to the controller pod's ServiceAccount (a token bound to the
    pod, as the kubelet projects it), talking to the same API server."""
    def switch(inv: Inventory) -> None:
        assert inv.controller is not None
        pod = standin.store.get("pods", "default", inv.controller.address)
        token = standin.api.incluster.mint("default", pod["spec"]["serviceAccountName"],
                                           pod["metadata"]["name"], pod["metadata"]["uid"])
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(standin, tmp_path / "ctl.yaml", token)))

    yield switch


def test_the_controller_gets_its_own_identity_and_only_its_pod_a_token(
        standin: Standin, managed: Callable[..., Inventory], store: InventoryStore) -> None:
    inv = managed()
    ctl_rec = inv.controller
    assert ctl_rec is not None and ctl_rec.address == "c1-controller" and ctl_rec.rank == -1
    names = {(r.kind, r.name) for r in inv.resources if r.extra.get("role") == "controller"}
    assert names == {(k, "c1-controller") for k in ("k8s-serviceaccount", "k8s-role",
                                                      "k8s-rolebinding", "k8s-secret",
                                                      "k8s-pod")}
    role = standin.store.get(f"{RBAC}/roles", "default", "c1-controller")
    assert role["rules"] == ctl.controller_rules(request("jobset", None))
    binding = standin.store.get(f"{RBAC}/rolebindings", "default", "c1-controller")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "c1-controller",
                                    "namespace": "default"}]
    pod = standin.store.get("pods", "default", "c1-controller")
    assert pod["spec"]["serviceAccountName"] == "c1-controller"
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == SA_DIR for m in mounts)  # the admission plugin's volume
    for node in standin.store.list("pods", "default", "mgpu-cloud-cluster=c1"):
        if node["metadata"]["name"] != "c1-controller":
            assert not any(m["mountPath"] == SA_DIR
                           for m in node["spec"]["containers"][0]["volumeMounts"])
    # it authorizes the controller's own login key, not the cluster key the nodes hold
    secret = standin.store.get("secrets", "default", "c1-controller")
    authorized = base64.b64decode(secret["data"]["authorized-keys"]).decode()
    keys = store.keys_dir("c1")
    assert authorized.split()[:2] == (keys / "controller_ed25519.pub").read_text().split()[:2]
    assert authorized.split()[1] not in (keys / "id_ed25519.pub").read_text()


def test_the_api_refuses_a_role_the_user_could_not_grant(standin: Standin) -> None:
    """RBAC escalation prevention, as the stand-in models it: the user holds the Role of the
    docs, so a Role listing nodes (cluster-scoped, not in it) is refused."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    with pytest.raises(client.ApiException) as refused:
        client.RbacAuthorizationV1Api(api).create_namespaced_role("default", {
            "apiVersion": RBAC, "kind": "Role", "metadata": {"name": "wide"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]})
    assert refused.value.status == 403
    assert "attempting to grant RBAC permissions not currently held" in refused.value.body


def test_the_controllers_token_is_judged_by_its_role(
        standin: Standin, managed: Callable[..., Inventory],
        as_controller: Callable[[Inventory], None]) -> None:
    from kubernetes import client

    from provision.cluster.providers.k8s.client import kube

    inv = managed()
    as_controller(inv)
    k = kube("default", None)
    assert k.core.read_namespaced_pod(inv.nodes[0].address, "default").metadata.uid
    for call in (lambda: k.core.list_namespaced_secret("default"),
                 lambda: k.core.read_namespaced_secret("c1-login", "default"),
                 lambda: k.core.delete_namespaced_secret("other", "default")):
        with pytest.raises(client.ApiException) as refused:
            call()
        assert refused.value.status == 403
        assert 'User \\"system:serviceaccount:default:c1-controller\\"' in refused.value.body
    standin.api.requests[:] = [  # refused on purpose above: not the Role's fault
        r for r in standin.api.requests if "/secrets" not in r.path]
    # its token is bound to its pod: once the pod is gone, it is refused
    standin.store.remove("pods", "default", "c1-controller")
    with pytest.raises(client.ApiException) as gone:
        k.core.read_namespaced_pod(inv.nodes[0].address, "default")
    assert gone.value.status == 401


@pytest.mark.parametrize("mode", ["jobset", "pods"])
def test_from_inside_it_replaces_a_pod_and_removes_the_cluster_then_itself(
        standin: Standin, mode: str, managed: Callable[..., Inventory],
        as_controller: Callable[[Inventory], None], store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = managed(k8s={"api": mode})
    user_kubeconfig = str(standin.kubeconfig)
    prov = get_provider("k8s")
    as_controller(inv)
    # the controller's view: nodes at their pod IPs (supervisor.localize)
    inside = inv.model_copy(update={"nodes": [inside_view(n) for n in inv.nodes]})
    lost = inside.nodes[1]
    assert prov.node_alive(inside, lost)  # type: ignore[attr-defined]
    standin.kubelet.ended(standin.store.get("pods", "default", inv.nodes[1].address), 137,
                          "Error")
    assert not prov.node_alive(inside, lost)  # type: ignore[attr-defined]
    new = prov.replace(inside, store, lost)  # type: ignore[attr-defined]
    assert new.resource_id != lost.resource_id and new.rank == 1
    # an object of another cluster with a recorded name is left: deleted by uid only
    prov.teardown_from_controller(inside, store)  # type: ignore[attr-defined]
    left = sorted(x.split("/")[-3] for x in standin.labelled("c1"))
    assert left == ["pods", "rolebindings", "roles", "secrets", "serviceaccounts"], left
    prov.remove_controller_from_inside(inside)  # type: ignore[attr-defined]
    # its pod is deleted gracefully: the kubelet stops it, then it is gone (no pod: no token)
    until(lambda: "pods" not in [x.split("/")[-3] for x in standin.labelled("c1")], 30)
    left = sorted(x.split("/")[-3] for x in standin.labelled("c1"))
    assert left == ["rolebindings", "roles", "serviceaccounts"], left
    monkeypatch.setenv("KUBECONFIG", user_kubeconfig)  # the user's next `down` ends it
    pipeline.down("c1", store=store, log=lambda m: None)
    assert standin.labelled("c1") == []


def test_a_lost_controller_is_made_again_with_the_same_identity(
        standin: Standin, managed: Callable[..., Inventory], store: InventoryStore) -> None:
    """Issue 36's take-back on k8s: the provider is sure the old pod is gone (Failed), deletes
    it and its login Secret, and makes a new pod under the ServiceAccount already there."""
    inv = managed()
    prov = get_provider("k8s")
    old = inv.controller
    assert old is not None and prov.node_alive(inv, old)  # type: ignore[attr-defined]
    standin.kubelet.ended(standin.store.get("pods", "default", old.address), 137, "Error")
    assert not prov.node_alive(inv, old)  # type: ignore[attr-defined]
    sa = standin.store.get("serviceaccounts", "default", "c1-controller")["metadata"]["uid"]
    new = prov.remake_controller(inv, store)  # type: ignore[attr-defined]
    assert new.resource_id != old.resource_id and new.host_key != old.host_key
    assert standin.store.get("serviceaccounts", "default", "c1-controller")["metadata"][
        "uid"] == sa
    mine = sorted((r.kind, r.id) for r in inv.resources if r.extra.get("role") == "controller"
                  and r.kind == "k8s-pod")
    assert mine == [("k8s-pod", new.resource_id)]  # the lost pod forgotten
    pipeline.down("c1", store=store, log=lambda m: None)
    assert standin.labelled("c1") == []
