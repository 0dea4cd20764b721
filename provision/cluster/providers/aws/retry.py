"""Retry policies (tenacity), in one place.

- `transient(fn, ...)`: throttling / 5xx / connection errors are retried with exponential
  backoff and full jitter, a bounded number of times. Anything else (capacity errors included)
  is raised at once. botocore's own retries are switched off (clients.py) so this is the only
  retry layer and the number of API calls is predictable.
- `while_busy(fn, codes)`: eventual-consistency waits of teardown (a placement group still
  "in use", a security group with a DependencyViolation while ENIs detach).

Test seam (documented, public): `using(RetryPolicy(...))` swaps the policy for a block, e.g.
`using(NO_WAIT)` makes every wait zero so tests are fast and deterministic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from provision.cluster.providers.aws.errors import error_code, is_transient

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8  # transient errors: tries in all (first call included)
    backoff_initial_s: float = 0.5  # full-jitter exponential: random(0, min(max, init*2**n))
    backoff_max_s: float = 20.0
    busy_attempts: int = 90  # teardown: resource still in use
    busy_interval_s: float = 5.0
    poll_interval_s: float = 5.0  # waiting for instance states
    launch_timeout_s: float = 1200.0
    terminate_timeout_s: float = 1200.0


DEFAULT = RetryPolicy()
NO_WAIT = RetryPolicy(
    backoff_initial_s=0.0, backoff_max_s=0.0, busy_interval_s=0.0, poll_interval_s=0.0
)

_current: list[RetryPolicy] = [DEFAULT]


def policy() -> RetryPolicy:
    return _current[-1]


@contextlib.contextmanager
def using(new: RetryPolicy) -> Iterator[RetryPolicy]:
    """Use `new` inside the block (tests: `with using(NO_WAIT): ...`)."""
    _current.append(new)
    try:
        yield new
    finally:
        _current.remove(new)


def transient(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """fn(*args, **kwargs), retrying transient errors; re-raises the last error."""
    import tenacity

    p = policy()
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(p.attempts),
        wait=tenacity.wait_random_exponential(multiplier=p.backoff_initial_s, max=p.backoff_max_s),
        retry=tenacity.retry_if_exception(is_transient),
        reraise=True,
    )
    return retrying(fn, *args, **kwargs)


def while_busy(fn: Callable[[], T], codes: frozenset[str]) -> T:
    """fn(), retried at a fixed interval while it fails with one of `codes`."""
    import tenacity

    p = policy()
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(p.busy_attempts),
        wait=tenacity.wait_fixed(p.busy_interval_s),
        retry=tenacity.retry_if_exception(lambda exc: error_code(exc) in codes),
        reraise=True,
    )
    return retrying(fn)
