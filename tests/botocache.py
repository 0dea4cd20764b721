"""Two per-process caches for the tests' in-process AWS (moto), which rebuild the same thing on
every call. Neither changes what a client or moto does; they only stop the rebuilding:

- botocore builds a new client *class* on every `session.client(...)`: one method per operation
  of the service (EC2: ~750) and its docstrings, ~23 ms each time (botocore/client.py
  `ClientCreator._create_client_class`). The product makes a fresh session per provider, as it
  should, and the AWS tests make ~1,100 clients: a class per (service, API version) is kept here.
  The class depends on nothing else but the handlers of `creating-client-class.<service>`,
  which botocore and boto3 register alike in every session (botocore/handlers.py: the
  presigned URL methods; boto3/session.py: the S3 transfer methods). The cache keys on them,
  and steps aside when a handler from elsewhere is registered there.
- moto looks up a response class's methods with `inspect.getmembers` on every request it
  answers (moto/core/responses.py `call_action` -> `method_names_from_class`), ~1 ms each:
  the list of a class's functions is kept per class.

In the AWS unit tests the two were ~20% of their CPU (cProfile of tests/providers/aws).
"""

from __future__ import annotations

import functools
from typing import Any


def install() -> None:
    """Idempotent: the first call patches; later calls find the patches in place."""
    import botocore.client
    import moto.core.responses

    creator = botocore.client.ClientCreator
    if not getattr(creator._create_client_class, "_mgpu_cached", False):
        creator._create_client_class = _cached_class(creator._create_client_class)
    names = moto.core.responses.method_names_from_class
    if not hasattr(names, "cache_info"):
        moto.core.responses.method_names_from_class = functools.cache(names)


def _handlers(creator: Any, service_model: Any) -> tuple[str, ...]:
    """The full names of what `creating-client-class.<service>` runs in this session."""
    event = f"creating-client-class.{service_model.service_id.hyphenize()}"
    emitter = getattr(creator._event_emitter, "_emitter", creator._event_emitter)
    return tuple(_name(h) for h in emitter._handlers.prefix_search(event))


def _name(handler: Any) -> str:
    if getattr(handler, "__qualname__", "") == "lazy_call.<locals>._handler":  # boto3's
        cells = [c.cell_contents for c in handler.__closure__ or ()]
        return next((c for c in cells if isinstance(c, str)), repr(handler))
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def _cached_class(build: Any) -> Any:
    classes: dict[tuple[str, str, tuple[str, ...]], Any] = {}

    @functools.wraps(build)
    def create_client_class(self: Any, service_name: str, service_model: Any) -> Any:
        handlers = _handlers(self, service_model)
        if not all(h.startswith(("botocore.", "boto3.")) for h in handlers):  # not theirs
            return build(self, service_name, service_model)
        key = (service_name, service_model.api_version, handlers)
        if key not in classes:
            classes[key] = build(self, service_name, service_model)
        return classes[key]

    create_client_class._mgpu_cached = True  # type: ignore[attr-defined]
    return create_client_class
