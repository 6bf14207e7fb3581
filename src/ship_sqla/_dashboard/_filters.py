"""The dashboard's request parameters, read and checked in ONE place (S2; issue 25, D5).

Every page that takes parameters (the runs page's ``state``, ``job``, ``tenant``, ``since``,
``until`` and ``cursor``; the dead letters' ``job``, ``tenant`` and ``cursor``; the audit log's
``before``; a run page's run id) names them, and :func:`read_filters` reads them before the
page asks anything of the operator surface. Each value goes through the library's own check
for that kind of value (:func:`~ship_sqla.kernel._tenancy.check_tenant`, the job id rule,
:func:`~ship_sqla.kernel._keys.require_key`, ...); a value one refuses raises
:class:`BadParameter` naming the parameter and carrying the typed error (its stable
``SHIP_SQLA_*`` code and fix), which the page answers with a 400 problem page. Only the
library's typed input errors (:data:`INPUT_ERRORS`) are turned into a 400: anything else is a
bug and stays one.

A check that needs the stored data stays where the data is: a cursor's signature and query are
checked by the operator surface, and its :class:`~ship_sqla.errors.InvalidCursorError` is
answered the same way, naming ``cursor``. Pure: tested without a server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs

from ship_sqla.kernel._browse import run_order
from ship_sqla.kernel._errors import (
    BoundExceededError,
    ConfigurationError,
    InvalidCursorError,
    ShipError,
    TenantViolationError,
)
from ship_sqla.kernel._jobs import is_job_id
from ship_sqla.kernel._keys import InvalidKeyError, require_key
from ship_sqla.kernel._ports import RUN_STATES, RunState
from ship_sqla.kernel._tenancy import check_tenant

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


__all__ = [
    "INPUT_ERRORS",
    "RUN_STATES",
    "BadParameter",
    "Filters",
    "Parameter",
    "read_filters",
]

Parameter: TypeAlias = Literal[
    "state",
    "job",
    "tenant",
    "since",
    "until",
    "cursor",
    "before",
    "run_id",
    "actor",
    "operation",
    "target",
]
"""A request parameter a page may read (``run_id`` is a path parameter, the rest the query's;
``actor``, ``operation`` and ``target`` are the audit page's filters)."""

MAX_CURSOR_CHARS: Final = 4096
"""Longer than any cursor the operator surface issues: a longer one is refused unread."""
MAX_ENTRY_ID: Final = 2**63 - 1
"""The audit log's entry ids are PostgreSQL bigints."""
_DATE_CHARS: Final = 64
MAX_AUDIT_FILTER_CHARS: Final = 200

INPUT_ERRORS: Final[tuple[type[ShipError], ...]] = (
    ConfigurationError,
    BoundExceededError,
    InvalidCursorError,
    InvalidKeyError,
    TenantViolationError,
)
"""The library's typed errors about a caller's input: a page answers them with 400."""


class BadParameter(Exception):  # noqa: N818 - an answer (400), not an error of the library
    """``parameter`` of the request was refused by ``error`` (a typed library error: its code
    and fix); the page answers 400 naming the parameter and nothing else ran."""

    def __init__(self, parameter: Parameter, error: ShipError) -> None:
        super().__init__(f"{parameter}: {error}")
        self.parameter = parameter
        self.error = error


@attrs.frozen
class Filters:
    """A page's checked parameters; None where absent or empty (no filter)."""

    state: RunState = "waiting"
    job: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    cursor: str | None = None
    before: int | None = None
    run_id: str | None = None
    raw_since: str = ""
    raw_until: str = ""
    actor: str | None = None
    operation: str | None = None
    target: str | None = None


def read_filters(
    query: Mapping[str, str], path: Mapping[str, str], reads: tuple[Parameter, ...]
) -> Filters:
    """The parameters ``reads`` names, from the query string (``query``) and the route's path
    parameters (``path``: ``run_id``), each checked; :class:`BadParameter` for the first one
    refused. A page ignores parameters it does not read."""
    found: dict[str, object] = {}
    for name in reads:
        raw = path.get(name) if name == "run_id" else query.get(name)
        try:
            found.update(_read(name, raw))
        except INPUT_ERRORS as exc:
            raise BadParameter(name, exc) from exc
    filters = Filters(**found)  # type: ignore[arg-type]  # each value checked by _read
    if "state" in reads and run_order(filters.state) not in ("created", "finished"):
        for name, value in (("since", filters.since), ("until", filters.until)):
            if value is not None:
                raise BadParameter(
                    name,
                    ConfigurationError(
                        f"{name} (a time range) applies to the finished states only:"
                        f" {filters.state} runs page in "
                        + ("claim order" if filters.state == "waiting" else "lease expiry order")
                        + ", and a range there could only be filtered, reading past every other"
                        f" {filters.state} run (S2: every page read is bounded).",
                        fix="clear the time range, or pick a finished state: completed (by"
                        " finish time), dead, discarded, cancelled (by creation time).",
                    ),
                )
    return filters


def _read(name: Parameter, raw: str | None) -> dict[str, object]:
    if name == "state":
        return {"state": _state(raw or "waiting")}
    if name == "run_id":
        return {"run_id": require_key(raw, "run id")}
    if not raw:
        return {}  # absent or empty: no filter
    if name in ("since", "until"):
        return {name: _when(name, raw), f"raw_{name}": raw}
    return {name: _READERS[name](raw)}


def _job(raw: str) -> str:
    if not is_job_id(raw):
        raise ConfigurationError(
            f"{raw[:80]!r} is not a job id.",
            fix="give the id passed to define_job: 1-128 characters, letters, digits and"
            " _ . : - (not starting with a symbol), or clear the job filter.",
        )
    return raw


def _tenant(raw: str) -> str | None:
    return check_tenant(raw, operation="the dashboard's tenant filter")


def _cursor(raw: str) -> str:
    if len(raw) > MAX_CURSOR_CHARS or not raw.isascii() or not raw.isprintable():
        raise InvalidCursorError(
            f"the page cursor is not one this dashboard issued ({len(raw)} characters,"
            " not all printable ASCII).",
            fix="follow the page's own 'Next page' link, or restart from the first page.",
        )
    return raw


def _before(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_ENTRY_ID:
        raise ConfigurationError(
            f"{raw[:40]!r} is not an audit entry id.",
            fix="follow the page's own 'Older' link: a whole number from 1 to 2^63-1.",
        )
    return int(raw)


def _audit_text(name: str) -> Callable[[str], str]:
    """An audit filter's reader: printable text of at most 200 characters, trimmed."""

    def read(raw: str) -> str:
        value = raw.strip()
        if len(value) > MAX_AUDIT_FILTER_CHARS or not value.isprintable():
            raise ConfigurationError(
                f"the {name} filter {raw[:40]!r} is not printable text of at most"
                f" {MAX_AUDIT_FILTER_CHARS} characters.",
                fix=f"type the {name} as the audit log shows it, or clear the field.",
            )
        return value

    return read


_READERS: Final[dict[str, Callable[[str], object]]] = {
    "job": _job,
    "tenant": _tenant,
    "cursor": _cursor,
    "before": _before,
    "actor": _audit_text("actor"),
    "operation": _audit_text("operation"),
    "target": _audit_text("target"),
}


def _state(raw: str) -> RunState:
    for state in RUN_STATES:
        if raw == state:
            return state
    raise ConfigurationError(
        f"unknown state {raw[:40]!r}.", fix=f"pick one of {', '.join(RUN_STATES)}."
    )


def _when(name: str, raw: str) -> datetime:
    """A ``datetime-local`` value (or ISO-8601 with an offset); without an offset it is UTC."""
    try:
        if len(raw) > _DATE_CHARS:
            raise ValueError(raw)  # noqa: TRY301 - one refusal for every malformed date
        parsed = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{name} {raw[:40]!r} is not a date and time.",
            fix="use YYYY-MM-DDTHH:MM[:SS] (UTC), as the date picker gives it.",
        ) from exc
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
