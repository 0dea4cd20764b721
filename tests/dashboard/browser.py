"""Headless Chromium for the dashboard's browser tests: Debian's chromium + chromium-driver
driven by Selenium (no browser download). As root Chromium needs --no-sandbox; the
background-networking flags keep it from calling out of this closed network at start."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kit import IN_CI

CHROMIUM = os.environ.get("MGPU_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MGPU_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,1000", "--hide-scrollbars",
         "--force-device-scale-factor=1"]
T = TypeVar("T")


def browser_or_skip() -> None:
    """Skip without Chromium, except in CI, where scripts/setup.sh installs it: fail there."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (Path(p).exists() or shutil.which(p))]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        why = f"browser tests need {', '.join(missing)} (scripts/setup.sh installs them)"
        if IN_CI:
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)


def make_driver(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    return driver


def wait_for(check: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.25) -> T:
    """Poll `check` until it returns something truthy (returned), or fail after `timeout`
    seconds saying `what` was awaited. Exceptions count as 'not yet' (the page may be
    redrawing); the last one is reported."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}"
                                 + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


def js_errors(driver: Any) -> list[str]:
    """SEVERE console entries (uncaught errors, failed loads) since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


DOCS = os.environ.get("MGPU_DASHBOARD_DOCS")  # also save screenshots there (docs/dashboard)


def shot(driver: Any, tmp_path: Path, name: str) -> Path:
    """Screenshot `name`.png under the test's tmp dir; also into $MGPU_DASHBOARD_DOCS when set
    (how docs/dashboard/*.png are made: see docs/dashboard/README.md)."""
    path = screenshot(driver, tmp_path / f"{name}.png")
    if DOCS:
        Path(DOCS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(DOCS) / path.name)
    return path


def screenshot(driver: Any, path: Path, full: bool = True) -> Path:
    """A PNG of the page from its top; `full`: the whole page, not just the window (the
    viewport is set to the page's height through the DevTools protocol, then reset)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    if full:
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1440, "height": min(max(height, 600), 6000), "deviceScaleFactor": 1,
            "mobile": False})
    try:
        driver.save_screenshot(str(path))
    finally:
        if full:
            driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return path
