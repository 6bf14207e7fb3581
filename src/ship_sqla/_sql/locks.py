"""The advisory locks' statements (L1, L2) and the fence table's (F4): what
:class:`~ship_sqla._locks.AdvisoryLockProvider` runs. ``{fences}`` is the fence table
(:func:`~ship_sqla._locks.ship_lock_fences_table`); the lock statements name no table
(:data:`~ship_sqla._sql.TABLELESS`). Sent as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["CHECK_FENCE", "NEXT_FENCE", "STILL_HELD", "TRY_LOCK"]

TRY_LOCK: Final = Template(
    "SELECT pg_try_advisory_xact_lock(CAST(:lock_id AS bigint))", compacted=False
)
"""Take the lock for this transaction, or answer false at once (never waits)."""

STILL_HELD: Final = Template("SELECT 1", compacted=False)
"""Proves the holding session and its transaction (hence the xact lock) are still alive. Sent
through the driver's simple query protocol (``_locks._drop_statement_snapshot``), right after
the lock is taken and at each extension, so the idle holding transaction keeps no snapshot
(an extended-protocol statement's portal would keep one, pinning the xmin horizon, J22)."""

NEXT_FENCE: Final = Template(
    """
INSERT INTO {fences} AS f (namespace, key, fence, updated_at)
VALUES (CAST(:namespace AS text), CAST(:key AS text), 1, now())
ON CONFLICT (namespace, key) DO UPDATE SET fence = f.fence + 1, updated_at = now()
RETURNING f.fence
""",
    compacted=False,
)
"""F4, ``<fences>_pkey``: the key's next fence, committed at once (autocommit)."""

CHECK_FENCE: Final = Template(
    """
SELECT f.fence FROM {fences} f
WHERE f.namespace = CAST(:namespace AS text) AND f.key = CAST(:key AS text)
FOR SHARE
""",
    compacted=False,
)
"""F4, ``<fences>_pkey``: the key's newest fence, share-locked for the caller's transaction, so
no newer fence is drawn before that transaction ends."""
