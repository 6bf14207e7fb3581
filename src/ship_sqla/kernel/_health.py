"""J22: the database's health as data, a metric and an alarm.

A store that can read its database's health is a :class:`StorageHealthSource`: it answers a
:class:`StorageHealth` (the ship tables' live and dead tuples, sizes and time since their last
vacuum; the oldest held snapshot and who holds it; the history partitions prepared ahead and
the runs its DEFAULT partitions caught, J17). The rules that turn it into alarms are here,
pure: :meth:`StorageHealth.alarms` against :class:`HealthBounds`. Three readers use them:

- the fleet's queue sampler (F5: the one runtime holding the sampler lease) exports the values
  as gauges (:class:`~ship_sqla.kernel._metrics.JobMetrics`) and logs
  ``SHIP_SQLA_DB_HORIZON_HELD`` through :class:`HorizonWarning`, throttled;
- the operator surface (:meth:`~ship_sqla.kernel.JobOperations.storage_health`, ``ship-sqla
  jobs health``);
- the dashboard, which shows a banner while an alarm holds.

A store that cannot read any of it (the in-memory one) answers :data:`UNKNOWN_HEALTH`:
``status`` is ``"unknown"``, never an alarm. This module imports no SQLAlchemy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from ship_sqla.kernel._clock import Clock

__all__ = [
    "HORIZON_HELD",
    "UNKNOWN_HEALTH",
    "HealthAlarm",
    "HealthBounds",
    "HealthStatus",
    "HorizonHolder",
    "HorizonScope",
    "HorizonWarning",
    "StorageHealth",
    "StorageHealthSource",
    "TableHealth",
]

logger = logging.getLogger("ship_sqla.jobs")

HORIZON_HELD: Final = "SHIP_SQLA_DB_HORIZON_HELD"
"""The code of the warning a sampler logs while a snapshot older than the bound is held."""

HealthStatus = Literal["healthy", "alarm", "unknown"]
"""``unknown``: the store reads no health (in-memory) or the read failed."""

HorizonScope = Literal["all", "own-role", "none"]
"""Whose sessions the horizon read could see: ``all`` (the role has ``pg_read_all_stats`` or is
a superuser), ``own-role`` (only the role's own sessions: the usual holders, other roles'
analytics or admin sessions, are invisible) or ``none`` (not read)."""

AlarmKind = Literal["horizon", "dead_tuples", "partitions", "history_strays"]


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    del instance
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(
            f"HealthBounds.{attribute.name} must be a positive number, got {value!r}.",
            fix=f"pass a number above 0 (the default is {attribute.default}).",
        )


@attrs.frozen
class HealthBounds:
    """Where the storage health turns into an alarm (J22).

    - ``horizon_alarm``: seconds a snapshot may be held before it is an alarm (default 300:
      at 1,000 runs/s five minutes is 300,000 dead versions the claims walk past; long enough
      that a nightly report or a ``pg_dump`` of a small database does not trip it).
    - ``dead_tuples_floor`` and ``dead_tuples_ratio``: the runs table's dead tuples are an
      alarm past ``max(floor, ratio x live)`` (default 10,000 and 10: autovacuum is not
      keeping up, or a held snapshot keeps it from removing them).
    - ``partitions_ahead_min``: fewer history partitions ready ahead is an alarm (default 2;
      read when J17's history table exists). Runs in its DEFAULT partitions always are.
    - ``warn_every``: seconds between two warnings about the same holder (default 300).
    """

    horizon_alarm: float = attrs.field(default=300.0, validator=_positive)
    dead_tuples_floor: int = attrs.field(default=10_000, validator=_positive)
    dead_tuples_ratio: float = attrs.field(default=10.0, validator=_positive)
    partitions_ahead_min: int = attrs.field(default=2, validator=_positive)
    warn_every: float = attrs.field(default=300.0, validator=_positive)


@attrs.frozen
class TableHealth:
    """One ship table as PostgreSQL's statistics see it: ``table`` is its role (``runs``,
    ``state``, ``workers``, ``steps``, ``events``), ``name`` its quoted, qualified name;
    ``live_tuples`` and ``dead_tuples`` the statistics' estimates; ``size_bytes`` heap, indexes
    and TOAST; ``vacuum_age`` seconds since its last vacuum or autovacuum (None: never);
    ``largest_index_bytes`` the size of its largest index (None: not read, or no index), which
    the sampler's early index rebuild reads (J17, :mod:`ship_sqla.kernel._early_rebuild`)."""

    table: str
    name: str
    live_tuples: int
    dead_tuples: int
    size_bytes: int
    vacuum_age: float | None
    largest_index_bytes: int | None = None


@attrs.frozen
class HorizonHolder:
    """What holds the oldest snapshot of the database: a session (``pid``, its
    ``application_name``) or a prepared transaction (``pid`` None, ``application_name`` its
    global id); ``age`` seconds since its transaction started, on the database's clock. The
    query text is never read."""

    pid: int | None
    application_name: str
    age: float
    kind: Literal["session", "prepared"] = "session"


@attrs.frozen
class HealthAlarm:
    """One bound crossed: ``kind``, and a sentence with its fix."""

    kind: AlarmKind
    message: str


