"""Issue 36 items 4-5 on every backend (in-memory twin, PostgreSQL; with and without a history
table, J16): find runs by id, job, tenant, state, time range, worker, error text and payload
field, each within its stated bound (S2: a page that stops scanning says so), keyset pages
forward and back; act on what matches (retry, cancel, discard) with a preview count and a
confirmation token, in batches, with progress, and one audit entry (S1) recording the filter,
the count and links."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from job_helpers import claim_request

from ship_sqla import create_job_operations
from ship_sqla.errors import BoundExceededError, PermissionDeniedError
from ship_sqla.kernel import _search as search_module
from ship_sqla.kernel import failed
from ship_sqla.kernel._browse import MAX_BROWSE_JOBS
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._search import BulkTokenError, RunFilter, RunFilterError
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.operators import InMemoryAuditLog
from ship_sqla.testing import FrozenClock


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job(
    "find.mail",
    noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)
OTHER = define_job(
    "find.other",
    noop,
    payload=dict,
    concurrency=Concurrency(max=1000, lease=30),
    retry=RetryPolicy(attempts=1),
)


@pytest.fixture
def backend(any_shape_backend_factory: Any, clock: FrozenClock) -> Any:
    """Every backend, in the default shape (J16: ended runs in history) and the in-place one
    (ended runs in the runs table): a search spans both."""
    return any_shape_backend_factory(clock)


@pytest.fixture
def audit() -> InMemoryAuditLog:
    return InMemoryAuditLog()


@pytest.fixture
def ops(backend: Any, audit: InMemoryAuditLog) -> Any:
    return create_job_operations(backend, authorizer=lambda *_: True, audit=audit, actor="ann")


async def seed(backend: Any, clock: FrozenClock) -> dict[str, list[str]]:
    """12 dead runs of JOB (errors "boom 0".."boom 11", payload order.id = i % 3), 5 running
    runs of OTHER held by worker "w2", 30 waiting runs of JOB (due a minute apart)."""
    ids: dict[str, list[str]] = {}
    for i in range(12):
        await backend.enqueue(JOB, {"order": {"id": i % 3}, "i": i})
    claimed = await backend.claim(claim_request(JOB, worker="w1", limit=12))
    for n, run in enumerate(claimed):
        assert await backend.settle([failed(run, f"boom {n}", retry_at=None)]) == ["dead"]
    ids["dead"] = [run.run_id for run in claimed]
    with tenant_ambient("acme"):
        for i in range(5):
            await backend.enqueue(OTHER, {"i": i})
    ids["running"] = [
        r.run_id for r in await backend.claim(claim_request(OTHER, worker="w2", limit=5))
    ]
    ids["waiting"] = []
    for i in range(30):
        at = clock.now() + timedelta(minutes=i)
        ids["waiting"].append((await backend.enqueue(JOB, {"order": {"id": 9}}, run_at=at)).run_id)
    return ids


async def every_page(ops: Any, flt: RunFilter, *, scan: int = 10_000) -> list[str]:
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        page = await ops.search_runs(flt, limit=20, cursor=cursor, scan=scan)
        seen.extend(r.run_id for r in page.items)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor
    raise AssertionError("no end")


async def test_each_filter_finds_exactly_its_runs(
    backend: Any, ops: Any, clock: FrozenClock
) -> None:
    """Issue 36 item 4 (S2): id, job, tenant, state, worker, error text, payload field and a
    time range on a live state each find exactly the runs that match, on every backend."""
    ids = await seed(backend, clock)
    dead = ids["dead"]
    cases: list[tuple[list[str], set[str]]] = [
        ([f"id={dead[3]}"], {dead[3]}),
        (["job=find.other"], set(ids["running"])),
        (["tenant=acme"], set(ids["running"])),
        (["state=dead"], set(dead)),
        (["worker=w2"], set(ids["running"])),
        (["error=BOOM 1"], {dead[1], dead[10], dead[11]}),
        (["state=dead", "payload=order.id=2"], {dead[i] for i in range(12) if i % 3 == 2}),
        (["payload=order.id=9"], set(ids["waiting"])),
    ]
    for fields, expected in cases:
        found = await every_page(ops, RunFilter.parse(fields))
        assert len(found) == len(set(found)), fields
        assert set(found) == expected, fields
    start = (clock.now() + timedelta(minutes=10)).isoformat()
    end = (clock.now() + timedelta(minutes=15)).isoformat()
    ranged = await every_page(ops, RunFilter.parse(["state=waiting", f"from={start}", f"to={end}"]))
    assert ranged == ids["waiting"][10:15]


async def test_pages_go_forward_and_back(backend: Any, ops: Any, clock: FrozenClock) -> None:
    """Issue 36 item 4: pages of 20..200 with first / previous / next keyset cursors; the
    previous page is the page before; a cursor of another filter is refused."""
    ids = await seed(backend, clock)
    flt = RunFilter.parse(["job=find.mail", "state=waiting"])
    first = await ops.search_runs(flt, limit=20)
    assert first.previous_cursor is None
    second = await ops.search_runs(flt, limit=20, cursor=first.next_cursor)
    assert [r.run_id for r in first.items + second.items] == ids["waiting"]
    assert second.next_cursor is None
    back = await ops.search_runs(flt, limit=20, cursor=second.previous_cursor)
    assert back.items == first.items
    with pytest.raises(RunFilterError) as bad:
        await ops.search_runs(flt, limit=10)
    assert bad.value.field == "limit"
    with pytest.raises(Exception, match="cursor"):
        await ops.search_runs(RunFilter.parse(["state=waiting"]), cursor=first.next_cursor)


async def test_a_page_stops_at_its_scan_bound_and_says_so(
    backend: Any, ops: Any, clock: FrozenClock
) -> None:
    """S2, issue 36 item 4: a filter the index does not serve reads at most ``scan`` entries a
    page; the page reports "scanned N, stopped", and its cursor goes on to every match."""
    ids = await seed(backend, clock)
    flt = RunFilter.parse(["payload=order.id=2"])
    page = await ops.search_runs(flt, limit=20, scan=5)
    assert page.stopped
    assert page.scanned == 5
    assert page.note == "scanned 5, stopped"
    found = await every_page(ops, flt, scan=5)
    assert set(found) == {ids["dead"][i] for i in range(12) if i % 3 == 2}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (["state=finished"], "state"),
        (["from=yesterday"], "from"),
        (["from=2026-01-01T00:00:00"], "from"),
        (["from=2026-01-02T00:00:00+00:00", "to=2026-01-01T00:00:00+00:00"], "to"),
        (["payload=order.id"], "payload"),
        (["job=no spaces"], "job"),
        (["colour=red"], "colour"),
        (["tenant=" + "x" * 300], "tenant"),
    ],
)
def test_bad_filter_input_is_a_typed_error_naming_the_field(fields: list[str], field: str) -> None:
    """Issue 36 item 4: bad input is a RunFilterError naming the field, with the fix."""
    with pytest.raises(RunFilterError) as bad:
        RunFilter.parse(fields)
    assert bad.value.field == field
    assert bad.value.fix


async def test_retry_matching_previews_asks_for_its_token_and_audits(
    backend: Any, ops: Any, audit: InMemoryAuditLog, clock: FrozenClock
) -> None:
    """S1, issue 36 item 5: the preview counts the runs the action takes and answers a token
    bound to the action, filter and count; the action refuses another filter's or action's
    token and changes nothing; with its token it retries every match in batches, reporting
    progress, and writes ONE audit entry with the filter, the count and links."""
    ids = await seed(backend, clock)
    flt = RunFilter.parse(["error=boom", "payload=order.id=0"])
    expected = {ids["dead"][i] for i in range(12) if i % 3 == 0}
    preview = await ops.preview_matching("retry", flt)
    assert preview.count == len(expected)
    assert not preview.capped
    for wrong in (
        lambda: ops.discard_filtered(flt, token=preview.token),
        lambda: ops.retry_filtered(RunFilter.parse(["error=boom"]), token=preview.token),
        lambda: ops.retry_filtered(flt, token="3.1.forged"),  # noqa: S106 - not a secret,
    ):
        with pytest.raises(BulkTokenError):
            await wrong()
    assert await audit.list_entries(limit=10) == []
    steps: list[Any] = []
    result = await ops.retry_filtered(flt, token=preview.token, batch_size=3, progress=steps.append)
    assert set(result.changed) == expected
    assert result.complete
    assert [s.done for s in steps] == [3, 4]
    for run_id in expected:
        assert (await ops.get_run(run_id)).state == "waiting"
    [entry] = await audit.list_entries(limit=10)
    assert entry.operation == "jobs.retry_filtered"
    assert entry.count == 4
    assert entry.details["filter"] == [["error", "boom"], ["payload", "order.id=0"]]
    assert entry.details["previewed"] == 4
    assert entry.details["batches"] == 2
    assert sorted(entry.details["links"]["runs"]) == sorted(f"/runs/{r}" for r in expected)
    assert entry.details["links"]["search"].startswith("/search?error=boom")


async def test_preview_counts_what_the_search_finds(
    backend: Any, ops: Any, clock: FrozenClock
) -> None:
    """Issue 36 items 1 and 5 (S2, J16): the preview counts in one bounded statement on
    PostgreSQL (COUNT_MATCHING_*) and by the walk in memory; for every filter, on every
    backend and shape, the count is exactly the runs the search finds in the action's states:
    run id, job, tenant, worker (the holder of a running run, the last attempt's of a dead
    one), error text (any case), payload fields, and a time range on each state's own time."""
    ids = await seed(backend, clock)
    now = clock.now()
    late = (now + timedelta(minutes=10)).isoformat()
    cases: list[tuple[str, list[str]]] = [
        ("retry", []),
        ("retry", [f"id={ids['dead'][4]}"]),
        ("retry", [f"id={ids['waiting'][0]}"]),
        ("retry", ["job=find.mail", "error=BOOM 1"]),
        ("retry", ["payload=order.id=2"]),
        ("retry", ["payload=order.id=2", "payload=i=5"]),
        ("retry", ["worker=w1"]),
        ("retry", ["tenant=acme"]),
        ("retry", [f"to={late}"]),
        ("cancel", []),
        ("cancel", ["tenant=acme"]),
        ("cancel", ["worker=w2"]),
        ("cancel", ["state=waiting", f"from={late}"]),
        ("cancel", ["state=running", f"to={late}"]),
        ("cancel", ["job=find.mail", "payload=order.id=9"]),
        # a job and a tenant: on PostgreSQL the tenant indexes' branches (the conformance
        # tables have fair_claims and partitioned_claims), index-only, then with a residual
        ("cancel", ["job=find.other", "tenant=acme"]),
        ("cancel", ["job=find.other", "tenant=acme", "worker=w2"]),
        ("cancel", ["job=find.other", "tenant=acme", "worker=w1"]),
        ("cancel", ["job=find.mail", "tenant=acme"]),
        ("discard", []),
        ("discard", ["payload=order.id=0"]),
        ("discard", ["job=find.other"]),
        ("discard", ["error=no such text"]),
    ]
    states = {"retry": ("dead",), "cancel": ("waiting", "running"), "discard": ("waiting", "dead")}
    for action, fields in cases:
        flt = RunFilter.parse(fields)
        found = await every_page(ops, flt)
        expected = [r for r in found if (await ops.get_run(r)).state in states[action]]
        preview = await ops.preview_matching(action, flt)
        assert (action, fields, preview.count) == (action, fields, len(expected))
        assert not preview.capped
        assert not preview.stopped


