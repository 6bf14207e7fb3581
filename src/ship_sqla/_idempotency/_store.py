"""The idempotency store (SPEC section 5): claim a key, run the effect once, replay the answer.

I1 ``begin`` and ``complete`` join the active unit of work: the claim, the business writes and
   the stored response commit together, and a rollback leaves no claim behind.
I2 Every outcome is explicit (started / replay / in progress / fingerprint mismatch). A
   concurrent duplicate never runs the effect twice: the primary key admits one claim, and a
   duplicate that meets an uncommitted claim waits at most ``lock_timeout`` before it is told
   "in progress" (it never hangs for as long as the first request runs).
I3 ``cleanup`` deletes expired keys of one prefix in bounded batches.

Bounds, checked before any SQL runs: a key is 1 to 255 bytes of UTF-8, a prefix 1 to 200, a
tenant 1 to 255 (:data:`ship_sqla._scope.MAX_TENANT_BYTES`; ``""`` and blank tenants are
refused, they would alias "no tenant", stored as ``''``). Together they stay far below the
primary key's btree row limit (about 2.7 kB), so no key is refused by PostgreSQL with "index row
requires N bytes". A refused connection or a lost one raises
:class:`~ship_sqla.errors.DatabaseUnavailableError`. Every statement reaches the database through
one :class:`~ship_sqla._scope.StoreConnections`, whose one entry decides how (the unit of
work's connection, else a short transaction of the store's own, or one autocommitted
statement).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ship_sqla._idempotency._lock_wait import (
    LockWaitTimedOutError,
    bounded_lock_wait,
    lock_timeout_setting,
)
from ship_sqla._idempotency._sql import IdempotencyStatements, build_statements
from ship_sqla._idempotency._types import (
    IdempotencyClaim,
    IdempotencyClaimLostError,
    IdempotencyFingerprintMismatch,
    IdempotencyInProgress,
    IdempotencyKeyError,
    IdempotencyOutcome,
    IdempotencyRecord,
    IdempotencyReplay,
    IdempotencyStarted,
    StoredResponse,
    _ClaimOwner,
)
from ship_sqla._scope import Database, StoreConnections, check_tenant, tenant_within
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._errors import BoundExceededError, ConfigurationError
from ship_sqla.kernel._json_text import unstorable_text

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla._scope import TransactionScope, Within
    from ship_sqla.kernel._transactional import InboxAnswer

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_CLEANUP_LIMIT",
    "MAX_KEY_LENGTH",
    "IdempotencyStore",
    "create_idempotency_store",
]

DEFAULT_PREFIX = "default"
MAX_KEY_LENGTH = 255
"""Bytes of UTF-8 (255 ASCII characters; a UUID is 36)."""
MAX_PREFIX_LENGTH = 200
"""Bytes of UTF-8."""
MAX_CLEANUP_LIMIT = 10_000
DEFAULT_LOCK_TIMEOUT = timedelta(seconds=1)
DEFAULT_CLAIM_LEASE = timedelta(minutes=1)
DEFAULT_TTL = timedelta(hours=24)
_INBOX_MARK = StoredResponse(status=200)
"""What a job inbox key stores as its response: the run completed (its outcome is the run's)."""
# A key deleted by cleanup between our INSERT and our read is retried; a third race in a row is
# answered "in progress" rather than looping.
_BEGIN_ROUNDS = 3


def _check_text(kind: str, value: str, limit: int) -> None:
    # Printable first: a surrogate code point (not printable) has no UTF-8 to measure.
    if not value or not value.isprintable() or len(value.encode()) > limit:
        raise IdempotencyKeyError(
            f"idempotency {kind} {value[:60]!r} must be 1 to {limit} bytes (UTF-8) of"
            " printable text.",
            fix=f"use a short opaque {kind}, e.g. a UUID"
            if kind == "key"
            else f"use a short namespace such as 'http' or 'webhook:<name>' as the {kind}.",
        )


def _positive(name: str, value: timedelta) -> float:
    seconds = value.total_seconds()
    if seconds <= 0:
        raise ConfigurationError(
            f"{name} must be positive, got {seconds:g} s.", fix=f"pass a positive {name}."
        )
    return seconds


class IdempotencyStore(_ClaimOwner):
    """Idempotency keys on PostgreSQL. Build with :func:`create_idempotency_store`."""

    def __init__(
        self,
        *,
        database: Database,
        table: Table,
        clock: Clock | None,
        lock_timeout: timedelta,
        claim_lease: timedelta,
        ttl: timedelta,
    ) -> None:
        if not {"prefix", "key", "fingerprint"} <= set(table.c.keys()):
            raise ConfigurationError(
                "create_idempotency_store needs the Table made by ship_idempotency_table().",
                fix="pass table=ship_idempotency_table(metadata).",
            )
        self._connections = StoreConnections(database, name="idempotency")
        self._table = table
        self._clock: Clock = clock or SystemClock()
        self._lock_timeout = lock_timeout_setting(lock_timeout)
        self._lease_seconds = _positive("claim_lease", claim_lease)
        self._ttl_seconds = _positive("ttl", ttl)
        if self._ttl_seconds <= self._lease_seconds:
            raise ConfigurationError(
                f"ttl ({ttl}) must be longer than claim_lease ({claim_lease}); a key would"
                " expire, and be forgotten, while its first request may still run.",
                fix="keep ttl in hours or days (the IETF draft suggests 24 h) and the lease short.",
            )
        self._sql: IdempotencyStatements = build_statements(table)

    @property
    def database(self) -> Database:
        return self._connections.database

    @property
    def table(self) -> Table:
        return self._table

    def _now(self) -> datetime | None:
        return now_bound(self._clock)

    # -- begin ----------------------------------------------------------------------------------

    async def begin(
        self,
        key: str,
        fingerprint: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        tenant: str | None = None,
        ttl: timedelta | None = None,
        scope: TransactionScope | None = None,
    ) -> IdempotencyOutcome:
        """Claim ``key`` for the request identified by ``fingerprint``, or say why not.

        Keys live under ``prefix`` and ``tenant`` (default: the unit of work's tenant). Joins the
        given or ambient unit of work (I1); outside one the claim commits at once. Answers
        :class:`IdempotencyStarted` (run the effect, then ``claim.complete``),
        :class:`IdempotencyReplay`, :class:`IdempotencyInProgress` (after waiting at most
        ``lock_timeout`` for an uncommitted claim) or :class:`IdempotencyFingerprintMismatch`.
        """
        _check_text("key", key, MAX_KEY_LENGTH)
        _check_text("prefix", prefix, MAX_PREFIX_LENGTH)
        check_tenant(tenant, operation="idempotency begin")
        if not fingerprint:
            raise IdempotencyKeyError(
                "the request fingerprint is empty, so a reused key could not be told apart.",
                fix="fingerprint what identifies the request: method, path and a body hash.",
            )
        if (problem := unstorable_text(fingerprint)) is not None:
            raise IdempotencyKeyError(
                f"the request fingerprint holds {problem}: PostgreSQL text cannot store it.",
                fix="fingerprint with a hash's hex digest (sha256 of method, path and body).",
            )
        ttl_seconds = self._ttl_seconds if ttl is None else _positive("ttl", ttl)
        async with self._connections.transaction("begin", scope=scope) as tx:
            tenant = tenant_within(tx.scope, tenant, operation="idempotency begin")
            params: dict[str, Any] = {
                "k_prefix": prefix,
                "k_tenant": tenant or "",
                "k_key": key,
                "fingerprint": fingerprint,
                "lease": self._lease_seconds,
                "ttl": ttl_seconds,
                "now": self._now(),
            }
            for _ in range(_BEGIN_ROUNDS):
                params["token"] = uuid.uuid4()
                try:
                    outcome = await self._begin_once(tx.connection, params)
                except LockWaitTimedOutError:
                    return IdempotencyInProgress(locked_until=None)
                if outcome is not None:
                    return outcome
            return IdempotencyInProgress(locked_until=None)

    async def _begin_once(
        self, connection: AsyncConnection, params: dict[str, Any]
    ) -> IdempotencyOutcome | None:
        async with bounded_lock_wait(connection, self._lock_timeout):
            row = (await connection.execute(self._sql.claim_new, params)).first()
            if row is None:
                row = (await connection.execute(self._sql.take_over, params)).first()
            if row is not None:
                return IdempotencyStarted(self._claim(params, row.locked_until, row.expires_at))
            existing = (await connection.execute(self._sql.read, params)).first()
        if existing is None:
            return None  # deleted by cleanup since our INSERT conflicted: claim again
        if existing.fingerprint != params["fingerprint"]:
            return IdempotencyFingerprintMismatch(key=params["k_key"])
        if existing.status == "completed":
            return IdempotencyReplay(
                response=StoredResponse.from_json(existing.response),
                completed_at=existing.completed_at,
            )
        return IdempotencyInProgress(locked_until=existing.locked_until)

    def _claim(
        self, params: dict[str, Any], locked_until: datetime, expires_at: datetime
    ) -> IdempotencyClaim:
        return IdempotencyClaim(
            prefix=params["k_prefix"],
            tenant=params["k_tenant"],
            key=params["k_key"],
            fingerprint=params["fingerprint"],
            token=params["token"],
            locked_until=locked_until,
            expires_at=expires_at,
            owner=self,
        )

    # -- settle (through IdempotencyClaim) ------------------------------------------------------

    def _claim_params(self, claim: IdempotencyClaim) -> dict[str, Any]:
        return {
            "k_prefix": claim.prefix,
            "k_tenant": claim.tenant,
            "k_key": claim.key,
            "token": claim.token,
            "now": self._now(),
        }

    async def _complete(
        self,
        claim: IdempotencyClaim,
        response: StoredResponse,
        scope: TransactionScope | None,
    ) -> datetime:
        params = self._claim_params(claim)
        # The ttl restarts at completion: a key is remembered for ttl after its answer exists.
        params |= {"response": response.to_json(), "ttl": self._ttl_seconds}
        rows = await self._connections.rows(
            "complete", self._sql.complete, params, scope=scope, by_name=True
        )
        if not rows:
            raise _lost(claim, "complete")
        completed_at: datetime = rows[0].completed_at
        return completed_at

    async def _release(self, claim: IdempotencyClaim, scope: TransactionScope | None) -> None:
        params = self._claim_params(claim)
        rows = await self._connections.rows("release", self._sql.release, params, scope=scope)
        if not rows:
            raise _lost(claim, "release")

    # -- the job inbox (J13) ---------------------------------------------------------------------

    async def mark_inbox(
        self, key: str, fingerprint: str, *, prefix: str, ttl: float | None
    ) -> InboxAnswer:
        """:class:`~ship_sqla.kernel.InboxStore`: claim ``key`` and complete it at once, in the
        active unit of work (a transactional job's: I1, the mark commits with the handler's
        writes), or say why not (I2): completed before, ``"duplicate"``; an open transaction
        holds it (after at most ``lock_timeout``), ``"held"``; another fingerprint,
        ``"mismatch"``."""
        self._connections.require_joined(
            "an inbox mark",
            fix="build the store on the engine of the job's transaction= unit of work (the"
            " runtime marks the key inside it).",
        )
        outcome = await self.begin(
            key, fingerprint, prefix=prefix, ttl=None if ttl is None else timedelta(seconds=ttl)
        )
        if isinstance(outcome, IdempotencyStarted):
            await outcome.claim.complete(_INBOX_MARK)
            return "new"
        if isinstance(outcome, IdempotencyReplay):
            return "duplicate"
        if isinstance(outcome, IdempotencyInProgress):
            return "held"
        return "mismatch"

    # -- reads and maintenance ------------------------------------------------------------------

    async def get(
        self,
        key: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        tenant: str | None = None,
        scope: TransactionScope | None = None,
    ) -> IdempotencyRecord | None:
        """The key's row, whatever its status (None when there is none)."""
        check_tenant(tenant, operation="idempotency get")
        connections = self._connections
        tenant = tenant_within(connections.scope_of(scope), tenant, operation="idempotency get")
        params = {"k_prefix": prefix, "k_tenant": tenant or "", "k_key": key}
        rows = await connections.rows("get", self._sql.read, params, scope=scope, by_name=True)
        if not rows:
            return None
        row = rows[0]
        return IdempotencyRecord(
            prefix=row.prefix,
            tenant=row.tenant_id or None,
            key=row.key,
            fingerprint=row.fingerprint,
            status=row.status,
            response=None if row.response is None else StoredResponse.from_json(row.response),
            locked_until=row.locked_until,
            expires_at=row.expires_at,
            created_at=row.created_at,
            completed_at=row.completed_at,
        )

    async def cleanup(
        self, *, prefix: str, limit: int = 1000, scope: TransactionScope | None = None
    ) -> int:
        """Delete up to ``limit`` expired keys of ``prefix`` (any tenant); return how many (I3).

        Call it until it returns less than ``limit`` to drain a backlog; each call is one short
        statement served by ``<table>_expires_idx``.
        """
        _check_text("prefix", prefix, MAX_PREFIX_LENGTH)
        check_cleanup_limit(limit)
        return await run_cleanup(
            self._connections, self._sql, prefix, limit, self._now(), scope=scope
        )


def check_cleanup_limit(limit: int) -> None:
    if limit < 1 or limit > MAX_CLEANUP_LIMIT:
        raise BoundExceededError(
            f"cleanup limit {limit} is outside 1..{MAX_CLEANUP_LIMIT}.",
            fix=f"delete in batches of at most {MAX_CLEANUP_LIMIT}, calling cleanup again until"
            " it returns less than the limit.",
        )


async def run_cleanup(
    connections: StoreConnections,
    statements: IdempotencyStatements,
    prefix: str,
    limit: int,
    now: datetime | None,
    *,
    scope: Within,
) -> int:
    """One bounded DELETE of ``prefix``'s expired keys where ``scope`` says; how many. Shared
    with the webhook store, whose cleanup also removes its prefix's expired keys."""
    params = {"k_prefix": prefix, "limit": limit, "now": now}
    return await connections.count("cleanup", statements.cleanup, params, scope=scope)


def _lost(claim: IdempotencyClaim, operation: str) -> IdempotencyClaimLostError:
    return IdempotencyClaimLostError(
        f"{operation} of idempotency key {claim.key!r} (prefix {claim.prefix!r}) was refused:"
        " the claim is no longer this caller's (it was released, or left in progress past"
        f" locked_until {claim.locked_until.isoformat()} and taken over by a retry); nothing"
        " was changed.",
        fix="finish the effect within claim_lease, or run begin and complete inside one unit of"
        " work so the claim cannot be taken over.",
    )


def create_idempotency_store(
    *,
    database: Database,
    table: Table,
    clock: Clock | None = None,
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
    claim_lease: timedelta = DEFAULT_CLAIM_LEASE,
    ttl: timedelta = DEFAULT_TTL,
) -> IdempotencyStore:
    """An idempotency store over ``table`` (from :func:`ship_idempotency_table`).

    ``lock_timeout`` bounds how long a duplicate waits for an uncommitted first claim before it
    is told "in progress" (I2). ``claim_lease`` is how long a claim committed without a response
    (its process died between ``begin`` and ``complete`` outside a unit of work) blocks retries.
    ``ttl`` is how long a key is remembered (the IETF draft suggests at least 24 hours; webhook
    senders retry for about 3 days). ``clock``: a frozen clock moves the SQL's ``now`` in tests.
    """
    return IdempotencyStore(
        database=database,
        table=table,
        clock=clock,
        lock_timeout=lock_timeout,
        claim_lease=claim_lease,
        ttl=ttl,
    )
