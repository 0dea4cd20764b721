"""The real pages in headless Chromium on synthetic state (no Docker): a 64-node cluster whose
nodes do not answer, its gate matrix, a finished job's charts and log, cost, and 404 pages.
Screenshots of each page go to the test's tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import browser_or_skip, js_errors, make_driver, screenshot, shot, wait_for
from conftest import Served, serve
from dash_synthetic import make_big_cluster, make_removed_cluster

pytestmark = pytest.mark.xdist_group("browser_synthetic")  # one site, one browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    browser_or_skip()
    home = tmp_path_factory.mktemp("dash-synthetic-home")
    make_big_cluster(home)
    make_big_cluster(home, "solo", nodes=1, provider="docker")
    make_removed_cluster(home)
    served = serve(home)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory, site: Served) -> Iterator[Any]:
    d = make_driver(tmp_path_factory.mktemp("chromium-profile"))
    try:
        d.get(site.url)  # the printed address: its cookie opens every page after it
        yield d
    finally:
        d.quit()


def count(driver: Any, css: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll({css!r}).length"))


def test_64_nodes_that_do_not_answer(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/clusters/big")
    assert count(driver, "#nodes tbody tr") == 64
    wait_for(lambda: count(driver, "#nodes td.status .pill.down") == 64, 90,
             "all 64 nodes shown as not answering")
    why = driver.execute_script(
        "return document.querySelector('#nodes tr[data-node=\"node-63\"] td.status').title")
    assert "Connection refused" in why
    assert "no node answers" in driver.find_element("id", "chart-util").text
    assert count(driver, "#gate-matrix tbody tr") == 64
    assert count(driver, "#gate-matrix td.slow") == 2  # node-1 <-> node-2, both halves
    assert "FAIL node-2 slow link" in driver.find_element("id", "gate").text
    assert js_errors(driver) == []
    shot(driver, tmp_path, "cluster-64-nodes")  # also in docs/dashboard/


def test_one_node_cluster(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/clusters/solo")
    assert count(driver, "#nodes tbody tr") == 1
    wait_for(lambda: count(driver, "#nodes td.status .pill.down") == 1, 60,
             "the node shown as not answering")
    assert count(driver, "#gate-matrix") == 0, "no pairs on one node"
    assert js_errors(driver) == []
    screenshot(driver, tmp_path / "cluster-1-node.png")


def test_finished_job_charts_and_log(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/clusters/big/jobs/1")
    points = wait_for(lambda: driver.execute_script(
        "return window.mgpuCharts.loss && window.mgpuCharts.loss.data[0].length"), 30,
        "the loss chart")
    assert points == 20
    assert "loss (node-0) · log scale" in driver.find_element("id", "metrics").text
    tile = driver.find_element("css selector", '[data-metric="samples/s"]').text
    assert "18.2k" in tile and "samples/s" in tile
    wait_for(lambda: "step 190 loss" in driver.find_element("id", "log").text, 30, "the log")
    assert "complete" in driver.find_element("id", "log-status").text
    driver.find_element("css selector", '#log-node option[value="node-5"]').click()
    wait_for(lambda: driver.find_element("id", "log").text == "rank 5 on node-5: ok", 30,
             "node-5's log after choosing it")
    assert not driver.find_element("id", "cancel-button").is_displayed()
    assert js_errors(driver) == []
    screenshot(driver, tmp_path / "job-finished.png")


def test_index_and_cost(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/")
    rows = driver.find_elements("css selector", "#clusters tbody tr")
    assert [r.get_attribute("data-cluster") for r in rows] == ["big", "solo"]
    assert "old-run" in driver.find_element("id", "removed").text
    shot(driver, tmp_path, "index")  # docs/: clouds have prices, docker clusters cost $0
    driver.get(site.base + "/cost")
    n = wait_for(lambda: driver.execute_script(
        "return window.mgpuCharts.cost && window.mgpuCharts.cost.data[0].length"), 30,
        "the cost chart")
    assert n >= 4
    assert "p5.48xlarge" in driver.find_element("id", "cost").text
    assert js_errors(driver) == []
    shot(driver, tmp_path, "cost")


def test_404_page_links_back(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/clusters/big/jobs/42")
    assert "cluster 'big' has no job '42'" in driver.find_element("tag name", "main").text
    screenshot(driver, tmp_path / "404.png")
    driver.find_element("link text", "← back to cluster big").click()
    wait_for(lambda: driver.current_url.endswith("/clusters/big"), 30, "the cluster page")
    js_errors(driver)  # the 404 itself is logged as a failed load; that one is expected


def test_open_page_and_a_browser_without_the_cookie(site: Served, tmp_path: Path) -> None:
    """A fresh browser: refused without the token; `--open`'s file:// page then lands on
    the page it names, with the cookie, and the token gone from the address bar."""
    from provision.operations.dashboard.server import redirect_page

    fresh = make_driver(tmp_path / "fresh-profile")
    page = redirect_page(site.url.replace("/?token=", "/clusters/solo?token="))
    try:
        fresh.get(site.base + "/clusters/big")
        assert "answers its owner only" in fresh.find_element("tag name", "body").text
        fresh.get(page.as_uri())
        wait_for(lambda: fresh.current_url == site.base + "/clusters/solo", 30,
                 "the cluster page, without ?token=")
        wait_for(lambda: count(fresh, "#nodes tbody tr") == 1, 30, "the page drawn")
        fresh.get(site.base + "/cost")
        assert "p5.48xlarge" in fresh.find_element("id", "cost").text
    finally:
        fresh.quit()
        page.unlink()
