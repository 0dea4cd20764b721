"""google.api_core / google.auth errors, classified by CODE tables (never by message text), and
translated into mgpu-cloud errors by ONE function, `translate`, called only by clients.py (the
client wrapper every Compute call goes through).

    what went wrong                                   class         what the provider does
    ------------------------------------------------  ------------  -----------------------------
    429, 5xx, TRANSIENT_REASONS, no answer,           transient     retried in place (bounded,
      an answer that is not Compute's JSON                          clients.Clients.call), then:
    google.auth DefaultCredentialsError / auth error  -> ProviderUnavailableError (AUTH_HINT)
    401 / 403 (not a rate limit)                      -> ProviderUnavailableError (AUTH_HINT)
    HTTP CAPACITY_REASONS (bulkInsert's 503           -> ZoneCapacityError   next zone
      insufficientCapacity): never retried in place
    404                                               gone          call_or_none -> None;
                                                                    wait(missing_ok) -> None
    409                                               -> AlreadyExistsError (create drops its
                                                                    records: not ours)
    other HTTP errors                                 -> the caller's error class
    Operation DONE with error.errors[]:
        ZONE_CAPACITY_CODES, zonal QUOTA_EXCEEDED     -> ZoneCapacityError   next zone
        REGION_CAPACITY_CODES                         -> ZoneCapacityError(region_wide) next region
        QUOTA_CODES (regional / global)               -> the caller's error, with a quota hint
        anything else                                 -> the caller's error class

Sources of the capacity tables: "Troubleshoot resource availability errors"
(https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability:
ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]); "Troubleshoot bulk VM creation"
(https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation: HTTP 503
reason insufficientCapacity, "create VMs in a different zone or region"); SkyPilot's GCP
failover handler (skypilot-org/skypilot sky/backends/cloud_vm_ray_backend.py, `_gcp_handler`:
UNSUPPORTED_OPERATION "observed empirically when VM is preempted during creation" and
RESOURCE_NOT_READY are blocked per zone); GPU_STOCKOUT and REGION_RESOURCE_POOL_EXHAUSTED as
reported against GPU creates (issue 19).
"""

from __future__ import annotations

from typing import Any

from provision.model.errors import (
    CapacityError,
    MgpuError,
    ProviderUnavailableError,
    ProvisionError,
)

# Operation error codes meaning "this zone cannot hold the request now": try another zone.
ZONE_CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "NOT_ENOUGH_RESOURCES",
    "GPU_STOCKOUT",
    "UNSUPPORTED_OPERATION",  # a Spot VM preempted while it was being created (SkyPilot)
    "RESOURCE_NOT_READY",
    "insufficientCapacity",
})
# ... and "this whole region cannot": the other zones of the region are skipped.
REGION_CAPACITY_CODES = frozenset({"REGION_RESOURCE_POOL_EXHAUSTED"})
# Quota codes: failover only when the exceeded quota is scoped to a zone (quotaInfo.dimensions
# has a "zone" key); a regional or global quota is the same in every zone of the region.
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
# `errors[].reason` values of HTTP errors.
TRANSIENT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "backendError"})
CAPACITY_REASONS = frozenset({"insufficientCapacity"})
AUTH_HINT = (
    "log in with `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file), and enable the Compute Engine API for the project"
)
QUOTA_HINT = "request more quota: https://console.cloud.google.com/iam-admin/quotas"


class ZoneCapacityError(CapacityError):
    """The zone (or, `region_wide`, its whole region) has no capacity for the request now.
    Raised per attempt; create/replace decide whether another zone is tried."""

    def __init__(self, message: str, codes: list[str], region_wide: bool) -> None:
        super().__init__(message)
        self.codes = codes
        self.region_wide = region_wide


class AlreadyExistsError(ProvisionError):
    """409: a resource of that name exists (and is not known to be ours)."""


class OperationFailed(Exception):
    """A Compute operation finished DONE with `error.errors[]` (internal: `translate` turns it
    into an MgpuError before it leaves clients.py)."""

    def __init__(self, what: str, codes: list[str], messages: list[str], zonal_quota: bool,
                 http_status: int | None) -> None:
        super().__init__(f"{what}: " + "; ".join(
            f"{c}: {m}" for c, m in zip(codes, messages, strict=True)))
        self.what = what
        self.codes = codes
        self.zonal_quota = zonal_quota
        self.http_status = http_status

    @property
    def capacity(self) -> str | None:
        """"zone", "region" (no capacity there now) or None (some other failure)."""
        if any(c in REGION_CAPACITY_CODES for c in self.codes):
            return "region"
        if any(c in ZONE_CAPACITY_CODES for c in self.codes):
            return "zone"
        if self.zonal_quota and self.is_quota:
            return "zone"
        return None

    @property
    def is_quota(self) -> bool:
        return any(c in QUOTA_CODES for c in self.codes)