@attrs.frozen
class StorageHealth:
    """The storage health of one backend's tables (J22). ``known`` is False when the store
    reads none (:data:`UNKNOWN_HEALTH`); ``partitions_ahead`` (the fewest history day partitions
    ready after today over the state classes) and ``history_strays`` (the rows the history's
    DEFAULT partitions caught: an alarm when not zero, J17) are None without a history
    table."""

    tables: tuple[TableHealth, ...] = ()
    horizon: HorizonHolder | None = None
    horizon_scope: HorizonScope = "none"
    partitions_ahead: int | None = None
    history_strays: int | None = None
    bounds: HealthBounds = HealthBounds()
    known: bool = False

    def table(self, role: str) -> TableHealth | None:
        """The entry of the table of ``role`` (``"runs"``...), None when not read."""
        return next((t for t in self.tables if t.table == role), None)

    def alarms(self) -> tuple[HealthAlarm, ...]:
        """The bounds crossed, each with its fix (empty when healthy or unknown)."""
        if not self.known:
            return ()
        found: list[HealthAlarm] = []
        bounds = self.bounds
        holder = self.horizon
        if holder is not None and holder.age > bounds.horizon_alarm:
            found.append(HealthAlarm("horizon", horizon_message(holder)))
        runs = self.table("runs")
        if runs is not None:
            limit = max(bounds.dead_tuples_floor, bounds.dead_tuples_ratio * runs.live_tuples)
            if runs.dead_tuples > limit:
                found.append(
                    HealthAlarm(
                        "dead_tuples",
                        f"the runs table {runs.name} has {runs.dead_tuples:,} dead tuples"
                        f" ({runs.live_tuples:,} live): autovacuum is behind or a held snapshot"
                        " keeps them. Fix: end long transactions (see the snapshot alarm),"
                        " check the table's autovacuum options (`ship-sqla schema check`) and"
                        " autovacuum_naptime (docs/production.md).",
                    )
                )
        ahead = self.partitions_ahead
        if ahead is not None and ahead < bounds.partitions_ahead_min:
            found.append(
                HealthAlarm(
                    "partitions",
                    f"{ahead} history partition(s) ready ahead (fewer than"
                    f" {bounds.partitions_ahead_min}). Fix: run `ship-sqla jobs maintain`.",
                )
            )
        if self.history_strays:
            found.append(
                HealthAlarm(
                    "history_strays",
                    f"{self.history_strays} run(s) in the history's DEFAULT partitions (no day"
                    " partition was ready for them: maintenance fell behind, or a clock is far"
                    " off). Fix: run `ship-sqla jobs maintain`, which creates their days and"
                    " moves them out.",
                )
            )
        return tuple(found)

    @property
    def status(self) -> HealthStatus:
        if not self.known:
            return "unknown"
        return "alarm" if self.alarms() else "healthy"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (``ship-sqla jobs health --json``)."""
        return {
            "status": self.status,
            "alarms": [{"kind": a.kind, "message": a.message} for a in self.alarms()],
            "tables": [attrs.asdict(t) for t in self.tables],
            "horizon": None if self.horizon is None else attrs.asdict(self.horizon),
            "horizon_scope": self.horizon_scope,
            "partitions_ahead": self.partitions_ahead,
            "history_strays": self.history_strays,
        }


UNKNOWN_HEALTH: Final = StorageHealth()
"""The answer of a store that reads no storage health: ``status == "unknown"``."""


def horizon_message(holder: HorizonHolder) -> str:
    """The alarm's sentence: who holds the snapshot and the fix (never the query)."""
    who = (
        f"pid {holder.pid} (application_name {holder.application_name!r})"
        if holder.kind == "session"
        else f"prepared transaction {holder.application_name!r}"
    )
    return (
        f"{who} has held a snapshot for {holder.age:.0f} s: dead rows cannot be removed while it"
        " does, and every claim walks past them. Fix: end that transaction"
        " (pg_terminate_backend, or COMMIT/ROLLBACK PREPARED), and set"
        " idle_in_transaction_session_timeout (docs/production.md)."
    )


@runtime_checkable
class StorageHealthSource(Protocol):
    """A store that reads its database's health (J22). Every read is a few catalog and
    statistics views, bounded by the number of ship tables and sessions."""

    async def storage_health(self) -> StorageHealth: ...


class HorizonWarning:
    """Logs ``SHIP_SQLA_DB_HORIZON_HELD`` (WARNING) while a health's horizon alarm holds: at
    once for a new holder, then at most once per ``bounds.warn_every`` seconds of ``clock``
    (monotonic) for the same one. :meth:`observe` answers whether it logged."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last: tuple[int | None, str, float] | None = None

    def observe(self, health: StorageHealth) -> bool:
        holder = health.horizon
        if holder is None or holder.age <= health.bounds.horizon_alarm or not health.known:
            self._last = None
            return False
        now = self._clock.monotonic()
        last = self._last
        if (
            last is not None
            and (last[0], last[1]) == (holder.pid, holder.application_name)
            and now - last[2] < health.bounds.warn_every
        ):
            return False
        self._last = (holder.pid, holder.application_name, now)
        logger.warning(
            "%s: %s",
            HORIZON_HELD,
            horizon_message(holder),
            extra={
                "ship.code": HORIZON_HELD,
                "ship.db.horizon.pid": holder.pid,
                "ship.db.horizon.application_name": holder.application_name,
                "ship.db.horizon.age": round(holder.age, 3),
            },
        )
        return True
