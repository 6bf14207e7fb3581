"""The command line's parameter types: every value is checked before any database work, and
every refusal is bad input (exit 2) naming the option and what to write instead."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click
from sqlalchemy import MetaData
from sqlalchemy.exc import ArgumentError

from ship_sqla._naming import MAX_IDENTIFIER_BYTES
from ship_sqla._outbox._store import check_outbox_id
from ship_sqla._server import NoServerError, to_async_url
from ship_sqla.kernel._durations import require_duration
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import JobDefinition
from ship_sqla.kernel._keys import InvalidKeyError
from ship_sqla.kernel._registry import JobRegistry

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

if TYPE_CHECKING:
    AnyParamType = click.ParamType[Any]
else:  # click < 8.4's ParamType is not generic at runtime
    AnyParamType = click.ParamType

__all__ = [
    "LIFESPAN",
    "METADATA",
    "REGISTRY",
    "SINK",
    "AnyParamType",
    "DatabaseUrl",
    "Duration",
    "Identifier",
    "JobsReference",
    "LifespanReference",
    "ObjectReference",
    "OutboxId",
    "SinkReference",
]


class ObjectReference(AnyParamType):
    """``module:attr`` (``attr`` may be dotted) naming an object of ``expected`` type.

    The current directory is importable, as it is for ``python -m``, so ``ship-sqla`` finds the
    application's modules from its project root. Every failure is a usage error (exit 2).
    """

    name = "MODULE:ATTR"

    def __init__(self, expected: type[Any], what: str, example: str) -> None:
        self.expected = expected
        self.what = what
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        if isinstance(value, self.expected):
            return value
        found = self._load(value, param, ctx)
        if not isinstance(found, self.expected):
            self.fail(
                f"{value} is a {type(found).__name__}, not a {self.what}"
                f" ({self.expected.__module__}.{self.expected.__qualname__}).",
                param,
                ctx,
            )
        return found

    def _load(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        module_name, _, attribute = str(value).partition(":")
        if not module_name or not attribute:
            self.fail(
                f"{value!r} is not MODULE:ATTR; name the {self.what} like {self.example}.",
                param,
                ctx,
            )
        module = self._import(module_name, param, ctx)
        found: Any = module
        for part in attribute.split("."):
            try:
                found = getattr(found, part)
            except AttributeError:
                public = sorted(n for n in vars(module) if not n.startswith("_"))
                self.fail(
                    f"module {module_name!r} has no attribute {attribute!r}"
                    f" (it defines: {', '.join(public[:20]) or 'nothing public'}).",
                    param,
                    ctx,
                )
        return found

    def _import(
        self, module_name: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:  # noqa: ANN401 - a module
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (
                module_name == exc.name or module_name.startswith(f"{exc.name}.")
            ):
                self.fail(
                    f"module {module_name!r} was not found (searched from {cwd} and the"
                    " installed packages); run from the project root or install the project.",
                    param,
                    ctx,
                )
            self.fail(
                f"importing {module_name!r} failed: it imports {exc.name!r}, which is not"
                " installed.",
                param,
                ctx,
            )
        except Exception as exc:  # noqa: BLE001 - any import-time error is the user's input problem
            self.fail(f"importing {module_name!r} raised {type(exc).__name__}: {exc}", param, ctx)


class JobsReference(ObjectReference):
    """``module:attr`` naming a :class:`JobRegistry`, one job definition, or a list or tuple of
    them; converted to a registry. Every failure is a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(JobRegistry, "job registry", "examples.worker:registry")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        if isinstance(value, JobRegistry):
            return value
        found = self._load(value, param, ctx)
        if isinstance(found, JobRegistry):
            return found
        if isinstance(found, JobDefinition):
            found = [found]
        registry: JobRegistry | None = None
        message = (
            f"{value} is a {type(found).__name__}, not a job registry: name a JobRegistry,"
            " a job definition (define_job) or a list of them, defined at module level, like"
            " examples.worker:registry."
        )
        if isinstance(found, list | tuple) and all(isinstance(d, JobDefinition) for d in found):
            try:
                registry = JobRegistry(found)
            except ConfigurationError as exc:
                message = f"{value}: {exc}"
        if registry is None:
            self.fail(message, param, ctx)
        return registry


class LifespanReference(ObjectReference):
    """``module:attr`` naming a lifespan: a callable returning an async context manager (an
    ``@asynccontextmanager`` function). Every failure is a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(object, "lifespan", "myapp.worker:lifespan")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        found = value if callable(value) else self._load(value, param, ctx)
        if not callable(found) or hasattr(found, "__aenter__"):
            self.fail(
                f"{value} is a {type(found).__name__}, not a lifespan: name a module-level"
                " @asynccontextmanager function (called once; it yields the resources), like"
                " myapp.worker:lifespan.",
                param,
                ctx,
            )
        return found


class SinkReference(ObjectReference):
    """``module:attr`` naming an outbox sink: an async callable taking the message (an ``async
    def publish(message)``, or an object whose ``__call__`` is one). A class, an async context
    manager or a callable that cannot take one message is refused, saying what to pass. Every
    failure is a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(object, "sink", "myapp.relay:publish")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        found = value if callable(value) else self._load(value, param, ctx)
        problem = _sink_problem(found)
        if problem is not None:
            self.fail(
                f"{value} is {problem}, not an outbox sink: name a module-level async function"
                " taking the message (async def publish(message)), like myapp.relay:publish;"
                " for a sink that needs resources opened first, pass --lifespan APP:LIFESPAN"
                " instead (an @asynccontextmanager function that yields the sink).",
                param,
                ctx,
            )
        return found


