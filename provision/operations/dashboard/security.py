"""Who may look and who may press a button.

- Bound to a loopback address (the default, 127.0.0.1): only requests whose Host header names
  a loopback address are answered, so a web page elsewhere cannot reach the dashboard through
  DNS rebinding.
- Bound elsewhere (`--host`): every request needs the token printed at start, once as
  `?token=...` (then kept in an HttpOnly, SameSite=Strict cookie) or as `Authorization:
  Bearer ...` for scripts.
- A POST (the cancel and down buttons) needs the page's CSRF token in `X-CSRF-Token`, and an
  Origin header, when sent, naming this server: another site's page cannot press a button.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

COOKIE = "mgpu_dashboard"
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """'127.0.0.1:8765' -> '127.0.0.1'; '[::1]:80' -> '::1'."""
    return urlsplit(f"//{header}").hostname or ""


@dataclass(frozen=True)
class Access:
    """host: the address the server is bound to; token: required on every request (None
    when bound to loopback); csrf: required on every POST."""

    host: str
    token: str | None
    csrf: str

    def host_allowed(self, header_host: str) -> bool:
        if self.token is not None:
            return True  # reachable under any name; the token guards it
        return is_loopback(host_of(header_host))


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


class AccessMiddleware(BaseHTTPMiddleware):
    def __init__(self, app: object, access: Access) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.access = access

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        acc = self.access
        host_header = request.headers.get("host", "")
        if not acc.host_allowed(host_header):
            return PlainTextResponse(f"this dashboard answers on {acc.host} only", 400)
        if acc.token is not None:
            given = request.query_params.get("token")
            if _same(given, acc.token):
                clean = request.url.remove_query_params("token")
                resp: Response = RedirectResponse(str(clean.path) + (
                    f"?{clean.query}" if clean.query else ""), 303)
                resp.set_cookie(COOKIE, acc.token, httponly=True, samesite="strict")
                return resp
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not (_same(request.cookies.get(COOKIE), acc.token) or _same(bearer, acc.token)):
                return PlainTextResponse(
                    "this dashboard needs its token: open the address `mgpu-cloud dashboard` "
                    "printed (it ends in ?token=...)", 401)
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if origin is not None and urlsplit(origin).netloc != host_header:
                return JSONResponse({"error": "cross-site request refused"}, 403)
            if not _same(request.headers.get("x-csrf-token"), acc.csrf):
                return JSONResponse({"error": "missing or wrong X-CSRF-Token: press the "
                                              "button on the dashboard's page"}, 403)
        return await call_next(request)
