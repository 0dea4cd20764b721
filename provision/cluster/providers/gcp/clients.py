"""Every Compute client the provider uses, built with ONE set of client options, and the ONE
boundary where google errors become mgpu-cloud errors: every call goes through `Clients.call`
/ `call_or_none` / `wait`, which retry what is transient and raise what is not as an MgpuError
(errors.translate, classified by code tables). No other module of the provider catches a
google exception.

Why one builder: `insert()` returns an ExtendedOperation whose `.result()` polls through an
operations client built without our ClientOptions (so it would call the real endpoint even when
we talk to a fake). We therefore call the `*_unary` variants, which return the raw Operation, and
wait with our own Zone/Region/Global operations clients built here with the same options.

Seams (documented in provision/cluster/providers/gcp/__init__.py):
    MGPU_CLOUD_GCP_ENDPOINT       http(s)://host:port -> ClientOptions(api_endpoint=...) and
                                  AnonymousCredentials; unset -> google.auth.default() (ADC)
    MGPU_CLOUD_GCP_RETRY_BASE_S   base of the exponential wait between retries of 429/5xx (1.0)
    MGPU_CLOUD_GCP_POLL_S         pause between operation waits that return not-DONE (2.0)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from provision.cluster.providers.gcp.errors import (
    AUTH_HINT,
    is_not_found,
    is_transient,
    operation_failure,
    translate,
)
from provision.model.errors import (
    MgpuError,
    ProviderUnavailableError,
    ProvisionError,
    UserInputError,
)

ENDPOINT_ENV = "MGPU_CLOUD_GCP_ENDPOINT"
RETRY_BASE_ENV = "MGPU_CLOUD_GCP_RETRY_BASE_S"
POLL_ENV = "MGPU_CLOUD_GCP_POLL_S"
PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
MAX_ATTEMPTS = 6
CALL_TIMEOUT_S = 180.0  # operations.wait itself returns after at most ~2 min
OPERATION_DEADLINE_S = 30 * 60.0

T = TypeVar("T")


def _float_env(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


@dataclass
class Clients:
    """Lazily built Compute clients sharing credentials and client options."""

    project: str
    credentials: Any
    client_options: Any
    retry_base_s: float = field(default_factory=lambda: _float_env(RETRY_BASE_ENV, 1.0))
    poll_s: float = field(default_factory=lambda: _float_env(POLL_ENV, 2.0))

    def _make(self, cls_name: str) -> Any:
        from google.cloud import compute_v1

        cls = getattr(compute_v1, cls_name)
        return cls(credentials=self.credentials, client_options=self.client_options)

    @cached_property
    def instances(self) -> Any:
        return self._make("InstancesClient")

    @cached_property
    def resource_policies(self) -> Any:
        return self._make("ResourcePoliciesClient")

    @cached_property
    def firewalls(self) -> Any:
        return self._make("FirewallsClient")

    @cached_property
    def networks(self) -> Any:
        return self._make("NetworksClient")

    @cached_property
    def subnetworks(self) -> Any:
        return self._make("SubnetworksClient")

    @cached_property
    def machine_types(self) -> Any:
        return self._make("MachineTypesClient")

    @cached_property
    def accelerator_types(self) -> Any:
        return self._make("AcceleratorTypesClient")

    @cached_property
    def images(self) -> Any:
        return self._make("ImagesClient")

    @cached_property
    def regions(self) -> Any:
        return self._make("RegionsClient")

    @cached_property
    def projects(self) -> Any:
        return self._make("ProjectsClient")

    @cached_property
    def reservations(self) -> Any:
        return self._make("ReservationsClient")

    @cached_property
    def zone_operations(self) -> Any:
        return self._make("ZoneOperationsClient")

    @cached_property
    def region_operations(self) -> Any:
        return self._make("RegionOperationsClient")

    @cached_property
    def global_operations(self) -> Any:
        return self._make("GlobalOperationsClient")

    # --- calls: the ONE boundary where google errors become mgpu-cloud errors ----------------
    def _retrying(self, method: Callable[..., T], request: Any) -> T:
        import tenacity

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_attempt(MAX_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=self.retry_base_s, max=30 * self.retry_base_s),
            reraise=True,
        )
        return retrying(method, request=request, retry=None, timeout=CALL_TIMEOUT_S)

    def call(self, method: Callable[..., T], request: Any, what: str,
             error: type[MgpuError] = ProvisionError) -> T:
        """One API call doing `what`; 429/5xx/rate limits retried with exponential backoff
        (tenacity); every failure raised as an MgpuError (errors.translate; `error` is the
        class of a failure without a class of its own).

        Inserts carry a requestId, so a retried insert whose first attempt did reach the server
        returns the same operation instead of making a second resource. The client's own retry
        is disabled (retry=None) so there is one retry policy, this one.
        """
        try:
            return self._retrying(method, request)
        except Exception as exc:
            raise translate(exc, what, error) from exc

    def call_or_none(self, method: Callable[..., T], request: Any, what: str,
                     error: type[MgpuError] = ProvisionError) -> T | None:
        """`call`, but a 404 (the resource does not exist) is None instead of an error."""
        try:
            return self._retrying(method, request)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise translate(exc, what, error) from exc

    def iterate(self, pager: Any, what: str, error: type[MgpuError] = ProvisionError) -> list[Any]:
        """Every item of a (aggregated) list `call`'s pager: its further pages are fetched
        here, so their errors are translated here too."""
        try:
            return list(pager)
        except Exception as exc:
            raise translate(exc, what, error) from exc

    def wait(self, op: Any, what: str, error: type[MgpuError] = ProvisionError, *,
             missing_ok: bool = False) -> Any:
        """Block until `op` is DONE through our own operations clients. Returns the DONE
        operation; raises an MgpuError (a ZoneCapacityError when the zone or region has no
        capacity) if it finished with errors. `missing_ok`: None when the operation's target
        is gone (a 404 while waiting on a delete)."""
        try:
            return self._wait(op, what)
        except Exception as exc:
            if missing_ok and is_not_found(exc):
                return None
            raise translate(exc, what, error) from exc

    def _wait(self, op: Any, what: str) -> Any:
        from google.cloud import compute_v1

        done = compute_v1.Operation.Status.DONE
        deadline = time.monotonic() + OPERATION_DEADLINE_S
        while op.status != done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: operation {op.name} not done after "
                                   f"{OPERATION_DEADLINE_S:.0f} s")
            if op.zone:
                op = self._retrying(self.zone_operations.wait, compute_v1.WaitZoneOperationRequest(
                    project=self.project, zone=op.zone.rsplit("/", 1)[-1], operation=op.name))
            elif op.region:
                op = self._retrying(self.region_operations.wait,
                                    compute_v1.WaitRegionOperationRequest(
                                        project=self.project, region=op.region.rsplit("/", 1)[-1],
                                        operation=op.name))
            else:
                op = self._retrying(self.global_operations.wait,
                                    compute_v1.WaitGlobalOperationRequest(
                                        project=self.project, operation=op.name))
            if op.status != done and self.poll_s:
                time.sleep(self.poll_s)
        failure = operation_failure(what, op)
        if failure is not None:
            raise failure
        return op


def _credentials_and_options() -> tuple[Any, Any, str | None]:
    """(credentials, client options, project found by ADC or None). No API call is made."""
    from google.api_core.client_options import ClientOptions

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
        return anonymous, ClientOptions(api_endpoint=endpoint), None
    import google.auth

    try:
        credentials, adc_project = google.auth.default(scopes=SCOPES)
    except Exception as exc:
        raise translate(exc, "loading Google Cloud credentials") from exc
    return credentials, ClientOptions(), adc_project


def build_clients(project: str | None) -> Clients:
    """Clients for `project` (or the project from the environment / ADC).

    Raises ProviderUnavailableError for missing credentials and UserInputError when no project
    can be found; both before any API call.
    """
    credentials, options, adc_project = _credentials_and_options()
    project = project or next((os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None)
    project = project or adc_project
    if not project:
        raise UserInputError(
            "no Google Cloud project given",
            hint="pass --project PROJECT_ID (or `gcp: {project: ...}` in the YAML file, or set "
            "GOOGLE_CLOUD_PROJECT)",
        )
    if credentials is None:  # pragma: no cover - google.auth.default never returns None
        raise ProviderUnavailableError("no Google Cloud credentials", hint=AUTH_HINT)
    return Clients(project=project, credentials=credentials, client_options=options)
