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


def check_preconditions(res: str, obj: dict[str, Any], body: Any) -> None:
    """ApiError 409 when the DELETE's preconditions do not hold for the stored `obj`."""
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
