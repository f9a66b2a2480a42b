"""Nobody but the host's owner can act through its HTTP surface: not a page elsewhere, not another user.

The daemon runs as a real subprocess serving ``--http 127.0.0.1:PORT`` with no
token file (the documented default). A page served from another origin (another
port on 127.0.0.1) is opened in headless Chromium and tries every write a page
can send without a preflight; another local user (``nobody``) tries with curl.
None of it is written, while the owner's same requests are.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from support import ROOT, free_port
from support.daemon import DaemonRig, owner_headers, wait_for_http

from streamkit import StreamEvent, open_log

_ATTACK = """<!doctype html><title>cute cats</title><body><script>
const host = "HOST";
const event = (type) => JSON.stringify({type: type, payload: {}});
const tries = [
  fetch(host + "/v1/events", {method: "POST", mode: "no-cors", body: event("csrf.appended")}),
  fetch(host + "/v1/events", {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body: event("csrf.plain")}),
  fetch(host + "/v1/events?path=/", {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: event("csrf.form")}),
  fetch(host + "/v1/processors/fragile/skip", {method: "POST", mode: "no-cors",
    body: JSON.stringify({offset: 1, by: "evil page", reason: "csrf"})}),
  fetch(host + "/v1/events", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: event("csrf.cors")}),
  fetch(host + "/v1/events").then((r) => r.text()),
];
// A form posts too, into a hidden frame: text/plain, shaped to parse as JSON.
const frame = document.createElement("iframe");
frame.name = "sink";
document.body.appendChild(frame);
const form = document.createElement("form");
form.method = "POST";
form.action = host + "/v1/events";
form.enctype = "text/plain";
form.target = "sink";
const field = document.createElement("input");
field.name = '{"type": "csrf.form_post", "payload": {}, "x": "';
field.value = '"}';
form.appendChild(field);
document.body.appendChild(form);
const posted = new Promise((resolve) => { frame.onload = resolve; });
form.submit();
Promise.allSettled([...tries, posted]).then((results) => {
  document.title = "done " + results.map((r) => r.status).join(",");
});
</script>"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DaemonRig]:
    shutil.copy(ROOT / "tests" / "support" / "host.py", tmp_path / "hostprocs.py")
    made = DaemonRig(tmp_path, socket_prefix="skx", tmp_on_pythonpath=True)
    try:
        yield made
    finally:
        made.close()


