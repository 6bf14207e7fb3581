"""F1's kept count (kernel ``_plans/held_count.py``) as a rule: whatever the order of grants,
releases, forgotten releases, recounts and a gate made again, the kept count is never below
the true number of running runs (so a claim never grants above the cap), and a recount makes
it exact again (so a drift never outlives the next recount)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ship_sqla.kernel._plans.held_count import RELEASE_SLOTS, held, release_slot

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["grant", "release", "forget", "recount", "gate-again"]),
        st.integers(min_value=1, max_value=5),
    ),
    max_size=60,
)


@given(STEPS)
def test_f1_the_kept_count_is_never_below_the_running_runs(steps: list[tuple[str, int]]) -> None:
    """F1: grants (each a claim's: a claim that finds no kept count recounts first) add to
    ``granted`` and to the running runs; a release adds to ``released``
    as its run leaves ``running``; a forgotten one does not; a recount sets the base from an
    exact count; a gate made again starts its total at 0. After every step the kept count is
    None (the claim counts) or at least the running runs, and right after a recount it is
    exactly them (or None, while the gate has granted nothing)."""
    running = granted = released = 0
    base: int | None = None
    base_total: int | None = None
    for kind, n in steps:
        if kind == "grant":
            # A grant is a claim's: one that finds no kept count recounts first (rule 3).
            if held(granted=granted, released=released, base=base, base_total=base_total) is None:
                base, base_total = granted - released - running, granted
            running, granted = running + n, granted + n
        elif kind in {"release", "forget"} and running:
            taken = min(n, running)
            running -= taken
            released += taken if kind == "release" else 0
        elif kind == "recount":
            base, base_total = granted - released - running, granted
        elif kind == "gate-again":
            granted = 0
        kept = held(granted=granted, released=released, base=base, base_total=base_total)
        assert kept is None or kept >= running, (kind, kept, running)
        if kind == "recount":
            assert kept == running or (kept is None and granted == 0)


def test_f1_release_slots_are_the_sql_modulo() -> None:
    """The release slot of a backend is ``pg_backend_pid() % RELEASE_SLOTS``, as the settle's
    SQL computes it."""
    assert [release_slot(pid) for pid in (0, 7, 8, 12345)] == [0, 7, 0, 12345 % RELEASE_SLOTS]
