"""The dashboard's cookie, scoped as tightly as browsers allow (issue 42): host-only (no
Domain), Path=/, a session cookie, HttpOnly, SameSite=Strict, the port in its NAME (cookies
are not port-scoped, RFC 6265 section 8.5). Each attribute is read from the header as a
browser parses it, so dropping any of them fails here."""

from __future__ import annotations

from http.cookies import SimpleCookie
from pathlib import Path

from conftest import TOKEN, make_client


def test_the_cookie_is_host_only_session_httponly_strict_and_named_by_port(
        mgpu_home: Path) -> None:
    c = make_client(mgpu_home, login=False)
    try:
        res = c.get(f"/clusters?token={TOKEN}", follow_redirects=False)
        header = res.headers["set-cookie"]
        jar = SimpleCookie()
        jar.load(header)
        assert list(jar) == ["mgpu_dashboard_8765"], header
        morsel = jar["mgpu_dashboard_8765"]
        assert morsel.value == TOKEN
        assert morsel["path"] == "/" and morsel["domain"] == ""
        assert morsel["max-age"] == "" and morsel["expires"] == "", header  # session only
        assert morsel["httponly"] is True and morsel["samesite"].lower() == "strict", header
        attributes = {part.split("=")[0].strip().lower() for part in header.split(";")[1:]}
        assert attributes == {"path", "httponly", "samesite"}, header
        # another port's dashboard name does not stand for this one's
        c.cookies.clear()
        c.cookies.set("mgpu_dashboard_9999", TOKEN)
        assert c.get("/api/clusters").status_code == 401
        c.cookies.set("mgpu_dashboard_8765", TOKEN)
        assert c.get("/api/clusters").status_code == 200
    finally:
        c.dash.live.close()
