"""The live overview (issue 36 item 3): one server-sent-events stream per dashboard process,
read at most once a second whoever watches. The clients are driven through the ASGI
application itself (no server): each request's ``receive`` answers ``http.disconnect`` when the
test closes it, as a server does when the browser tab goes away."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest
from dashboard_support import MAIL, REPORT, authorizer, dashboard_tables
from sqlalchemy import event

from ship_sqla import create_dashboard, create_job_backend

WINDOW = 2
"""Readings per measured window."""


class SseClient:
    """One ``GET`` of an event stream through the ASGI app; its events parsed as they come."""

    def __init__(
        self, app: Any, target: str, user: str = "viewer", cookie: str = "session=s1"
    ) -> None:
        path, _, query = target.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": [(b"x-user", user.encode()), (b"cookie", cookie.encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("dashboard.test", 80),
        }
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.blocks: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.body = b""
        self._buffer = b""
        self._gone = asyncio.Event()
        self._asked = False
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            return
        chunk = message.get("body", b"")
        self.body += chunk
        self._buffer += chunk
        while b"\n\n" in self._buffer:
            block, self._buffer = self._buffer.split(b"\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.decode().splitlines():
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data" and "data" in fields:  # SSE: data lines join with newlines
                    value = fields["data"] + "\n" + value
                fields[name or "comment"] = value
            self.blocks.put_nowait(fields)

    async def next_event(self, within: float = 5.0) -> dict[str, str]:
        """The next ``event:`` block (``retry`` and comment lines skipped)."""
        async with asyncio.timeout(within):
            while True:
                block = await self.blocks.get()
                if "event" in block:
                    return block

    async def close(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 5)


@pytest.fixture
async def live(ship_engine: Any) -> Any:
    """(the dashboard, its hub, the backend, the statements counter)."""
    metadata, runs, state, workers, _audit = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    app = create_dashboard(backend, authorizer=authorizer, audit=None, definitions=[MAIL, REPORT])
    [route] = [r for r in app.routes if getattr(r, "path", None) == "/live/overview"]
    hub = route.endpoint.__self__.hub  # type: ignore[attr-defined]
    statements = [0]

    def count(*_args: Any) -> None:
        statements[0] += 1

    event.listen(ship_engine.sync_engine, "before_cursor_execute", count)
    yield app, hub, backend, statements
    event.remove(ship_engine.sync_engine, "before_cursor_execute", count)


async def _measure(clients: list[SseClient], hub: Any, statements: list[int]) -> tuple[int, int]:
    """(statements, hub readings) over ``WINDOW`` events of the first client, once every
    client has had its first event."""
    for client in clients:
        await client.next_event()
    first = clients[0]
    await first.next_event()
    before, readings = statements[0], hub.readings
    started = time.monotonic()
    for _ in range(WINDOW):
        await first.next_event()
    elapsed = time.monotonic() - started
    assert elapsed >= WINDOW * 0.9, elapsed  # at most one reading a second
    return statements[0] - before, hub.readings - readings


async def test_s2_fifty_tabs_cost_the_database_what_one_does_and_the_hub_stops(live: Any) -> None:
    """S2 (each reading is the overview's bounded reads, read-only): 50 clients of the stream
    cost the same statements per second as one (within one reading), because the process
    reads the overview at most once a second whoever watches; each client's message has an id,
    the ``overview`` event and the JSON snapshot, after a ``retry:`` hint; when the last client
    leaves, the hub's task ends (it reads nothing more)."""
    app, hub, _backend, statements = live
    one = SseClient(app, "/live/overview")
    alone, alone_readings = await _measure([one], hub, statements)
    assert one.status == 200
    assert one.headers["content-type"].startswith("text/event-stream")
    assert one.body.startswith(b"retry: 3000\n\n")
    message = await one.next_event()
    assert message["event"] == "overview"
    assert int(message["id"]) > 0
    snapshot = json.loads(message["data"])
    assert {j["job"] for j in snapshot["jobs"]} == {MAIL.id, REPORT.id}
    tabs = [SseClient(app, "/live/overview") for _ in range(49)]
    crowd, crowd_readings = await _measure([one, *tabs], hub, statements)
    assert hub.watchers == 50
    per_reading = alone // alone_readings
    assert alone_readings == crowd_readings == WINDOW
    assert abs(crowd - alone) <= per_reading, (alone, crowd)
    for client in [one, *tabs]:
        await client.close()
    assert hub.watchers == 0
    await asyncio.wait_for(hub.idle(), 5)
    assert not hub.running


async def test_s2_a_committed_enqueue_is_in_the_stream_within_two_seconds(live: Any) -> None:
    """S2: a run enqueued (committed) while a client watches shows in the stream's next
    snapshots within 2 s: dash.mail's due count goes from 0 to 1."""
    app, hub, backend, _statements = live
    client = SseClient(app, "/live/overview")
    first = json.loads((await client.next_event())["data"])
    assert {j["job"]: j["due"] for j in first["jobs"]}[MAIL.id] == 0
    await backend.enqueue(MAIL, {"i": 1})
    committed = time.monotonic()
    due = 0
    while due == 0:
        left = 2.0 - (time.monotonic() - committed)
        snapshot = json.loads((await client.next_event(within=max(left, 0.01)))["data"])
        due = {j["job"]: j["due"] for j in snapshot["jobs"]}[MAIL.id]
    assert due == 1
    await client.close()
    await asyncio.wait_for(hub.idle(), 5)
    assert not hub.running


async def test_s2_the_stream_asks_read_permission_and_checks_its_interval(live: Any) -> None:
    """S2: a user without ``ship.jobs:read`` is refused (403, how to fix it) and starts no
    hub; an interval outside 1..60 s is a 400; ``every=N`` spaces a client's events by N s."""
    app, hub, _backend, _statements = live
    refused = SseClient(app, "/live/overview", user="nobody")
    await asyncio.wait_for(refused.task, 5)
    assert refused.status == 403
    assert b"Fix:" in refused.body
    for bad in ("0", "61", "x", "1.5", "%00"):
        answer = SseClient(app, f"/live/overview?every={bad}")
        await asyncio.wait_for(answer.task, 5)
        assert answer.status == 400, bad
        assert b"Fix:" in answer.body, bad
    assert not hub.running
    slow = SseClient(app, "/live/overview?every=2")
    await slow.next_event()
    started = time.monotonic()
    await slow.next_event()
    assert time.monotonic() - started >= 1.5
    await slow.close()
    await asyncio.wait_for(hub.idle(), 5)
    assert not hub.running


def _mail_due(html: str) -> str:
    """The overview's due cell of dash.mail (a link to its waiting runs)."""
    found = re.search(r'job=dash\.mail&amp;state=waiting">([^<]*)</a>', html)
    assert found is not None, html[:2000]
    return found.group(1)


async def test_s2_the_html_stream_shows_a_committed_enqueue_within_two_seconds(live: Any) -> None:
    """S2 (issue 36 item 3): the overview page's own stream (``?format=html``) sends the
    overview's content as the page renders it, and a run enqueued (committed) while it watches
    shows within 2 s; a manager's variant carries their own form token (put in per client), a
    viewer's has no buttons; JSON and HTML clients share the hub's one reading a second."""
    app, hub, backend, _statements = live
    started = time.monotonic()
    viewer = SseClient(app, "/live/overview?format=html")
    manager = SseClient(app, "/live/overview?format=html", user="admin")
    figures = SseClient(app, "/live/overview")
    first = await viewer.next_event()
    assert first["event"] == "overview"
    assert "<h2>Jobs</h2>" in first["data"]
    assert _mail_due(first["data"]) == "0"
    assert ">Pause</button>" not in first["data"]
    managed = (await manager.next_event())["data"]
    assert ">Pause</button>" in managed
    assert "ship-sqla-csrf-slot" not in managed
    tokens = set(re.findall(r'name="csrf_token" value="([0-9a-f]+)"', managed))
    assert len(tokens) == 1, tokens
    assert json.loads((await figures.next_event())["data"])["jobs"]
    await backend.enqueue(MAIL, {"i": 1})
    committed = time.monotonic()
    due = "0"
    while due == "0":
        left = 2.0 - (time.monotonic() - committed)
        due = _mail_due((await viewer.next_event(within=max(left, 0.01)))["data"])
    assert due == "1"
    assert hub.readings <= time.monotonic() - started + 1  # one a second for all three
    for client in (viewer, manager, figures):
        await client.close()
    await asyncio.wait_for(hub.idle(), 5)
    assert not hub.running


async def test_the_refresh_choice_is_a_cookie_the_pages_follow(live: Any) -> None:
    """Issue 36 item 3: the header's Refresh form (a GET, no JavaScript needed) sets the
    per-browser cookie and returns to the page; "live" makes the overview connect to its
    stream (no poll), N s polls every N s, "off" neither; a choice not offered is a 400 with
    the fix, and the return path is only ever one of the dashboard's."""
    app, _hub, _backend, _statements = live
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://app", headers={"x-user": "viewer"}
    ) as client:
        page = (await client.get("/")).text
        assert 'id="refresh-every"' in page
        assert 'hx-trigger="every 10000ms"' in page  # no choice: refresh_seconds
        assert '<option value="10" selected>' in page
        set_live = await client.get("/refresh", params={"every": "live", "next": "/"})
        assert set_live.status_code == 303
        assert set_live.headers["location"] == "/"
        assert "ship_dashboard_refresh=live" in set_live.headers["set-cookie"]
        page = (await client.get("/")).text
        assert 'sse-connect="/live/overview?format=html"' in page
        assert "hx-trigger" not in page
        assert '<option value="live" selected>' in page
        await client.get("/refresh", params={"every": "5", "next": "/workers"})
        assert 'hx-trigger="every 5000ms"' in (await client.get("/")).text
        assert 'hx-trigger="every 5000ms"' in (await client.get("/workers")).text
        await client.get("/refresh", params={"every": "off"})
        page = (await client.get("/")).text
        assert "hx-trigger" not in page
        assert "sse-connect" not in page
        away = await client.get("/refresh", params={"every": "2", "next": "//evil.example/"})
        assert away.headers["location"] == "/"
        bad = await client.get("/refresh", params={"every": "3"})
        assert bad.status_code == 400
        assert "Fix:" in bad.text
        cleared = await client.get("/refresh", params={"next": "/"})  # no choice: the default
        assert cleared.status_code == 303
        assert 'hx-trigger="every 10000ms"' in (await client.get("/")).text
    bad_format = SseClient(app, "/live/overview?format=xml")
    await asyncio.wait_for(bad_format.task, 5)
    assert bad_format.status == 400
    assert b"Fix:" in bad_format.body


