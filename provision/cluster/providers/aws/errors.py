"""botocore errors, classified by error CODE (never by message text).

    ClientError code            class        what the provider does
    ------------------------    ---------    ------------------------------------------------
    THROTTLE_CODES, 5xx         transient    retried in place (retry.transient, bounded)
    CAPACITY_CODES              capacity     never retried in place: next zone / market
    NOT_FOUND_CODES             gone         teardown treats the resource as deleted
    BUSY_CODES                  busy         teardown retries (retry.while_busy)
    AUTH_CODES, no credentials  -> ProviderUnavailableError
    unparseable answer          transient    retried in place, then ProviderUnavailableError
      (no EC2 error code, or botocore's generic HTTP-status one; ResponseParserError; or an
      answer without the field the operation returns: e.g. an HTML page from a proxy, which
      botocore may parse into an empty result)
    QUOTA_CODES                 -> ProvisionError with a quota hint
    INPUT_CODES                 -> UserInputError (plan) / ProvisionError (create)

`map_errors(action)` is the single boundary where botocore exceptions become MgpuErrors;
AwsProvider wraps each public method in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from provision.model.errors import (
    CapacityError,
    MgpuError,
    ProviderUnavailableError,
    ProvisionError,
    UserInputError,
)

THROTTLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "EC2ThrottledException", "SlowDown", "PriorRequestNotComplete",
})
SERVER_CODES = frozenset({
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
    "ServerInternal", "RequestTimeout", "RequestTimeoutException",
})
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "Unsupported", "SpotMaxPriceTooLow",
    "InsufficientCapacityOnHost",
})
NOT_FOUND_CODES = frozenset({
    "InvalidInstanceID.NotFound", "InvalidGroup.NotFound", "InvalidKeyPair.NotFound",
    "InvalidPlacementGroup.Unknown", "InvalidAllocationID.NotFound",
    "InvalidAddress.NotFound", "InvalidAssociationID.NotFound",
    "InvalidNetworkInterfaceID.NotFound", "InvalidVolume.NotFound", "NatGatewayNotFound",
    "InvalidSubnetID.NotFound", "InvalidRouteTableID.NotFound",
})
BUSY_CODES = frozenset({
    "DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidGroup.InUse",
    "InvalidNetworkInterface.InUse", "VolumeInUse", "IncorrectState",
})
AUTH_CODES = frozenset({
    "AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "OptInRequired", "UnrecognizedClientException",
    "AccessDenied", "AccessDeniedException", "Blocked", "PendingVerification",
})
QUOTA_CODES = frozenset({
    "VcpuLimitExceeded", "InstanceLimitExceeded", "AddressLimitExceeded",
    "MaxSpotInstanceCountExceeded", "PlacementGroupLimitExceeded",
    "SecurityGroupLimitExceeded", "RulesPerSecurityGroupLimitExceeded", "KeyPairLimitExceeded",
    "NatGatewayLimitExceeded", "SubnetLimitExceeded", "RouteTableLimitExceeded",
})
INPUT_CODES = frozenset({
    "InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable",
    "InvalidInstanceType", "InvalidParameterValue", "InvalidParameterCombination",
    "InvalidParameter", "MissingParameter", "ParameterNotFound",
    "InvalidKeyPair.Duplicate", "InvalidGroup.Duplicate", "InvalidPlacementGroup.Duplicate",
})


class UnexpectedAnswer(Exception):
    """EC2 answered, but not with what the operation returns (e.g. an HTML error page that
    botocore parsed into an empty result). Raised by api.Ec2; never leaves the aws package."""

    def __init__(self, operation: str, missing: str) -> None:
        super().__init__(f"{operation}: the answer has no {missing!r}")
        self.operation, self.missing = operation, missing


def is_unparseable(exc: BaseException) -> bool:
    """An answer that is not an EC2 response (classified by exception type)."""
    if isinstance(exc, UnexpectedAnswer):
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "ResponseMetadata" in response:
        code = error_code(exc)
        # No code, or botocore's generic one (the HTTP status as the code: an HTML or empty
        # error body): not an EC2 error answer.
        if code is None or code.isdigit():
            return True
    try:
        from botocore.parsers import ResponseParserError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, ResponseParserError)


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (None for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code else None


def http_status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def is_transient(exc: BaseException) -> bool:
    """Throttling, 5xx and connection failures: safe to retry in place (all our writes are
    idempotent or ClientToken'ed). Capacity errors are NOT transient even when EC2 sends
    them with HTTP 500: failover decides what to do with them."""
    if is_unparseable(exc):
        return True  # a proxy's error page is usually gone on the next try; bounded anyway
    code = error_code(exc)
    if code is not None:
        if code in CAPACITY_CODES:
            return False
        return code in THROTTLE_CODES or code in SERVER_CODES or http_status(exc) >= 500
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, BotoConnectionError)


def is_capacity(exc: BaseException) -> bool:
    return error_code(exc) in CAPACITY_CODES


def is_not_found(exc: BaseException) -> bool:
    return error_code(exc) in NOT_FOUND_CODES


def describe(exc: BaseException) -> str:
    """'Code: message' of a ClientError, or the exception's text."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        if not err.get("Code") or str(err["Code"]).isdigit():
            return f"HTTP {http_status(exc)} without an EC2 error code"
        return f"{err.get('Code', '?')}: {err.get('Message', '')}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"


def translate(exc: BaseException, action: str, *, planning: bool) -> MgpuError:
    """One botocore exception -> the MgpuError the CLI shows."""
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ProviderUnavailableError(
            f"{action}: no usable AWS credentials ({exc})",
            hint="configure them the usual way (aws configure, AWS_PROFILE, aws sso login, "
            "or environment variables); mgpu-cloud never stores credentials",
        )
    if isinstance(exc, NoRegionError):
        return UserInputError(f"{action}: no AWS region", hint="pass --region, e.g. us-east-1")
    if is_unparseable(exc):
        return ProviderUnavailableError(
            f"{action}: AWS sent an answer that is not an EC2 response ({exc})",
            hint="a proxy or firewall between you and AWS may be answering instead (check "
            "HTTPS_PROXY and the endpoint); the request is safe to repeat",
        )
    code = error_code(exc)
    text = describe(exc)
    if code in AUTH_CODES:
        return ProviderUnavailableError(
            f"{action}: AWS refused the request ({text})",
            hint="check the credentials boto3 finds (aws sts get-caller-identity) and their "
            "EC2 permissions",
        )
    if code in CAPACITY_CODES:
        return CapacityError(f"{action}: no capacity ({text})")
    if code in QUOTA_CODES:
        return ProvisionError(
            f"{action}: an AWS quota is too low ({text})",
            hint="request an increase in the Service Quotas console (e.g. 'Running On-Demand "
            "P instances' counts vCPUs), or ask for fewer nodes",
        )
    if code in INPUT_CODES and planning:
        return UserInputError(f"{action}: {text}")
    return ProvisionError(f"{action}: {text}")


@contextlib.contextmanager
def map_errors(action: str, *, planning: bool = False) -> Iterator[None]:
    """Translate botocore exceptions raised inside into MgpuErrors (MgpuErrors pass)."""
    try:
        yield
    except MgpuError:
        raise
    except Exception as exc:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError | BotoCoreError) or is_unparseable(exc):
            raise translate(exc, action, planning=planning) from exc
        raise
