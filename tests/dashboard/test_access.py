"""Who may use the dashboard, against the real `mgpu-cloud dashboard` on 127.0.0.1: a second
local user (a plain HTTP client with no cookie and no token, as anyone else logged in to a
shared login node would be) is refused everywhere; the printed address gives the owner the
cookie and a clean same-site redirect; no request sends the browser off-site."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urljoin, urlsplit

import pytest
from conftest import Served, serve
from dash_synthetic import make_big_cluster

OTHERS = ["/", "/cost", "/clusters/big", "/clusters/big/jobs/1", "/api/clusters",
          "/api/clusters/big", "/api/clusters/big/monitor", "/api/clusters/big/jobs/1",
          "/api/clusters/big/jobs/1/log?node=node-0", "/api/cost", "/api/health",
          "/clusters/big?format=json", "/static/dashboard.js"]
BUTTONS = ["/api/clusters/big/jobs/3/cancel", "/api/clusters/big/down"]


def started(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("dash-access-home")
    make_big_cluster(home, nodes=2)
    served = serve(home, *args)
    try:
        assert served.token, f"no ?token= in the printed address {served.url}"
        yield served
    finally:
        served.stop()
        assert "Traceback" not in served.stderr, served.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from started(tmp_path_factory)


@pytest.fixture(scope="module")
def site_any(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Bound to every address (`--host 0.0.0.0`), reached here on 127.0.0.1."""
    yield from started(tmp_path_factory, "--host", "0.0.0.0")  # noqa: S104 - under test


def raw(port: int, target: str, method: str = "GET", headers: dict[str, str] | None = None,
        host: str | None = None) -> tuple[int, dict[str, str], str]:
    """One request with exactly this request-target (no client normalising it), as a
    hostile local program would send it."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}",
             "Connection: close", "Content-Length: 0"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        body = resp.read().decode(errors="replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def same_site(location: str, base: str) -> bool:
    """Whether a browser following `location` from `base` stays on base's host and port.
    Browsers read a backslash as a slash and drop tabs and newlines, so this does too."""
    cleaned = location.replace("\\", "/").replace("\t", "").replace("\n", "").replace("\r", "")
    if not cleaned.startswith("/") or cleaned.startswith("//"):
        return False
    return urlsplit(urljoin(base + "/", cleaned)).netloc == urlsplit(base).netloc


def test_a_second_local_user_is_refused_everywhere(site: Served) -> None:
    """No token, no cookie: every page, JSON view, log stream and static file is 401."""
    for path in OTHERS:
        status, headers, body = raw(site.port, path)
        assert status == 401, (path, status, body[:200])
        assert "mgpu-cloud dashboard" in body and "token" in body, path
        assert headers["www-authenticate"] == 'Bearer realm="mgpu-cloud-dashboard"'
        assert "node-0" not in body and "train.py" not in body, "nothing of the state leaks"


OTHER_USER = """
import sys, urllib.error, urllib.request
base, = sys.argv[1:]
for path, data in [("/api/clusters/big/jobs/1/log?node=node-0", None), ("/clusters/big", None),
                   ("/api/clusters/big/jobs/3/cancel", b"")]:
    try:
        urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=30)
        print(path, 200)
    except urllib.error.HTTPError as err:
        print(path, err.code)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="becoming another user needs root and setpriv")
def test_another_unix_user_on_this_machine_is_refused(site: Served) -> None:
    """The threat itself: uid 65534 (nobody) on the same machine, reading a log, a page and
    pressing Cancel, with the system's Python."""
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "/usr/bin/python3", "-c", OTHER_USER, site.base],
                         capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.split() == ["/api/clusters/big/jobs/1/log?node=node-0", "401",
                                  "/clusters/big", "401", "/api/clusters/big/jobs/3/cancel",
                                  "401"], res.stdout + res.stderr


