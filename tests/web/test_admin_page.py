"""The admin page in a real browser: headless Chromium (Debian's) driven by selenium.

A `streamkit host --http` daemon runs as a subprocess; events are appended
from other processes; the page must show them within 2 s. The screenshots
the tests take are what docs/http.md shows (written there when
STREAMKIT_UPDATE_SCREENSHOT is set).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait
from streamkit.processors.tasks import task_requested_event
from support import ROOT, free_port
from support.daemon import DaemonRig, admin_address, wait_for_http
from support.upcasting import stored_at_v4

from streamkit import StreamEvent, open_log

_JOBS = """
async def job(args, ctx):
    return None


async def broken(args, ctx):
    raise RuntimeError("the printer is on fire")


async def slow(args, ctx):
    import asyncio

    await asyncio.sleep(60)
"""

_CONFIG = """
db = "page.db"
retention_interval = 0.5

[[retention]]
path = "/"
keep_last = 100000
delete = true

[retry]
initial_delay = 0.2
max_delay = 0.5
stall_after = 100000

[[processors]]
class = "hostprocs:Tally"

[[processors]]
class = "hostprocs:Fragile"

[[processors]]
class = "hostprocs:Typed"
path = "/orders"
on_malformed = "skip"

[[processors]]
class = "streamkit.processors.tasks:TasksProcessor"
path = "/ops"
[processors.kwargs]
handlers = { job = "pagejobs:job", broken = "pagejobs:broken", slow = "pagejobs:slow" }

[[processors]]
class = "streamkit.processors.dlq:DlqProcessor"
path = "/ops"

[[processors]]
class = "boardprocs:TaskBoard"
path = "/board"

