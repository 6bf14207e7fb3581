"""The pytest plugin itself: both isolation fixtures, and the embedded-server fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._server import NoServerError, to_async_url


async def test_connection_fixture_is_rolled_back(ship_connection: AsyncConnection) -> None:
    await ship_connection.execute(text("create table plugin_probe (id int)"))
    assert ship_connection.in_transaction()


async def test_rolled_back_work_is_gone(ship_connection: AsyncConnection) -> None:
    found = await ship_connection.execute(text("select to_regclass('plugin_probe')"))
    assert found.scalar() is None


async def test_private_database_is_isolated(ship_engine: AsyncEngine, ship_engine_url: str) -> None:
    async with ship_engine.begin() as c:
        name = (await c.execute(text("select current_database()"))).scalar()
        await c.execute(text("create table committed_probe (id int)"))
    assert str(name).startswith("ship_sqla_test_db_")
    assert str(name) in ship_engine_url


def test_urls_are_normalised_to_asyncpg() -> None:
    assert to_async_url("postgres://u@h/d").drivername == "postgresql+asyncpg"
    assert to_async_url("postgresql+psycopg://u@h/d").drivername == "postgresql+asyncpg"
    with pytest.raises(NoServerError, match="needs PostgreSQL"):
        to_async_url("mysql://u@h/d")


@pytest.mark.slow
def test_embedded_server_fallback(tmp_path: Path) -> None:
    """With no server configured or local, the plugin starts the embedded one (pgserver)."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            import pytest
            from sqlalchemy import text

            @pytest.mark.anyio
            async def test_probe(ship_engine, ship_server):
                assert ship_server.source == "embedded"
                async with ship_engine.connect() as c:
                    assert (await c.execute(text("select 1"))).scalar() == 1

            @pytest.fixture
            def anyio_backend():
                return "asyncio"
            """
        )
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"SHIP_SQLA_DATABASE_URL", "DATABASE_URL"}
    }
    env["SHIP_SQLA_EMBEDDED"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
