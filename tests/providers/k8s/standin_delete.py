"""A delete's preconditions, as the API server checks them (issue 42: the cleanup deletes an
object only if it is still the one whose label it read).

Upstream: k8s.io/apiserver/pkg/storage/interfaces.go `Preconditions.Check` compares the
DeleteOptions' `preconditions.uid` and `preconditions.resourceVersion` with the stored
object's, and a mismatch is an InvalidObjError, which the generic registry's Delete
(registry/generic/registry/store.go) returns as errors.NewConflict: HTTP 409, reason
Conflict, message `Operation cannot be fulfilled on RESOURCE "NAME": Precondition failed: UID
in precondition: X, UID in object meta: Y` (ResourceVersion likewise). A body's options win
over the query's (endpoints/handlers/delete.go decodes the body when there is one).
"""

from __future__ import annotations

from typing import Any

from standin_store import ApiError

PROPAGATION = ("Orphan", "Background", "Foreground")  # metav1.DeletionPropagation values


def check_preconditions(res: str, obj: dict[str, Any], body: Any) -> None:
    """ApiError 422 for a propagationPolicy the API does not know (apimachinery's
    ValidateDeleteOptions: "Unsupported value"), 409 when the DELETE's preconditions do not
    hold for the stored `obj`."""
    policy = body.get("propagationPolicy") if isinstance(body, dict) else None
    if policy is not None and policy not in PROPAGATION:
        raise ApiError(422, "Invalid", f'propagationPolicy: Unsupported value: "{policy}": '
                       "supported values: " + ", ".join(f'"{p}"' for p in PROPAGATION))
    wanted = (body.get("preconditions") or {}) if isinstance(body, dict) else {}
    meta = obj.get("metadata") or {}
    plural = res.split("/")[-1]
    resource = f"{plural}.{res.split('/')[0]}" if "/" in res else plural  # jobsets.jobset.x-k8s.io
    for field, says in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if wanted.get(field) is not None and wanted[field] != meta.get(field):
            raise ApiError(409, "Conflict", (
                f'Operation cannot be fulfilled on {resource} "{meta.get("name")}": '
                f"Precondition failed: {says} in precondition: {wanted[field]}, {says} in "
                f"object meta: {meta.get(field)}"))