def test_a_second_local_user_cannot_press_the_buttons(site: Served) -> None:
    """Even with a CSRF header it guessed or read somewhere: the token comes first."""
    for path in BUTTONS:
        for headers in ({}, {"X-CSRF-Token": "guess"}):
            status, _, body = raw(site.port, path, "POST", headers)
            assert status == 401, (path, headers, body[:200])
    token = site.token
    # the job is still recorded as running, and the cluster is still there
    status, _, body = raw(site.port, "/api/clusters/big/jobs/3",
                          headers={"Authorization": f"Bearer {token}"})
    assert status == 200 and '"state":"running"' in body.replace(" ", "")


def test_the_printed_address_gives_the_cookie_and_a_clean_redirect(site: Served) -> None:
    assert site.url.startswith("http://127.0.0.1:") and "?token=" in site.url
    token = site.token
    status, headers, _ = raw(site.port, f"/clusters/big?format=json&token={token}")
    assert status == 303 and headers["location"] == "/clusters/big?format=json"
    cookie = headers["set-cookie"]
    name_value = cookie.split(";")[0]
    assert name_value.endswith(f"={token}") and f"_{site.port}=" in name_value, cookie
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    status, _, body = raw(site.port, "/clusters/big", headers={"Cookie": name_value})
    assert status == 200 and 'data-node="node-1"' in body
    assert raw(site.port, "/api/clusters", headers={"Authorization": f"Bearer {token}"})[0] \
        == 200


@pytest.mark.parametrize("target", [
    "//evil.example/?token={t}", "//evil.example?token={t}", "///evil.example/?token={t}",
    "/\\evil.example?token={t}", "/\\/evil.example/?token={t}", "\\\\evil.example/?token={t}",
    "/%2F%2Fevil.example/?token={t}", "/%5Cevil.example?token={t}",
    "/%09/evil.example?token={t}", "/%0A/evil.example?token={t}",
    "http://evil.example/?token={t}", "https://evil.example/x?token={t}",
    "/https://evil.example/?token={t}", "/?token={t}&next=//evil.example",
])
@pytest.mark.parametrize("bound", ["site", "site_any"])
def test_the_token_redirect_never_leaves_the_site(request: pytest.FixtureRequest, target: str,
                                                  bound: str) -> None:
    site: Served = request.getfixturevalue(bound)
    status, headers, body = raw(site.port, target.format(t=site.token))
    assert status == 303, (status, body[:200])
    assert same_site(headers["location"], site.base), headers["location"]
    assert site.token not in headers["location"]


def test_a_wrong_token_is_refused_and_gives_no_cookie(site: Served) -> None:
    token = site.token
    for target, headers in [(f"/?token={token[:-1]}", {}), ("/?token=", {}),
                            (f"/?token={token}x", {}),
                            ("/api/clusters", {"Authorization": "Bearer nope"}),
                            ("/api/clusters", {"Authorization": f"Basic {token}"}),
                            ("/api/clusters", {"Cookie": f"mgpu_dashboard_{site.port}=nope"}),
                            ("/api/clusters", {"Cookie": f"mgpu_dashboard={token}x"})]:
        status, got, body = raw(site.port, target, headers=headers)
        assert status == 401, (target, headers, status)
        assert "set-cookie" not in got and "location" not in got


def test_loopback_still_answers_loopback_names_only(site: Served) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends Host: evil.example,
    and is refused even with the token."""
    token = site.token
    bearer = {"Authorization": f"Bearer {token}"}
    assert raw(site.port, "/api/clusters", headers=bearer, host="evil.example")[0] == 400
    assert raw(site.port, f"/?token={token}", host=f"evil.example:{site.port}")[0] == 400
    assert raw(site.port, "/api/clusters", headers=bearer, host=f"localhost:{site.port}")[0] \
        == 200


def test_urllib_with_the_printed_address_reads_the_page(site: Served) -> None:
    """What a script does with the printed line: open it (redirect and cookie included)."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(site.url, timeout=30) as resp:  # noqa: S310 - our own server
        assert resp.status == 200 and resp.url == site.base + "/"
    with opener.open(site.base + "/api/clusters", timeout=30) as resp:  # noqa: S310
        assert resp.status == 200 and b'"big"' in resp.read()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(site.base + "/api/clusters", timeout=30)  # noqa: S310
    assert err.value.code == 401