[[processors]]
class = "hostprocs:Gated"
path = "/gate"
"""


def append(db: Path, event: dict[str, object], path: str = "/") -> None:
    """Append ``event`` from another process: the ``streamkit append`` command."""
    argv = [sys.executable, "-m", "streamkit", "append", "--db", str(db), str(event["type"])]
    argv += ["--payload", json.dumps(event.get("payload", {})), "--path", path]
    subprocess.run(argv, check=True, capture_output=True)


async def append_directly(db: Path, event: dict[str, object], path: str) -> None:
    """Append from this process, through a log opened without any contracts."""
    async with open_log(db) as log:
        await log.stream(path).append(event)


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
    """The text of the first match; read again if the page re-rendered it meanwhile."""
    for _ in range(10):
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return found[0].text if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was re-rendered ten times in a row while being read")


def click(driver: WebDriver, css: str) -> None:
    """Click the first match; find it again if the page re-rendered it meanwhile."""
    for _ in range(10):
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was re-rendered ten times in a row while being clicked")


def rows(driver: WebDriver, css: str) -> list[str]:
    """The texts of every match; read again if the page re-rendered them meanwhile."""
    for _ in range(10):
        try:
            return [row.text for row in driver.find_elements(By.CSS_SELECTOR, css)]
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was re-rendered ten times in a row while being read")


@pytest.fixture
def page(browser: WebDriver, tmp_path: Path) -> Iterator[tuple[WebDriver, Path, str]]:
    """The page of a daemon running Tally and Fragile on /, Typed on /orders, and the tasks
    and the DLQ on /ops."""
    shutil.copy(ROOT / "tests" / "support" / "host.py", tmp_path / "hostprocs.py")
    shutil.copy(ROOT / "tests" / "support" / "upcasting.py", tmp_path / "boardprocs.py")
    (tmp_path / "pagejobs.py").write_text(_JOBS)
    # Written by newer code before this host starts: its data check at start flags it.
    asyncio.run(append_directly(tmp_path / "page.db", stored_at_v4("t", 1, "o", "x"), "/board"))
    # Gated's catch-up waits at its first event for a gate nobody opens: it never serves.
    asyncio.run(append_directly(tmp_path / "page.db", {"type": "item"}, "/gate"))
    (tmp_path / "streamkit.toml").write_text(_CONFIG)
    port = free_port()
    rig = DaemonRig(tmp_path, socket_prefix="skp", tmp_on_pythonpath=True)
    try:
        rig.start_host(
            "p", "--config", str(tmp_path / "streamkit.toml"), "--http", f"127.0.0.1:{port}"
        )
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base)
        # The page's address with its token, as its owner gets it: from the control socket.
        admin = admin_address(tmp_path / "page.db")
        assert admin.startswith(f"{base}/#token=")
        browser.get(admin)
        # The token leaves the address bar (it would be bookmarked, shared, screenshotted).
        WebDriverWait(browser, 5).until(lambda d: d.current_url == f"{base}/")
        yield browser, tmp_path / "page.db", base
    finally:
        rig.close()


# The page re-renders its tables as it follows the host: an element found one moment
# may be replaced before its text is read; the next poll finds the new one.
STALE = (StaleElementReferenceException,)


def test_the_admin_page_follows_the_host_and_browses_its_events(
    page: tuple[WebDriver, Path, str], tmp_path: Path
) -> None:
    """Processors, hosts and live state within 2 s; the event browser pages, filters, opens one."""
    browser, db, base = page
    wait = WebDriverWait(browser, 10, ignored_exceptions=STALE)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-slug="tally"]'))
    # Noise gone: the host is named as people read it, with a favicon.
    wait.until(lambda d: "(pid " in text_of(d, "#host"))
    assert httpx.get(f"{base}/favicon.ico").headers["content-type"].startswith("image/svg")
    wait.until(lambda d: "(this host): " in text_of(d, "#hosts"))
    assert "tally" in text_of(browser, "#hosts")
    Select(browser.find_element(By.ID, "live-slug")).select_by_value("tally")
    wait.until(lambda d: live_offsets(d) == [])
    assert "revision" not in text_of(browser, "#live-info")

    quick = WebDriverWait(browser, 2, ignored_exceptions=STALE)
    cursor = 'tr[data-slug="tally"] td.cursor'
    for count in (1, 2):
        append(db, {"type": "item"})
        offsets = [e.offset for e in durable_items(db)]
        assert len(offsets) == count
        quick.until(lambda d, at=str(offsets[-1]): text_of(d, cursor) == at)
        quick.until(lambda d, want=offsets: live_offsets(d) == want)

    # The last hour, a minute at a time: the events tally processed, as bars.
    chart = 'tr[data-slug="tally"] td.chart'
    wait.until(
        lambda d: int(d.find_element(By.CSS_SELECTOR, chart).get_attribute("data-events") or 0) >= 2
    )
    assert browser.find_elements(By.CSS_SELECTOR, f"{chart} svg rect.events")
    assert " events, 0 failed batch(es) in the last " in browser.find_element(
        By.CSS_SELECTOR, f"{chart} svg"
    ).get_attribute("aria-label")

    # The event browser: newest first page, a type filter, one event opened.
    append(db, {"type": "note", "payload": {"n": 1}})
    wait.until(lambda d: len(rows(d, "#events tbody tr")) == 3)
    # Each row previews its payload, one line.
    assert rows(browser, "#events tbody tr")[-1].endswith('{"n":1}')
    browser.find_element(By.ID, "events-type").send_keys("item")
    click(browser, '#events-form button[type="submit"]')
    wait.until(lambda d: all(" item" in r for r in rows(d, "#events tbody tr")))
    assert len(rows(browser, "#events tbody tr")) == 2
    first = offsets[0]
    click(browser, f'#events tr[data-offset="{first}"]')
    wait.until(lambda d: f"Event {first} of /" in text_of(d, "#event-title"))
    assert "tally ✓" in text_of(browser, "#event-processors")
    body = json.loads(text_of(browser, "#event-body"))
    assert set(body) == {"payload", "metadata", "source", "idempotency_key"}
    browser.execute_script("document.getElementById('events-section').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "admin-events.png"))
    if os.environ.get("STREAMKIT_UPDATE_SCREENSHOT"):
        shutil.copy(tmp_path / "admin-events.png", ROOT / "docs" / "admin-events.png")

    # 420 px wide: nothing scrolls the page sideways.
    browser.set_window_size(420, 900)
    wait.until(
        lambda d: d.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"
        )
    )


def test_the_admin_page_flags_failures_and_drives_tasks_and_dead_letters(
    page: tuple[WebDriver, Path, str], tmp_path: Path
) -> None:
    """A failing processor is flagged before it stalls; tasks on /ops: timeline, cancel; a DLQ
    record: detail, replay of one, and what the replay did."""
    browser, db, _ = page
    wait = WebDriverWait(browser, 15, ignored_exceptions=STALE)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-slug="fragile"]'))

    # A poison event: the processor fails and retries; it is flagged long before a stall.
    append(db, {"type": "item", "payload": {"boom": True}})
    fragile = 'tr[data-slug="fragile"]'
    wait.until(
        lambda d: (
            "failing" in (d.find_element(By.CSS_SELECTOR, fragile).get_attribute("class") or "")
        )
    )
    problem = text_of(browser, f"{fragile} td.problem-cell")
    assert "failing:" in problem
    assert "poison at" in problem
    assert text_of(browser, f"{fragile} td.state") == "failing"
    # Its failed batches are in its chart, in red; its traceback is a button away.
    wait.until(
        lambda d: (
            d.find_element(By.CSS_SELECTOR, f"{fragile} td.chart").get_attribute("data-failures")
            != "0"
        )
    )
    assert browser.find_elements(By.CSS_SELECTOR, f"{fragile} td.chart svg rect.failures")
    click(browser, f'{fragile} button[data-action="traceback"]')
    wait.until(lambda d: text_of(d, "#versions-title").startswith("Traceback: fragile"))
    assert text_of(browser, "#versions").startswith("Traceback (most recent call last):")

    # A payload that does not validate is skipped (this processor's entry chose "skip"):
    # the page names its type and version.
    # (The host refuses it at its door; a producer writing straight to the file does not.)
    with pytest.raises(subprocess.CalledProcessError):
        append(db, {"type": "order", "payload": {"order": "many"}}, path="/orders")
    asyncio.run(append_directly(db, {"type": "order", "payload": {"order": "many"}}, "/orders"))
    typed = 'tr[data-slug="typed"] td.problem-cell'
    wait.until(lambda d: "skipped as malformed: order v1" in text_of(d, typed))
    assert "(first at offset " in text_of(browser, typed)
    # A processor still catching up: how far, with a bar.
    gated = 'tr[data-slug="gated"] td.problem-cell'
    wait.until(lambda d: "catching-up 0/1" in text_of(d, gated))
    assert browser.find_elements(By.CSS_SELECTOR, f"{gated} progress")
    # What the host's data check found at start: a payload newer than its code.
    board = text_of(browser, 'tr[data-slug="task-board"] td.problem-cell')
    assert "schema check at start: task.created v4: 1 events (1..1): AHEAD" in board

    # Tasks run on /ops, not /: the section is there, with the scheduled time.
    later = time.time() + 3600
    append(db, task_requested_event(task_id="t-9", name="job", not_before=later), path="/ops")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-task="t-9"]'))
    row = text_of(browser, 'tr[data-task="t-9"]')
    assert "scheduled" in row
    assert time.strftime("%Y-%m-%dT", time.gmtime(later)) in row
    # Every numeric column's header sits over its numbers, right-aligned like them.
    aligned = browser.execute_script(
        "return [...document.querySelectorAll('th.num')].map("
        "(th) => getComputedStyle(th).textAlign)"
    )
    assert len(aligned) == 19
    assert set(aligned) == {"right"}
    # A task with no not_before has no scheduled time: nothing is shown, never 1970.
    append(db, task_requested_event(task_id="t-now", name="slow"), path="/ops")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-task="t-now"]'))
    assert "1970" not in text_of(browser, 'tr[data-task="t-now"]')
    click(browser, 'tr[data-task="t-9"] td')
    wait.until(lambda d: "Task t-9: scheduled" in text_of(d, "#task-title"))
    assert rows(browser, "#task-timeline tbody tr")[0].split()[2] == "requested"

    # A task whose handler always fails is dead-lettered; its timeline shows the attempt.
    append(db, task_requested_event(task_id="t-bad", name="broken", max_attempts=1), path="/ops")
    browser.find_element(By.ID, "task-id").send_keys("t-bad")
    click(browser, '#task-search button[type="submit"]')
    wait.until(lambda d: "Task t-bad: dead-lettered" in text_of(d, "#task-title"))
    (*_, last) = rows(browser, "#task-timeline tbody tr")
    assert "dead-lettered 1" in last  # the attempt it ended, with how long it took
    assert re.search(r" \d+\.\d{3} s ", last)
    assert "the printer is on fire" in last
    # The handler's traceback, kept in the dead-lettering event: the page shows it as text.
    assert "Traceback of attempt 1 (dead-lettered, offset " in text_of(
        browser, "#task-traceback-title"
    )
    shown = text_of(browser, "#task-traceback")
    assert shown.startswith("Traceback (most recent call last):")
    assert shown.rstrip().endswith("the printer is on fire")
    # The tasks that finished lately, beside the live ones: how each ended, how long it
    # took, filtered by how it ended.
    finished = '#finished-tasks tr[data-task="t-bad"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, finished))
    ended = text_of(browser, finished)
    assert "broken dead-lettered 1" in ended
    assert re.search(r" \d+\.\d{3} s ", ended)
    assert "the printer is on fire" in ended
    Select(browser.find_element(By.ID, "finished-status")).select_by_value("succeeded")
    click(browser, '#finished-filter button[type="submit"]')
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, finished))
    Select(browser.find_element(By.ID, "finished-status")).select_by_value("dead-lettered")
    click(browser, '#finished-filter button[type="submit"]')
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, finished))
    browser.execute_script("document.getElementById('tasks-section').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "admin-tasks.png"))

    # Its dead letter: the detail with its payload, then a replay of that one record.
    record = 'tr[data-record^="tasks/t-bad@"]'  # the tasks processor's record id
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, record))
    click(browser, f"{record} td")
    wait.until(lambda d: ": pending, 0 replay(s)" in text_of(d, "#dlq-title"))
    assert text_of(browser, "#dlq-title").startswith("Record tasks/t-bad@")
    assert json.loads(text_of(browser, "#dlq-body"))["record"]["payload"]
    assert text_of(browser, "#dlq-traceback").rstrip().endswith("the printer is on fire")
    # Retention: the pending record's queue holds /ops's history from its scan floor on.
    held = 'tr[data-path="/ops"] td.held-by'
    wait.until(lambda d: "processor dlq@1 (serving): retain_from" in text_of(d, held))
    assert text_of(browser, 'tr[data-path="/ops"] td.horizon') == "1"
    # The policy of /: kept by count, run by this host, nothing to take yet.
    policy = 'tr[data-path="/"] td.policy'
    wait.until(lambda d: "stopped by keep_last" in text_of(d, policy))
    assert text_of(browser, policy).startswith("keep last 100000, delete · ")
    assert "policies run every 0.5 s by this host" in text_of(browser, "#retention-note")
    browser.set_window_size(1600, 1500)
    browser.execute_script(
        "window.scrollTo(0, 0); "
        "for (const box of document.querySelectorAll('.scroll')) box.scrollLeft = 0"
    )
    browser.save_screenshot(str(tmp_path / "admin-page.png"))
    browser.set_window_size(1280, 1100)
    click(browser, f"{record} button")
    # The replay runs the task again, which fails again: the page says what happened.
    wait.until(lambda d: "1 replayed" in text_of(d, "#dlq-outcome"))
    wait.until(lambda d: "1 replay(s)" in text_of(d, "#dlq-title"))
    wait.until(
        lambda d: "Failed again after the replay: tasks/t-bad@" in text_of(d, "#dlq-outcome")
    )
    assert "the printer is on fire" in text_of(browser, "#dlq-outcome")

    # Cancel asks first; accepted, the task goes.
    click(browser, 'tr[data-task="t-9"] button')
    alert = WebDriverWait(browser, 5).until(lambda d: d.switch_to.alert)
    assert "Cancel task t-9" in alert.text
    alert.accept()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, 'tr[data-task="t-9"]'))
    if os.environ.get("STREAMKIT_UPDATE_SCREENSHOT"):
        for name in ("admin-page.png", "admin-tasks.png"):
            shutil.copy(tmp_path / name, ROOT / "docs" / name)


def test_the_admin_page_compares_versions_and_cuts_over_by_hand(
    browser: WebDriver, tmp_path: Path
) -> None:
    """A version built with a manual cutover: the page shows it awaiting, compares both
    versions side by side, and its "cut over" button makes it serve."""
    shutil.copy(ROOT / "tests" / "support" / "host.py", tmp_path / "hostprocs.py")
    db = tmp_path / "cut.db"
    rig = DaemonRig(tmp_path, socket_prefix="skc", tmp_on_pythonpath=True)
    try:
        common = ("--db", str(db), "--lease-ttl", "1")
        rig.start_host("old", *common, "--processor", "hostprocs:Effector")
        for _ in range(3):
            append(db, {"type": "item", "payload": {"n": 2}})
        port = free_port()
        rig.start_host(
            "new",
            *common,
            "--processor",
            "hostprocs:ManualEffectorV2",
            "--http",
            f"127.0.0.1:{port}",
        )
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base)
        admin = [sys.executable, "-m", "streamkit", "admin", "--db", str(db)]
        token = subprocess.run(
            [*admin, "--socket", rig.socket("new"), "--token"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        browser.get(f"{base}/#token={token}")
        wait = WebDriverWait(browser, 20, ignored_exceptions=STALE)
        row = 'tr[data-slug="effector"]'
        wait.until(lambda d: "awaiting-cutover" in text_of(d, row))
        browser.execute_script("window.confirm = () => true")

        click(browser, f"{row} button:nth-of-type(1)")  # compare versions
        wait.until(lambda d: "v1  serving" in text_of(d, "#versions"))
        shown = text_of(browser, "#versions")
        assert "v2  building" in shown
        assert "difference(s) from the serving state" in shown
        assert "replace /total" in shown
        assert "counted by the running hosts:" in shown
        assert "v2  awaiting-cutover  malformed 0" in shown

        click(browser, f"{row} button:nth-of-type(2)")  # cut over
        wait.until(lambda d: "version 2 serves from offset" in text_of(d, "#versions"))
        wait.until(lambda d: "awaiting-cutover" not in text_of(d, row))
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f"{row} button"))
    finally:
        rig.close()


_SCHEDULES_CONFIG = """
db = "sched.db"