def operation_failure(what: str, op: Any) -> OperationFailed | None:
    """OperationFailed for a DONE `compute_v1.Operation` with errors, else None."""
    errors = list(op.error.errors) if op.error else []
    if not errors:
        return None
    zonal_quota = any(
        "zone" in dict(detail.quota_info.dimensions)
        for e in errors
        for detail in e.error_details
        if detail.quota_info
    )
    status = int(op.http_error_status_code) if op.http_error_status_code else None
    return OperationFailed(
        what, [e.code for e in errors], [e.message for e in errors], zonal_quota, status
    )


def reasons(exc: BaseException) -> set[str]:
    """The `errors[].reason` values of an HTTP error."""
    out: set[str] = set()
    for err in getattr(exc, "errors", None) or []:
        if isinstance(err, dict) and err.get("reason"):
            out.add(str(err["reason"]))
    reason = getattr(exc, "reason", None)
    if reason:
        out.add(str(reason))
    return out


def is_unparseable(exc: BaseException) -> bool:
    from google.protobuf import json_format

    return isinstance(exc, json_format.ParseError)


def is_transient(exc: BaseException) -> bool:
    """429, 5xx, rate-limit 403s and unparseable answers: safe to retry (inserts carry a
    requestId). A 503 that says the zone has no capacity is not: the next zone is tried."""
    from google.api_core import exceptions as gexc

    if is_unparseable(exc):
        return True
    if isinstance(exc, gexc.TooManyRequests | gexc.ServerError):
        return not reasons(exc) & CAPACITY_REASONS
    if isinstance(exc, gexc.Forbidden):
        return bool(reasons(exc) & TRANSIENT_REASONS)
    import requests

    return isinstance(exc, requests.ConnectionError | requests.Timeout)


def is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.NotFound)


def _operation_error(exc: OperationFailed, action: str, error: type[MgpuError]) -> MgpuError:
    scope = exc.capacity
    if scope is not None:
        return ZoneCapacityError(f"{action}: no capacity ({', '.join(sorted(set(exc.codes)))}):"
                                 f" {exc}", exc.codes, region_wide=scope == "region")
    return error(f"{action} failed: {exc}", hint=QUOTA_HINT if exc.is_quota else None)


def translate(exc: BaseException, action: str,
              error: type[MgpuError] = ProvisionError) -> BaseException:
    """The mgpu-cloud error for `exc` raised while doing `action` (`error`: the class of a
    failure that has no class of its own); `exc` itself when it is not a Google error."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    if isinstance(exc, MgpuError):
        return exc
    if isinstance(exc, OperationFailed):
        return _operation_error(exc, action, error)
    if isinstance(exc, auth_exc.DefaultCredentialsError):
        return ProviderUnavailableError(f"{action}: no Google Cloud credentials found ({exc})",
                                        hint=AUTH_HINT)
    if isinstance(exc, auth_exc.GoogleAuthError):
        return ProviderUnavailableError(f"{action}: Google Cloud authentication failed ({exc})",
                                        hint=AUTH_HINT)
    if isinstance(exc, gexc.Unauthenticated | gexc.PermissionDenied):
        return ProviderUnavailableError(
            f"{action}: access denied by Compute Engine ({exc.code} {exc.message})",
            hint=AUTH_HINT)
    if isinstance(exc, gexc.GoogleAPICallError) and reasons(exc) & CAPACITY_REASONS:
        return ZoneCapacityError(f"{action}: no capacity (HTTP {exc.code} {exc.message})",
                                 sorted(reasons(exc) & CAPACITY_REASONS), region_wide=False)
    if isinstance(exc, gexc.Conflict):
        return AlreadyExistsError(f"{action} failed: HTTP {exc.code} {exc.message}")
    if isinstance(exc, gexc.GoogleAPICallError):
        return error(f"{action} failed: HTTP {exc.code} {exc.message}")
    if isinstance(exc, gexc.RetryError | TimeoutError):
        return error(f"{action} failed: {exc}")
    if is_unparseable(exc):
        return ProviderUnavailableError(
            f"{action}: the answer is not a Compute Engine response ({exc})",
            hint="a proxy or firewall between you and Google may be answering instead (check "
            "HTTPS_PROXY); the request is safe to repeat")
    if isinstance(exc, OSError):
        return error(f"{action} failed: cannot reach Compute Engine ({exc})")
    return exc
