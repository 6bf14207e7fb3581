"""Test support for ship_sqla and the applications built on it.

The pytest plugin (``ship_sqla.testing._plugin``) is loaded automatically when ship_sqla is
installed; it provides ``ship_server``, ``ship_metadata``, ``ship_connection``, ``ship_engine``,
``ship_engine_url`` and ``ship_clock``, the ``ship_replay`` marker and fixture (one test per
workflow history file, D11) and the ``--ship-record-histories DIR`` option. This module exports
what tests use directly: the test databases, the frozen clock, and the workflow replayer with
its history files (D11); ``NoServerError``, ``HistoryFormatError`` and ``ReplayFailedError`` are
in :mod:`ship_sqla.errors`.
"""

from ship_sqla._server import ResolvedServer as ResolvedServer
from ship_sqla._server import resolve_server as resolve_server
from ship_sqla.kernel._clock import FrozenClock as FrozenClock
from ship_sqla.kernel._history import History as History
from ship_sqla.kernel._history import HistoryStep as HistoryStep
from ship_sqla.kernel._history import read_histories as read_histories
from ship_sqla.kernel._history import read_history as read_history
from ship_sqla.kernel._history import write_history as write_history
from ship_sqla.kernel._replay import Replayer as Replayer
from ship_sqla.kernel._replay import ReplayResult as ReplayResult
from ship_sqla.testing._databases import DatabaseFactory as DatabaseFactory

__all__ = (
    "DatabaseFactory",
    "FrozenClock",
    "History",
    "HistoryStep",
    "ReplayResult",
    "Replayer",
    "ResolvedServer",
    "read_histories",
    "read_history",
    "resolve_server",
    "write_history",
)