async def test_s2_a_failed_reading_keeps_the_page_under_a_notice_and_the_next_clears_it(
    live: Any,
) -> None:
    """S2 (issue 36 item 3): a reading of the live overview that fails (the database away, a
    query error) never ends the stream and never blanks the page: the HTML stream sends the last
    good content under a notice naming the failure and the time of what is shown, as the page's
    own ``overview`` event (the page swaps nothing else); the JSON stream sends a ``problem``
    event; the next good reading clears the notice."""
    app, hub, _backend, _statements = live
    page = SseClient(app, "/live/overview?format=html")
    figures = SseClient(app, "/live/overview")
    good = await page.next_event()
    assert good["event"] == "overview"
    assert 'id="live-problem"' not in good["data"]
    await figures.next_event()
    read_page, read = hub._read_page, hub._read

    async def failing() -> Any:
        raise OSError("connection refused")

    hub._read_page, hub._read = failing, failing
    failed = await page.next_event()
    while 'id="live-problem"' not in failed["data"]:  # a reading made before the swap
        failed = await page.next_event()
    assert failed["event"] == "overview"
    assert 'id="live-problem"' in failed["data"]
    assert "Live updates failed: the overview could not be read" in failed["data"]
    assert "The figures below are from" in failed["data"]
    assert "<h2>Jobs</h2>" in failed["data"]  # the last good content stays
    problem = await figures.next_event()
    while problem["event"] != "problem":
        problem = await figures.next_event()
    assert "could not be read" in json.loads(problem["data"])["problem"]
    hub._read_page, hub._read = read_page, read
    again = await page.next_event()
    while 'id="live-problem"' in again["data"]:  # one reading may have failed in between
        again = await page.next_event()
    assert "<h2>Jobs</h2>" in again["data"]
    for client in (page, figures):
        await client.close()
    await asyncio.wait_for(hub.idle(), 5)
