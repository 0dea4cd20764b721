"""The dashboard in headless Chromium against a real 2-node docker cluster with a running job:
both nodes live on the cluster page, the job's log growing, its loss chart filling, `cancel`
pressed on the page stopping every rank, and `down` pressed on the page removing the cluster.

One cluster, one dashboard and one browser are shared by the tests (module scope; they run in
file order, the last removes the cluster). Run under the Docker lock. Screenshots of each page
go to each test's tmp dir (and to $MGPU_DASHBOARD_DOCS when set: docs/dashboard/ is made so).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import DOCS, browser_or_skip, js_errors, make_driver, screenshot, shot, wait_for
from conftest import Served, serve
from engine import force_remove, leftovers, unique
from kit import cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("browser_docker")]  # one cluster, tests in file order
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
NAME = unique("it22-dash")
# Pictures for docs/ (MGPU_DASHBOARD_DOCS set) are taken once the charts hold more points.
SAMPLES, LOSS_POINTS = (30, 30) if DOCS else (5, 8)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Path]:
    browser_or_skip()
    home = tmp_path_factory.mktemp("dash-docker-home")
    res = cli("up", "--nodes", "2", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        cli("down", NAME, home=home)  # idempotent: the last test removed it already
        force_remove(NAME)
        assert leftovers(NAME) == []


@pytest.fixture(scope="module")
def job(home: Path) -> str:
    """A job that trains until cancelled, printing its loss about once a second. The fabric
    gate runs first (`check --fabric`: a detached launch does not run it), so that the
    cluster page has a real gate result to show."""
    cli("check", NAME, "--fabric", home=home)  # its exit code judges the nodes, not the gate
    [status] = json.loads(cli("status", NAME, "--json", home=home).stdout)
    assert status["fabric_gate"] is not None, "the gate's result was not kept"
    res = cli("launch", NAME, "--detach", "--", EXAMPLE, "--steps", "100000", "--sleep", "0.2",
              "--log-every", "5", home=home)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture(scope="module")
def site(home: Path) -> Iterator[Served]:
    served = serve(home)
    try:
        yield served
    finally:
        served.stop()
        assert "Traceback" not in served.stderr, served.stderr


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory, site: Served) -> Iterator[Any]:
    d = make_driver(tmp_path_factory.mktemp("chromium-profile"))
    try:
        d.get(site.url)  # the printed address: its cookie opens every page after it
        yield d
    finally:
        d.quit()


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def log_lines(driver: Any) -> int:
    return int(js(driver, "return document.getElementById('log').textContent"
                          ".split('\\n').filter(Boolean).length"))


def chart_points(driver: Any, name: str) -> int:
    return int(js(driver, f"const c = window.mgpuCharts[{name!r}]; "
                          "return c ? c.data[0].length : 0"))


def test_cluster_page_shows_both_nodes_live(site: Served, driver: Any, job: str,
                                            tmp_path: Path) -> None:
    driver.get(f"{site.base}/clusters/{NAME}")
    rows = driver.find_elements("css selector", "#nodes tbody tr")
    assert [r.get_attribute("data-node") for r in rows] == ["node-0", "node-1"]
    wait_for(lambda: len(driver.find_elements("css selector", "#nodes .pill.answering")) == 2,
             90, "both nodes answering with monitor samples")
    cpu = driver.find_element("css selector", '#nodes tr[data-node="node-1"] .util').text
    assert cpu.isdigit(), f"node-1's CPU % cell: {cpu!r}"
    assert "CPU % (no GPUs)" in driver.find_element("id", "chart-util").text
    wait_for(lambda: chart_points(driver, "util") >= SAMPLES, 3 * SAMPLES + 60,
             f"{SAMPLES} samples in the CPU chart")
    series = js(driver, "return window.mgpuCharts.util.series.map(s => s.label)")
    assert series[1:] == ["node-0", "node-1"]
    assert driver.find_element("css selector", f'#jobs tr[data-job="{job}"] .pill').text \
        == "running"
    gate = driver.find_element("id", "gate").text
    assert gate.startswith("Fabric gate\npass"), gate
    labels = [e.text for e in driver.find_elements("css selector", "#bringup .gantt-label")]
    assert labels == ["plan", "create call", "create call: nodes running", "bootstrap",
                      "bootstrap: ssh answers"], labels  # where `up`'s time went
    assert js_errors(driver) == []
    shot(driver, tmp_path, "cluster")


def test_job_page_log_grows_and_loss_chart_fills(site: Served, driver: Any, job: str,
                                                 tmp_path: Path) -> None:
    driver.get(f"{site.base}/clusters/{NAME}/jobs/{job}")
    assert driver.find_element("id", "job-state").text == "running"
    wait_for(lambda: "step 0 loss" in driver.find_element("id", "log").text, 120,
             "the first loss line in node-0's log")
    before = log_lines(driver)
    wait_for(lambda: log_lines(driver) >= before + 3, 60, "the log to grow while the job runs")
    wait_for(lambda: chart_points(driver, "loss") >= LOSS_POINTS, 3 * LOSS_POINTS + 60,
             f"{LOSS_POINTS} points in the loss chart")
    xs = js(driver, "return window.mgpuCharts.loss.data[0]")
    assert xs == sorted(xs) and xs[0] == 0 and xs[1] == 5, "x is the step (--log-every 5)"
    driver.find_element("css selector", '#log-node option[value="node-1"]').click()
    wait_for(lambda: "on node-1" in driver.find_element("id", "log").text, 60,
             "node-1's own log after choosing it")
    driver.find_element("css selector", '#log-node option[value="node-0"]').click()
    wait_for(lambda: "step 0 loss" in driver.find_element("id", "log").text, 60,
             "node-0's log again")
    assert js_errors(driver) == []
    shot(driver, tmp_path, "job")


def test_cancel_on_the_page_stops_the_job(site: Served, driver: Any, job: str, home: Path,
                                          tmp_path: Path) -> None:
    driver.get(f"{site.base}/clusters/{NAME}/jobs/{job}")
    driver.find_element("id", "cancel-button").click()
    dialog = driver.find_element("id", "confirm")
    wait_for(dialog.is_displayed, 10, "the confirmation dialog")
    assert f"Cancel job {job}?" in dialog.text
    driver.find_element("id", "confirm-no").click()  # asking again is harmless ...
    wait_for(lambda: not dialog.is_displayed(), 10, "the dialog to close")
    assert driver.find_element("id", "job-state").text == "running", "... and changes nothing"
    driver.find_element("id", "cancel-button").click()
    wait_for(dialog.is_displayed, 10, "the confirmation dialog")
    driver.find_element("id", "confirm-yes").click()
    wait_for(lambda: driver.find_element("id", "job-state").text == "cancelled", 90,
             "the job shown as cancelled")
    # the state comes from the page's polling, the banner from the cancel request's own answer:
    # either may arrive first (CI saw the state before the answer)
    wait_for(lambda: f"job {job}: cancelled" in driver.find_element("id", "action-result").text,
             60, "the cancel request's answer shown")
    assert not driver.find_element("id", "cancel-button").is_displayed()
    [rec] = [r for r in json.loads(cli("jobs", NAME, "--json", home=home).stdout)
             if r["id"] == job]
    assert rec["state"] == "cancelled"
    left = cli("exec", NAME, "--", "pgrep -f '[t]rain_ddp.py' || echo none", home=home)
    assert left.stdout.count("none") == 2, f"ranks survived the cancel:\n{left.stdout}"
    wait_for(lambda: "complete" in driver.find_element("id", "log-status").text, 60,
             "the log marked complete")
    assert js_errors(driver) == []
    shot(driver, tmp_path, "job-cancelled")


def test_index_and_cost_pages(site: Served, driver: Any, tmp_path: Path) -> None:
    driver.get(site.base + "/")
    row = driver.find_element("css selector", f'#clusters tr[data-cluster="{NAME}"]')
    assert "docker" in row.text and "ready" in row.text
    screenshot(driver, tmp_path / "index.png")  # docs/ has the synthetic one: priced clouds
    driver.get(site.base + "/cost")
    assert NAME in driver.find_element("id", "cost").text
    wait_for(lambda: chart_points(driver, "cost") >= 2, 30, "the cost chart")
    assert js_errors(driver) == []
    screenshot(driver, tmp_path / "cost.png")


def test_down_on_the_page_removes_the_cluster(site: Served, driver: Any) -> None:
    driver.get(f"{site.base}/clusters/{NAME}")
    driver.find_element("id", "down-button").click()
    wait_for(driver.find_element("id", "confirm").is_displayed, 10, "the confirmation dialog")
    yes = driver.find_element("id", "confirm-yes")
    assert not yes.is_enabled(), "not before the cluster's name is typed"
    driver.find_element("id", "confirm-input").send_keys(NAME)
    wait_for(yes.is_enabled, 10, "the button to be enabled by the typed name")
    yes.click()
    wait_for(lambda: "Cluster removed." in driver.find_element("id", "removal").text, 180,
             "the removal to finish")
    assert driver.find_element("id", "cluster-state").text == "removed"
    assert leftovers(NAME) == []
    assert js_errors(driver) == []
