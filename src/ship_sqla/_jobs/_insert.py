"""Storing prepared runs on PostgreSQL (J1, J2): the one insert path of ``enqueue`` and of a
schedule's tick, through the backend's :class:`~ship_sqla._scope.StoreConnections` (in the unit
of work's transaction, the backend's own, or the tick's).

Runs that cannot conflict (generated ids, no dedupe key) and a job without a depth limit take a
plain INSERT from ``unnest`` (``ENQUEUE_PLAIN``); with a depth limit, the job's gate then the
same INSERT bounded by the count (``ENQUEUE_PLAIN_CAPPED``); the rest (durable ids, dedupe keys)
take the checked statement (``ENQUEUE_MANY``), after the gate when a limit is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs
from sqlalchemy.exc import DBAPIError

from ship_sqla._direct import CopyIn, copy_text
from ship_sqla._jobs._sql.enqueue import (
    ANNOUNCE,
    ENQUEUE_COPY_ALLOWED,
    ENQUEUE_COPY_COLUMNS,
    ENQUEUE_COPY_MIN_RUNS,
    ENQUEUE_GATE,
    ENQUEUE_MANY,
    ENQUEUE_ONE,
    ENQUEUE_ONE_ANNOUNCED,
    ENQUEUE_ONE_SAMPLED,
    ENQUEUE_PLAIN,
    ENQUEUE_PLAIN_ANNOUNCED,
    ENQUEUE_PLAIN_CAPPED,
    ENQUEUE_PLAIN_SAMPLED,
    SET_PARTITION_KEYS,
)
from ship_sqla._jobs._sql.live import ENQUEUE_MANY_EITHER
from ship_sqla._jobs._tables import state_row
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._ports import EnqueueResult

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from sqlalchemy import TextClause
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import Joined, StoreConnections, Within
    from ship_sqla.kernel._plans.prepare import PreparedRun

__all__ = ["RunInserter", "conflict_free", "inserted"]

_ENQUEUE_PASSES: Final = 3
_QUEUE_FULL: Final = EnqueueResult(run_id=None, rejected="queue-full")


def conflict_free(runs: Sequence[PreparedRun]) -> bool:
    """No durable run id and no dedupe key: no run of the batch can be a duplicate (J1)."""
    return all(not run.durable_id and run.dedupe_key is None for run in runs)


def inserted(runs: Sequence[PreparedRun]) -> list[EnqueueResult]:
    """Every run of ``runs`` stored as itself (a plain insert's answer). Positional: a bulk of
    10,000 is where the keyword's cost shows."""
    return [EnqueueResult(run.run_id) for run in runs]


def _segments(runs: Sequence[PreparedRun]) -> list[list[int]]:
    """Consecutive runs of requests that repeat no run id and no dedupe key among themselves.

    One statement decides its requests against the stored runs only, so a request that repeats
    an earlier one of the same batch goes in the next statement, which sees the earlier insert:
    a batch then behaves exactly like its requests enqueued one by one. A batch without such
    repeats (the usual case) is one statement.
    """
    segments: list[list[int]] = []
    current: list[int] = []
    ids: set[str] = set()
    dedupe_keys: set[str] = set()
    for index, run in enumerate(runs):
        key = run.dedupe_key
        if run.run_id in ids or (key is not None and key in dedupe_keys):
            segments.append(current)
            current, ids, dedupe_keys = [], set(), set()
        current.append(index)
        ids.add(run.run_id)
        if key is not None:
            dedupe_keys.add(key)
    segments.append(current)
    return segments


@attrs.frozen
class _PlainBatch:
    """ENQUEUE_PLAIN's parameters, built column by column from the prepared runs: no per-run
    dict (a batch of 10,000 is where this shows)."""

    ids: list[str]
    payloads: str
    """The encoded payloads as ONE JSON array, in request order (joined, not re-encoded)."""
    keys: list[str | None]
    run_ats: list[datetime | None]
    max_attempts: list[int]
    priorities: list[int]
    trace_contexts: list[str | None]
    tenant: str | None
    """F2: every run of one enqueue call is for the same (ambient) tenant."""
    handler_version: int | None
    """D9: every run of one enqueue call is of one job, so of one handler version."""

    @classmethod
    def of(cls, runs: Sequence[PreparedRun]) -> _PlainBatch:
        return cls(
            [run.run_id for run in runs],
            "[" + ",".join([run.payload_json for run in runs]) + "]",
            [run.key for run in runs],
            [run.run_at for run in runs],
            [run.max_attempts for run in runs],
            [run.priority for run in runs],
            [run.trace_context for run in runs],
            runs[0].tenant if runs else None,
            runs[0].handler_version if runs else None,
        )

    def params(self, job_id: str, now: datetime | None) -> dict[str, object]:
        return {
            "job_id": job_id,
            "now": now,
            "ids": self.ids,
            "payloads": self.payloads,
            "keys": self.keys,
            "run_ats": self.run_ats,
            "max_attempts": self.max_attempts,
            "priorities": self.priorities,
            "trace_contexts": self.trace_contexts,
            "tenant": self.tenant,
            "handler_version": self.handler_version,
        }


def _one_params(run: PreparedRun, job_id: str, now: datetime | None) -> dict[str, object]:
    """ENQUEUE_ONE's parameters: ``run``'s columns as scalars."""
    return {
        "job_id": job_id,
        "now": now,
        "id": run.run_id,
        "payload_json": run.payload_json,
        "key": run.key,
        "run_at": run.run_at,
        "max_attempts": run.max_attempts,
        "priority": run.priority,
        "trace_context": run.trace_context,
        "tenant": run.tenant,
        "handler_version": run.handler_version,
    }


_NULL: Final = "\\N"
"""NULL in COPY's text format."""

_COPY_CHUNK_RUNS: Final = 1000
"""Runs per chunk of a bulk's COPY text: the server stores one chunk while the next is made."""


def _copy_rows(
    statements: JobStatements, job_id: str, runs: Sequence[PreparedRun], now: datetime | None
) -> CopyIn | None:
    """ENQUEUE_PLAIN's rows for ``runs`` as COPY text (ENQUEUE_COPY_COLUMNS), or None when COPY
    is not worth it or would not store the same rows: fewer than ENQUEUE_COPY_MIN_RUNS, or, with
    no frozen clock (``now`` None), some runs with a due time and some without (the INSERT's
    ``coalesce(run_at, now())`` is the server's clock, which a COPY column takes for every row
    or for none)."""
    if len(runs) < ENQUEUE_COPY_MIN_RUNS:
        return None
    timed = [run.run_at is not None for run in runs]
    columns: tuple[str, ...] = ENQUEUE_COPY_COLUMNS
    tenant = runs[0].tenant
    job = copy_text(job_id)
    version = runs[0].handler_version
    tail = "\t" + (_NULL if tenant is None else copy_text(tenant))
    tail += "\t" + (_NULL if version is None else str(version))
    stamp = ""
    if now is not None:
        columns += ("created_at", "updated_at", "run_at")
        stamp = now.isoformat()
        tail += f"\t{stamp}\t{stamp}\t"
    elif all(timed):
        columns += ("run_at",)
        tail += "\t"
    elif any(timed):
        return None
    dated = len(columns) > len(ENQUEUE_COPY_COLUMNS)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(runs), _COPY_CHUNK_RUNS):
            lines = []
            for run in runs[start : start + _COPY_CHUNK_RUNS]:
                key, trace, run_at = run.key, run.trace_context, run.run_at
                line = "\t".join(
                    (
                        copy_text(run.run_id),
                        job,
                        copy_text(run.payload_json),
                        _NULL if key is None else copy_text(key),
                        str(run.max_attempts),
                        str(run.priority),
                        _NULL if trace is None else copy_text(trace),
                    )
                )
                if not dated:
                    lines.append(line + tail)
                else:
                    lines.append(line + tail + (stamp if run_at is None else run_at.isoformat()))
            yield ("\n".join(lines) + "\n").encode()

    return CopyIn(
        table=statements.runs_table,
        schema=statements.runs_schema,
        columns=columns,
        chunks=chunks,
    )