def _serve_tally(rig: DaemonRig, tmp_path: Path) -> tuple[str, Path]:
    """A daemon running Tally and Fragile (which stalls on a ``boom`` item), on HTTP."""
    port = free_port()
    db = tmp_path / "x.db"
    rig.start_host(
        "x", "--db", str(db), "--processor", "hostprocs:Tally", "--processor",
        "hostprocs:Fragile", "--http", f"127.0.0.1:{port}",
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_for_http(base)
    return base, db


def _events(db: Path) -> list[StreamEvent]:
    async def read() -> list[StreamEvent]:
        async with open_log(db, read_only=True) as log:
            return list((await log.stream("/").read(0, 1000)).events)

    return asyncio.run(read())


class _Page(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_a_page_on_another_origin_can_write_nothing(
    browser: WebDriver, rig: DaemonRig, tmp_path: Path
) -> None:
    """no-cors fetches, a CORS fetch and a text/plain form from another origin: none is written."""
    base, db = _serve_tally(rig, tmp_path)
    owner = owner_headers(db)
    # A poison event stalls fragile at offset 1: what the skips below name.
    poison = {"type": "item", "payload": {"boom": True}}
    seeded = httpx.post(f"{base}/v1/events", json=poison, headers=owner)
    assert seeded.status_code == 201, seeded.text
    page = type("Attack", (_Page,), {"body": _ATTACK.replace("HOST", base).encode()})
    evil = ThreadingHTTPServer(("127.0.0.1", 0), page)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{evil.server_address[1]}/")
        WebDriverWait(browser, 20).until(lambda d: d.title.startswith("done "))
    finally:
        evil.shutdown()
        evil.server_close()
    # The owner's same request passes: the refusals above were the guard, not bad requests.
    skip = httpx.post(
        f"{base}/v1/processors/fragile/skip",
        json={"offset": 1, "by": "owner", "reason": "a test"},
        headers=owner,
    )
    assert skip.status_code == 201, skip.text
    events = _events(db)
    assert not [e.type for e in events if e.type.startswith("csrf.")]
    skipped_by = [e.payload["by"] for e in events if e.type == "streamkit.event-skipped"]
    assert skipped_by == ["owner"]


def test_a_rebound_name_a_foreign_origin_and_a_plain_text_body_are_refused_even_with_the_token(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """Each check holds on its own: Host, Origin and the declared JSON, each with the token."""
    base, db = _serve_tally(rig, tmp_path)
    owner = owner_headers(db)
    body = json.dumps({"type": "item"})
    as_json = {**owner, "Content-Type": "application/json"}
    refusals = [
        ({**as_json, "Host": "rebind.evil.example"}, 400, "INVALID_REQUEST"),
        ({**as_json, "Origin": "http://evil.example"}, 403, "FORBIDDEN"),
        ({**as_json, "Origin": "null"}, 403, "FORBIDDEN"),
        ({**owner, "Content-Type": "text/plain"}, 400, "MALFORMED_REQUEST"),
        ({**owner}, 400, "MALFORMED_REQUEST"),
    ]
    for headers, status, code in refusals:
        refused = httpx.post(f"{base}/v1/events", content=body, headers=headers)
        assert (refused.status_code, refused.json()["code"]) == (status, code), headers
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert "nothing was" in refused.json()["detail"]
    rebound = httpx.get(f"{base}/healthz", headers={"Host": "rebind.evil.example:80"})
    assert rebound.status_code == 400
    assert _events(db) == []
    # The page's own origin and the loopback's name are this server.
    same = httpx.post(f"{base}/v1/events", content=body, headers={**as_json, "Origin": base})
    assert same.status_code == 201, same.text
    port = base.rsplit(":", 1)[1]
    named = httpx.get(f"{base}/v1/processors", headers={**owner, "Host": f"localhost:{port}"})
    assert named.status_code == 200, named.text


def _as_nobody() -> list[str]:
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    if (
        shutil.which("sudo")
        and subprocess.run(
            ["sudo", "-n", "-u", "nobody", "true"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return ["sudo", "-n", "-u", "nobody"]
    reason = "needs root (runuser) or password-less sudo to act as the user nobody"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def test_another_local_user_gets_nothing_over_http(rig: DaemonRig, tmp_path: Path) -> None:
    """As ``nobody``: appends, reads, skips and metrics are 401, as the 0600 socket refuses them."""
    if shutil.which("curl") is None:
        pytest.fail("needs curl (.ci/run installs it)")
    as_nobody = _as_nobody()
    base, db = _serve_tally(rig, tmp_path)
    answers = {}
    for method, url, data in (
        ("POST", "/v1/events", '{"type": "item"}'),
        ("GET", "/v1/events", None),
        ("POST", "/v1/processors/tally/skip", '{"offset": 1, "by": "nobody"}'),
        ("GET", "/metrics", None),
        ("GET", "/healthz", None),
    ):
        argv = [*as_nobody, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method]
        if data is not None:
            argv += ["-H", "Content-Type: application/json", "--data", data]
        done = subprocess.run(
            [*argv, base + url], capture_output=True, text=True, timeout=30, check=True
        )
        answers[f"{method} {url}"] = done.stdout
    assert answers == {
        "POST /v1/events": "401",
        "GET /v1/events": "401",
        "POST /v1/processors/tally/skip": "401",
        "GET /metrics": "401",
        "GET /healthz": "200",
    }
    assert _events(db) == []
    # Nor can that user ask the socket for the token.
    denied = subprocess.run(
        [*as_nobody, sys.executable, "-m", "streamkit", "admin", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert denied.returncode != 0
    assert "#token=" not in denied.stdout
