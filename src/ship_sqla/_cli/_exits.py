"""How a command ends: the exit codes of the package docstring, and the errors that carry them.

The root group (:class:`ShipGroup`) turns every ship error into its exit code, so a command
raises and never picks a code itself, except ``schema check``/``apply`` (1 for a difference)
and ``worker`` / ``outbox relay`` (130 after the drain a Ctrl-C started).
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import click

from ship_sqla.kernel._errors import ConfigurationError, ShipError

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "OperationFailedError",
    "ShipGroup",
    "fail",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
"""The shell's code for a process ended by SIGINT (128 + 2): any command interrupted by Ctrl-C,
and ``ship-sqla worker`` or ``outbox relay`` after the drain a Ctrl-C started; SIGTERM (a
deployment's stop) makes them exit 0."""


class OperationFailedError(click.ClickException):
    """Exit 1 with ``Error: <message>`` on stderr."""

    exit_code = EXIT_FAILED


class ShipGroup(click.Group):
    """Turns ship errors raised by any command into exit codes: ConfigurationError is bad input
    (2), any other ShipError a failed operation (1). Both print the error's code, what happened
    and the fix; neither prints a traceback."""

    def invoke(self, ctx: click.Context) -> Any:  # noqa: ANN401 - click's signature
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # click's own answer is "Aborted!" and 1; the shell's convention is 130.
            click.echo("ship-sqla: interrupted (Ctrl-C).", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except ConfigurationError as exc:
            raise click.UsageError(str(exc), ctx) from exc
        except ShipError as exc:
            raise OperationFailedError(str(exc)) from exc


def fail(message: str, *, as_json: bool, cause: BaseException) -> NoReturn:
    """Exit 1 with ``message`` on stderr; with ``--json`` also as ``{"ok": false, "error"}``."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message}))
    raise OperationFailedError(message) from cause
