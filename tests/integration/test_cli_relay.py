"""``ship-sqla outbox relay APP:SINK`` driven as an operator would: a subprocess against a real
database (issue 27 item 5), with the sinks of ``tests/support/relay_sinks.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from sqlalchemy import MetaData, text

from ship_sqla import (
    create_job_backend,
    create_outbox,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
)
from ship_sqla._jobs._stats import ship_job_stats_table
from ship_sqla._outbox._stats import outbox_stats_id
from ship_sqla.jobs import Schedule

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.ext.asyncio import AsyncEngine

SUPPORT = Path(__file__).resolve().parents[1] / "support"

STARTED = "INFO ship_sqla.relay: relaying outbox orders as "
IDLE = "INFO ship_sqla.relay: nothing deliverable now and nothing in flight (--burst)."


def _environment(sink_log: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    environment["RELAY_SINK_LOG"] = str(sink_log)
    return environment


async def _relay(url: str, sink_log: Path, *args: str) -> tuple[int, str, str]:
    """``python -m ship_sqla outbox relay ARGS`` to its end, from tests/support."""
    command = [sys.executable, "-m", "ship_sqla", "outbox", "relay", "--database-url", url]
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [*command, *args], cwd=SUPPORT, env=_environment(sink_log), check=False
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def _start(url: str, sink_log: Path, *args: str) -> subprocess.Popen[str]:
    """The relay as a long-running process; its stderr read line by line."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "ship_sqla", "outbox", "relay", "--database-url", url,
            "--outbox-id", "orders", "--poll-interval", "0.2", *args,
        ],
        cwd=SUPPORT, env=_environment(sink_log), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _read_until(process: subprocess.Popen[str], wanted: str, seen: list[str]) -> str:
    """The first stderr line containing ``wanted`` (every line read goes to ``seen``)."""
    assert process.stderr is not None
    while True:
        line = await anyio.to_thread.run_sync(process.stderr.readline)
        assert line, f"the relay ended before printing {wanted!r}: {''.join(seen)}"
        seen.append(line)
        if wanted in line:
            return line


async def _end(process: subprocess.Popen[str], seen: list[str]) -> tuple[int, str]:
    """The process's exit code and every stderr line it printed."""
    try:
        code = await anyio.to_thread.run_sync(process.wait, 30)
        assert process.stderr is not None
        seen.append(process.stderr.read())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    return code, "".join(seen)


@pytest.fixture
async def outbox_table(ship_engine: AsyncEngine) -> Any:
    metadata = MetaData()
    table = ship_outbox_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return table


async def _enqueue(ship_engine: AsyncEngine, table: Any, *payloads: Any) -> list[uuid.UUID]:
    outbox = create_outbox(database=ship_engine, table=table)
    return [await outbox.enqueue("orders", "order.placed", p) for p in payloads]


async def _states(ship_engine: AsyncEngine) -> dict[str, tuple[str, int]]:
    async with ship_engine.connect() as connection:
        rows = (await connection.execute(text("SELECT id, state, attempts FROM ship_outbox"))).all()
    return {str(row.id): (row.state, row.attempts) for row in rows}


def _only_expected_lines(err: str, *expected: str) -> None:
    """Every stderr line is one of the relay's expected INFO lines."""
    for line in err.splitlines():
        assert any(e in line for e in expected), f"unexpected stderr line: {line}\n{err}"


# --- --burst ------------------------------------------------------------------------------------


