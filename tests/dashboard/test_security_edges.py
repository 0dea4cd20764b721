"""Issue 42 (the mutation run): the dashboard's access rules (security.py) at their edges,
in-process: only the Bearer scheme carries the token, a 401 alone asks for it
(WWW-Authenticate), HEAD is a read like GET, and each refusal says what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import TOKEN, make_client


def test_only_the_bearer_scheme_carries_the_token(mgpu_home: Path) -> None:
    c = make_client(mgpu_home, login=False)
    try:
        assert c.get("/api/health", headers={"authorization": f"Bearer {TOKEN}"}
                     ).status_code == 200
        for scheme in ("Basic", "Token", "bearerx"):
            res = c.get("/api/health", headers={"authorization": f"{scheme} {TOKEN}"})
            assert res.status_code == 401, scheme
        wrong = c.get("/api/health?token=nope", follow_redirects=False)
        assert "wrong token (each start of the dashboard makes a new one): " in wrong.text
    finally:
        c.dash.live.close()


def test_a_403_does_not_ask_for_the_token_and_says_what_to_do(client: Any) -> None:
    res = client.post("/api/clusters/big/jobs/3/cancel")
    assert res.status_code == 403 and "www-authenticate" not in res.headers
    assert res.json()["error"] == ("missing or wrong X-CSRF-Token: press the button on the "
                                   "dashboard's page")
    evil = client.post("/api/clusters/big/jobs/3/cancel",
                       headers={"X-CSRF-Token": client.dash.access.csrf,
                                "Origin": "http://evil.example"})
    assert evil.json()["error"] == "cross-site request refused"
    host = client.get("/", headers={"host": "evil.example:8765"})
    assert host.status_code == 400 and host.text == "this dashboard answers on 127.0.0.1 only"


def test_head_is_a_read_like_get(client: Any) -> None:
    assert client.head("/api/health").status_code == 200  # no CSRF token asked


def test_a_same_site_location_keeps_every_character_past_its_slashes() -> None:
    """Only slashes and backslashes are taken off the front (a path starting with `X`, the
    letter mutmut pads strings with, keeps it)."""
    from provision.operations.dashboard.security import same_site_path

    assert same_site_path("/Xpage", []) == "/Xpage"
    assert same_site_path("//\\\\Xpage/a b", [("k", "v")]) == "/Xpage/a%20b?k=v"


def test_a_post_whose_origin_is_this_server_is_taken(client: Any) -> None:
    """The Origin check compares the origin's host:port with the Host header: this server's
    own origin is handed on exactly as a POST without one (another site's is refused)."""
    csrf = {"X-CSRF-Token": client.dash.access.csrf}
    plain = client.post("/api/clusters/big/jobs/3/cancel", headers=csrf)
    own = client.post("/api/clusters/big/jobs/3/cancel",
                      headers={**csrf, "Origin": f"http://{client.base_url.netloc.decode()}"})
    assert plain.status_code != 403 and own.status_code == plain.status_code
    assert own.json() == plain.json()
