"""What the long-running commands (``ship-sqla worker``, ``ship-sqla outbox relay``) share:
their logging options, the stop signals, and the drain a second signal cuts short.

- :func:`run_options` adds ``--drain-timeout``, ``--burst``, ``-v``, ``--log-level`` and
  ``--log-format`` (each command words its own ``--burst`` and drain help);
  :func:`logging_to_stderr` prints the ``ship_sqla`` logger's lines while the command runs.
- :func:`stop_signals` installs SIGTERM and SIGINT handlers on the running loop for the
  command's life: the first signal asks for the drain; one more during the drain means "quit
  now", as uvicorn, Celery and Sidekiq read it. :func:`drain` runs a stop, cut short at the
  second signal. The exit code: 130 after a SIGINT (the shell's code for Ctrl-C), else 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ship_sqla._cli._exits import EXIT_INTERRUPTED, EXIT_OK
from ship_sqla._cli._logging import LOG_FORMATS, LOG_LEVELS, ROOT_LOGGER, configure_logging
from ship_sqla._cli._params import Duration
from ship_sqla.kernel._durations import MAX_DRAIN_TIMEOUT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from ship_sqla._cli._logging import LogFormat

__all__ = ["StopSignals", "drain", "logging_to_stderr", "run_options", "stop_signals"]

_Command = TypeVar("_Command", bound="Callable[..., None]")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_options(
    *, drain_help: str, burst_help: str, verbose_help: str
) -> Callable[[_Command], _Command]:
    """``--drain-timeout`` (default 30s, at most 1d), ``--burst``, ``-v``, ``--log-level`` and
    ``--log-format``, worded alike for every long-running command."""
    options = [
        click.option(
            "--drain-timeout",
            type=Duration(maximum=MAX_DRAIN_TIMEOUT, allow_zero=True),
            default="30s",
            show_default=True,
            help=f"{drain_help} (0: at once), at most 1d. A second SIGTERM or Ctrl-C during the"
            " drain ends it at once.",
        ),
        click.option("--burst", is_flag=True, help=burst_help),
        click.option(
            "-v",
            "--verbose",
            is_flag=True,
            help=f"Log at debug level: {verbose_help}.",
        ),
        click.option(
            "--log-level",
            type=click.Choice(LOG_LEVELS, case_sensitive=False),
            default=None,
            help="The log level (default: info; -v: debug). warning shows only retries, stale"
            " settles, drains and worse.",
        ),
        click.option(
            "--log-format",
            type=click.Choice(LOG_FORMATS),
            default="text",
            show_default=True,
            help="text for people, json (one object per line) for log shippers.",
        ),
    ]

    def decorate(command: _Command) -> _Command:
        decorated: Any = command
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


@contextlib.contextmanager
def logging_to_stderr(
    *, verbose: bool, log_level: str | None, log_format: LogFormat
) -> Iterator[None]:
    """The ``ship_sqla`` logger's lines on stderr at ``--log-level`` (or debug with ``-v``,
    else info) while the command runs."""
    handler = configure_logging(log_level or ("debug" if verbose else "info"), log_format)
    try:
        yield
    finally:
        logging.getLogger(ROOT_LOGGER).removeHandler(handler)


class StopSignals:
    """SIGTERM / SIGINT as a long-running command reads them: the first sets :attr:`stop`
    (drain); one more once stopping (or draining) sets :attr:`hurry` (quit now)."""

    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self.draining = False

    def received(self, number: int) -> None:
        self.numbers.append(number)
        if self.stop.is_set() or self.draining:
            self.hurry.set()
        self.stop.set()

    @property
    def exit_code(self) -> int:
        """130 after a SIGINT (Ctrl-C), else 0 (SIGTERM, a deployment's stop, or none)."""
        return EXIT_INTERRUPTED if signal.SIGINT in self.numbers else EXIT_OK


@contextlib.asynccontextmanager
async def stop_signals() -> AsyncIterator[StopSignals]:
    """SIGTERM and SIGINT handled on the running loop until the block ends. Enter it before
    any work starts, so a signal is never the default (abrupt) exit once work may be running."""
    loop = asyncio.get_running_loop()
    signals = StopSignals()
    for number in _SIGNALS:
        loop.add_signal_handler(number, signals.received, number)
    try:
        yield signals
    finally:
        for number in _SIGNALS:
            loop.remove_signal_handler(number)


async def drain(
    stopping: Awaitable[None],
    signals: StopSignals,
    *,
    hurry: Callable[[], Awaitable[None]],
) -> None:
    """Await ``stopping`` (a graceful stop that drains); a second signal meanwhile awaits
    ``hurry()`` (which cuts the drain short), then ``stopping`` still to its end."""
    signals.draining = True
    stopped = asyncio.ensure_future(stopping)
    hurried = asyncio.ensure_future(signals.hurry.wait())
    try:
        await asyncio.wait({stopped, hurried}, return_when=asyncio.FIRST_COMPLETED)
        if hurried.done() and not stopped.done():
            await hurry()
    finally:
        hurried.cancel()
        await stopped