[[processors]]
class = "streamkit.processors.schedules:SchedulesProcessor"

[[processors]]
class = "streamkit.processors.tasks:TasksProcessor"
[processors.kwargs]
handlers = { ping = "pagejobs:job" }
"""


def test_the_admin_page_shows_schedules_and_pauses_resumes_and_deletes_them(
    browser: WebDriver, tmp_path: Path
) -> None:
    """A schedule firing every second: its row counts slots; pause, resume and delete it."""
    (tmp_path / "pagejobs.py").write_text(_JOBS)
    (tmp_path / "streamkit.toml").write_text(_SCHEDULES_CONFIG)
    port = free_port()
    rig = DaemonRig(tmp_path, socket_prefix="sks", tmp_on_pythonpath=True)
    try:
        rig.start_host(
            "s", "--config", str(tmp_path / "streamkit.toml"), "--http", f"127.0.0.1:{port}"
        )
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base)
        # One defined from the command line, one from the page's form.
        add = [sys.executable, "-m", "streamkit", "schedules", "add", "beat", "--every", "1s"]
        add += ["--task", "ping", "--overlap", "allow_all", "--db", str(tmp_path / "sched.db")]
        subprocess.run(add, check=True, capture_output=True, cwd=tmp_path)
        browser.get(admin_address(tmp_path / "sched.db"))
        wait = WebDriverWait(browser, 15, ignored_exceptions=STALE)
        wait.until(lambda d: not d.find_element(By.ID, "schedules-section").get_attribute("hidden"))

        def submit(name: str, timing: str, zone: str) -> None:
            for field, value in (
                ("schedule-name", name),
                ("schedule-timing", timing),
                ("schedule-tz", zone),
                ("schedule-task", "ping"),
            ):
                box = browser.find_element(By.ID, field)
                box.clear()
                box.send_keys(value)
            click(browser, "#schedule-add button")

        # The processor's own summary has a column of its own, apart from its problems.
        summary = 'tr[data-slug="schedules"] td.summary'
        wait.until(lambda d: "schedules 1" in text_of(d, summary))
        none = "\u2013"  # the page's en dash for "nothing here"
        assert text_of(browser, 'tr[data-slug="schedules"] td.problem-cell') == none
        submit("nightly", "0 3 * * *", "Europe/Berlin")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-schedule="nightly"]'))
        assert "cron 0 3 * * * Europe/Berlin" in text_of(browser, 'tr[data-schedule="nightly"]')
        submit("broken", "61 * * * *", "UTC")  # refused: the page says why, nothing is added
        wait.until(lambda d: "no schedule was made" in text_of(d, "#schedule-add-note"))
        assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-schedule="broken"]')
        row = 'tr[data-schedule="beat"]'

        def fired(d: WebDriver) -> bool:
            found = d.find_elements(By.CSS_SELECTOR, f"{row} td.num")
            return bool(found) and found[0].text.isdigit() and int(found[0].text) >= 2

        wait.until(fired)
        assert not browser.find_element(By.ID, "schedules-section").get_attribute("hidden")
        assert "every 1 s" in text_of(browser, row)
        assert text_of(browser, f"{row} td.status") in ("active", "1 running", "2 running")
        browser.execute_script("window.confirm = () => true")
        click(browser, f"{row} button:nth-of-type(1)")  # pause
        wait.until(lambda d: text_of(d, f"{row} td.status") == "paused")
        time.sleep(1.5)  # slots come due while it is paused
        click(browser, f"{row} button:nth-of-type(1)")  # resume
        # The slots of the pause are on record once it resumed.
        wait.until(lambda d: "(paused " in text_of(d, f"{row} td.missed"))
        wait.until(lambda d: text_of(d, f"{row} td.status") != "paused")
        # Backfill the pause: the page asks for the range (answered here), the host fires
        # the slots of it that did not fire and says so.
        browser.execute_script(
            "const answers = [new Date(Date.now() - 60000).toISOString(),"
            " new Date().toISOString()]; window.prompt = () => answers.shift()"
        )
        click(browser, f"{row} button:nth-of-type(2)")  # backfill

        def backfilled() -> bool:
            log = tmp_path / "sched.db"
            done = subprocess.run(
                [sys.executable, "-m", "streamkit", "read", "--db", str(log), "--json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found = [json.loads(line) for line in done.splitlines() if line.strip()]
            return any(e["type"] == "schedule.backfilled" and e["payload"]["slots"] for e in found)

        wait.until(lambda d: backfilled())
        click(browser, f"{row} button:nth-of-type(3)")  # delete
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, row))
        assert [r.split()[0] for r in rows(browser, "#schedules tbody tr")] == ["nightly"]
    finally:
        rig.close()
