"""The overview, live (issue 36 item 3): one server-sent-events stream per dashboard process.

A :class:`LiveHub` runs one asyncio task while at least one client watches, and none when
nobody does. The task reads the overview's figures (the reads the overview page makes: demand,
paused jobs, throughput, workers) at most once per ``period`` (1 s), whatever the number of
clients, and hands each client the newest snapshot. 50 open tabs therefore cost the database
what one does. A client never queues: it holds one slot, the latest snapshot; a slow client
skips the snapshots it had no time to read (bounded memory per client).

A client asks for an interval (``?every=N``, 1..60 s; 1 is "live"): it is sent a snapshot at
most every N s, and the hub reads no more often than its most eager client needs. The page's
"off" sends no request at all. The stream (``GET /live/overview``, ``text/event-stream``) starts
with a ``retry:`` hint, then ``event: overview`` messages with an ``id`` (the snapshot's
sequence number) and a JSON ``data`` line, and a comment line every 15 s when nothing else was
sent, so proxies keep it open and a gone client is noticed at the latest then.

``?format=html`` (the overview page's own stream, with the "live" refresh choice) sends, in
place of the JSON, the overview's content as its page renders it (``pages/overview.html``, the
one rendering path): the hub reads the page's reads once per snapshot and each variant (the
mount's path, viewer or manager) is rendered once per snapshot, whoever watches; a manager's
form token is put into the rendered text per client (a string replacement). The page morphs it
in (htmx-ext-sse, idiomorph): a ticked checkbox, the focus and the scroll survive.

The refresh choice (:data:`REFRESH_COOKIE`) is per browser: ``live`` (this stream on the
overview), ``2`` to ``60`` s (the page polls), or ``off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import attrs
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from ship_sqla._dashboard._html import render
from ship_sqla._dashboard._reads import (
    THROUGHPUT_BUCKET,
    THROUGHPUT_BUCKETS,
    THROUGHPUT_CAP,
    overview_jobs,
)
from ship_sqla._dashboard._security import NONCE_KEY
from ship_sqla.kernel._errors import (
    BoundExceededError,
    ConfigurationError,
    PermissionDeniedError,
    ShipError,
)
from ship_sqla.kernel._operations import MANAGE_PERMISSION, READ_PERMISSION, JobOperations
from ship_sqla.kernel._serving import serving_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from starlette.requests import Request

    from ship_sqla._dashboard._app import _Dashboard

_log = logging.getLogger("ship_sqla.dashboard.live")

PERIOD: Final = 1.0
"""The hub's shortest period between two snapshots, in seconds: at most one a second."""
HEARTBEAT: Final = 15.0
"""A comment line is sent after this many seconds without an event."""
RETRY_MS: Final = 3000
"""The ``retry:`` hint: how long a browser waits before it reconnects a dropped stream."""
MAX_EVERY: Final = 60
REFRESH_COOKIE: Final = "ship_dashboard_refresh"
"""The cookie of the user's refresh choice (set by ``GET /refresh``)."""
REFRESH_CHOICES: Final = ("live", "2", "5", "10", "30", "60", "off")
CSRF_SLOT: Final = "ship-sqla-csrf-slot"
"""The form token rendered into a manager's variant, replaced per client by its own."""
_LIVE_OPERATION: Final = "dashboard live"


def refresh_choice(given: str | None) -> str | None:
    """``given`` when it is one of :data:`REFRESH_CHOICES`, else None (no choice made)."""
    return given if given in REFRESH_CHOICES else None


@attrs.frozen
class Snapshot:
    """One reading of the overview: ``seq`` counts the hub's readings (the SSE ``id``), ``event``
    is ``overview`` (or ``problem`` when the reading failed), ``data`` its JSON text (when a
    JSON client was due), ``reading`` the page's reads (when an HTML client was due) and
    ``pages`` its rendered variants, each rendered once (SSE ``data:`` lines)."""

    seq: int
    event: str
    data: str | None
    reading: object = None
    pages: dict[tuple[str, bool], str] = attrs.field(factory=dict)
    problem: str | None = None
    """Why the reading failed (``event`` is ``problem``); its ``reading`` is then the last good
    page reading (None: none yet), shown under a notice saying so."""
    read_at: datetime | None = None
    """When ``reading`` was read (UTC)."""


