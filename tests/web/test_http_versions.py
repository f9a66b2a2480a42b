"""A processor's versions over HTTP: the comparison, the manual cutover and the rollback.

Two hosts on one log: ``a`` serves version 1 (``Effector``), ``b`` builds
version 2 with a manual cutover and serves HTTP. ``GET .../versions`` shows
both rows, their states, the patch between them and ``b``'s counts; ``POST
.../cutover`` cuts over once (again: refused); ``POST .../rollback``
reinstates version 1; bad bodies are refused with nothing changed.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from support.host import Effector, ManualEffectorV2
from support.waits import until

from streamkit import open_log
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.web import HttpService


async def test_versions_cutover_and_rollback_over_http(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    lease = {"ttl": 1.0, "heartbeat": 0.1}
    old = ProcessorHost(
        HostConfig(db=db, lease=lease, shutdown_grace=0.5),
        processors=[Effector()],
        serve_control=False,
        owner="a",
    )
    config = HostConfig(db=db, lease=lease, shutdown_grace=0.5, http={"listen": "127.0.0.1:0"})
    assert config.http is not None
    service = HttpService(config.http)
    new = ProcessorHost(
        config, processors=[ManualEffectorV2()], serve_control=False, owner="b", services=[service]
    )
    try:
        await old.start()
        async with open_log(db) as log:
            written = await log.stream("/").append(
                *({"type": "item", "payload": {"n": 3}} for _ in range(40))
            )
        await old.wait_until_processed("effector", written[-1].offset, timeout=30)
        await new.start()
        token = {"Authorization": f"Bearer {service.token}"}
        async with httpx.AsyncClient(base_url=service.url, headers=token, timeout=30) as client:

            async def waiting() -> bool:
                (row,) = (await client.get("/v1/processors")).json()["processors"]
                return bool(row["phase"] == "awaiting-cutover")

            await until(waiting)
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert "awaiting-cutover" in ready.text

            shown = (await client.get("/v1/processors/effector/versions")).json()
            assert shown["serving_version"] == "1"
            roles = {v["version"]: v for v in shown["versions"]}
            assert (roles["1"]["role"], roles["2"]["role"]) == ("serving", "building")
            assert roles["1"]["state"] == {"total": 120, "items": 40}
            assert roles["2"]["state"] == {"total": 1200, "items": 40}
            assert roles["2"]["patch"] == [{"op": "replace", "path": "/total", "value": 1200}]
            (here,) = shown["hosts"]
            assert (here["owner"], here["version"], here["phase"]) == ("b", "2", "awaiting-cutover")
            assert here["malformed_payloads"] == 0

            cut = await client.post("/v1/processors/effector/cutover")
            assert cut.status_code == 200, cut.text
            assert cut.json() == {
                "slug": "effector",
                "path": "/",
                "version": "2",
                "from_version": "1",
                "offset": roles["1"]["cursor"],  # where version 1 stood (it serves no more)
            }
            again = await client.post("/v1/processors/effector/cutover", json={"within": 5})
            assert again.status_code == 400
            assert again.json()["code"] == "INVALID_REQUEST"
            assert "nothing was cut over" in again.json()["detail"]
            bad = await client.post("/v1/processors/effector/cutover", json={"within": "soon"})
            assert bad.status_code == 400

            refused = await client.post("/v1/processors/effector/rollback", json={})
            assert refused.status_code == 400
            assert "nothing was changed" in refused.json()["detail"]
            back = await client.post("/v1/processors/effector/rollback", json={"to": "1"})
            assert back.status_code == 200, back.text
            assert back.json() == {"slug": "effector", "version": "1", "serving_version": "2"}
            twice = await client.post("/v1/processors/effector/rollback", json={"to": "1"})
            assert twice.status_code == 400
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)
