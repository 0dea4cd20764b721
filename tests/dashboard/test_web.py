"""The dashboard's pages and JSON in-process (Starlette's TestClient) on synthetic state: every
page and its twin, 404s with a link back, nodes that do not answer, and who may do what."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser import wait_for
from conftest import BASE, CSRF, TOKEN, make_client
from dash_synthetic import make_big_cluster, make_removed_cluster

from provision.operations.dashboard import web

PAGES = {"/": "/api/clusters", "/clusters/big": "/api/clusters/big",
         "/clusters/big/jobs/1": "/api/clusters/big/jobs/1", "/cost": "/api/cost",
         "/clusters/old-run": "/api/clusters/old-run",
         "/clusters/old-run/jobs/1": "/api/clusters/old-run/jobs/1"}


@pytest.fixture
def state(mgpu_home: Path) -> Path:
    make_big_cluster(mgpu_home)
    make_removed_cluster(mgpu_home)
    return mgpu_home


def test_every_page_renders_and_has_a_json_twin(client: Any, state: Path) -> None:
    for page, api in PAGES.items():
        html = client.get(page)
        assert html.status_code == 200, (page, html.text[-500:])
        assert html.headers["content-type"].startswith("text/html")
        twin = client.get(api).json()
        assert client.get(page, params={"format": "json"}).json().keys() == twin.keys()
    assert client.get("/api/cost").json()["total_usd"] > 0
    job = wait_for(lambda: (j := client.get("/api/clusters/big/jobs/1").json())["metrics"]
                   and j, 30, "the saved logs read (on a thread of the dashboard)")
    assert job["job"]["state"] == "succeeded" and job["logs"]["source"] == "saved"
    assert job["metrics"]["loss"]["node"] == "node-0" and len(job["metrics"]["loss"]["x"]) == 20
    from provision.job.managed.client import remember

    remember("big", "ftp://nowhere")  # a managed-runs store that cannot be read
    page = client.get("/clusters/big").text
    assert 'id="runs"' in page and "could not be read" in page
    assert page.count('<tr data-node="') == 64 and 'id="gate-matrix"' in page
    assert 'id="spares"' in page and "node-64" in page  # the warm spare, not a rank row
    job_page = client.get("/clusters/big/jobs/1").text
    assert 'id="job-ledger"' in job_page and '<tr data-bucket="spare, idle">' in job_page
    buckets = {b["bucket"]: b for b in job["job"]["ledger"]}
    assert buckets["spare, idle"]["node_hours"] == round(5100 / 3600, 4), buckets
    assert "/static/vendor/uPlot.iife.min.js" in page
    assert client.get("/static/vendor/uPlot.iife.min.js").status_code == 200


def test_saved_logs_page_through_by_line_number(client: Any, state: Path) -> None:
    first = wait_for(lambda: (r := client.get("/api/clusters/big/jobs/1/log",
                                              params={"node": "node-0"}).json())["done"] and r,
                     30, "node-0's saved log read")
    assert first["source"] == "saved" and first["from"] == 0
    assert first["lines"][1] == "step 0 loss 2.0100"
    rest = client.get("/api/clusters/big/jobs/1/log",
                      params={"node": "node-0", "from": first["next"] - 2}).json()
    assert rest["lines"][-1].startswith("throughput: samples/s=")
    default = client.get("/api/clusters/big/jobs/1/log").json()
    assert default["node"] == "node-0", "rank 0 when no node is named"
    gone = client.get("/api/clusters/old-run/jobs/1/log").json()
    assert gone["source"] == "missing" and "not copied" in gone["error"]


@pytest.mark.parametrize(("url", "message", "back"), [
    ("/clusters/nope", "no cluster named &#39;nope&#39;", 'href="/"'),
    ("/clusters/big/jobs/99", "has no job &#39;99&#39;", 'href="/clusters/big"'),
    ("/clusters/big/jobs/abc", "has no job &#39;abc&#39;", 'href="/clusters/big"'),
    ("/clusters/Bad_Name!", "is not a cluster name", 'href="/"'),
    ("/no/such/page", "nothing here", 'href="/"'),
    ("/api/clusters/big/jobs/1/log?node=node-99", "did not run on a node named",
     'href="/clusters/big/jobs/1"'),
])
def test_unknown_addresses_are_404_pages_with_a_way_back(client: Any, state: Path, url: str,
                                                         message: str, back: str) -> None:
    res = client.get(url, headers={"accept": "text/html"})
    assert res.status_code == 404
    if url.startswith("/api/"):
        assert "did not run on a node named 'node-99'" in res.json()["error"]
        return
    assert message in res.text and back in res.text and "Traceback" not in res.text


def test_a_failing_page_is_an_error_page_not_a_traceback(client: Any, state: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(home: Path | None = None) -> dict[str, Any]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(web, "clusters_view", broken)
    res = client.get("/")
    assert res.status_code == 500 and "disk on fire" in res.text
    assert "Traceback" not in res.text and 'href="/"' in res.text


def test_nodes_that_do_not_answer_say_so(client: Any, state: Path) -> None:
    """64 nodes that refuse connections: every one is listed, with why (never a blank)."""
    def all_silent() -> dict[str, Any] | None:
        d = client.get("/api/clusters/big/monitor").json()
        ok = len(d["nodes"]) == 64 and all("Connection refused" in n.get("error", "")
                                           for n in d["nodes"])
        return d if ok else None

    d = wait_for(all_silent, 60, "all 64 nodes reported as not answering")
    assert all(n["error"].startswith("not answering: ") for n in d["nodes"])
    assert d["series"]["nodes"][63] == "node-63" and d["series"]["util"][0] == []
    log = wait_for(lambda: (r := client.get("/api/clusters/big/jobs/3/log").json())["error"]
                   and r, 60, "the running job's log to say its node does not answer")
    assert log["source"] == "live" and log["error"].startswith("not answering")


def test_a_removed_cluster_has_no_buttons_that_work(client: Any, state: Path) -> None:
    headers = {"X-CSRF-Token": CSRF}
    res = client.post("/api/clusters/old-run/jobs/1/cancel", headers=headers)
    assert res.status_code == 409 and "no cluster named 'old-run'" in res.json()["error"]
    res = client.post("/api/clusters/old-run/down", headers=headers)
    assert res.status_code == 409 and "removed already" in res.json()["error"]
    assert client.post("/api/clusters/nope/down", headers=headers).status_code == 404


def test_buttons_need_the_pages_token_and_origin(client: Any, state: Path) -> None:
    url = "/api/clusters/big/jobs/3/cancel"
    assert client.post(url).status_code == 403
    assert client.post(url, headers={"X-CSRF-Token": "guess"}).status_code == 403
    evil = client.post(url, headers={"X-CSRF-Token": CSRF, "Origin": "http://evil.example"})
    assert evil.status_code == 403 and "cross-site" in evil.json()["error"]


def test_a_script_with_the_bearer_token_needs_no_csrf_but_a_right_origin(state: Path) -> None:
    """A browser never adds `Authorization` by itself, so a bearer request is no CSRF; a page
    of another site still cannot send one as ours (Origin)."""
    c = make_client(state, login=False)
    try:
        url, bearer = "/api/clusters/old-run/down", {"Authorization": f"Bearer {TOKEN}"}
        assert c.post(url).status_code == 401
        assert c.post(url, headers={"X-CSRF-Token": CSRF}).status_code == 401
        res = c.post(url, headers=bearer)
        assert res.status_code == 409 and "removed already" in res.json()["error"]
        evil = c.post(url, headers={**bearer, "Origin": "http://evil.example"})
        assert evil.status_code == 403 and "cross-site" in evil.json()["error"]
    finally:
        c.dash.live.close()


def test_loopback_only_answers_loopback_names(client: Any, state: Path) -> None:
    assert client.get("/", headers={"host": "evil.example:8765"}).status_code == 400
    assert client.get("/", headers={"host": "localhost:8765"}).status_code == 200
    assert client.get("/", headers={"host": "[::1]:8765"}).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])  # noqa: S104 - what --host allows
def test_every_request_needs_the_token(state: Path, host: str) -> None:
    c = make_client(state, token="s3cret", host=host, login=False)
    try:
        for url in [*PAGES, *PAGES.values(), "/api/health", "/static/dashboard.js"]:
            res = c.get(url)
            assert res.status_code == 401 and "?token=" in res.text, url
            assert res.headers["www-authenticate"] == 'Bearer realm="mgpu-cloud-dashboard"'
        assert c.get("/", headers={"authorization": "Bearer nope"}).status_code == 401
        assert c.get("/?token=nope", follow_redirects=False).status_code == 401
        assert "set-cookie" not in c.get("/?token=nope", follow_redirects=False).headers
        assert c.get("/api/clusters", headers={"authorization": "Bearer s3cret"}).status_code \
            == 200
        res = c.get("/clusters/big?token=s3cret", follow_redirects=False)
        assert res.status_code == 303 and res.headers["location"] == "/clusters/big"
        cookie = res.headers["set-cookie"].lower()
        assert "mgpu_dashboard_8765=s3cret" in cookie and "httponly" in cookie
        assert "samesite=strict" in cookie
        assert c.get("/clusters/big").status_code == 200, "the cookie now stands for the token"
    finally:
        c.dash.live.close()


@pytest.mark.parametrize(("path", "location"), [
    ("/clusters/big?format=json&token=T", "/clusters/big?format=json"),
    ("//evil.example/?token=T", "/evil.example/"),
    ("///evil.example?token=T&a=1", "/evil.example?a=1"),
    ("/%5Cevil.example?token=T", "/evil.example"),
    ("/%5C/evil.example?token=T", "/evil.example"),
    ("/%09/evil.example?token=T", "/%09/evil.example"),
    ("/%2F%2Fevil.example?token=T", "/evil.example"),
    ("/a%5Cb?token=T", "/a%5Cb"),
    ("/?token=T&next=//evil.example", "/?next=%2F%2Fevil.example"),
])
def test_the_token_redirect_stays_on_this_site(state: Path, path: str, location: str) -> None:
    c = make_client(state, token="T", login=False)
    try:
        res = c.get(BASE + path, follow_redirects=False)
        assert res.status_code == 303 and res.headers["location"] == location
    finally:
        c.dash.live.close()


def test_followed_from_another_site_the_token_page_moves_on_by_itself(state: Path) -> None:
    """`--open` opens a file:// page that goes to the printed address: a browser would not
    send the Strict cookie on a 303 it follows from there, so the answer is a page that
    refreshes to the same place (on this site) itself."""
    c = make_client(state, token="T", login=False)
    try:
        res = c.get(BASE + "//evil.example/?token=T", headers={"sec-fetch-site": "cross-site"},
                    follow_redirects=False)
        assert res.status_code == 200 and "set-cookie" in res.headers
        assert '<meta http-equiv="refresh" content="0;url=/evil.example/">' in res.text
    finally:
        c.dash.live.close()


def test_the_cluster_page_shows_the_bring_up_timeline(client: Any, state: Path) -> None:
    from provision.model import timeline
    from provision.model.inventory import InventoryStore

    store = InventoryStore()
    assert "Not recorded for this cluster." in client.get("/clusters/big").text
    inv = store.load("big")
    tl = timeline.begin(inv, "up", timeline.Timeline(command="up", started_at=1000.0))
    tl.add("plan", since=1000.0, at=1000.5)
    tl.add("create call", since=1000.5, at=1040.5)
    tl.add("nodes running", since=1000.5, at=1030.5, part_of="create call", detail="64 node(s)")
    tl.add("bootstrap", since=1040.5, at=1060.5)
    store.save(inv)
    page = client.get("/clusters/big").text
    assert "Not recorded for this cluster." not in page
    for label in ("plan", "create call", "create call: nodes running", "bootstrap"):
        assert f'<span class="gantt-label">{label}</span>' in page
    assert 'title="64 node(s)"' in page and "40.0 s" in page
    phases = client.get("/api/clusters/big").json()["bringup"]
    assert phases[3] == {"phase": "bootstrap", "start_s": 40.5, "seconds": 20.0, "detail": ""}
