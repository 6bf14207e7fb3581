"""Find anything, and act on what matches (issue 36 items 4-5; S1, S2).

:class:`RunFilter` is what an operator searches by: a run id (a jump), a job, a tenant, a
state, a time range on that state's own time, a worker, error text and payload fields
(``path=value``). :func:`search_runs` walks the runs page statements the dashboard already reads
(:meth:`~ship_sqla.kernel._browse.RunBrowser.list_runs`: each page one bounded, index-served
read, in the live table and, with a history table, in history too, J16) and keeps the runs that
match. What the index serves costs a page; the rest (tenant, worker, error, payload, a live
state's time range) is read past, at most ``scan`` index entries per page
(:data:`FILTER_BOUNDS`): a page that stops there says so ("scanned N, stopped") and its next
cursor goes on from where it stopped. The same walk serves every backend: the in-memory one is
this module's twin of the PostgreSQL one for the conformance suite.

Acting on what matches (:func:`act_matching`) walks the same way, up to :data:`MAX_BULK_RUNS`
runs in batches of ``batch_size`` (at most 1,000), each batch in one transaction when a
``transaction`` runner is given. The preview (:func:`preview_matching`) only counts: a browser
that counts itself (:class:`MatchCounter`, PostgreSQL: ONE statement over the states' index
ranges, :data:`MAX_BULK_SCAN` entries at most in all, the filters tested in SQL by the rules
:meth:`RunFilter.matches` applies) does; else the walk counts (the in-memory backend). Either
way it counts what the action's walk reaches, no more: across jobs, the runs of the jobs the
runs pages across jobs read (:data:`MAX_BROWSE_JOBS` per state). The preview answers a count and a
confirmation token bound to the action, the filter and that count; the action takes only the
token, acts on at most the previewed count, and reports progress after each batch.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import string
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol, cast, runtime_checkable

import attrs

from ship_sqla.kernel._browse import (
    MAX_BROWSE_JOBS,
    RunQuery,
    position_cursor_values,
    position_from_cursor_values,
    position_of,
    run_order,
)
from ship_sqla.kernel._cursor import (
    KeysetPosition,
    decode_cursor,
    encode_cursor,
    query_fingerprint,
)
from ship_sqla.kernel._errors import ConfigurationError, InvalidCursorError, RefusedError
from ship_sqla.kernel._jobs import is_job_id
from ship_sqla.kernel._ports import RUN_STATES
from ship_sqla.kernel._tenancy import check_tenant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from ship_sqla.kernel._browse import RunBrowser, RunPosition
    from ship_sqla.kernel._ports import RunRecord, RunState

__all__ = [
    "BULK_STATES",
    "DEFAULT_SCAN",
    "FILTER_BOUNDS",
    "MAX_BULK_BATCH",
    "MAX_BULK_RUNS",
    "MAX_BULK_SCAN",
    "MAX_PAGE_SIZE",
    "MAX_SCAN",
    "MIN_PAGE_SIZE",
    "BulkAction",
    "BulkPreview",
    "BulkProgress",
    "BulkTokenError",
    "MatchCount",
    "MatchCounter",
    "RunFilter",
    "RunFilterError",
    "SearchPage",
]

MIN_PAGE_SIZE: Final = 20
MAX_PAGE_SIZE: Final = 200
DEFAULT_SCAN: Final = 2000
"""Runs a search page reads past at most, by default (``scan=``)."""
MAX_SCAN: Final = 100_000
MAX_BULK_RUNS: Final = 100_000
"""The most runs one bulk action by filter changes (issue 36)."""
MAX_BULK_BATCH: Final = 1000
MAX_BULK_SCAN: Final = 1_000_000
"""Index entries a preview or a bulk action reads past at most."""
TOKEN_TTL: Final = 900.0
"""Seconds a confirmation token stays good (15 minutes)."""
_READ: Final = 500
"""Runs per page statement of the walk (the runs pages' own maximum)."""
_MAX_STACK: Final = 20
"""Pages a cursor remembers for "previous"; past them, previous goes to the first page."""
_MAX_TEXT: Final = 200
_MAX_PAYLOAD_FIELDS: Final = 5

FILTER_BOUNDS: Final[Mapping[str, str]] = {
    "id": "one read by id (the live table, then history)",
    "job": "served by the state's index: a page costs its rows",
    "state": "served by the state's index: a page costs its rows",
    "from/to": "finished states: served by the index (created_at); waiting (run_at) and running"
    " (lease expiry): read past, within the scan bound",
    "tenant": "read past, within the scan bound",
    "worker": "read past, within the scan bound",
    "error": "read past, within the scan bound",
    "payload": "read past, within the scan bound",
}
"""Each filter and what it costs (issue 36: every filter has a stated bound). "Within the scan
bound": a page reads at most ``scan`` index entries (default :data:`DEFAULT_SCAN`), then stops
and says so."""

BulkAction = Literal["retry", "cancel", "discard"]
BULK_STATES: Final[Mapping[str, tuple[RunState, ...]]] = {
    "retry": ("dead",),
    "cancel": ("waiting", "running"),
    "discard": ("waiting", "dead"),
}
"""The states each bulk action takes runs from (J8, K2)."""


class RunFilterError(ConfigurationError):
    """A search filter cannot be used: ``field`` names which one, ``fix`` says how."""

    code = "SHIP_SQLA_RUN_FILTER_INVALID"

    def __init__(self, field: str, message: str, *, fix: str) -> None:
        self.field = field
        super().__init__(f"filter {field}: {message}", fix=fix)


class BulkTokenError(RefusedError, RuntimeError):
    """A bulk action's confirmation token does not fit the action and filter, or is too old:
    nothing changed."""

    code = "SHIP_SQLA_BULK_TOKEN_INVALID"


def _field_error(field: str, message: str, fix: str) -> RunFilterError:
    return RunFilterError(field, message, fix=fix)


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT:
        raise _field_error(
            field,
            f"{value!r} is not text of 1..{_MAX_TEXT} characters.",
            f"give {field} as non-blank text of at most {_MAX_TEXT} characters, or leave it out.",
        )
    if not value.isprintable():
        raise _field_error(field, "holds unprintable characters.", "type plain text.")
    return value


def _time(field: str, value: object) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise _field_error(
                field,
                f"{value!r} is not a date and time.",
                f"write {field} as ISO 8601 with its offset, e.g. 2026-12-06T21:00:00+00:00.",
            ) from None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise _field_error(
            field,
            f"{value!r} has no time zone.",
            f"give {field} with its offset (+00:00 for UTC).",
        )
    return value


def _payload_field(value: object) -> tuple[tuple[str, ...], Any]:
    fix = 'write payload as path=value, e.g. order.id=42 or customer.name="Ann".'
    if not isinstance(value, str) or "=" not in value:
        raise _field_error("payload", f"{value!r} is not path=value.", fix)
    path_text, raw = value.split("=", 1)
    path = tuple(part.strip() for part in path_text.split("."))
    if not path_text.strip() or any(not part for part in path) or len(path) > 10:  # noqa: PLR2004
        raise _field_error("payload", f"the path {path_text!r} is empty or malformed.", fix)
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw  # a bare word is a string
    if isinstance(parsed, (dict, list)):
        raise _field_error("payload", "the value is an object or a list.", fix)
    return path, parsed


@attrs.frozen
class RunFilter:
    """What to find (every field optional; all given must match):

    - ``run_id``: that one run (a jump box);
    - ``job_id``, ``tenant``: exact;
    - ``state``: one run state (None: every state, live first);
    - ``time_from`` / ``time_to``: ``[from, to)`` on the state's own time: a waiting run's due
      time (``run_at``), a running run's lease expiry, a completed run's finish time (J18:
      its runs page's order), a dead, discarded or cancelled run's creation time;
    - ``worker``: the worker that holds it or ran its last attempt (exact);
    - ``error``: text in its last error, the letters A-Z in any case (every other character
      as written: the same rule in SQL and in Python, whatever the database's locale);
    - ``payload``: ``(path, value)`` pairs, each ``payload[path...] == value`` as JSON values
      compare (``true`` is not 1; a path part of digits indexes a list, ``-1`` its last).

    Build with :meth:`parse` (from ``name=value`` texts, a form's or ``--filter``'s); every bad
    field raises :class:`RunFilterError` naming it and the fix."""

    FIELDS: ClassVar[tuple[str, ...]] = (
        "id",
        "job",
        "tenant",
        "state",
        "from",
        "to",
        "worker",
        "error",
        "payload",
    )

    run_id: str | None = None
    job_id: str | None = None
    tenant: str | None = None
    state: RunState | None = None
    time_from: datetime | None = None
    time_to: datetime | None = None
    worker: str | None = None
    error: str | None = None
    payload: tuple[tuple[tuple[str, ...], Any], ...] = ()

    @classmethod
    def parse(cls, fields: Iterable[str] | Mapping[str, str | list[str]]) -> RunFilter:
        """A filter from ``name=value`` texts (``["job=mail", "payload=order.id=7"]``) or a
        form's fields; blank values are left out; ``payload`` may repeat."""
        pairs: list[tuple[str, str]] = []
        if isinstance(fields, dict):
            for name, value in fields.items():
                values = value if isinstance(value, list) else [value]
                pairs.extend((name, item) for item in values)
        else:
            for text in fields:
                if "=" not in text:
                    raise _field_error(
                        str(text), "is not name=value.", f"write one of {', '.join(cls.FIELDS)}."
                    )
                name, value = text.split("=", 1)
                pairs.append((name.strip(), value))
        given: dict[str, Any] = {}
        payload: list[str] = []
        for name, value in pairs:
            if name not in cls.FIELDS:
                raise _field_error(name, "is not a filter.", f"use one of {', '.join(cls.FIELDS)}.")
            if not value.strip():
                continue
            if name == "payload":
                payload.append(value)
            else:
                given[name] = value.strip()
        return cls.of(
            run_id=given.get("id"),
            job_id=given.get("job"),
            tenant=given.get("tenant"),
            state=given.get("state"),
            time_from=given.get("from"),
            time_to=given.get("to"),
            worker=given.get("worker"),
            error=given.get("error"),
            payload=payload,
        )

    @classmethod
    def of(
        cls,
        *,
        run_id: object = None,
        job_id: object = None,
        tenant: object = None,
        state: object = None,
        time_from: object = None,
        time_to: object = None,
        worker: object = None,
        error: object = None,
        payload: Iterable[str] = (),
    ) -> RunFilter:
        """A checked filter (:class:`RunFilterError` for the first bad field)."""
        if job_id is not None and not is_job_id(job_id):
            raise _field_error(
                "job",
                f"{job_id!r} is not a job id.",
                "pick the job from the list (letters, digits and _ . : -).",
            )
        if state is not None and state not in RUN_STATES:
            raise _field_error(
                "state", f"{state!r} is not a run state.", f"use one of {', '.join(RUN_STATES)}."
            )
        if tenant is not None:
            try:
                check_tenant(_text("tenant", tenant), operation="search")
            except ConfigurationError as exc:
                raise _field_error("tenant", exc.message, exc.fix or "") from None
        start = None if time_from is None else _time("from", time_from)
        end = None if time_to is None else _time("to", time_to)
        if start is not None and end is not None and start >= end:
            raise _field_error("to", "is not after from.", "give a to later than from.")
        fields = [_payload_field(item) for item in payload]
        if len(fields) > _MAX_PAYLOAD_FIELDS:
            raise _field_error(
                "payload", f"{len(fields)} fields given.", f"give at most {_MAX_PAYLOAD_FIELDS}."
            )
        return cls(
            run_id=None if run_id is None else _text("id", run_id),
            job_id=cast("str | None", job_id),
            tenant=cast("str | None", tenant),
            state=state,
            time_from=start,
            time_to=end,
            worker=None if worker is None else _text("worker", worker),
            error=None if error is None else _text("error", error),
            payload=tuple(fields),
        )

    def as_fields(self) -> list[tuple[str, str]]:
        """The filter as ``(name, value)`` pairs :meth:`parse` reads back (a link's query)."""
        out: list[tuple[str, str]] = []
        simple = (
            ("id", self.run_id),
            ("job", self.job_id),
            ("tenant", self.tenant),
            ("state", self.state),
            ("from", None if self.time_from is None else self.time_from.isoformat()),
            ("to", None if self.time_to is None else self.time_to.isoformat()),
            ("worker", self.worker),
            ("error", self.error),
        )
        out.extend((name, value) for name, value in simple if value is not None)
        for path, value in self.payload:
            out.append(("payload", ".".join(path) + "=" + json.dumps(value)))
        return out

    def describe(self) -> str:
        """The filter in words: ``job=mail state=dead`` (``every run`` when empty)."""
        return " ".join(f"{name}={value}" for name, value in self.as_fields()) or "every run"

    def fingerprint(self) -> str:
        return query_fingerprint(
            ("ship_sqla.jobs.search", *(f"{n}={v}" for n, v in self.as_fields()))
        )

    def states(self, allowed: tuple[RunState, ...] = RUN_STATES) -> tuple[RunState, ...]:
        """The states this filter walks, in walk order."""
        if self.state is None:
            return allowed
        if self.state not in allowed:
            raise _field_error(
                "state",
                f"{self.state!r} runs cannot be acted on this way.",
                f"use one of {', '.join(allowed)}, or leave state out.",
            )
        return (self.state,)

    def matches(self, record: RunRecord) -> bool:
        """Whether ``record`` matches every field (the walk's residual check, in Python)."""
        exact = (
            (self.run_id, record.run_id),
            (self.job_id, record.job_id),
            (self.tenant, record.tenant),
            (self.state, record.state),
            (self.worker, record.worker),
        )
        if any(wanted is not None and wanted != got for wanted, got in exact):
            return False
        if not self._in_range(record):
            return False
        if self.error is not None and (
            record.last_error is None
            or self.error.translate(_ASCII_LOWER) not in record.last_error.translate(_ASCII_LOWER)
        ):
            return False
        return all(_json_equal(_at(record.payload, path), value) for path, value in self.payload)

    def _in_range(self, record: RunRecord) -> bool:
        if self.time_from is None and self.time_to is None:
            return True
        at = {
            "claim": record.run_at,
            "lease": record.lease_expires_at,
            "created": record.created_at,
            "finished": record.finished_at,
        }[run_order(record.state)]
        if at is None:
            return False
        return (self.time_from is None or at >= self.time_from) and (
            self.time_to is None or at < self.time_to
        )


_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
"""The error filter's case rule: the letters A-Z in any case, every other character as written
(PostgreSQL's ``lower(... COLLATE "C")``, whatever the database's locale: the bulk preview's
count tests it in SQL, the walk here, and both must agree)."""

_INDEX: Final = re.compile(r"[+-]?[0-9]+")
"""A path part PostgreSQL's ``#>`` reads as an array index (``-1``: the last element)."""


def _at(payload: Any, path: tuple[str, ...]) -> tuple[bool, Any]:  # noqa: ANN401 - JSON
    """The value at ``path`` in ``payload`` as ``payload #> path`` finds it: (False, None)
    when there is none."""
    node = payload
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and _INDEX.fullmatch(part):
            index = int(part)
            if index < 0:
                index += len(node)
            if not 0 <= index < len(node):
                return False, None
            node = node[index]
        else:
            return False, None
    return True, node


def _json_equal(found: tuple[bool, Any], value: Any) -> bool:  # noqa: ANN401 - JSON
    """Whether the value ``found`` (:func:`_at`) is ``value`` as JSON values compare (jsonb's
    ``=``): ``true`` is not the number 1 (Python's ``True == 1`` is), 1 and 1.0 are equal."""
    present, node = found
    if not present:
        return False
    if isinstance(node, bool) or isinstance(value, bool):
        return type(node) is type(value) and node == value
    return bool(node == value)


Start = tuple[int, "RunPosition | None"]
"""Where a walk starts: the index of a state in the filter's walk, and the position in that
state's order after which it goes on (None: from its start)."""


@attrs.frozen
class SearchPage:
    """A page of runs that match: ``items`` (at most the page size), cursors for the
    ``next_cursor`` and ``previous_cursor`` page (None: none; ``previous_cursor`` of the second
    page is the first page's, ``""``), ``scanned``: index entries read, ``stopped``: whether the
    page stopped at ``bound`` entries with more to read (``note`` says so; ``next_cursor`` goes
    on from there)."""

    items: tuple[RunRecord, ...]
    next_cursor: str | None
    previous_cursor: str | None
    scanned: int
    stopped: bool
    bound: int

    @property
    def note(self) -> str | None:
        """``"scanned N, stopped"`` when the page stopped at its bound, else None."""
        return f"scanned {self.scanned:,}, stopped" if self.stopped else None


@attrs.define
class _Walk:
    """Where a walk is: the runs found and the position after each (kept only when asked:
    a preview counts), how many matched, the entries read."""

    keep: bool = True
    found: list[tuple[RunRecord, Start]] = attrs.Factory(list)
    matched: int = 0
    scanned: int = 0
    end: Start | None = None
    """Where the walk stopped with more to read; None when every state was read to its end."""


async def _walk(
    browser: RunBrowser,
    flt: RunFilter,
    states: tuple[RunState, ...],
    start: Start,
    *,
    want: int,
    bound: int,
    keep: bool = True,
) -> _Walk:
    """Read pages in each state's order from ``start`` until ``want`` runs match or ``bound``
    entries were read; every page is one of the runs pages' bounded, index-served reads."""
    walk = _Walk(keep=keep)
    index, after = start
    # The first read asks what the page needs (a filter the index serves then costs one page,
    # as the runs page does); each read after it asks four times more, up to _READ.
    size = want
    while index < len(states) and walk.matched < want and walk.scanned < bound:
        state = states[index]
        ask = min(size, _READ, bound - walk.scanned)
        size = min(size * 4, _READ)
        finished = run_order(state) in ("created", "finished")
        query = RunQuery(
            state=state,
            limit=ask,
            job_id=flt.job_id,
            time_from=flt.time_from if finished else None,
            time_to=flt.time_to if finished else None,
            after=after,
        )
        rows = await browser.list_runs(query, max_jobs=MAX_BROWSE_JOBS)
        for row in rows:
            walk.scanned += 1
            after = position_of(row)
            if flt.matches(row.record):
                walk.matched += 1
                if keep:
                    walk.found.append((row.record, (index, after)))
                if walk.matched == want:
                    break
        if walk.matched < want and len(rows) < ask:
            index, after = index + 1, None
    walk.end = (index, after) if index < len(states) else None
    return walk


def _encode(stack: list[Start], query: str, secret: bytes) -> str:
    values: list[Any] = []
    for index, position in stack[:_MAX_STACK]:
        values.append(index)
        values.extend(("none",) if position is None else position_cursor_values(position))
    return encode_cursor(KeysetPosition(query, tuple(values)), secret)


_KIND_WIDTH: Final = {"none": 0, "claim": 3, "lease": 2, "created": 2, "finished": 2}


def _decode(cursor: str, query: str, secret: bytes, states: tuple[RunState, ...]) -> list[Start]:
    values = list(decode_cursor(cursor, secret=secret, query=query))
    stack: list[Start] = []
    while values:
        index, kind = values[0], values[1] if len(values) > 1 else None
        width = _KIND_WIDTH.get(kind) if isinstance(kind, str) else None
        if not isinstance(index, int) or not 0 <= index < len(states) or width is None:
            raise InvalidCursorError(
                "the search cursor does not hold a search position.",
                fix="start again from the first page.",
            )
        chunk, values = values[1 : 2 + width], values[2 + width :]
        position = (
            None if kind == "none" else position_from_cursor_values(tuple(chunk), states[index])
        )
        stack.append((index, position))
    return stack


async def search_runs(
    browser: RunBrowser,
    get_run: Callable[[str], Awaitable[RunRecord | None]],
    flt: RunFilter,
    *,
    secret: bytes,
    limit: int = 50,
    cursor: str | None = None,
    scan: int = DEFAULT_SCAN,
) -> SearchPage:
    """One page of runs matching ``flt`` (see the module doc). ``limit`` is 20..200, ``scan``
    1..:data:`MAX_SCAN`; a cursor is valid only for the same filter."""
    if not MIN_PAGE_SIZE <= limit <= MAX_PAGE_SIZE:
        raise _field_error(
            "limit", f"{limit} rows per page.", f"ask for {MIN_PAGE_SIZE}..{MAX_PAGE_SIZE}."
        )
    if not 1 <= scan <= MAX_SCAN:
        raise _field_error("scan", f"{scan} entries.", f"give 1..{MAX_SCAN}.")
    if flt.run_id is not None:
        record = await get_run(flt.run_id)
        found = () if record is None or not flt.matches(record) else (record,)
        return SearchPage(found, None, None, 1, stopped=False, bound=1)
    states = flt.states()
    query = flt.fingerprint()
    stack: list[Start] = [(0, None)] if not cursor else _decode(cursor, query, secret, states)
    walk = await _walk(browser, flt, states, stack[0], want=limit + 1, bound=scan)
    items = tuple(record for record, _ in walk.found[:limit])
    nxt: Start | None = None
    if len(walk.found) > limit:
        nxt = walk.found[limit - 1][1]
    elif walk.end is not None:
        nxt = walk.end
    stopped = nxt is not None and len(walk.found) <= limit
    next_cursor = None if nxt is None else _encode([nxt, *stack], query, secret)
    previous_cursor = None
    if len(stack) > 1:
        previous_cursor = _encode(stack[1:], query, secret)
    elif cursor:
        previous_cursor = ""  # the first page
    return SearchPage(items, next_cursor, previous_cursor, walk.scanned, stopped, scan)


# --- acting on what matches -------------------------------------------------------------------


@attrs.frozen
class BulkPreview:
    """What a bulk action by filter would take: ``count`` runs (at most
    :data:`MAX_BULK_RUNS`; ``capped`` when more match), ``scanned`` entries read (``stopped``:
    the walk stopped at :data:`MAX_BULK_SCAN` entries in all with more to read, so ``count`` is
    a lower bound), and the ``token`` the action requires. Without a job in the filter, the
    count, as the action, covers the runs of the first :data:`MAX_BROWSE_JOBS` jobs (by id) with
    runs in each state: what the runs pages across jobs read."""

    action: BulkAction
    count: int
    capped: bool
    scanned: int
    stopped: bool
    token: str


@attrs.frozen
class BulkProgress:
    """After each committed batch: runs ``done`` of ``total`` (the previewed count), how many
    ``changed``, and the batches committed."""

    done: int
    changed: int
    total: int
    batches: int


def _mac(secret: bytes, action: str, flt: RunFilter, count: int, issued: int) -> str:
    body = f"{action}\x00{flt.fingerprint()}\x00{count}\x00{issued}".encode()
    return hmac.new(secret, b"ship_sqla.bulk\x00" + body, hashlib.sha256).hexdigest()[:32]


def bulk_token(secret: bytes, action: str, flt: RunFilter, count: int, now: float) -> str:
    issued = int(now)
    return f"{count}.{issued}.{_mac(secret, action, flt, count, issued)}"


def check_bulk_token(secret: bytes, action: str, flt: RunFilter, token: object, now: float) -> int:
    """The previewed count ``token`` confirms for ``action`` on ``flt``, else
    :class:`BulkTokenError` (nothing changes)."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():  # noqa: PLR2004
        count, issued = int(parts[0]), int(parts[1])
        good = hmac.compare_digest(parts[2], _mac(secret, action, flt, count, issued))
        if good and 0 <= now - issued <= TOKEN_TTL:
            return count
        if good:
            raise BulkTokenError(
                f"the {action} confirmation is {int(now - issued)} s old.",
                fix="preview again and confirm within 15 minutes.",
            )
    raise BulkTokenError(
        f"the confirmation token was not issued for {action} of {flt.describe()}.",
        fix="preview this action with this filter and pass the token it answers.",
    )


def check_bulk_total(operation: str, total: int) -> None:
    """Refuse a confirmed count past :data:`MAX_BULK_RUNS` (a preview never issues one: it
    caps its count and says so) before any statement."""
    if total > MAX_BULK_RUNS:
        raise ConfigurationError(
            f"{operation} was confirmed for {total:,} runs; one action takes at most"
            f" {MAX_BULK_RUNS:,} runs.",
            fix="preview again (the preview caps its count at the limit), act, then preview"
            " and act again for the rest.",
        )


@attrs.frozen
class MatchCount:
    """A count of the runs that match: ``matched`` (it may pass the cap), index entries
    ``scanned``, ``stopped``: a read reached its bound with more to read."""

    matched: int
    scanned: int
    stopped: bool


@runtime_checkable
class MatchCounter(Protocol):
    """A browser that counts a filter's matches itself (PostgreSQL: one statement, J16's two
    tables in it, ``_jobs/_sql/count.py``) rather than by the walk; it answers what the walk
    would (the conformance suite checks both backends against one another)."""

    async def count_matching(
        self, flt: RunFilter, states: tuple[RunState, ...], *, scan: int, max_jobs: int
    ) -> MatchCount:
        """The runs in ``states`` matching ``flt`` that the walk reaches: reading at most
        ``scan`` index entries in all, in the walk's order, and without a job, only runs of the
        jobs :meth:`~ship_sqla.kernel._browse.RunBrowser.list_runs` reads across jobs (the
        first ``max_jobs`` job ids with runs in each state)."""
        ...


async def _count(browser: RunBrowser, flt: RunFilter, states: tuple[RunState, ...]) -> MatchCount:
    """How many runs in ``states`` match: the browser's own count when it has one, else the
    walk (the in-memory backend: its runs are in this process), up to one more than
    :data:`MAX_BULK_RUNS`."""
    if isinstance(browser, MatchCounter):
        return await browser.count_matching(
            flt, states, scan=MAX_BULK_SCAN, max_jobs=MAX_BROWSE_JOBS
        )
    walk = await _walk(
        browser, flt, states, (0, None), want=MAX_BULK_RUNS + 1, bound=MAX_BULK_SCAN, keep=False
    )
    return MatchCount(walk.matched, walk.scanned, walk.end is not None)


async def preview_matching(
    browser: RunBrowser,
    action: BulkAction,
    flt: RunFilter,
    *,
    secret: bytes,
    now: float | None = None,
) -> BulkPreview:
    """Count the runs ``action`` would take (see :class:`BulkPreview`): one bounded count, not
    the action's walk (a preview reads no row it does not count)."""
    states = flt.states(BULK_STATES[action])
    seen = await _count(browser, flt, states)
    count = min(seen.matched, MAX_BULK_RUNS)
    token = bulk_token(secret, action, flt, count, time.time() if now is None else now)
    capped = seen.matched > MAX_BULK_RUNS
    stopped = seen.stopped and not capped
    return BulkPreview(action, count, capped, seen.scanned, stopped, token)


