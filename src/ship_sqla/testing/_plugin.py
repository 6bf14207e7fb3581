"""The ship_sqla pytest plugin (auto-loaded through the ``pytest11`` entry point).

Fixtures:

- ``ship_server`` (session): the PostgreSQL server tests use — ``SHIP_SQLA_DATABASE_URL``,
  else 127.0.0.1:5432 if it answers, else an embedded server (``embedded`` extra), else a
  clear error (a generic ``DATABASE_URL`` is never read).
- ``ship_metadata`` (session): the ``MetaData`` whose tables every test database starts with.
  Override it in your ``conftest.py`` to return your application's metadata.
- ``ship_connection``: an ``AsyncConnection`` in a transaction that is rolled back after the test.
  Cheap; use it for anything that needs neither commits nor several connections.
- ``ship_engine`` / ``ship_engine_url``: an ``AsyncEngine`` (and its URL) on a private database
  cloned from the template and dropped after the test: for commits, locks, LISTEN, several
  connections and subprocesses.
- ``ship_clock``: a :class:`~ship_sqla.testing.FrozenClock` that moves only when the test says.
- ``ship_replay`` (D11): with ``@pytest.mark.ship_replay(registry=..., histories="glob")``, one
  test per history file, failing with the divergence (D7) when the file does not replay clean.

Option ``--ship-record-histories DIR`` (D11): the history of every workflow run the session's
tests execute is written to ``DIR``, one file per run.

Async fixtures are plain async functions: run tests with anyio's plugin (mark ``anyio``, with an
``anyio_backend`` of ``"asyncio"``) or pytest-asyncio in auto mode.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._server import ResolvedServer, resolve_server, stop_embedded
from ship_sqla.kernel._clock import FrozenClock
from ship_sqla.kernel._job_context import NO_RESOURCES
from ship_sqla.kernel._replay import Replayer, ReplayResult
from ship_sqla.testing._databases import DatabaseFactory, new_database_name
from ship_sqla.testing._recorder import HistoryRecorder

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from sqlalchemy.engine import URL


@pytest.fixture(scope="session")
def ship_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResolvedServer]:
    server = resolve_server(
        embedded_dir=Path(tmp_path_factory.mktemp("ship_sqla_pg")), embedded_cleanup="delete"
    )
    try:
        yield server
    finally:
        stop_embedded(server)


@pytest.fixture(scope="session")
def ship_metadata() -> MetaData:
    """Override to return the metadata whose tables every test database starts with."""
    return MetaData()


@pytest.fixture(scope="session")
def _ship_databases(
    ship_server: ResolvedServer, ship_metadata: MetaData
) -> Iterator[tuple[DatabaseFactory, str, URL]]:
    """The session's template database, and one shared clone for rolled-back tests."""
    factory = DatabaseFactory(ship_server)
    template = new_database_name("tpl")
    shared = new_database_name("shared")
    asyncio.run(factory.create_template(template, ship_metadata))
    try:
        shared_url = asyncio.run(factory.create(shared, template=template))
        try:
            yield factory, template, shared_url
        finally:
            asyncio.run(factory.drop(shared))
    finally:
        asyncio.run(factory.drop(template))


@pytest.fixture
async def ship_connection(
    _ship_databases: tuple[DatabaseFactory, str, URL],
) -> AsyncIterator[AsyncConnection]:
    _, _, url = _ship_databases
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            transaction = await connection.begin()
            try:
                yield connection
            finally:
                if transaction.is_active:
                    await transaction.rollback()
    finally:
        await engine.dispose()


@pytest.fixture
async def _ship_private(
    _ship_databases: tuple[DatabaseFactory, str, URL],
) -> AsyncIterator[tuple[URL, AsyncEngine]]:
    factory, template, _ = _ship_databases
    async with factory.private(template) as private:
        yield private


@pytest.fixture
def ship_engine(_ship_private: tuple[URL, AsyncEngine]) -> AsyncEngine:
    return _ship_private[1]