async def test_newest_dead_errors_reads_what_the_dead_runs_page_lists(
    backend: Any, ops: Any, clock: FrozenClock
) -> None:
    """Issue 36 items 1 and 6 (S2, J16): the error groups' one narrow read (DEAD_ERRORS on
    PostgreSQL, the runs pages in memory) answers a job's newest dead runs in the runs page's
    order with their error and finish time, at most its limit; a limit past its bound is
    refused before any read."""
    await seed(backend, clock)
    page = await ops.list_runs(state="dead", job_id="find.mail", limit=20)
    for limit in (1, 5, 12, 2001):
        read = await ops.newest_dead_errors("find.mail", limit=limit)
        expected = page.items[:limit]
        assert [r.run_id for r in read] == [r.run_id for r in expected]
        assert [r.last_error for r in read] == [r.last_error for r in expected]
        assert [r.finished_at for r in read] == [r.finished_at for r in expected]
        assert {r.job_id for r in read} == {"find.mail"}
    assert await ops.newest_dead_errors("find.other", limit=10) == []
    with pytest.raises(BoundExceededError):
        await ops.newest_dead_errors("find.mail", limit=2002)


async def test_cancel_and_discard_matching_take_their_states_only(
    backend: Any, ops: Any, clock: FrozenClock
) -> None:
    """K2, J8, issue 36 item 5: cancel takes waiting and running runs, discard waiting and
    dead ones; a filter on a state the action cannot take is a RunFilterError; the action acts
    on at most the previewed count (runs matching after the preview wait for the next)."""
    ids = await seed(backend, clock)
    with pytest.raises(RunFilterError):
        await ops.preview_matching("cancel", RunFilter.parse(["state=dead"]))
    other = RunFilter.parse(["job=find.other"])
    preview = await ops.preview_matching("cancel", other)
    assert preview.count == 5
    with tenant_ambient("acme"):
        await backend.enqueue(OTHER, {"late": True})
    result = await ops.cancel_filtered(other, token=preview.token)
    assert len(result.changed) == 5  # the previewed count, no more
    # waiting runs first: the late one is cancelled, one running run is left unasked
    late = RunFilter.parse(["job=find.other", "state=waiting"])
    assert (await ops.preview_matching("cancel", late)).count == 0
    waiting = RunFilter.parse(["job=find.mail", "payload=order.id=9"])
    preview = await ops.preview_matching("discard", waiting)
    assert preview.count == 30
    result = await ops.discard_filtered(waiting, token=preview.token, batch_size=7)
    assert len(result.changed) == 30
    left = await every_page(ops, RunFilter.parse(["state=discarded"]))
    assert set(left) == set(ids["waiting"])