async def test_burst_delivers_the_enqueued_messages_and_exits_0(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """O2, issue 27 item 5: `--burst` publishes every message deliverable now to APP:SINK,
    completes them, and exits 0 once a claim finds nothing; stderr holds only its own lines."""
    ids = await _enqueue(ship_engine, outbox_table, {"n": 1}, {"n": 2}, {"n": 3})
    sink_log = tmp_path / "sink.log"

    code, out, err = await _relay(
        ship_engine_url, sink_log, "relay_sinks:record", "--outbox-id", "orders", "--burst"
    )

    assert (code, out) == (0, ""), err
    _only_expected_lines(err, STARTED, IDLE, "INFO ship_sqla.relay: stopped: 3 message(s)")
    published = [json.loads(line) for line in sink_log.read_text().splitlines()]
    assert sorted(p["id"] for p in published) == sorted(str(i) for i in ids)
    assert {p["topic"] for p in published} == {"order.placed"}
    assert set((await _states(ship_engine)).values()) == {("delivered", 1)}


async def test_burst_with_stats_table_writes_the_outboxs_trend(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """Issue 36 item 6: `--stats-table ship_job_stats` makes the relay write the messages it
    delivered (and a pending sample) into the job history at its stop: the outbox page's
    trend. A missing stats table refuses the start, naming it."""
    stats_table = ship_job_stats_table(MetaData())
    await _enqueue(ship_engine, outbox_table, {"n": 1}, {"n": 2})
    sink_log = tmp_path / "sink.log"
    args = ("relay_sinks:record", "--outbox-id", "orders", "--burst")
    code, _out, err = await _relay(
        ship_engine_url, sink_log, *args, "--stats-table", "ship_job_stats"
    )
    assert code == 1, err
    assert "ship_job_stats" in err
    async with ship_engine.begin() as connection:
        await connection.run_sync(stats_table.metadata.create_all)
    code, _out, err = await _relay(
        ship_engine_url, sink_log, *args, "--stats-table", "ship_job_stats"
    )
    assert code == 0, err
    async with ship_engine.connect() as connection:
        found = await connection.execute(
            text("SELECT sum(completed), max(waiting) FROM ship_job_stats WHERE job_id = :id"),
            {"id": outbox_stats_id("orders")},
        )
        assert tuple(found.one()) == (2, 0)


async def test_friction_5_a_relay_process_is_one_command_with_its_lifespan(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """Issue 27 item 5 ("no relay runner: every user writes a relay process with its own
    signal handling"): the tables from `schema apply`, then `ship-sqla outbox relay --lifespan
    APP:LIFESPAN --burst` opens the sink's resources before the first claim, delivers, and
    closes them after the drain; --log-format json for a log shipper."""
    apply = [sys.executable, "-m", "ship_sqla", "schema", "apply", "--only", "outbox"]
    done = await anyio.run_process(
        [*apply, "--database-url", ship_engine_url], cwd=tmp_path, env=_environment(tmp_path)
    )
    assert done.stderr.decode() == ""
    table = ship_outbox_table(MetaData())
    [message_id] = await _enqueue(ship_engine, table, {"sku": "A-1"})
    sink_log = tmp_path / "sink.log"

    code, _, err = await _relay(
        ship_engine_url, sink_log, "--lifespan", "relay_sinks:lifespan", "--outbox-id",
        "orders", "--burst", "--log-format", "json",
    )  # fmt: skip

    assert code == 0, err
    lines = sink_log.read_text().splitlines()
    assert (lines[0], lines[-1]) == ("enter", "exit")
    assert json.loads(lines[1])["id"] == str(message_id)
    logged = [json.loads(line) for line in err.splitlines()]
    assert {(e["level"], e["logger"]) for e in logged} == {("info", "ship_sqla.relay")}
    assert logged[-1]["message"] == "stopped: 1 message(s) delivered."


async def test_a_sink_that_raises_leaves_the_message_for_retry(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """O4, S3: a sink that raises fails the message, which stays pending for a retry after
    the backoff; the failure is one WARNING line naming the message, its topic and attempt and
    the sink's error, never the payload; SIGTERM then stops the relay with exit 0."""
    [message_id] = await _enqueue(ship_engine, outbox_table, {"card": "4111-secret"})
    sink_log = tmp_path / "sink.log"
    process = _start(ship_engine_url, sink_log, "relay_sinks:failing")
    seen: list[str] = []
    try:
        with anyio.fail_after(30):
            line = await _read_until(process, "SHIP_SQLA_OUTBOX_PUBLISH_FAILED", seen)
        process.send_signal(signal.SIGTERM)
    finally:
        code, err = await _end(process, seen)

    assert code == 0, err
    assert " WARNING ship_sqla.relay: OutboxPublishError: " in line
    assert f"publishing outbox message {message_id} (topic 'order.placed', attempt 1/" in line
    assert "ConnectionError: the broker is down; it will be retried after a backoff" in line
    assert "4111-secret" not in err
    state, attempts = (await _states(ship_engine))[str(message_id)]
    assert state == "pending"
    assert attempts >= 1


# --- signals ------------------------------------------------------------------------------------


async def test_sigterm_drains_the_sink_call_in_flight_and_exits_0(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """J12's rule for the relay: SIGTERM stops the claims; the message in the sink finishes
    and is completed before the exit (0)."""
    sink_log = tmp_path / "sink.log"
    process = _start(ship_engine_url, sink_log, "relay_sinks:slow")
    seen: list[str] = []
    try:
        with anyio.fail_after(30):
            await _read_until(process, STARTED, seen)
            [message_id] = await _enqueue(ship_engine, outbox_table, {"n": 1})
            await _read_until(process, f"sink: start {message_id}", seen)
        process.send_signal(signal.SIGTERM)
    finally:
        code, err = await _end(process, seen)

    assert code == 0, err
    assert "stopping: draining for up to 30s" in err
    assert "stopped: 1 message(s) delivered." in err
    assert (await _states(ship_engine))[str(message_id)] == ("delivered", 1)


async def test_a_second_signal_cuts_the_drain_short(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """A second SIGTERM during the drain cancels the sink call at once (not after the day of
    --drain-timeout): exit 0, its message left claimed until its lease lapses."""
    sink_log = tmp_path / "sink.log"
    process = _start(ship_engine_url, sink_log, "relay_sinks:hang", "--drain-timeout", "1d")
    seen: list[str] = []
    try:
        with anyio.fail_after(30):
            await _read_until(process, STARTED, seen)
            [message_id] = await _enqueue(ship_engine, outbox_table, {"n": 1})
            await _read_until(process, f"sink: start {message_id}", seen)
            process.send_signal(signal.SIGTERM)
            await _read_until(process, "stopping: draining for up to 86400s", seen)
            process.send_signal(signal.SIGTERM)
    finally:
        code, err = await _end(process, seen)

    assert code == 0, err
    assert "WARNING ship_sqla.relay: second signal: cancelling the sink call in flight" in err
    assert "stopped: 0 message(s) delivered." in err
    assert (await _states(ship_engine))[str(message_id)] == ("claimed", 1)


async def test_ctrl_c_stops_an_idle_relay_with_exit_130(
    ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT) drains as SIGTERM does, and exits 130, the shell's code for it."""
    process = _start(ship_engine_url, tmp_path / "sink.log", "relay_sinks:record")
    seen: list[str] = []
    try:
        with anyio.fail_after(30):
            await _read_until(process, STARTED, seen)
        process.send_signal(signal.SIGINT)
    finally:
        code, err = await _end(process, seen)
    assert code == 130, err
    assert "stopped: 0 message(s) delivered." in err


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "name the sink as APP:SINK, or a lifespan"),
        (("relay_sinks:record", "--lifespan", "relay_sinks:lifespan"), "(one of the two)"),
        (("relay_sinks:not_a_sink",), "relay_sinks:not_a_sink is a int, not an outbox sink"),
        (("relay_sinks:lifespan",), "cannot be called with one message"),
        (("relay_sinks:nowhere",), "has no attribute 'nowhere'"),
    ],
)
async def test_a_sink_that_is_not_one_is_exit_2(
    ship_engine_url: str, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    """Bad input names what was wrong and the fix (exit 2), before any database work."""
    code, _, err = await _relay(ship_engine_url, tmp_path / "sink.log", *args, "--outbox-id", "o")
    assert code == 2, err
    assert says in err
    assert "Traceback" not in err


async def test_a_missing_outbox_table_is_exit_1_naming_schema_apply(
    ship_engine_url: str, tmp_path: Path
) -> None:
    """The start-time probe: no outbox table is exit 1 at once, naming the table and the
    `schema apply` command that creates it."""
    code, _, err = await _relay(
        ship_engine_url, tmp_path / "sink.log", "relay_sinks:record", "--outbox-id", "orders",
        "--table", "app_outbox", "--burst",
    )  # fmt: skip
    assert code == 1, err
    assert "SHIP_SQLA_TABLES_MISSING" in err
    assert "app_outbox" in err
    assert "schema apply" in err
    assert "Traceback" not in err


# --- the dashboard's flags ----------------------------------------------------------------------

DASHBOARD_APP = """
from ship_sqla.jobs import JobRegistry, Schedule

registry = JobRegistry()


@registry.job("dash.nightly", payload=dict, schedule=Schedule(cron="0 3 * * *"))
async def nightly(ctx, payload):
    return None
"""


def _get(base: str, path: str) -> str:
    with urllib.request.urlopen(base + path, timeout=30) as answer:  # noqa: S310 - local test URL
        return str(answer.read().decode())


async def test_friction_5_the_dashboard_shows_the_outbox_and_schedules_from_flags(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """Issue 27 item 5 ("the dashboard cannot show the outbox or schedule details without
    writing Python"): `ship-sqla dashboard --registry APP:REGISTRY --outbox-id ID` shows the
    schedules' last occurrence and the outbox page (its dead message), S2."""
    (tmp_path / "dash_app.py").write_text(DASHBOARD_APP)
    runs, state = ship_job_runs_table(MetaData()), ship_job_state_table(MetaData())
    async with ship_engine.begin() as connection:
        for table in (runs, state):
            await connection.run_sync(table.metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    nightly = define_job("dash.nightly", _noop, payload=dict, schedule=Schedule(cron="0 3 * * *"))
    await backend.install_schedules([nightly])
    outbox = create_outbox(database=ship_engine, table=outbox_table)
    dead = await outbox.enqueue("orders", "order.placed", {"n": 1}, max_attempts=1)
    [claimed] = await outbox.claim("orders", 1, 30.0)
    assert await outbox.fail(claimed, "the broker is down") == "dead"

    command = [
        sys.executable, "-m", "ship_sqla", "dashboard", "--database-url", ship_engine_url,
        "--port", "0", "--registry", "dash_app:registry", "--outbox-id", "orders", "--no-audit",
    ]  # fmt: skip
    process = await anyio.open_process(command, cwd=tmp_path, env=_environment(tmp_path))
    try:
        assert process.stdout is not None
        with anyio.fail_after(60):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
        base = line.decode().split(" on ", 1)[1].split("/ ", 1)[0]
        schedules = await anyio.to_thread.run_sync(_get, base, "/schedules")
        page = await anyio.to_thread.run_sync(_get, base, "/outbox")
    finally:
        process.terminate()
        await process.wait()
    assert "dash.nightly" in schedules
    assert "needs the job definitions" not in schedules
    assert "orders" in page
    assert str(dead) in page
    assert "No outbox configured" not in page


async def _noop(ctx: Any, payload: Any) -> None:
    return None


async def test_a_lifespan_that_raises_refuses_the_start(
    ship_engine: AsyncEngine, ship_engine_url: str, outbox_table: Any, tmp_path: Path
) -> None:
    """A lifespan that cannot open the sink's resources refuses the start (exit 2,
    LifespanFailedError naming it and its error) and claims nothing."""
    [message_id] = await _enqueue(ship_engine, outbox_table, {"n": 1})
    code, _, err = await _relay(
        ship_engine_url, tmp_path / "sink.log", "--lifespan", "relay_sinks:broken",
        "--outbox-id", "orders", "--burst",
    )  # fmt: skip
    assert code == 2, err
    assert "SHIP_SQLA_LIFESPAN_FAILED" in err
    assert "relay_sinks.broken raised ConnectionError: the broker refused" in err
    assert "Traceback" not in err
    assert (await _states(ship_engine))[str(message_id)] == ("pending", 0)
