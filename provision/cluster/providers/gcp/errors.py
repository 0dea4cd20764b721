"""The one boundary where google.api_core / google.auth errors become mgpu-cloud errors.

    google.auth DefaultCredentialsError  -> ProviderUnavailableError  (missing ADC)
    api_core TooManyRequests / ServerError (+ rate-limit reasons)  -> retried (TRANSIENT), then
                                                                      ProvisionError
    api_core NotFound in plan             -> UserInputError (caller names what was not found)
    api_core Forbidden/Unauthenticated    -> ProviderUnavailableError (credentials / API disabled)
    anything else from api_core           -> ProvisionError / TeardownError (the caller's `error`)
    an answer that is not Compute's JSON  -> retried (TRANSIENT), then ProviderUnavailableError
      (json_format.ParseError: e.g. a proxy's HTML page with HTTP 200)
    Operation DONE with error.errors[]    -> OperationFailed (internal, carries the codes)
        ZONE_CAPACITY_CODES, zonal QUOTA_EXCEEDED      -> zone failover
        other codes                                     -> ProvisionError

Classification is by exception type, error reason and operation error code (tables below),
never by message text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from provision.model.errors import MgpuError, ProviderUnavailableError, ProvisionError

# Operation error codes meaning "this zone cannot hold the request now": try another zone.
ZONE_CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "NOT_ENOUGH_RESOURCES",
    }
)
# Quota codes: failover only when the exceeded quota is scoped to a zone (quotaInfo.dimensions
# has a "zone" key); a regional or global quota is the same in every zone of the region.
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})
# `errors[].reason` values of HTTP errors that are transient even though the status is 403.
TRANSIENT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "backendError"})
CREDENTIAL_REASONS = frozenset({"accessNotConfigured", "SERVICE_DISABLED", "forbidden"})
AUTH_HINT = (
    "log in with `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file), and enable the Compute Engine API for the project"
)


class OperationFailed(Exception):
    """A Compute operation finished DONE with `error.errors[]` (internal; never leaves gcp/)."""

    def __init__(self, what: str, codes: list[str], messages: list[str], zonal_quota: bool,
                 http_status: int | None) -> None:
        super().__init__(f"{what}: " + "; ".join(f"{c}: {m}" for c, m in zip(codes, messages, strict=True)))
        self.what = what
        self.codes = codes
        self.messages = messages
        self.zonal_quota = zonal_quota
        self.http_status = http_status

    @property
    def zone_should_fail_over(self) -> bool:
        if any(c in ZONE_CAPACITY_CODES for c in self.codes):
            return True
        return self.zonal_quota and any(c in QUOTA_CODES for c in self.codes)

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


def _reasons(exc: BaseException) -> set[str]:
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
    requestId)."""
    from google.api_core import exceptions as gexc

    if is_unparseable(exc):
        return True
    if isinstance(exc, gexc.TooManyRequests | gexc.ServerError):
        return True
    if isinstance(exc, gexc.Forbidden):
        return bool(_reasons(exc) & TRANSIENT_REASONS)
    import requests

    return isinstance(exc, requests.ConnectionError | requests.Timeout)


def is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.NotFound)


def is_conflict(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.Conflict)


@contextlib.contextmanager
def map_errors(action: str, error: type[MgpuError] = ProvisionError) -> Iterator[None]:
    """Translate google errors raised inside into mgpu-cloud errors naming `action`."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    try:
        yield
    except MgpuError:
        raise
    except OperationFailed as exc:
        raise error(f"{action} failed: {exc}") from exc
    except auth_exc.DefaultCredentialsError as exc:
        raise ProviderUnavailableError(
            f"{action}: no Google Cloud credentials found ({exc})", hint=AUTH_HINT
        ) from exc
    except auth_exc.GoogleAuthError as exc:
        raise ProviderUnavailableError(f"{action}: Google Cloud authentication failed ({exc})",
                                       hint=AUTH_HINT) from exc
    except (gexc.Unauthenticated, gexc.PermissionDenied) as exc:
        raise ProviderUnavailableError(
            f"{action}: access denied by Compute Engine ({exc.code} {exc.message})", hint=AUTH_HINT
        ) from exc
    except gexc.GoogleAPICallError as exc:
        raise error(f"{action} failed: HTTP {exc.code} {exc.message}") from exc
    except gexc.RetryError as exc:
        raise error(f"{action} failed: {exc}") from exc
    except OSError as exc:
        raise error(f"{action} failed: cannot reach Compute Engine ({exc})") from exc
    except Exception as exc:
        if not is_unparseable(exc):
            raise
        raise ProviderUnavailableError(
            f"{action}: the answer is not a Compute Engine response ({exc})",
            hint="a proxy or firewall between you and Google may be answering instead (check "
            "HTTPS_PROXY); the request is safe to repeat",
        ) from exc