def _due(runs: Sequence[PreparedRun], wall: datetime) -> bool:
    return any(run.run_at is None or run.run_at <= wall for run in runs)


class RunInserter:
    """``insert``'s statements for one backend's tables; stateless between calls."""

    __slots__ = ("_connections", "_copy_allowed", "_depth_limit", "_now", "_s", "_wall")

    def __init__(
        self,
        statements: JobStatements,
        connections: StoreConnections,
        *,
        depth_limit: int | None,
        now: Callable[[], datetime | None],
        wall: Callable[[], datetime],
    ) -> None:
        self._s = statements
        self._connections = connections
        self._depth_limit = depth_limit
        self._now = now
        self._wall = wall
        self._copy_allowed: bool | None = None
        """ENQUEUE_COPY_ALLOWED's answer (None: not asked yet)."""

    async def probe_copy(self, scope: Within) -> None:
        """Ask once whether the runs table takes COPY (ENQUEUE_COPY_ALLOWED: not with row-level
        security on), where ``scope`` says; :meth:`copy` offers none until this answered yes."""
        if self._copy_allowed is None:
            [(allowed,)] = await self._connections.rows(
                "enqueue", self._s[ENQUEUE_COPY_ALLOWED], {"runs": self._s.runs_name}, scope=scope
            )
            self._copy_allowed = bool(allowed)

    def copy_refused(self, error: BaseException) -> bool:
        """Whether ``error`` is COPY refused for the table (0A000: row-level security turned on
        since the probe); then later bulks take the INSERT."""
        if sqlstate_of(error) != "0A000":
            return False
        self._copy_allowed = False
        return True

    def unchecked(self, runs: Sequence[PreparedRun]) -> bool:
        """Whether ``runs`` need none of ENQUEUE_MANY's J1 probes (:func:`conflict_free`): the
        plain INSERTs serve them."""
        return conflict_free(runs)

    def one_statement(self, runs: Sequence[PreparedRun]) -> bool:
        """Whether :meth:`store_plain` serves ``runs`` (one statement, so an own connection
        may autocommit it): no depth limit to gate, nothing to check."""
        return self._depth_limit is None and self.unchecked(runs)

    def copy(self, job_id: str, runs: Sequence[PreparedRun]) -> tuple[CopyIn | None, bool]:
        """ENQUEUE_PLAIN's rows as a COPY (ENQUEUE_COPY_COLUMNS) when that is worth it, stores
        the same rows and the table takes COPY (:meth:`probe_copy`; else None: the plain
        INSERT), and whether a run is due now. Only for what
        the plain INSERT serves (:meth:`one_statement`, or a tick's uncapped conflict-free
        runs); :meth:`store_plain` announces (K1) after it, in the same transaction."""
        due = _due(runs, self._wall())
        if not self._copy_allowed:  # refused, or not asked yet (ask first: probe_copy)
            return None, due
        return _copy_rows(self._s, job_id, runs, self._now()), due

    def plain(
        self,
        job_id: str,
        runs: Sequence[PreparedRun],
        *,
        announce: tuple[str, str] | None,
        sample: bool = False,
    ) -> tuple[TextClause, dict[str, object], bool]:
        """The ONE statement that stores ``runs`` of ``job_id`` when nothing needs checking
        (:meth:`one_statement`, or a tick's uncapped conflict-free runs), its parameters, and
        whether a run of it is due now: ENQUEUE_PLAIN (ENQUEUE_ONE for one run), or its
        announcing form (ENQUEUE_PLAIN_ANNOUNCED, ENQUEUE_ONE_ANNOUNCED) carrying ``announce``
        (K1) when a run is due, else with ``sample`` its sampling form (ENQUEUE_*_SAMPLED).
        Every run is inserted; the announcing and sampling forms answer the table's ``seq``
        (:meth:`reads_seq`, :func:`fleet_seq_of`), the plain ones nothing."""
        due = _due(runs, self._wall())
        s = self._s
        if len(runs) == 1:
            params = _one_params(runs[0], job_id, self._now())
            forms = (s[ENQUEUE_ONE], s[ENQUEUE_ONE_ANNOUNCED], s[ENQUEUE_ONE_SAMPLED])
        else:
            params = _PlainBatch.of(runs).params(job_id, self._now())
            forms = (s[ENQUEUE_PLAIN], s[ENQUEUE_PLAIN_ANNOUNCED], s[ENQUEUE_PLAIN_SAMPLED])
        statement, announced, sampled = forms
        if announce is not None and due:
            statement = announced
            params["channel"], params["payload"] = announce
        elif sample:
            statement = sampled
        return statement, params, due

    async def insert_on(
        self,
        tx: Joined,
        job_id: str,
        runs: Sequence[PreparedRun],
        *,
        capped: bool = True,
        announce: tuple[str, str] | None = None,
        sample: bool = False,
    ) -> tuple[list[EnqueueResult], bool, int | None]:
        """Store ``runs`` of ``job_id`` in the transaction of ``tx`` (a block of
        :meth:`~ship_sqla._scope.StoreConnections.transaction`): the results in order (J1, J2),
        whether a run it inserted is due now (the local loop is worth waking after commit), and
        the plain INSERT's ``fleet_seq`` when it announced or ``sample`` asked for it (None on
        the other paths).
        ``capped=False`` (a schedule's tick): no J2 gate and no cap. ``announce``: the (channel,
        payload) to notify in this same transaction when a run it inserts is due now (K1; the
        plain INSERT carries the NOTIFY itself, the other paths send ANNOUNCE after inserting);
        None: no announcement."""
        depth_limit = self._depth_limit if capped else None
        unchecked = self.unchecked(runs)
        if depth_limit is None and unchecked:
            due, fleet_seq = await self.store_plain(
                job_id, runs, announce=announce, sample=sample, scope=tx
            )
            await self._store_partition_keys(tx.connection, runs)
            return inserted(runs), due, fleet_seq
        connection = tx.connection
        if depth_limit is not None:
            await self._take_gate(connection, job_id)
        if depth_limit is not None and unchecked:
            params = _PlainBatch.of(runs).params(job_id, self._now())
            params["depth_limit"] = depth_limit
            room = min(
                int(await connection.scalar(self._s[ENQUEUE_PLAIN_CAPPED], params)), len(runs)
            )
            results = [EnqueueResult(run_id=run.run_id) for run in runs[:room]]
            results += [_QUEUE_FULL] * (len(runs) - room)
            due = _due(runs[:room], self._wall())
        else:
            results, due = await self._insert_checked(connection, job_id, runs, depth_limit)
        if announce is not None and due:
            await self._announce(connection, announce)
        await self._store_partition_keys(connection, runs)
        return results, due, None

    async def _store_partition_keys(
        self, connection: AsyncConnection, runs: Sequence[PreparedRun]
    ) -> None:
        """F8/F9 (SET_PARTITION_KEYS): the partition keys of the runs just inserted, in the
        same transaction, so no claim sees them without; nothing for runs without keys."""
        keyed = [(run.run_id, run.partition) for run in runs if run.partition is not None]
        if keyed:
            await connection.execute(
                self._s[SET_PARTITION_KEYS],
                {
                    "ids": [run_id for run_id, _ in keyed],
                    "partition_keys": [key for _, key in keyed],
                },
            )

    async def store_plain(
        self,
        job_id: str,
        runs: Sequence[PreparedRun],
        *,
        announce: tuple[str, str] | None,
        sample: bool = False,
        scope: Within,
    ) -> tuple[bool, int | None]:
        """Store runs nothing needs to check (:meth:`one_statement`, or a tick's uncapped
        conflict-free runs) where ``scope`` says: whether a run is due now, and the INSERT's
        ``fleet_seq`` when it announced or ``sample`` asked for it (else None). THE insert path,
        decided here once for every caller: a COPY when :meth:`copy` offers one and the path
        the connection layer takes can run it (:meth:`~ship_sqla._scope.StoreConnections.copy`),
        with the announcement (K1) in its transaction; else the one INSERT (ENQUEUE_PLAIN or
        ENQUEUE_ONE, in its announcing or sampling form: :meth:`plain`). A COPY the table
        refuses (0A000: row-level security turned on since the probe) makes later bulks take
        the INSERT; on its own it wrote nothing, so the INSERT stores these runs instead; in a
        transaction it joined, that transaction is lost and the error propagates."""
        connections = self._connections
        if len(runs) >= ENQUEUE_COPY_MIN_RUNS:
            await self.probe_copy(scope)
        copy, due = self.copy(job_id, runs)
        if copy is not None:
            then = None
            if due and announce is not None:
                channel, payload = announce
                then = (self._s[ANNOUNCE], {"channel": channel, "payload": payload})
            try:
                if await connections.copy("enqueue", copy, then, scope=scope):
                    return due, None
            except DBAPIError as error:
                if not self.copy_refused(error) or connections.joins(scope):
                    raise
        statement, params, due = self.plain(job_id, runs, announce=announce, sample=sample)
        if self.reads_seq(statement):
            rows = await connections.rows("enqueue", statement, params, scope=scope)
            return due, fleet_seq_of(rows)
        await connections.execute("enqueue", statement, params, scope=scope)
        return due, None

    def reads_seq(self, statement: TextClause) -> bool:
        """Whether ``statement`` (from :meth:`plain`) answers rows whose last column is a
        ``seq`` it took (the announcing and sampling forms)."""
        s = self._s
        forms = (
            s[ENQUEUE_ONE_ANNOUNCED],
            s[ENQUEUE_PLAIN_ANNOUNCED],
            s[ENQUEUE_ONE_SAMPLED],
            s[ENQUEUE_PLAIN_SAMPLED],
        )
        return any(statement is form for form in forms)  # by identity: == builds SQL

    async def _announce(self, connection: AsyncConnection, announce: tuple[str, str]) -> None:
        channel, payload = announce
        await connection.execute(self._s[ANNOUNCE], {"channel": channel, "payload": payload})

    async def _take_gate(self, connection: AsyncConnection, job_id: str) -> None:
        """The job's enqueue gate, held until ``connection``'s transaction ends (J2 hard cap:
        ENQUEUE_GATE). Only with a ``queue_depth_limit``."""
        await connection.execute(
            self._s[ENQUEUE_GATE], {"gate": state_row(job_id, "enqueue-gate"), "now": self._now()}
        )

    async def _insert_checked(
        self,
        connection: AsyncConnection,
        job_id: str,
        runs: Sequence[PreparedRun],
        depth_limit: int | None,
    ) -> tuple[list[EnqueueResult], bool]:
        """Runs that may be deduplicated (J1) or rejected (J2): ENQUEUE_MANY, per segment."""
        results: list[EnqueueResult | None] = [None] * len(runs)
        due_now = False
        for segment in _segments(runs):
            todo = segment
            for _ in range(_ENQUEUE_PASSES):
                todo, inserted_due = await self._pass(
                    connection, job_id, runs, todo, results, depth_limit=depth_limit
                )
                due_now = due_now or inserted_due
                if not todo:
                    break
            if todo:
                raise RuntimeError(
                    f"enqueue of job {job_id!r}: {len(todo)} runs kept conflicting with"
                    f" concurrent inserts after {_ENQUEUE_PASSES} passes; nothing of this"
                    " call is settled."
                )
        return [result for result in results if result is not None], due_now

    async def _pass(
        self,
        connection: AsyncConnection,
        job_id: str,
        runs: Sequence[PreparedRun],
        todo: list[int],
        results: list[EnqueueResult | None],
        *,
        depth_limit: int | None,
    ) -> tuple[list[int], bool]:
        """One ENQUEUE_MANY over ``runs[todo]``; fills ``results``; returns the lost races."""
        batch = [runs[i] for i in todo]
        params = {
            "job_id": job_id,
            "depth_limit": depth_limit,
            "now": self._now(),
            "ids": [run.run_id for run in batch],
            "payloads": [run.payload_json for run in batch],
            "dedupe_keys": [run.dedupe_key for run in batch],
            "keys": [run.key for run in batch],
            "run_ats": [run.run_at for run in batch],
            "max_attempts": [run.max_attempts for run in batch],
            "priorities": [run.priority for run in batch],
            "trace_contexts": [run.trace_context for run in batch],
            "tenant": batch[0].tenant if batch else None,
            "handler_version": batch[0].handler_version if batch else None,
        }
        # J16: with a history table, a durable id that ended is there (J1).
        checked = ENQUEUE_MANY if not self._s.live_only else ENQUEUE_MANY_EITHER
        answer = (await connection.execute(self._s[checked], params)).all()
        lost: list[int] = []
        due_now = False
        wall = self._wall()
        for row in answer:
            index = todo[row.ord - 1]
            if row.inserted:
                results[index] = EnqueueResult(run_id=row.id)
                run_at = runs[index].run_at
                due_now = due_now or run_at is None or run_at <= wall
            elif row.existing_id is not None:
                results[index] = EnqueueResult(run_id=row.existing_id, deduplicated=True)
            elif row.room is not None and row.rn > row.room:
                results[index] = _QUEUE_FULL
            else:
                lost.append(index)
        return lost, due_now


def fleet_seq_of(rows: Sequence[Any]) -> int | None:
    """The largest ``seq`` an announcing or sampling INSERT answered (its rows' last column),
    or None."""
    values = [row[-1] for row in rows if row[-1] is not None]
    return max(values) if values else None
