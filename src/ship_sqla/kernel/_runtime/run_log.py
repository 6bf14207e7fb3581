"""The worker's log lines (S3): what a run's attempt came to, one line each, on the stdlib logger
``ship_sqla.jobs``; and the periodic summary.

Written once, here, called from the runtime's outcome hook (``JobRuntime._record``, which the
completer's ``_answered`` and the executor call with every recorded outcome) and from the claim
loop for a run its claim dead-lettered (J6). Levels:

- ERROR: a dead letter (``event="dead"``, or ``"timeout"`` when the last attempt timed out);
- WARNING: a retry (``"retry"``; ``"timeout"`` when the attempt timed out), a stale settle
  (``"stale"``, J5), a run cut short by the drain deadline (``"drain"``, J12) or by a lost
  single-runner lock (``"lock_lost"``);
- INFO: an operator's cancel (``"cancelled"``, K2), a snooze (``"snoozed"``), the drain's start
  and end (``"draining"``, ``"stopped"``) and the summary (``"summary"``);
- DEBUG: completions, lock-held hand-backs and workflow suspensions.

Every line names the job id, run id and attempt (``attempt/max_attempts``) and, when the attempt
failed, the error's summary (its first lines, without the traceback, which the run's history
keeps: ``ship-sqla jobs show RUN_ID``; the traceback is added at DEBUG). A line never carries
the payload, the single-runner key, headers or anything else the run carries. Each record has
the same facts as a dict in ``record.ship_sqla`` (``event``, ``job_id``, ``run_id``,
``attempt``, ``max_attempts``, ``error``...), for structured formatters such as the CLI's
``--log-format json``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Final

from ship_sqla.kernel._settlement import Settlement

if TYPE_CHECKING:
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._ports import BuriedRun
    from ship_sqla.kernel._runtime.state import InFlight

__all__ = ["LOGGER_NAME", "RECORD_FIELD", "RunLog", "error_summary"]

LOGGER_NAME: Final = "ship_sqla.jobs"
RECORD_FIELD: Final = "ship_sqla"
"""The ``LogRecord`` attribute holding a line's facts as a dict."""

_TRACEBACK: Final = "\n\nTraceback (most recent call last):"

_FAILED_OUTCOMES: Final = frozenset({"retrying", "dead"})

logger = logging.getLogger(LOGGER_NAME)


def error_summary(error: str | None) -> tuple[str | None, str | None]:
    """A history entry's error text split into its summary and its traceback (None: none)."""
    if error is None:
        return None, None
    head, found, tail = error.partition(_TRACEBACK)
    return head.strip(), (found.strip() + tail if found else None)


class RunLog:
    """Writes the lines (see the module docstring) and counts the outcomes for the summary.

    Cheap when the logger is quiet: a line is built only when its level is enabled; the counts
    are one dict update per attempt.
    """

    def __init__(self, worker_id: str, log: logging.Logger = logger) -> None:
        self._worker_id = worker_id
        self._log = log
        self._counts: dict[str, int] = {}

    def outcome(self, entry: InFlight, outcome: JobOutcome) -> None:
        """One attempt of ``entry``'s run ended with ``outcome`` (the ``ship.job.runs`` one)."""
        self._counts[outcome] = self._counts.get(outcome, 0) + 1
        event, level = _event_of(entry, outcome)
        if not self._log.isEnabledFor(level):
            return
        settlement = entry.settlement
        fields: dict[str, Any] = {}
        error: str | None = None
        if isinstance(settlement, Settlement):
            run_at = None if settlement.run_at is None else settlement.run_at.isoformat()
            if settlement.failure_kind is not None:
                fields["kind"] = settlement.failure_kind
                if outcome == "retrying":
                    fields["retry_at"] = run_at
            if settlement.snoozes_added:
                fields["run_at"] = run_at
            if settlement.entry is not None:
                error = settlement.entry.error
        if outcome in _FAILED_OUTCOMES:
            fields["outcome"] = outcome
        run = entry.run
        summary, traceback = error_summary(error)
        self._emit(
            level,
            event,
            job_id=run.job_id,
            run_id=run.run_id,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            tenant=run.tenant,
            error=summary,
            traceback=traceback if self._log.isEnabledFor(logging.DEBUG) else None,
            **fields,
        )

    def buried(self, job_id: str, buried: BuriedRun) -> None:
        """J6, J15: a claim dead-lettered a run whose lease lapsed on its final attempt, or at
        its ``retry.max_lapses``-th lapse in a row (a crash loop)."""
        self._counts["dead"] = self._counts.get("dead", 0) + 1
        if self._log.isEnabledFor(logging.ERROR):
            self._emit(
                logging.ERROR,
                "dead",
                job_id=job_id,
                run_id=buried.run_id,
                attempt=buried.attempt,
                # A crash loop's attempts were not spent: its bound is not known here.
                max_attempts=None if buried.crash_loop else buried.attempt,
                error="its lease lapsed retry.max_lapses times in a row (a crash loop: its"
                " worker died each time it ran it)"
                if buried.crash_loop
                else "the lease of its final attempt lapsed (its worker died or stopped"
                " heartbeating)",
                kind="lapsed",
                outcome="dead",
            )

    def draining(self, in_flight: int, drain_timeout: float) -> None:
        self._emit(logging.INFO, "draining", in_flight=in_flight, drain_timeout_s=drain_timeout)

    def stopped(self) -> None:
        self._emit(logging.INFO, "stopped")

    def summary(self, seconds: float, in_flight: int) -> None:
        """The counts since the last summary, as one INFO line; then start counting anew."""
        counts, self._counts = self._counts, {}
        ended = sum(counts.values())
        failed = counts.get("retrying", 0) + counts.get("dead", 0)
        self._emit(
            logging.INFO,
            "summary",
            runs_per_s=round(ended / seconds, 2) if seconds > 0 else None,
            runs=ended,
            completed=counts.get("completed", 0),
            failed=failed,
            dead=counts.get("dead", 0),
            stale=counts.get("stale", 0),
            in_flight=in_flight,
            interval_s=round(seconds, 3),
        )

    def _emit(self, level: int, event: str, **facts: Any) -> None:  # noqa: ANN401 - JSON values
        facts = {k: v for k, v in facts.items() if v is not None}
        record: dict[str, Any] = {"event": event, "worker_id": self._worker_id, **facts}
        self._log.log(level, "%s", _LazyText(event, facts), extra={RECORD_FIELD: record})