def _sink_problem(found: object) -> str | None:
    """Why ``found`` cannot be a sink, or None."""
    kind = f"a {type(found).__name__}"
    if isinstance(found, type):
        return f"the class {found.__qualname__} (make an instance at module level)"
    if not callable(found) or hasattr(found, "__aenter__"):
        return kind
    try:
        inspect.signature(found).bind(None)
    except TypeError:
        return f"{kind} that cannot be called with one message"
    except ValueError:  # no signature to read (a builtin): taken as it is
        return None
    return None


METADATA = ObjectReference(MetaData, "SQLAlchemy MetaData", "myapp.db:metadata")
REGISTRY = JobsReference()
LIFESPAN = LifespanReference()
SINK = SinkReference()


class DatabaseUrl(AnyParamType):
    """A PostgreSQL URL; ``postgresql://`` and ``postgres://`` are used through asyncpg."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> URL:  # noqa: ANN401
        try:
            return to_async_url(str(value))
        except (ArgumentError, ValueError) as exc:
            self.fail(f"{value!r} is not a database URL ({exc}).", param, ctx)
        except NoServerError as exc:
            self.fail(exc.message, param, ctx)


class Identifier(AnyParamType):
    """One PostgreSQL identifier (a table or a schema name), used as given and always quoted.

    A dotted name is refused: ``--schema`` names the schema, so ``app.runs`` is more likely a
    mistake than a table whose name contains a dot.
    """

    name = "NAME"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:  # noqa: ANN401
        text = str(value)
        if not text.strip():
            self.fail(
                f"the {self.what} name is empty; name one, or leave the option out.", param, ctx
            )
        if "\x00" in text:
            self.fail(f"the {self.what} name {text!r} contains a NUL character.", param, ctx)
        if "." in text:
            hint = " (pass the schema with --schema)" if self.what == "table" else ""
            self.fail(
                f"{text!r} is a dotted name; give the bare {self.what} name{hint}.", param, ctx
            )
        size = len(text.encode())
        if size > MAX_IDENTIFIER_BYTES:
            self.fail(
                f"the {self.what} name {text!r} is {size} bytes, over PostgreSQL's"
                f" {MAX_IDENTIFIER_BYTES}-byte identifier limit.",
                param,
                ctx,
            )
        return text


_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|[smhd]?)\s*")


class Duration(AnyParamType):
    """Seconds, or a number with a unit: ``0.5``, ``250ms``, ``3600``, ``90m``, ``12h``, ``7d``;
    converted to a ``timedelta``.

    The one type of every duration option: the value must be finite, positive (or zero where
    ``allow_zero``) and at most ``maximum`` seconds, the bound the library applies to the same
    setting (:func:`ship_sqla.kernel._durations.require_duration`). Anything else, ``nan``,
    ``inf``, ``1e12``, ``-1`` or ``99999999999d``, is bad input (exit 2) naming the option.
    """

    name = "DURATION"

    def __init__(self, *, maximum: float, allow_zero: bool = False) -> None:
        self.maximum = maximum
        self.allow_zero = allow_zero

    def convert(
        self,
        value: Any,  # noqa: ANN401 - click's signature
        param: click.Parameter | None,
        ctx: click.Context | None,
    ) -> timedelta:
        if isinstance(value, timedelta):
            seconds: float = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = value
        else:
            found = _DURATION.fullmatch(str(value))
            if found is None:
                self.fail(
                    f"{value!r} is not a duration; write seconds or a number with a unit ms, s,"
                    " m, h or d, like 0.5, 250ms, 3600, 90m, 12h or 7d.",
                    param,
                    ctx,
                )
            amount, unit = found.groups()
            seconds = float(amount) * _UNITS[unit or "s"]
        option = param.opts[0] if param is not None and param.opts else "the duration"
        try:
            checked = require_duration(
                seconds, option, maximum=self.maximum, allow_zero=self.allow_zero
            )
        except ConfigurationError as exc:
            self.fail(f"{value!r}: {exc.message}", param, ctx)
        return timedelta(seconds=checked)


class OutboxId(AnyParamType):
    """An ``outbox_id``, checked by the outbox's own rule before any database work: a bad one is
    bad input (exit 2), not a failed operation."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:  # noqa: ANN401
        try:
            return check_outbox_id(value)
        except InvalidKeyError as exc:
            self.fail(exc.message, param, ctx)