@attrs.define
class BulkOutcome:
    """What :func:`act_matching` did so far (kept when it is interrupted)."""

    changed: list[str] = attrs.Factory(list)
    unchanged: list[str] = attrs.Factory(list)
    batches: int = 0
    complete: bool = False


async def act_matching(  # noqa: PLR0917 - the action's inputs
    browser: RunBrowser,
    change: Callable[[list[str]], Awaitable[list[str]]],
    action: BulkAction,
    flt: RunFilter,
    total: int,
    outcome: BulkOutcome,
    *,
    batch_size: int,
    transaction: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]] | None,
    progress: Callable[[BulkProgress], object] | None,
) -> None:
    """Apply ``change`` (the admin port's batch operation: ONE statement per batch on
    PostgreSQL, answering the ids it changed) to at most ``total`` matching runs,
    ``batch_size`` per batch, each batch inside ``transaction`` (when given: all of it or none
    of it); ``outcome`` holds what committed (a batch that raised is not in it). The walk is
    keyset-paginated: each batch's read starts after the last run the previous batch took, so
    no batch reads again what an earlier one handled."""
    states = flt.states(BULK_STATES[action])
    start: Start | None = (0, None)
    done = 0
    while start is not None and done < total:
        want = min(batch_size, total - done)
        walk = await _walk(browser, flt, states, start, want=want, bound=MAX_BULK_SCAN)
        batch = [record.run_id for record, _ in walk.found]
        start = walk.found[-1][1] if len(walk.found) == want else None
        changed: list[str] = []

        async def apply(batch: list[str] = batch, changed: list[str] = changed) -> None:
            changed[:] = await change(batch)

        if batch:
            await (apply() if transaction is None else transaction(apply))
            outcome.batches += 1
        taken = set(changed)
        outcome.changed.extend(changed)
        outcome.unchanged.extend(run_id for run_id in batch if run_id not in taken)
        done += len(batch)
        if progress is not None and batch:
            progress(BulkProgress(done, len(outcome.changed), total, outcome.batches))
        if start is None and walk.end is not None:  # stopped at MAX_BULK_SCAN: not complete
            return
    outcome.complete = True