def _event_of(entry: InFlight, outcome: JobOutcome) -> tuple[str, int]:
    """The line's event and level for ``outcome`` (see the module docstring)."""
    settlement = entry.settlement
    failure_kind = settlement.failure_kind if isinstance(settlement, Settlement) else None
    if outcome in _FAILED_OUTCOMES and failure_kind is not None:
        dead = outcome == "dead"
        if failure_kind == "timeout":
            return "timeout", logging.ERROR if dead else logging.WARNING
        return ("dead" if dead else "retry"), logging.ERROR if dead else logging.WARNING
    if outcome == "cancelled" and settlement is not None and settlement.answer == "released":
        # The runtime cut the attempt short and handed the run back, attempt unspent.
        return ("drain" if entry.reason == "drain" else "lock_lost"), logging.WARNING
    return outcome, _LEVELS.get(outcome, logging.DEBUG)


_LEVELS: Final[dict[str, int]] = {
    "stale": logging.WARNING,
    "cancelled": logging.INFO,
    "snoozed": logging.INFO,
    "parked": logging.ERROR,
}

_MESSAGES: Final = {
    "completed": "run completed",
    "retry": "run failed, will retry",
    "timeout": "run timed out",
    "dead": "run dead-lettered",
    "stale": "run settle refused as stale (its lease lapsed; another worker may hold it)",
    "cancelled": "run cancelled",
    "drain": "run cut short by the drain deadline, back to waiting (attempt unspent)",
    "lock_lost": "run cut short: its single-runner lock was lost, back to waiting",
    "lock_held": "run handed back: its single-runner lock is held elsewhere",
    "snoozed": "run snoozed",
    "suspended": "workflow run suspended",
    "parked": "workflow run parked: its handler diverged from its history (D10)",
    "draining": "worker draining: no more claims",
    "stopped": "worker stopped",
    "summary": "summary",
}


class _LazyText:
    """The line's text, built only if a handler formats the record: ``<what> key=value ...``,
    one line (values with spaces or newlines are JSON-quoted)."""

    __slots__ = ("_event", "_facts")

    def __init__(self, event: str, facts: dict[str, Any]) -> None:
        self._event = event
        self._facts = facts

    def __str__(self) -> str:
        facts = dict(self._facts)
        parts = [_MESSAGES.get(self._event, self._event)]
        maximum = facts.pop("max_attempts", None)
        if "attempt" in facts and maximum is not None:
            facts["attempt"] = f"{facts['attempt']}/{maximum}"
        traceback = facts.pop("traceback", None)
        # The facts in the order they were given, the (long) error last.
        names = [name for name in facts if name != "error"]
        if "error" in facts:
            names.append("error")
        parts.extend(f"{name}={_value(facts[name])}" for name in names)
        text = " ".join(parts)
        # A traceback (DEBUG only) keeps its lines: it is read, not parsed.
        return f"{text}\n{traceback}" if traceback else text


def _value(value: Any) -> str:  # noqa: ANN401 - a JSON value
    text = str(value)
    if not text or any(c.isspace() or c in "\"'=" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text
