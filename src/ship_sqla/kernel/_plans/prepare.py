"""Preparing runs: every enqueue request is validated and encoded here, above the backend seam.

The enqueue front every backend shares (:class:`~ship_sqla.kernel._backend_base.JobBackendBase`)
and the schedules' ticks call :func:`prepare_runs` (:func:`prepare_run` for one) for every
request before a store sees it (:meth:`RunStore.insert` receives only prepared runs), so what a
run may carry is decided once, and bad input is refused with a typed error before any SQL runs
(nothing of the call is written):

- ``run_id`` and ``dedupe_key`` (given, or derived by the job's idempotency policy): non-empty
  text, no NUL, at most :data:`~ship_sqla.kernel._keys.MAX_KEY_CHARS` characters
  (:class:`~ship_sqla.kernel._keys.InvalidKeyError`);
- ``run_at``: a timezone-aware datetime (:class:`~ship_sqla.errors.ConfigurationError`);
- the payload: valid for the job's codec, then JSON (:class:`InvalidPayloadError`), every
  string in it, key or value at any depth, text ``jsonb`` can store: no NUL character, no
  surrogate code point (:func:`~ship_sqla.kernel._json_text.unstorable_json`;
  :class:`InvalidPayloadError` naming its path), and at most the job's ``max_payload_bytes``
  of encoded JSON (:class:`PayloadTooLargeError`);
- the single-runner key (``Concurrency.key``): text without NUL;
- ``priority``: an int from -10 to 10 (:class:`~ship_sqla.errors.InvalidPriorityError`), else the
  job's (K6).

The result is a :class:`PreparedRun`: what a backend stores, with nothing left to compute. Its
run id is the caller's, else a new UUIDv7 (:func:`~ship_sqla.kernel._ids.new_run_ids`, one
batch per call), and its ``max_attempts`` is the job's ``retry.attempts``: no backend derives
either. Its ``trace_context`` is the one its caller captured for the whole call (the enqueue
front: the W3C trace context current at the enqueue, K7; a schedule's tick: none). Only a
caller's id can name an existing run (``durable_id``); a generated one cannot
conflict, which is what lets a store skip the J1 probes for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._errors import ConfigurationError, InvalidPayloadError, PayloadTooLargeError
from ship_sqla.kernel._ids import new_run_ids
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json
from ship_sqla.kernel._keys import require_key, require_text
from ship_sqla.kernel._priority import require_priority

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import EnqueueRequest

__all__ = ["PreparedRun", "prepare_run", "prepare_runs"]


@attrs.define
class PreparedRun:
    """One enqueue request, checked and encoded: what a backend stores for the run.

    Read-only by convention, not frozen: one is built per request on the bulk enqueue path,
    where a frozen class's per-field ``object.__setattr__`` costs more than the checks."""

    run_id: str
    """The caller's durable id, else a new UUIDv7."""
    durable_id: bool
    """The caller chose ``run_id`` (a durable id such as a schedule's ``<job_id>/<occurrence>``):
    a stored run with that id, in any state, IS this run (J1). False for a generated id, which
    no stored run can have."""
    payload_json: str
    """The payload as compact ASCII JSON text (its length is its size in bytes)."""
    dedupe_key: str | None
    """The given dedupe key, else the job's idempotency policy's, else None (J1)."""
    key: str | None
    """The single-runner key (None when the job is not single-runner)."""
    run_at: datetime | None
    """When the run is due; None: now, on the backend's clock."""
    max_attempts: int
    """Attempts the run may start: the job's ``retry.attempts`` (J7)."""
    priority: int
    """The request's priority, else the job's (K6): higher first."""
    trace_context: str | None
    """The enqueue's W3C trace context as compact JSON text (``{"traceparent": ...}``), else
    None (K7)."""
    tenant: str | None = None
    """The tenant the run was enqueued for (F2): the ambient tenant of the enqueue, else None."""
    partition: str | None = None
    """F8/F9: the run's partition key (a job whose limits are per key): the enqueue's, else the
    job's function of the payload; else None."""
    handler_version: int | None = None
    """D9: the job's handler version at the enqueue (its ``version``), else None."""


def prepare_run(
    job: JobDefinition[Any], request: EnqueueRequest, *, trace_context: str | None = None
) -> PreparedRun:
    """``request`` validated and encoded for ``job``; raises before anything is written (see
    the module docstring for each check and its error)."""
    [prepared] = prepare_runs(job, (request,), trace_context=trace_context)
    return prepared


