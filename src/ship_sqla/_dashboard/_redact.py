"""What the dashboard may show of a run (issue 36 item 7): payloads behind a permission, and
the application's ``redact=`` hook over payloads, errors and step results.

``create_dashboard(redact=...)`` takes ``redact(field, value, job_id) -> value``: ``field`` is
``"payload"`` (a run's payload), ``"error"`` (a run's last error and each history entry's
error, text) or ``"result"`` (a workflow step's stored result); what it returns is shown in
place of ``value``, on every page and every JSON twin. A hook that raises hides the value (fail
closed: a redaction bug never shows what it was meant to hide), saying which exception.

A user the authorizer does not grant :data:`PAYLOADS_PERMISSION` (``ship.jobs:payloads``,
beside ``ship.jobs:read`` and ``ship.jobs:manage``) sees no payload and no step result: each
is replaced by :data:`HIDDEN` (the page says why). Errors stay shown (through the hook).

The rule is applied where the records are read, not where they are shown: the dashboard's
per-request operator surface is a :class:`ShownOperations`, whose ``get_run``, ``list_runs``,
``list_dead``, ``search_runs`` and ``list_parked`` answer shown records. Every page built on
them (and its JSON twin) gets the rule without doing anything. A page that shows error text
it reads elsewhere (an aggregate, say) passes it through :meth:`Shown.error`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._operations import JobOperations

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ship_sqla.kernel._browse import DeadError
    from ship_sqla.kernel._page import Page
    from ship_sqla.kernel._ports import RunRecord
    from ship_sqla.kernel._search import SearchPage
    from ship_sqla.kernel._workflows import StepRecord

__all__ = [
    "HIDDEN",
    "PAYLOADS_PERMISSION",
    "Redact",
    "Shown",
    "ShownOperations",
    "check_redact",
    "shown_operations",
]

PAYLOADS_PERMISSION: Final = "ship.jobs:payloads"
"""The permission to see payloads and step results on the dashboard (issue 36)."""
HIDDEN: Final = f"(hidden: seeing payloads needs {PAYLOADS_PERMISSION})"
"""What a user without :data:`PAYLOADS_PERMISSION` sees in place of a payload."""

Redact: TypeAlias = "Callable[[str, Any, str], Any]"
"""``redact(field, value, job_id) -> value``: ``field`` is ``"payload"``, ``"error"`` or
``"result"``."""


def check_redact(redact: object) -> Redact | None:
    """``redact`` when it is None or callable, else a :class:`ConfigurationError`."""
    if redact is not None and not callable(redact):
        raise ConfigurationError(
            f"redact must be callable(field, value, job_id), got {type(redact).__name__}.",
            fix="pass redact=lambda field, value, job_id: ... (or omit it).",
        )
    return redact


class Shown:
    """One request's rule: the hook, and whether its user may see payloads (asked once, on
    first use, through ``asks(permission, operation)``)."""

    def __init__(self, redact: Redact | None, asks: Callable[[str, str], Awaitable[bool]]) -> None:
        self._redact = redact
        self._asks = asks
        self._may: bool | None = None

    async def may_see_payloads(self) -> bool:
        if self._may is None:
            self._may = await self._asks(PAYLOADS_PERMISSION, "dashboard.payloads")
        return self._may

    def _apply(self, field: str, value: Any, job_id: str) -> Any:  # noqa: ANN401 - any value
        if self._redact is None or value is None:
            return value
        try:
            return self._redact(field, value, job_id)
        except Exception as exc:  # noqa: BLE001 - fail closed, say which
            return f"(hidden: the redact hook raised {type(exc).__name__})"

    def error(self, error: str | None, job_id: str) -> str | None:
        """An error's text as this dashboard shows it (through the hook)."""
        shown = self._apply("error", error, job_id)
        return None if shown is None else str(shown)

    async def run(self, record: RunRecord) -> RunRecord:
        """``record`` as this request's user may see it."""
        if await self.may_see_payloads():
            payload = self._apply("payload", record.payload, record.job_id)
        else:
            payload = HIDDEN
        if self._redact is None:
            return attrs.evolve(record, payload=payload)
        history = tuple(
            {**h, "error": self.error(h.get("error"), record.job_id)}
            if isinstance(h, dict) and h.get("error") is not None
            else h
            for h in record.history
        )
        return attrs.evolve(
            record,
            payload=payload,
            last_error=self.error(record.last_error, record.job_id),
            history=history,
        )

    async def runs(self, records: Iterable[RunRecord]) -> tuple[RunRecord, ...]:
        return tuple([await self.run(r) for r in records])

    async def steps(self, steps: Iterable[StepRecord], job_id: str) -> list[StepRecord]:
        """Workflow steps with their results as this user may see them (a waiting step has
        none)."""
        may = await self.may_see_payloads()
        shown = []
        for s in steps:
            if s.result_json is not None:
                value = self._apply("result", s.result, job_id) if may else HIDDEN
                s = attrs.evolve(s, result_json=json.dumps(value, default=str))  # noqa: PLW2901
            shown.append(s)
        return shown


class ShownOperations(JobOperations):
    """The dashboard's per-request operator surface: :class:`JobOperations` whose run reads
    answer the records as :class:`Shown` lets the request's user see them."""

    _shown: Shown

    @property
    def shown(self) -> Shown:
        return self._shown

    async def get_run(self, run_id: str) -> RunRecord | None:
        record = await super().get_run(run_id)
        return None if record is None else await self._shown.run(record)

    async def list_runs(self, *args: Any, **kwargs: Any) -> Page[RunRecord]:  # noqa: ANN401
        page = await super().list_runs(*args, **kwargs)
        return attrs.evolve(page, items=await self._shown.runs(page.items))

    async def list_dead(self, *args: Any, **kwargs: Any) -> Page[RunRecord]:  # noqa: ANN401
        page = await super().list_dead(*args, **kwargs)
        return attrs.evolve(page, items=await self._shown.runs(page.items))

    async def list_parked(self, *args: Any, **kwargs: Any) -> list[RunRecord]:  # noqa: ANN401
        return list(await self._shown.runs(await super().list_parked(*args, **kwargs)))

    async def search_runs(self, *args: Any, **kwargs: Any) -> SearchPage:  # noqa: ANN401
        page = await super().search_runs(*args, **kwargs)
        return attrs.evolve(page, items=await self._shown.runs(page.items))

    async def newest_dead_errors(self, *args: Any, **kwargs: Any) -> list[DeadError]:  # noqa: ANN401
        """The error groups' read, each error through the hook (as :meth:`list_runs`)."""
        found = await super().newest_dead_errors(*args, **kwargs)
        return [
            attrs.evolve(d, last_error=self._shown.error(d.last_error, d.job_id)) for d in found
        ]


def shown_operations(ops: JobOperations, shown: Shown) -> ShownOperations:
    """``ops`` (one request's, from :meth:`JobOperations.acting_as`) answering shown records."""
    wrapped = ShownOperations.__new__(ShownOperations)
    wrapped.__dict__.update(vars(ops))
    wrapped._shown = shown  # noqa: SLF001 - set once, here
    return wrapped
