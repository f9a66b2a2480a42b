"""The admin page in a real browser: headless Chromium (Debian's) driven by selenium.

A `streamkit host --http` daemon runs as a subprocess; events are appended
from other processes; the page must show them within 2 s. The screenshot
the test takes is what docs/http.md shows (written there when
STREAMKIT_UPDATE_SCREENSHOT is set).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait
from streamkit.processors.dlq import dead_lettered_event
from streamkit.processors.tasks import task_requested_event
from support import ROOT
from support.daemon import DaemonRig, eventually

from streamkit import StreamEvent, open_log

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

_JOBS = """
async def job(args, ctx):
    return None
"""


def _browser_missing() -> str | None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return None
    return "needs Debian's chromium and chromium-driver (.ci/run installs them)"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
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


def free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def append(db: Path, event: dict[str, object]) -> None:
    """Append ``event`` from another process: the ``streamkit append`` command."""
    argv = [sys.executable, "-m", "streamkit", "append", "--db", str(db), str(event["type"])]
    argv += ["--payload", json.dumps(event.get("payload", {}))]
    subprocess.run(argv, check=True, capture_output=True)


def durable_items(db: Path) -> list[StreamEvent]:
    async def read() -> list[StreamEvent]:
        async with open_log(db, read_only=True) as log:
            page = await log.stream("/").read(0, 1000)
        return [e for e in page.events if e.type == "item"]

    return asyncio.run(read())


def live_offsets(driver: WebDriver) -> list[int] | None:
    try:
        state = json.loads(text_of(driver, "#live-state"))
    except ValueError:
        return None
    return None if not isinstance(state, dict) else state.get("offsets")


def text_of(driver: WebDriver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def test_the_admin_page_follows_the_host_and_drives_it(browser: WebDriver, tmp_path: Path) -> None:
    """Processors and live state update within 2 s; replay shows its report; cancel ends a task."""
    shutil.copy(ROOT / "tests" / "support" / "host.py", tmp_path / "hostprocs.py")
    (tmp_path / "pagejobs.py").write_text(_JOBS)
    db = tmp_path / "page.db"
    port = free_port()
    rig = DaemonRig(tmp_path, socket_prefix="skp", tmp_on_pythonpath=True)
    try:
        tasks = 'streamkit.processors.tasks:TasksProcessor{"handlers": {"job": "pagejobs:job"}}'
        rig.start_host(
            "p",
            "--db",
            str(db),
            "--processor",
            "hostprocs:Tally",
            "--processor",
            "streamkit.processors.dlq:DlqProcessor",
            "--processor",
            tasks,
            "--http",
            f"127.0.0.1:{port}",
        )
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        eventually(up)
        browser.get(base + "/")
        # The page re-renders its tables as it follows the host: an element found one
        # moment may be replaced before its text is read; the next poll finds the new one.
        stale = (StaleElementReferenceException,)
        wait = WebDriverWait(browser, 10, ignored_exceptions=stale)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-slug="tally"]'))
        Select(browser.find_element(By.ID, "live-slug")).select_by_value("tally")
        wait.until(lambda d: live_offsets(d) == [])

        # Appends from another process: the table and the live state move within 2 s.
        quick = WebDriverWait(browser, 2, ignored_exceptions=stale)
        cursor = 'tr[data-slug="tally"] td.cursor'
        for count in (1, 2):
            append(db, {"type": "item"})
            offsets = [e.offset for e in durable_items(db)]
            assert len(offsets) == count
            quick.until(lambda d, at=str(offsets[-1]): text_of(d, cursor) == at)
            quick.until(lambda d, want=offsets: live_offsets(d) == want)

        # A dead letter shows up; the replay button replays it and the report appears.
        record = dead_lettered_event(
            record_id="charge/order-7",
            origin="billing",
            operation="charge",
            payload={"order": 7},
            error="card declined",
            attempts=3,
            request_type="charge.requested",
        )
        append(db, record)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-record="charge/order-7"]'))
        browser.find_element(By.ID, "dlq-replay").click()
        wait.until(lambda d: "charge/order-7" in text_of(d, "#dlq-report"))
        report = json.loads(text_of(browser, "#dlq-report"))
        assert report["replayed"] == ["charge/order-7"]

        # A task scheduled for later is listed; its cancel button cancels it.
        later = time.time() + 3600
        append(db, task_requested_event(task_id="t-9", name="job", not_before=later))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-task="t-9"]'))
        assert "scheduled" in text_of(browser, 'tr[data-task="t-9"]')
        browser.save_screenshot(str(tmp_path / "admin-page.png"))
        browser.find_element(By.CSS_SELECTOR, 'tr[data-task="t-9"] button').click()
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, 'tr[data-task="t-9"]'))
        if os.environ.get("STREAMKIT_UPDATE_SCREENSHOT"):
            shutil.copy(tmp_path / "admin-page.png", ROOT / "docs" / "admin-page.png")
    finally:
        rig.close()