async def test_acting_on_a_filter_asks_manage(backend: Any, clock: FrozenClock) -> None:
    """S1, J8: search and preview are reads; the actions ask ship.jobs:manage."""
    await seed(backend, clock)
    reader = create_job_operations(
        backend, authorizer=lambda permission, _op: permission == "ship.jobs:read"
    )
    flt = RunFilter.parse(["state=dead"])
    assert len((await reader.search_runs(flt)).items) == 12
    preview = await reader.preview_matching("retry", flt)
    with pytest.raises(PermissionDeniedError):
        await reader.retry_filtered(flt, token=preview.token)


async def _dead(backend: Any, payload: dict[str, Any], error: str) -> str:
    """One dead run of JOB with ``payload``, its last error ``error``."""
    await backend.enqueue(JOB, payload)
    (run,) = await backend.claim(claim_request(JOB, worker="w1", limit=1))
    assert await backend.settle([failed(run, error, retry_at=None)]) == ["dead"]
    return str(run.run_id)


async def test_the_preview_and_the_action_agree_on_error_case_and_json_values(
    backend: Any, ops: Any
) -> None:
    """S1, S2, issue 36 item 5: the preview's count (SQL on PostgreSQL) and the action's walk
    (Python) apply one rule, on every backend: error text matches with A-Z in any case and
    every other character as written (no ß = ss, no É = é, whatever the database's locale);
    a payload field compares as JSON (true is not 1, false is not 0); a path part of digits
    indexes a list, -1 its last element (as jsonb's #> reads it)."""
    d0 = await _dead(backend, {"flag": True, "list": [1, 2, 3]}, "Straße gesperrt")
    d1 = await _dead(backend, {"flag": 1, "list": [3]}, "STRASSE GESPERRT")
    d2 = await _dead(backend, {"flag": False}, "Échec: BOOM")
    d3 = await _dead(backend, {"flag": 0}, "échec: boom")
    cases: list[tuple[list[str], set[str]]] = [
        (["error=straße"], {d0}),
        (["error=strasse"], {d1}),
        (["error=échec"], {d3}),
        (["error=BOOM"], {d2, d3}),
        (["payload=flag=true"], {d0}),
        (["payload=flag=1"], {d1}),
        (["payload=flag=0"], {d3}),
        (["payload=list.-1=3"], {d0, d1}),
        (["payload=list.0=3"], {d1}),
    ]
    for fields, expected in cases:
        flt = RunFilter.parse(fields)
        preview = await ops.preview_matching("retry", flt)
        assert (fields, preview.count) == (fields, len(expected))
        assert (fields, set(await every_page(ops, flt))) == (fields, expected)
    flt = RunFilter.parse(["error=straße"])
    preview = await ops.preview_matching("retry", flt)
    result = await ops.retry_filtered(flt, token=preview.token)
    assert set(result.changed) == {d0}


