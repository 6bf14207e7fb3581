"""``ship-sqla outbox purge`` driven as a user would: a subprocess against a real database."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import pytest
from click.testing import CliRunner
from sqlalchemy import MetaData, text

from ship_sqla import ship_audit_table
from ship_sqla._cli import cli
from ship_sqla._outbox import create_outbox, ship_outbox_table

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def ship_sqla(*args: str, cwd: Path) -> tuple[int, str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args], cwd=cwd, env=environment, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_purge_deletes_old_deliveries_of_a_custom_table(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """Deliveries older than --older-than go, recent ones and pending messages stay; --table and
    --json as a script would use them."""
    metadata = MetaData()
    table = ship_outbox_table(metadata, name="app_outbox")
    ship_audit_table(metadata)  # S1: the purge is audited
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=ship_engine, table=table)
    for n in range(5):
        await outbox.enqueue("orders", "order.placed", {"n": n})
    messages = await outbox.claim("orders", 4, 30.0)
    assert await outbox.complete_many(messages) == ["delivered"] * 4
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE app_outbox SET delivered_at = now() - interval '8 days'"
                " WHERE id = ANY(:ids)"
            ),
            {"ids": [m.id for m in messages[:3]]},
        )

    code, out, err = await ship_sqla(
        "outbox", "purge", "--database-url", ship_engine_url, "--outbox-id", "orders",
        "--older-than", "7d", "--table", "app_outbox", "--json", cwd=tmp_path,
    )  # fmt: skip

    assert code == 0, err
    assert json.loads(out) == {"outbox_id": "orders", "deleted": 3}
    async with ship_engine.connect() as connection:
        left = (
            await connection.execute(text("SELECT state, count(*) FROM app_outbox GROUP BY 1"))
        ).all()
    assert dict(left) == {"delivered": 1, "pending": 1}


async def test_purge_of_a_missing_table_fails_with_exit_1(
    ship_engine_url: str, tmp_path: Path
) -> None:
    code, _, err = await ship_sqla(
        "outbox", "purge", "--database-url", ship_engine_url, "--outbox-id", "orders",
        "--older-than", "1h", "--no-audit", cwd=tmp_path,
    )  # fmt: skip
    assert code == 1
    assert "ship_outbox" in err
    assert "--table" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "a week"], "is not a duration"),
        (["--older-than", "7w"], "is not a duration"),
        (["--older-than", "nan"], "is not a duration"),
        (["--older-than", "inf"], "is not a duration"),
        (["--older-than", "1e12"], "is not a duration"),
        (["--older-than", "99999999999d"], "--older-than must be at most"),
        (["--older-than", "1000000000000"], "--older-than must be at most"),
        (["--older-than", "7d", "--table", "app.outbox"], "dotted name"),
        (["--older-than", "7d", "--pages-per-statement", "0"], "0 is not in the range"),
        ([], "Missing option '--older-than'"),
    ],
)
def test_bad_input_is_exit_2(args: list[str], message: str) -> None:
    """Bad options, durations that are not finite or beyond the bound among them, are exit 2
    naming the option, never a traceback (the purge's own bound is the library's)."""
    command = ["outbox", "purge", "--database-url", "postgresql://x@127.0.0.1/x"]
    result = CliRunner().invoke(cli, [*command, "--outbox-id", "o", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("outbox_id", "message"),
    [("", "must not be empty"), ("  ", "must not be blank"), ("x" * 300, "at most 255")],
)
def test_a_bad_outbox_id_is_exit_2(outbox_id: str, message: str) -> None:
    """O1: an outbox id the outbox would refuse is bad input (exit 2) before any database work,
    by the outbox's own rule."""
    command = ["outbox", "purge", "--database-url", "postgresql://x@127.0.0.1/x"]
    result = CliRunner().invoke(cli, [*command, "--outbox-id", outbox_id, "--older-than", "7d"])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("raw", "seconds"), [("3600", 3600), ("90m", 5400), ("12h", 43200), ("7d", 604800)]
)
def test_durations(raw: str, seconds: int) -> None:
    from ship_sqla._cli._params import Duration  # noqa: PLC0415 - the parameter type under test

    duration = Duration(maximum=30 * 86400)
    assert duration.convert(raw, None, None) == timedelta(seconds=seconds)
