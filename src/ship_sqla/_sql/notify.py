"""The announcements' statements (K1, K8): what :mod:`ship_sqla._notify` and the stores that
announce (the job backend, the outbox) send. They name no table. Sent as written
(``compacted=False``); the job tables' own copies (:mod:`ship_sqla._jobs._sql.enqueue`) are
compacted with the rest of the job statements.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["ANNOUNCE_AFTER_COMMIT", "LISTENER_PROBE", "NOTIFY", "announcing"]

NOTIFY: Final = Template(
    "SELECT pg_notify(CAST(:channel AS text), CAST(:payload AS text))", compacted=False
)
"""One announcement, in the caller's transaction (delivered when it commits)."""

ANNOUNCE_AFTER_COMMIT: Final = Template(
    """
SELECT count(pg_notify(CAST(:channel AS text), p)) AS sent
FROM unnest(CAST(:payloads AS text[])) AS p
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
""",
    compacted=False,
)
"""An :class:`~ship_sqla._notify.Announcer`'s post-commit announcement of every key committed
since its last one, in ONE notify-only transaction (autocommitted) that commits without waiting
for its WAL flush: it writes nothing, so a crash loses nothing but the notifications (listeners
look again when they reconnect), and it holds PostgreSQL's notify lock for microseconds, never
through a flush (:mod:`ship_sqla.kernel._plans.announce`)."""

LISTENER_PROBE: Final = Template("SELECT pg_notify($1, $2)", compacted=False)
"""A listener's probe notification (channel, token), sent on asyncpg connections of its own
(the listening one, or a short-lived sender): its text is run as written, with asyncpg's
positional parameters, never through SQLAlchemy."""


def announcing(insert_sql: str, *, sequence: str | None = None) -> str:
    """``insert_sql`` (a bare INSERT, with no RETURNING of its own) and the NOTIFY of
    :data:`NOTIFY` as ONE statement: a data-modifying CTE always runs to completion, and the
    NOTIFY runs once.
    ``:channel`` and ``:payload`` join the INSERT's parameters. ``sequence``: an identity
    column of the table, whose largest value the insert took is answered as ``fleet_seq``
    (how many rows every process has inserted: the announce rule's share of the budget)."""
    if sequence is None:
        return "\nWITH ship_enqueued AS (" + insert_sql.rstrip() + "\n)\n" + NOTIFY.sql + "\n"
    # The library's own statement text and column name: nothing of a caller's in it.
    return (
        f"\nWITH ship_enqueued AS ({insert_sql.rstrip()}\nRETURNING {sequence}\n)\n"  # noqa: S608
        f"{NOTIFY.sql} AS sent, (SELECT max({sequence}) FROM ship_enqueued) AS fleet_seq\n"
    )