async def test_a_preview_across_jobs_counts_the_jobs_the_action_reaches(
    backend: Any, ops: Any
) -> None:
    """S2, issue 36 item 5: without a job, the action walks the runs pages across jobs, which
    read the first 200 job ids with runs in the state (MAX_BROWSE_JOBS); the preview counts
    those same runs, on every backend, so the action takes what it previewed; naming no job
    again reaches the rest once the first ones have none."""
    jobs = [define_job(f"many.{n:03}", noop, payload=dict) for n in range(MAX_BROWSE_JOBS + 3)]
    for job in jobs:
        await backend.enqueue(job, {})
    everything = RunFilter.parse(["state=waiting"])
    preview = await ops.preview_matching("cancel", everything)
    assert preview.count == MAX_BROWSE_JOBS
    assert not preview.stopped
    result = await ops.cancel_filtered(everything, token=preview.token)
    assert len(result.changed) == MAX_BROWSE_JOBS
    assert result.complete
    rest = await ops.preview_matching("cancel", everything)
    assert rest.count == 3
    left = await every_page(ops, everything)
    assert {(await ops.get_run(r)).job_id for r in left} == {j.id for j in jobs[-3:]}


async def test_the_preview_reads_at_most_its_scan_bound_in_all_states_together(
    backend: Any, ops: Any, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S2, issue 36 item 5: the preview's bound (MAX_BULK_SCAN, 10 here) is on the entries of
    every state together, as the action's walk reads them (waiting first, then running): 30
    waiting and 5 running runs give a count of 10, stopped, on every backend."""
    monkeypatch.setattr(search_module, "MAX_BULK_SCAN", 10)
    await seed(backend, clock)
    preview = await ops.preview_matching("cancel", RunFilter.parse([]))
    assert (preview.count, preview.scanned, preview.stopped) == (10, 10, True)
