"""The ``ship-sqla`` command line (also ``python -m ship_sqla``).

Tables for people, ``--json`` for scripts. Exit codes are part of the interface:

- 0: success (for ``schema check``: the database matches the metadata);
- 1: the check found differences, or the operation failed (a run that does not exist, a
  missing table); the message on stderr says what happened and the fix. A database that is
  down or unreachable is ``SHIP_SQLA_DATABASE_UNAVAILABLE: <what failed and why> (database
  <url without password>). Fix: ...``, whatever the driver raised;
- 2: bad input: a usage error, a malformed option, a ``MODULE:ATTR`` that cannot be loaded;
- 130: interrupted by Ctrl-C (SIGINT); the worker and the outbox relay drain first.

One module per command group: ``schema``, ``demo``, ``worker`` (``worker`` and ``workers``),
``jobs/`` (a package: ``runs``, ``control``, ``upkeep``, ``bulk``), ``outbox`` (and ``relay``,
its ``relay`` verb, added to the group by ``_main``), ``enqueue``, ``dashboard``. They share
the modules whose names start with an underscore: ``_exits`` (exit
codes and the root group's class), ``_params`` (parameter types), ``_options`` (shared options),
``_tables`` (the tables a command names), ``_database`` (one engine per command; database
failures as exit 1), ``_operator`` (the operator surface at the shell), ``_output`` (what the
jobs commands print), ``_logging`` (the long-running commands' log), ``_running`` (their
signals, drain and shared options). ``_main`` assembles the root group; no
module imports a command group's module but ``_main``, so the imports have no cycle.
"""

from __future__ import annotations

from ship_sqla._cli._exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from ship_sqla._cli._main import cli, main

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "cli", "main"]