@attrs.define(eq=False)
class _Watcher:
    """One client: its interval, when it was last handed a snapshot (hub clock), and its one
    slot. Never a queue: a newer snapshot replaces one not yet sent."""

    every: float
    html: bool = False
    handed_at: float | None = None
    latest: Snapshot | None = None
    wake: asyncio.Event = attrs.field(factory=asyncio.Event)


class LiveHub:
    """The per-process hub (see the module). ``read`` returns the snapshot's data; ``clock``
    (monotonic seconds) and ``period`` are injectable for tests. Must be used from one event
    loop (the ASGI server's)."""

    def __init__(
        self,
        read: Callable[[], Awaitable[Mapping[str, Any]]],
        *,
        read_page: Callable[[], Awaitable[object]] | None = None,
        period: float = PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._read_page = read_page
        self._period = period
        self._clock = clock
        self._watchers: set[_Watcher] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._latest: Snapshot | None = None
        self._good: tuple[object, datetime | None] = (None, None)
        """The last page reading that succeeded, and when."""
        self.readings = 0
        """How many snapshots the hub has read (for tests and metrics)."""

    @property
    def running(self) -> bool:
        """Whether a task of the hub has not ended yet: one runs while someone watches; the
        last one's cancellation completes soon after the last client left (:meth:`idle`)."""
        return any(not t.done() for t in (self._task, self._stopping) if t is not None)

    async def idle(self) -> None:
        """Wait until no task of the hub runs (after the last client left)."""
        while self._task is None and self._stopping is not None and not self._stopping.done():
            await asyncio.wait([self._stopping])

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    @contextlib.asynccontextmanager
    async def watching(self, every: float, *, html: bool = False) -> AsyncIterator[_Watcher]:
        """A client watching for as long as the context lasts: the hub starts with the first
        client and stops when the last one leaves (cancelled, not left running idle). ``html``:
        the client wants the page's reading, not the JSON."""
        latest = self._latest if self.running else None  # a stopped hub's reading is stale
        if latest is not None and (latest.reading if html else latest.data) is None:
            latest = None  # read for the other format: this client waits for the next reading
        watcher = _Watcher(every=max(every, self._period), html=html, latest=latest)
        if latest is not None:
            watcher.wake.set()  # the newest reading at once; a fresh one follows within a period
        self._watchers.add(watcher)
        if not self.running:
            # A fresh context: the hub must not inherit the first client's request context (an
            # ambient transaction scope or tenant its app set) and read inside it for everyone.
            self._task = asyncio.create_task(
                self._run(), name="ship-sqla dashboard live hub", context=contextvars.Context()
            )
        try:
            yield watcher
        finally:
            self._watchers.discard(watcher)
            if not self._watchers and self._task is not None:
                # The client's own cancellation (a disconnect) may be redelivered at any await
                # here, so the task is cancelled and remembered, not awaited.
                self._stopping, self._task = self._task, None
                self._stopping.cancel()

    async def _run(self) -> None:
        while self._watchers:
            started = self._clock()
            due = [
                w
                for w in self._watchers
                if w.handed_at is None or started - w.handed_at >= w.every - self._period / 2
            ]
            if due:
                snapshot = await self._reading(
                    data=any(not w.html for w in due), page=any(w.html for w in due)
                )
                for w in due:
                    w.latest, w.handed_at = snapshot, started
                    w.wake.set()
            await asyncio.sleep(max(0.0, self._period - (self._clock() - started)))

    async def _reading(self, *, data: bool, page: bool) -> Snapshot:
        """One reading, of what the due clients want: the JSON ``data``, the ``page``'s reads,
        or both."""
        self.readings += 1
        reading, read_at, problem = None, None, None
        try:
            figures: Mapping[str, Any] | None = await self._read() if data else None
            if page and self._read_page is not None:
                reading, read_at = await self._read_page(), datetime.now(UTC)
                self._good = (reading, read_at)
        except ShipError as exc:
            _log.warning("the live overview could not be read: %s", exc)
            problem = str(exc)
        except Exception:  # noqa: BLE001 - a failed read never ends the stream; the next tries
            _log.exception("the live overview could not be read")
            problem = "the overview could not be read (see the server log)."
        if problem is not None:
            figures = {"problem": problem}
            reading, read_at = self._good  # the page stays, under a notice (Snapshot.problem)
        text = None if figures is None else json.dumps(figures, separators=(",", ":"))
        event = "overview" if problem is None else "problem"
        snapshot = Snapshot(self.readings, event, text, reading, problem=problem, read_at=read_at)
        self._latest = snapshot
        return snapshot


async def overview_figures(
    ops: JobOperations, job_ids: tuple[str, ...], *, now: Callable[[], datetime]
) -> dict[str, Any]:
    """The overview's figures as JSON data, read with the overview page's reads (S2: each a
    bounded, index-served statement): per job due / delayed / running / oldest due age /
    serving workers / paused since, the throughput buckets, the workers alive."""
    buckets = await ops.throughput(
        bucket_seconds=THROUGHPUT_BUCKET, buckets=THROUGHPUT_BUCKETS, cap=THROUGHPUT_CAP
    )
    paused = {p.job_id: p.paused_at for p in await ops.paused()}
    lines = await overview_jobs(ops, also=[*paused, *job_ids])
    try:
        workers = await ops.workers()
    except ConfigurationError:  # no workers table
        workers = None
    at = now()
    served = None if workers is None else serving_of(workers, now=at)
    jobs = []
    for line in lines:
        job_id, d = line.job_id, line.demand
        jobs.append(
            {
                "job": job_id,
                "due": 0 if d is None else d.due,
                "due_capped": d is not None and d.capped,
                "delayed": 0 if d is None else d.delayed,
                "running": 0 if d is None else d.running,
                "oldest_due_age": None if d is None else d.oldest_due_age,
                "dead": line.dead,
                "failing": line.failing,
                "workers": None if served is None else served.per_job.get(job_id, 0),
                "paused_at": None if job_id not in paused else paused[job_id].isoformat(),
            }
        )
    return {
        "at": at.isoformat(),
        "jobs": jobs,
        "throughput": {
            "bucket_seconds": THROUGHPUT_BUCKET,
            "completed": sum(b.completed for b in buckets),
            "dead": sum(b.dead for b in buckets),
            "capped": any(b.capped for b in buckets),
            "buckets": [[b.start.isoformat(), b.completed, b.dead] for b in buckets],
        },
        "workers": None
        if workers is None
        else {"alive": 0 if served is None else served.live_workers, "registered": len(workers)},
    }


def _read_only(permission: str, _operation: str) -> bool:
    return permission == READ_PERMISSION


class LiveOverview:
    """The ``GET /live/overview`` endpoint and its hub; one per dashboard application."""

    def __init__(
        self,
        jobs: JobOperations,
        *,
        authorizer: Callable[[Request, str, str], Any],
        job_ids: tuple[str, ...] = (),
        page: _Dashboard | None = None,
        period: float = PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The hub reads for every client at once: as itself, read-only. Each client's own
        # permission is asked when it connects (fail closed, as every page).
        reader = jobs.acting_as("dashboard live", authorizer=_read_only)
        self.authorizer = authorizer
        self.page = page
        self.hub = LiveHub(
            lambda: overview_figures(reader, job_ids, now=lambda: datetime.now(UTC)),
            read_page=None if page is None else lambda: page.overview_reading(reader),
            period=period,
            clock=clock,
        )

    @classmethod
    def of(cls, state: _Dashboard) -> LiveOverview:
        return cls(
            state.jobs, authorizer=state.authorizer, job_ids=tuple(state.definitions), page=state
        )

    async def _holds(self, request: Request, permission: str) -> bool:
        answer = self.authorizer(request, permission, _LIVE_OPERATION)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer is True

    async def stream(self, request: Request) -> Response:
        """The SSE stream (see the module); 403 without ``ship.jobs:read``, 400 for a bad
        ``every`` or ``format``."""
        every = _every(request.query_params.get("every"))
        form = request.query_params.get("format", "json")
        if form not in ("json", "html") or (form == "html" and self.page is None):
            refused: ShipError = ConfigurationError(
                f"format={form[:20]!r} is not a format of this stream.",
                fix="omit it (JSON), or pass ?format=html (the overview page's own stream).",
            )
            return PlainTextResponse(f"400 {refused}", 400)
        if every is None:
            refused = BoundExceededError(
                f"every must be a whole number of seconds, 1 to {MAX_EVERY}.",
                fix="omit it (live: 1 s), or pass ?every=2 to 60; the page's 'off' sends none.",
            )
            return PlainTextResponse(f"400 {refused}", 400)
        manager = await self._holds(request, MANAGE_PERMISSION)
        if not (manager or await self._holds(request, READ_PERMISSION)):
            refused = PermissionDeniedError(
                f"the authorizer refused both {READ_PERMISSION!r} and {MANAGE_PERMISSION!r}"
                f" for operation {_LIVE_OPERATION!r}; nothing was read.",
                fix=f"grant {READ_PERMISSION!r} to this user in the dashboard's authorizer.",
            )
            return PlainTextResponse(f"403 {refused}", 403)
        variant = None
        if form == "html" and self.page is not None:
            csrf = self.page.csrf(request) if manager else None
            variant = _Variant(self.page.base(request), csrf, _nonce(request))
        return StreamingResponse(
            self._events(every, variant),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _events(self, every: float, variant: _Variant | None) -> AsyncIterator[str]:
        """One client's messages (the JSON, or with a ``variant`` the page's HTML); the
        server's disconnect handling cancels it, which leaves the hub (``watching``'s exit)."""
        yield f"retry: {RETRY_MS}\n\n"
        async with self.hub.watching(every, html=variant is not None) as watcher:
            while True:
                try:
                    await asyncio.wait_for(watcher.wake.wait(), HEARTBEAT)
                except TimeoutError:
                    yield ": heartbeat\n\n"
                    continue
                watcher.wake.clear()
                snapshot = watcher.latest
                if snapshot is None:
                    continue
                if variant is None:
                    event, data = snapshot.event, f"data: {snapshot.data}\n"
                else:  # a failed reading too: the page's own event, the notice on top
                    event, data = "overview", self._page_lines(snapshot, variant)
                yield f"id: {snapshot.seq}\nevent: {event}\n{data}\n"

    def _page_lines(self, snapshot: Snapshot, variant: _Variant) -> str:
        """``snapshot``'s page for ``variant`` as SSE ``data:`` lines: rendered once per
        snapshot and variant (cached in the snapshot), the client's own form token put in."""
        key = (variant.base, variant.csrf is not None)
        lines = snapshot.pages.get(key)
        if lines is None:
            assert self.page is not None  # noqa: S101 - an HTML variant is made only with a page
            html = "" if snapshot.problem is None else _problem_notice(snapshot)
            if snapshot.reading is not None:
                html += self.page.overview_content(
                    snapshot.reading,  # type: ignore[arg-type]
                    base=variant.base,
                    csrf=None if variant.csrf is None else CSRF_SLOT,
                    nonce=_NONCE_SLOT,
                )[0]
            # Each of CR, LF and CRLF ends an SSE line: a CR in the content must not end one.
            lines = "".join(f"data: {line}\n" for line in _SSE_LINES.split(html))
            snapshot.pages[key] = lines
        if variant.csrf is not None:
            lines = lines.replace(f'value="{CSRF_SLOT}"', f'value="{variant.csrf}"')
        return lines.replace(f'nonce="{_NONCE_SLOT}"', f'nonce="{variant.nonce}"')


def _problem_notice(snapshot: Snapshot) -> str:
    """The notice over a live page whose last reading failed: why, and the time of what is
    shown under it (the next good reading replaces both)."""
    return str(render("live_problem.html", problem=snapshot.problem, read_at=snapshot.read_at))


_NONCE_SLOT: Final = "ship-sqla-nonce-slot"
_SSE_LINES: Final = re.compile(r"\r\n|\r|\n")


@attrs.frozen
class _Variant:
    """An HTML client: the mount's path its links start with, its form token (a manager's;
    None: a viewer's variant, no buttons) and the nonce its data island carries."""

    base: str
    csrf: str | None
    nonce: str


def _nonce(request: Request) -> str:
    return str(request.scope.get(NONCE_KEY, ""))


def _every(given: str | None) -> float | None:
    if given is None:
        return PERIOD
    if not (given.isascii() and given.isdigit() and len(given) <= 2):  # noqa: PLR2004 - "60"
        return None
    value = int(given)
    return float(value) if 1 <= value <= MAX_EVERY else None