def _payload_text(job_id: str, encoded: object, limit: int) -> str:
    """The stored text of a payload the job's codec encoded: compact JSON that PostgreSQL's
    jsonb can hold, at most ``limit`` bytes; else the error says which rule it broke."""
    try:
        text = encode_compact_json(encoded)
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"job {job_id!r}: the encoded payload is not JSON: {exc}",
            fix="declare a payload type whose fields are JSON values, or pass a codec.",
        ) from exc
    unstorable = unstorable_json(encoded, text)
    if unstorable is not None:
        raise InvalidPayloadError(
            f"job {job_id!r}: the encoded payload holds {unstorable}: PostgreSQL's jsonb"
            " cannot store it.",
            fix=unstorable.fix,
        )
    if len(text) > limit:
        raise PayloadTooLargeError(
            f"job {job_id!r}: the payload is {len(text)} bytes of encoded JSON, more than"
            f" the job's max_payload_bytes ({limit}).",
            fix="store large data elsewhere (a table, object storage) and enqueue a"
            " reference to it, or raise define_job(..., max_payload_bytes=...).",
        )
    return text


def prepare_runs(
    job: JobDefinition[Any],
    requests: Sequence[EnqueueRequest],
    *,
    trace_context: str | None = None,
    tenant: str | None = None,
) -> list[PreparedRun]:
    """:func:`prepare_run` of every request, in order, each carrying ``trace_context`` (K7)
    and ``tenant`` (F2);
    the first bad one raises, so a caller stores nothing of a batch until this returns. One
    loop with the job's settings looked up once, and the ids the callers did not give generated
    in one batch: a batch of 10,000 is where per-request lookups show."""
    encode = job.encode
    limit = job.max_payload_bytes
    attempts = job.retry.attempts
    policy = job.idempotency.key if job.idempotency is not None else None
    keyed = job.concurrency.single_runner
    default_priority = job.priority
    by_key = _partitioner(job) if job.partition == "key" else None
    if by_key is None and any(request.partition_key is not None for request in requests):
        by_key = _partitioner(job)
    version = job.version
    next_id = iter(new_run_ids(sum(1 for request in requests if request.run_id is None))).__next__
    prepared: list[PreparedRun] = []
    append = prepared.append
    for request in requests:
        run_id = request.run_id
        durable = run_id is not None
        if run_id is None:
            run_id = next_id()
        else:
            require_key(run_id, "run_id")
        run_at = request.run_at
        if run_at is not None:
            require_aware(run_at, "run_at")
        payload = request.payload
        text = _payload_text(job.id, encode(payload), limit)
        dedupe_key = request.dedupe_key
        if dedupe_key is not None:
            require_key(dedupe_key, "dedupe_key")
        elif policy is not None:
            dedupe_key = require_key(
                policy(payload), f"dedupe_key (from job {job.id!r}'s idempotency policy)"
            )
        key = None
        if keyed:
            key = require_text(
                job.key_of(payload),
                f"single-runner key (job {job.id!r}'s Concurrency.key)",
                max_chars=None,
            )
        priority = (
            default_priority
            if request.priority is None
            else require_priority(request.priority, "priority")
        )
        append(
            PreparedRun(
                run_id,
                durable,
                text,
                dedupe_key,
                key,
                run_at,
                attempts,
                priority,
                trace_context,
                tenant,
                None if by_key is None else by_key(request),
                version,
            )
        )
    return prepared


def _partitioner(job: JobDefinition[Any]) -> Callable[[EnqueueRequest], str | None] | None:
    """F8/F9: how a request of ``job`` gets its partition key (None: the job's limits are not
    per key, and a request that names one is refused)."""
    if job.partition != "key":

        def refuse(request: EnqueueRequest) -> str | None:
            raise ConfigurationError(
                f"enqueue of job {job.id!r} gives partition_key={request.partition_key!r}, but"
                " no limit of the job has partition='key'.",
                fix="drop partition_key=, or declare the job's RateLimit or Concurrency with"
                " partition='key'.",
            )

        return refuse
    derive = job.partition_key

    def key_of(request: EnqueueRequest) -> str | None:
        key = request.partition_key
        if key is None and derive is not None:
            key = derive(request.payload)
        if key is None:
            return None
        return require_key(key, f"partition_key (job {job.id!r})")

    return key_of
