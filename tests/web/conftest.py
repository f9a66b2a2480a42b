"""Fixtures of the web tests: headless Chromium, driven by chromedriver (Debian's packages)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def _browser_missing() -> str | None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return None
    return "needs Debian's chromium and chromium-driver (.ci/run installs them)"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """A headless Chromium; missing, it skips the test (fails it under STREAMKIT_REQUIRE_BROWSER)."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("STREAMKIT_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1100")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
