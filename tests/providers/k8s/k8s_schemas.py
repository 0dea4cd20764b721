"""Every manifest the provider sends, judged by the official schemas (the stand-in API
server calls `problems` on each create and patch, and answers 422 Invalid with them).

    core kinds   kubernetes-validate's strict JSON schemas (the Kubernetes OpenAPI, per
                 version), for Kubernetes 1.30 and 1.33 (VERSIONS); what uses DRA
                 (resource.k8s.io/v1, a pod's resourceClaims) for 1.34, where it is GA
                 (DRA_VERSIONS)
    JobSet       the JobSet CRD's openAPIV3Schema, v1alpha2 (data/jobset-v1alpha2.openapi.json.gz:
                 its source and commit are in the file), made strict here (an unknown field
                 is an error, as kubectl's field validation makes it); and its pod template
                 and Job template again as a Pod and a Job of each version above
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

VERSIONS = ("1.30.0", "1.33.0")
DRA_VERSIONS = ("1.34.0",)


def versions_for(obj: dict[str, Any]) -> tuple[str, ...]:
    """The Kubernetes versions a manifest must be valid for: DRA's are 1.34+."""
    text = json.dumps(obj)
    return DRA_VERSIONS if ('"resourceClaims"' in text or "resource.k8s.io/v1" in text) \
        else VERSIONS
DATA = Path(__file__).parent / "data"
JOBSET_FILE = DATA / "jobset-v1alpha2.openapi.json.gz"


@cache
def _schema_dir(version: str) -> Path:
    import kubernetes_validate

    return Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / \
        f"v{version}-local-strict"


@cache
def core_validator(version: str, kind: str, api_version: str) -> Any:
    folder = _schema_dir(version)
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads((folder / f"{kind.lower()}-{group}.json").read_text())
    defs = json.loads((folder / "_definitions.json").read_text())
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _strict(node: Any) -> Any:
    """An unknown field is an error: additionalProperties false wherever a schema lists its
    properties and neither allows others nor preserves unknown fields."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def jobset_source() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress(JOBSET_FILE.read_bytes()))
    return data


@cache
def jobset_validator() -> Any:
    schema = _strict(jobset_source()["schema"])
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: Any, obj: dict[str, Any], where: str) -> list[str]:
    return [f"{where}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(obj)]


def problems(obj: dict[str, Any]) -> list[str]:
    """Every schema error of `obj` (a manifest as sent), each naming the schema it broke."""
    kind, api_version = obj.get("kind", ""), obj.get("apiVersion", "")
    if kind == "JobSet":
        found = _errors(jobset_validator(), obj, "JobSet CRD v1alpha2 (kubernetes-sigs/jobset "
                        f"@{jobset_source()['commit'][:12]})")
        for rj in obj.get("spec", {}).get("replicatedJobs", []):
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rj["name"]},
                   "spec": copy.deepcopy(rj["template"]["spec"])}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   **copy.deepcopy(rj["template"]["spec"]["template"])}
            pod.setdefault("metadata", {})["name"] = rj["name"]
            for v in versions_for(pod):
                found += _errors(core_validator(v, "Job", "batch/v1"), job, f"Job (k8s {v})")
                found += _errors(core_validator(v, "Pod", "v1"), pod, f"Pod template (k8s {v})")
        return found
    found = []
    for v in versions_for(obj):
        try:
            validator = core_validator(v, kind, api_version)
        except FileNotFoundError:
            return [f"no schema for {api_version} {kind} in Kubernetes {v}"]
        found += _errors(validator, obj, f"{kind} (k8s {v}, kubernetes-validate)")
    return found