@pytest.fixture
def ship_engine_url(_ship_private: tuple[URL, AsyncEngine]) -> str:
    return _ship_private[0].render_as_string(hide_password=False)


@pytest.fixture
def ship_clock() -> FrozenClock:
    return FrozenClock()


# --- D11: replay tests and recorded histories ------------------------------------------------

_REPLAY_MARKER = "ship_replay"
_RECORDER_KEY = pytest.StashKey[HistoryRecorder]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ship_sqla")
    group.addoption(
        "--ship-record-histories",
        metavar="DIR",
        default=None,
        help="D11: write the history of every workflow run the tests execute to DIR (one"
        " ship_sqla.history/1 file per run), for replay tests against another build.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_REPLAY_MARKER}(registry, histories='*.json', resources=None): D11, one test per"
        " history file matching the glob (relative to the test's module), replayed against the"
        " registry's handlers (a JobRegistry, definitions, or 'module:attr'); request the"
        " ship_replay fixture.",
    )
    if config.getoption("--ship-record-histories", default=None):
        recorder = HistoryRecorder()
        recorder.install()
        config.stash[_RECORDER_KEY] = recorder


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.stash.get(_RECORDER_KEY, None)
    if recorder is None:
        return
    recorder.uninstall()
    directory = Path(config.getoption("--ship-record-histories"))
    written = recorder.write(directory)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"ship_sqla: recorded {len(written)} workflow history(ies) in {directory}"
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(_REPLAY_MARKER)
    if marker is None or "ship_history_path" not in metafunc.fixturenames:
        return
    pattern = str(marker.kwargs.get("histories", "*.json"))
    base = metafunc.definition.path.parent
    files = sorted(base.glob(pattern))
    if not files:
        # One failing test rather than none: an empty corpus must not pass unseen.
        metafunc.parametrize("ship_history_path", [base / pattern], ids=["no-history-files"])
        return
    names = [path.name for path in files]
    ids = names if len(set(names)) == len(names) else [str(p.relative_to(base)) for p in files]
    metafunc.parametrize("ship_history_path", files, ids=ids)


@pytest.fixture
def ship_history_path() -> Path:
    """The history file of a ``ship_replay`` test (parametrized by the marker)."""
    raise pytest.UsageError(f"ship_history_path is set by @pytest.mark.{_REPLAY_MARKER} only.")


def _replay_registry(marker: pytest.Mark) -> Any:  # noqa: ANN401 - a registry or definitions
    registry = marker.kwargs.get("registry", marker.args[0] if marker.args else None)
    if isinstance(registry, str):
        module, _, attribute = registry.partition(":")
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
        return found
    if registry is None:
        raise pytest.UsageError(f"@pytest.mark.{_REPLAY_MARKER} needs registry=.")
    return registry


@pytest.fixture
def ship_replay(request: pytest.FixtureRequest, ship_history_path: Path) -> ReplayResult:
    """D11: the replay of this test's history file against the marker's registry; the test
    fails with the D7 message when it is not clean (after its body ran)."""
    marker = request.node.get_closest_marker(_REPLAY_MARKER)
    if marker is None:
        raise pytest.UsageError(f"the ship_replay fixture needs @pytest.mark.{_REPLAY_MARKER}.")
    if not ship_history_path.is_file():
        # A failure of the test itself (not of its setup): an empty corpus must not pass.
        return ReplayResult(
            run_id="",
            job_id="",
            frontier=0,
            replayed=0,
            stopped="failed",
            failure=f"no history file matches {ship_history_path}",
            origin=str(ship_history_path),
        )
    replayer = Replayer(
        _replay_registry(marker), resources=marker.kwargs.get("resources", NO_RESOURCES)
    )
    return asyncio.run(replayer.replay_file(ship_history_path))


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:  # noqa: ANN401 - pluggy's result
    outcome = yield
    result = pyfuncitem.funcargs.get("ship_replay")
    if isinstance(result, ReplayResult):
        result.raise_if_not_clean()
    return outcome
