"""Shared by the dashboard's tests: jobs, users, dead runs, reading a page's CSRF token, the
headers every response must carry, and the dashboard served over real HTTP (uvicorn on a socket
that listens before the test goes on: no wait for the server to start).

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml): import this module by its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import re
import socket
import threading
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import attrs
from job_helpers import claim_request
from sqlalchemy import MetaData

from ship_sqla import ship_audit_table
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table, ship_job_workers_table
from ship_sqla.kernel import failed
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence


async def _noop(payload: dict[str, Any]) -> None:
    return None


MAIL = define_job(
    "dash.mail",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)
REPORT = define_job(
    "dash.report",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)

USERS = {
    "admin": {
        "ship.jobs:manage",
        "ship.jobs:payloads",
        "ship.jobs:read",
        "ship.outbox:manage",
        "ship.outbox:read",
        "ship.webhooks:manage",
        "ship.webhooks:read",
    },
    "viewer": {"ship.jobs:read", "ship.outbox:read", "ship.webhooks:read"},
    "nobody": set(),
}


def actor(request: Any) -> str:
    """The test application's user: the X-User header, or (for the browser) the ``as``
    cookie."""
    return str(request.headers.get("x-user") or request.cookies.get("as") or "nobody")


def authorizer(request: Any, permission: str, operation: str) -> bool:
    """The test application's authorizer: the permissions USERS gives the request's user."""
    return permission in USERS.get(actor(request), set())


def dashboard_tables() -> tuple[MetaData, Any, Any, Any, Any]:
    """A fresh MetaData with the tables the dashboard reads: (metadata, runs, state, workers,
    audit)."""
    metadata = MetaData()
    return (
        metadata,
        ship_job_runs_table(metadata),
        ship_job_state_table(metadata),
        ship_job_workers_table(metadata),
        ship_audit_table(metadata),
    )


async def dead_runs(backend: Any, job: Any, count: int, *, tenant_every: int = 0) -> list[str]:
    """Enqueue ``count`` runs of ``job`` and fail each on its only attempt: dead."""
    for i in range(count):
        await backend.enqueue(job, {"i": i})
    ids: list[str] = []
    while len(ids) < count:
        claimed = await backend.claim(claim_request(job, worker="w", limit=count - len(ids)))
        assert claimed
        outcomes = await backend.settle(
            [failed(run, f"boom {run.run_id}\nTraceback: line 1", retry_at=None) for run in claimed]
        )
        assert set(outcomes) == {"dead"}
        ids += [run.run_id for run in claimed]
    return ids


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


HOUR = timedelta(hours=1)


CSP_PATTERN = re.compile(
    r"default-src 'none'; script-src 'self' 'nonce-([A-Za-z0-9_-]{24})';"
    r" style-src 'self' 'nonce-\1'; img-src 'self'; connect-src 'self';"
    r" form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every response: its nonce is fresh per response (issue 36)."""

SECURITY_HEADERS = {
    "content-security-policy": CSP_PATTERN,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
"""What every dashboard response carries (issue 25; docs/dashboard.md, "Security headers")."""


def missing_security_headers(headers: Any) -> dict[str, str | None]:
    """The headers of :data:`SECURITY_HEADERS` that ``headers`` (any mapping with ``get``)
    lacks or holds with another value: name -> the value found. Empty: all present."""
    return {
        name: headers.get(name)
        for name, wanted in SECURITY_HEADERS.items()
        if not (
            wanted.fullmatch(headers.get(name) or "")
            if isinstance(wanted, re.Pattern)
            else headers.get(name) == wanted
        )
    }


@contextlib.contextmanager
def served(app: Any, *, dispose: Callable[[], Awaitable[None]] | None = None) -> Iterator[str]:
    """uvicorn serving ``app`` in a thread with its own event loop; yields the base URL.

    The socket listens before this yields, so a request made at once is queued by the kernel
    until uvicorn serves it: nothing waits for the server to start. ``dispose`` (e.g. an
    engine's) runs on the server's loop after it stopped."""
    import uvicorn  # noqa: PLC0415 - the dashboard extra

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    async def serve() -> None:
        try:
            await server.serve(sockets=[listening])
        finally:
            if dispose is not None:
                await dispose()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@attrs.frozen
class Answer:
    """One HTTP response: status, headers (lower-case names), body as text."""

    status: int
    headers: dict[str, str]
    text: str


def exchange(
    base: str,
    requests: Sequence[tuple[str, str, dict[str, str], str | None]],
) -> list[Answer]:
    """Send ``requests`` (method, path with its query already percent-encoded, headers, form
    body) one after another over ONE HTTP/1.1 keep-alive connection to ``base``; fails as soon
    as the server closes or resets it (every answer, a 400 included, must keep it open).
    Blocking: call it through ``anyio.to_thread.run_sync``."""
    where = urlsplit(base)
    assert where.hostname is not None
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    answers = []
    try:
        connection.connect()
        kept = connection.sock
        for method, path, headers, body in requests:
            form = {"content-type": "application/x-www-form-urlencoded"} if body else {}
            connection.request(method, where.path + path, body=body, headers={**headers, **form})
            response = connection.getresponse()
            content = response.read().decode("utf-8", "replace")
            answers.append(
                Answer(
                    response.status,
                    {name.lower(): value for name, value in response.getheaders()},
                    content,
                )
            )
            assert connection.sock is kept, (
                f"the server closed the connection after {method} {path} ({response.status})"
            )
    finally:
        connection.close()
    return answers


async def asgi_request(
    app: Any,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes = b"",
) -> Answer:
    """One request through the ASGI application ``app`` itself (no server, no HTTP client):
    ``target`` is the path and query as a client sends them, percent-encoded ASCII of any
    length. The scope is the one uvicorn builds: ``path`` is the percent-decoded path (invalid
    UTF-8 decoded as U+FFFD, as uvicorn's ``unquote`` does), ``query_string`` the raw bytes. An
    exception that escapes the application is answered as the server would: a 500."""
    path, _, query = target.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode("ascii"),
        "root_path": "",
        "query_string": query.encode("ascii"),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("dashboard.test", 80),
    }
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            return {"type": "http.disconnect"}
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    except Exception as exc:  # the server's answer to anything escaping: a 500
        return Answer(500, {}, "".join(traceback.format_exception(exc))[-3000:])
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(
        start["status"],
        {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]},
        content.decode("utf-8", "replace"),
    )
