"""The Role of docs/kubernetes.md as a rules layer (rbac.py; every stand-in test checks the
provider's requests with it at teardown): it is a valid Role, and it names what it lacks."""

from __future__ import annotations

import k8s_schemas
import rbac
from standin_api import Seen


def test_the_documented_role_is_a_valid_namespaced_role() -> None:
    role = rbac.role()
    assert role["apiVersion"] == "rbac.authorization.k8s.io/v1"
    for version in k8s_schemas.VERSIONS:
        validator = k8s_schemas.core_validator(version, "Role", role["apiVersion"])
        assert list(validator.iter_errors(role)) == []
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])


def test_the_layer_names_a_request_the_role_does_not_allow() -> None:
    seen = [Seen("GET", "/apis", None, {}, "user"),
            Seen("GET", "/api/v1/namespaces/ml/pods", None, {"watch": "True"}, "user"),
            Seen("GET", "/api/v1/namespaces/ml/pods/p/portforward", None, {}, "user"),
            Seen("PATCH", "/api/v1/namespaces/ml/pods/p", {}, {}, "user"),
            Seen("DELETE", "/api/v1/namespaces/ml/configmaps/x", None, {}, "user"),
            Seen("GET", "/api/v1/nodes", None, {}, "user")]
    assert rbac.denied(seen) == [
        "DELETE /api/v1/namespaces/ml/configmaps/x: delete configmaps (core)",
        "GET /api/v1/nodes: list nodes (core)",
        "PATCH /api/v1/namespaces/ml/pods/p: patch pods (core)"]
