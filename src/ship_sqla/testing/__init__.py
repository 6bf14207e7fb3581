"""Test support for ship_sqla and the applications built on it.

The pytest plugin (``ship_sqla.testing._plugin``) is loaded automatically when ship_sqla is
installed; it provides ``ship_server``, ``ship_metadata``, ``ship_connection``, ``ship_engine``,
``ship_engine_url`` and ``ship_clock``. This module exports what tests use directly;
``NoServerError`` is in :mod:`ship_sqla.errors`.
"""

from ship_sqla._server import ResolvedServer as ResolvedServer
from ship_sqla._server import resolve_server as resolve_server
from ship_sqla.kernel._clock import FrozenClock as FrozenClock
from ship_sqla.testing._databases import DatabaseFactory as DatabaseFactory

__all__ = ("DatabaseFactory", "FrozenClock", "ResolvedServer", "resolve_server")
