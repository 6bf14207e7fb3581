"""How a handler ends an attempt other than by returning (K4), and the errors of the per-run
timeout (K5).

A handler returns (the run is completed) or raises. What it raises decides what follows:

- :class:`RetryAfter` ``(delay)``: the attempt is spent and the run waits ``delay`` seconds (capped
  by the policy's ``max_delay``) instead of the backoff; dead once the attempts are spent;
- :class:`Snooze` ``(delay)``: the run waits ``delay`` seconds WITHOUT spending its attempt, at most
  ``RetryPolicy.max_snoozes`` times; past that a snooze is a failed attempt
  (:class:`JobSnoozeLimitError`, the retry policy decides);
- :class:`TerminalError`, or an exception of a type ``RetryPolicy.non_retryable`` names: the run is
  dead now, whatever attempts are left;
- anything else: a failed attempt, retried with the policy's backoff (J7).

A run whose handler outlives the job's ``timeout`` is cancelled, and the attempt is a failure
with :class:`JobTimeoutError` (``SHIP_SQLA_JOB_TIMEOUT``): retried with the backoff, or dead when
the policy names ``JobTimeoutError`` as non-retryable. Each outcome is recorded in the run's history
with its kind (:data:`~ship_sqla.kernel._ports.HistoryKind`).

The three outcome signals are exceptions rather than return values so they work from any depth
of the handler's call stack (``raise Snooze(30)`` inside a helper), as procrastinate's and
dramatiq's do; they are :class:`ShipError` subclasses with stable codes, so one that escapes a
handler run outside a runtime says what it is.
"""

from __future__ import annotations

from datetime import timedelta

from ship_sqla.kernel._durations import MAX_RETRY_DELAY, require_duration
from ship_sqla.kernel._errors import JobAttemptError

__all__ = [
    "JobSnoozeLimitError",
    "JobTimeoutError",
    "JobTimeoutIgnoredError",
    "RetryAfter",
    "Snooze",
    "TerminalError",
]


def _delay_seconds(delay: float | timedelta, name: str) -> float:
    value: object = delay.total_seconds() if isinstance(delay, timedelta) else delay
    return require_duration(value, name, maximum=MAX_RETRY_DELAY, allow_zero=True)


def _seconds_text(seconds: float) -> str:
    return f"{seconds:g} s"


class TerminalError(JobAttemptError):
    """Raise it from a handler to end the run now: dead-lettered on this attempt, whatever
    attempts are left (K4). ``raise TerminalError("card declined") from exc`` keeps the cause.

    An operator may still retry the dead run (one more attempt, J8)."""

    code = "SHIP_SQLA_JOB_TERMINAL"

    def __init__(self, message: str = "the handler ended the run as terminal") -> None:
        super().__init__(message)


class RetryAfter(JobAttemptError):  # noqa: N818 - an outcome a handler names, not an error
    """Raise it from a handler to fail this attempt and run again ``delay`` seconds (or a
    ``timedelta``) from now, instead of after the policy's backoff (K4): a rate limit's
    ``Retry-After``. The attempt is spent; on the final attempt the run is dead. The delay is
    capped by the policy's ``max_delay`` (a responder naming a week does not stall the run past
    what the job declared) and is not jittered."""

    code = "SHIP_SQLA_JOB_RETRY_AFTER"

    def __init__(self, delay: float | timedelta, message: str | None = None) -> None:
        self.delay = _delay_seconds(delay, "RetryAfter delay")
        self.reason = message
        text = f"retry after {_seconds_text(self.delay)}"
        super().__init__(f"{text}: {message}" if message else text)


class Snooze(JobAttemptError):  # noqa: N818 - an outcome a handler names, not an error
    """Raise it from a handler to put the run back to waiting for ``delay`` seconds (or a
    ``timedelta``) WITHOUT spending its attempt (K4): the work is not ready yet (an export still
    being built, a resource not there yet). Each snooze is recorded in the history (kind
    ``"snooze"``) and counted (``ctx.snoozes``); a run snoozes at most ``RetryPolicy.max_snoozes``
    times, after which a snooze is a failed attempt (:class:`JobSnoozeLimitError`)."""

    code = "SHIP_SQLA_JOB_SNOOZE"

    def __init__(self, delay: float | timedelta, message: str | None = None) -> None:
        self.delay = _delay_seconds(delay, "Snooze delay")
        self.reason = message
        text = f"snoozed for {_seconds_text(self.delay)}"
        super().__init__(f"{text}: {message}" if message else text)


class JobSnoozeLimitError(JobAttemptError, RuntimeError):
    """A handler snoozed a run that had already snoozed ``RetryPolicy.max_snoozes`` times: this
    snooze is a failed attempt instead (retried with the backoff, dead once the attempts are
    spent, or dead at once when the policy names this type as non-retryable). Recorded in the
    run's history, kind ``"failure"``."""

    code = "SHIP_SQLA_JOB_SNOOZE_LIMIT"


class JobTimeoutError(JobAttemptError, TimeoutError):
    """An attempt ran past its job's ``timeout``: the handler was cancelled and the attempt is a
    failure (K5), recorded in the history with kind ``"timeout"``. The retry policy decides what
    follows: the backoff, or dead at once when ``RetryPolicy.non_retryable`` names this type."""

    code = "SHIP_SQLA_JOB_TIMEOUT"


class JobTimeoutIgnoredError(JobTimeoutError):
    """Reported to ``on_error`` once per attempt: a handler cancelled at its timeout was still
    running a heartbeat interval later (it swallowed the cancellation, or blocks in code that
    cannot be cancelled). Its run keeps its lease, heartbeated until the handler really stops, so
    no other worker runs it meanwhile; then the attempt settles as a timeout (K5)."""

    code = "SHIP_SQLA_JOB_TIMEOUT_IGNORED"
