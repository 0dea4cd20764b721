"""Who may look and who may press a button.

The dashboard shows every log and runs `cancel` and `down` with its owner's credentials, so
it answers its owner only, wherever it listens (on 127.0.0.1 too: on a shared login node or a
Slurm front end every local user can connect to loopback).

- Every request needs the random token made at start (`secrets.token_urlsafe(24)`, new on
  each start, never written to disk): the address `mgpu-cloud dashboard` prints (and opens
  with `--open`) carries it as `?token=...`; that request is answered with an HttpOnly,
  SameSite=Strict, Path=/, host-only session cookie (named after the port: cookies are not
  port-scoped, so two dashboards on one host keep theirs; docs/security.md says what remains)
  and a 303 to the same page without the token. Scripts send `Authorization: Bearer TOKEN`.
  Without it: 401 with `WWW-Authenticate: Bearer realm="mgpu-cloud-dashboard"` (how a second
  `dashboard` on the same port knows one runs there), for pages, JSON, logs, static files
  and the buttons alike.
- The redirect after `?token=` is always a relative path on this site: the request's path
  with its leading slashes and backslashes collapsed to one `/` and the rest percent-encoded
  (`//evil.example/`, `/\\evil.example`, `http://evil.example/` in the request line: all
  stay here).
- Bound to a loopback address (the default, 127.0.0.1): only requests whose Host header names
  a loopback address are answered, so a web page elsewhere cannot reach the dashboard through
  DNS rebinding. Bound elsewhere (`--host`): any Host; the token guards it.
- A POST (the cancel and down buttons) made with the cookie needs the page's CSRF token in
  `X-CSRF-Token`; any POST whose Origin header is sent must name this server: another site's
  page cannot press a button. A script's `Authorization: Bearer` is no ambient credential (a
  browser never adds it by itself), so it needs no CSRF token.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

COOKIE = "mgpu_dashboard"
REALM = "mgpu-cloud-dashboard"
LOOPBACK_NAMES = ("localhost",)
NEEDS_TOKEN = ("this mgpu-cloud dashboard answers its owner only: open the address "
               "`mgpu-cloud dashboard` printed (it ends in ?token=...), or send "
               "`Authorization: Bearer TOKEN`")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """'127.0.0.1:8765' -> '127.0.0.1'; '[::1]:80' -> '::1'."""
    try:
        return urlsplit(f"//{header}").hostname or ""
    except ValueError:  # '[' without its ']'
        return ""


def same_site_path(path: str, query: list[tuple[str, str]]) -> str:
    """A Location that stays on this site: one `/`, then the path without its leading
    slashes and backslashes, percent-encoded (a browser reads `\\` as `/` and drops tabs and
    newlines; encoded, neither can make a second leading slash), then the query."""
    rest = quote(path.lstrip("/\\"), safe="/")
    return "/" + rest + (f"?{urlencode(query)}" if query else "")


@dataclass(frozen=True)
class Access:
    """host: the address the server is bound to; token: required on every request;
    csrf: required on every POST made with the cookie; port: names the cookie."""

    host: str
    token: str
    csrf: str
    port: int = 0

    @property
    def cookie(self) -> str:
        return f"{COOKIE}_{self.port}"

    def host_allowed(self, header_host: str) -> bool:
        if not is_loopback(self.host):
            return True  # reachable under any name; the token guards it
        return is_loopback(host_of(header_host))


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def refused(request: Request, status: int, message: str) -> Response:
    """401/403 for a caller that may not: JSON for /api/, text for pages."""
    headers = {"WWW-Authenticate": f'Bearer realm="{REALM}"'} if status == 401 else None
    if str(request.scope["path"]).startswith("/api/"):
        return JSONResponse({"error": message}, status, headers=headers)
    return PlainTextResponse(message, status, headers=headers)


class AccessMiddleware(BaseHTTPMiddleware):
    def __init__(self, app: object, access: Access) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.access = access

    def _token_login(self, request: Request) -> Response:
        """The printed address: a wrong token is refused; the right one gives the cookie and
        a redirect to the same page without it."""
        if not _same(request.query_params.get("token"), self.access.token):
            return refused(request, 401, "wrong token (each start of the dashboard makes a "
                                         "new one): " + NEEDS_TOKEN)
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        where = same_site_path(request.scope["path"], query)
        resp: Response = RedirectResponse(where, 303)
        if request.headers.get("sec-fetch-site") == "cross-site":
            # Followed from another site (`--open`'s file:// page): a browser sends no Strict
            # cookie on a redirect it follows from there, so this page moves on by itself.
            resp = HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="0;url='
                                f'{html.escape(where)}"><a href="{html.escape(where)}">'
                                f'continue</a>\n')
        # As tight as a browser allows (RFC 6265bis): no Domain (this host only, not its
        # subdomains), Path=/ (every page is the dashboard's), a session cookie (gone with
        # the browser; each start has a new token anyway), HttpOnly, SameSite=Strict. A
        # cookie is not port-scoped (RFC 6265 section 8.5): the port is in its NAME, so two
        # dashboards keep theirs. `__Host-` and Secure need https, which it does not serve.
        resp.set_cookie(self.access.cookie, self.access.token, path="/", domain=None,
                        max_age=None, expires=None, secure=False, httponly=True,
                        samesite="strict")
        return resp

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        acc = self.access
        host_header = request.headers.get("host", "")
        if not acc.host_allowed(host_header):
            return PlainTextResponse(f"this dashboard answers on {acc.host} only", 400)
        get = request.method in ("GET", "HEAD")
        if get and "token" in request.query_params:
            return self._token_login(request)
        by_bearer = _same(_bearer(request), acc.token)
        if not (by_bearer or _same(request.cookies.get(acc.cookie), acc.token)):
            return refused(request, 401, NEEDS_TOKEN)
        if not get:
            origin = request.headers.get("origin")
            if origin is not None and urlsplit(origin).netloc != host_header:
                return refused(request, 403, "cross-site request refused")
            if not by_bearer and not _same(request.headers.get("x-csrf-token"), acc.csrf):
                return refused(request, 403, "missing or wrong X-CSRF-Token: press the "
                                             "button on the dashboard's page")
        return await call_next(request)
