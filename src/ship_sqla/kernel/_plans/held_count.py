"""F1: the held count of a capped job, kept on state rows instead of counted off its running runs.

A capped claim needs the number of the job's running runs. Counting them off the runs table's
lease index costs, under a held MVCC horizon, one dead entry per run that ran since the hold
began (issue 39); so the count is kept instead, on the job's state rows, as

    held = granted - released - base

- ``granted``: the claim gate's total of due runs ever granted (``<job_id>#claim-gate``,
  ``claim_granted``), which every gated claim adds its grant to under the gate's row lock;
- ``released``: the sum of the job's release rows: one per release slot
  (``<job_id>#released-<slot>``, preferably the server backend's process id modulo
  :data:`RELEASE_SLOTS`, else any slot row no other transaction holds), to which every
  statement that takes runs of the job out of ``running`` (a settle of any kind, a workflow
  suspend) adds how many it took, in the same statement; and the claims' own
  (``<job_id>#released-claims``), to which a claim adds the lapsed runs it buried and the due
  runs its gate granted that it did not take (a claim sorts the lapsed runs it retakes with
  the due ones, so its limit may leave some of the grant);
- ``base``: the held base (``<job_id>#held-base``), set by a recount.

The rules that keep it safe (a count never below the true one, so the cap is never exceeded):

1. Every release is written in the statement that makes the transition, so in every snapshot
   the release rows and the runs' states agree. A path that forgets to release only leaves the
   count too high (fewer grants), never too low.
2. A recount (a capped claim whose lapsed probe sweeps: a backend's first claim of the job, and
   every ``sweep`` seconds, :class:`~ship_sqla.kernel._plans.claim_floor.LapsedFloors`) counts
   the job's running runs in its snapshot up to ``max + 1`` and, at or below ``max`` (exact),
   sets ``base = granted - released - count`` as that snapshot sees them, and the gate total it
   was set at. Each base is exact at its snapshot, and afterwards ``granted`` grows by every
   grant while ``released`` grows by at most every transition out of ``running``: whichever
   committed base a claim reads, its count is at least the true one. Above ``max`` the base is
   set aside (NULL) and claims count until a recount at or below it.
3. A claim uses the kept count only when a base is set and the gate's total is at least the
   one the base was set at, and at least 1 (a gate made again starts at 0, which every claim
   after it sees first: it restarts from a recount); otherwise it counts the runs (and that
   claim is a recount).
4. Release rows are only written for a job with a base (the settle's snapshot sees it), so an
   uncapped job's settle writes nothing; a release a settle skips because the base was made
   after its snapshot is one of rule 1's too-high drifts.
5. Drift (a forgotten path, a release skipped under rule 4)
   only ever raises the count, and is gone at the next recount: within ``sweep`` seconds plus
   one claim interval of any backend claiming the job (a job held at its cap by the drift
   recounts at every sweep of every claiming backend).

No claim waits on a settle: claims read the release rows in their snapshot without locking
them (a release committed after the snapshot only makes the count higher), and only claims
write the base and the claims' release row (under the gate's lock). No settle waits on a
release row either: a settle adds to its backend's slot when that row is free, else to the first
slot row no other transaction holds (``FOR UPDATE SKIP LOCKED``), so a settle in a user's
transaction (J13), which holds its slot row until that transaction commits, makes no other
settle wait; with every slot row held (or none made yet and this backend's held) the release is
dropped: a rule 5 drift (the cap lower until the next recount, never higher).

The in-memory backend counts its running runs exactly (one process, no snapshot): it implements
the same bound with no drift; :func:`held` is the formula both state.
"""

from __future__ import annotations

from typing import Final

__all__ = ["RELEASE_SLOTS", "held", "release_slot"]

RELEASE_SLOTS: Final = 8
"""How many release rows a job's settles spread over (by server backend process id): two
backends contend on one only when their ids fall in one slot and they settle one job at once."""


def release_slot(backend_pid: int) -> int:
    """The release slot of the server backend ``backend_pid`` (SQL: ``pg_backend_pid() % 8``)."""
    return backend_pid % RELEASE_SLOTS


def held(*, granted: int, released: int, base: int | None, base_total: int | None) -> int | None:
    """F1's kept count of a capped job's running runs (rules 1-3 above); None: not kept (no
    base, or a gate made again since the base): the claim counts the runs."""
    if base is None or base_total is None or granted < max(base_total, 1):
        return None
    return granted - released - base
