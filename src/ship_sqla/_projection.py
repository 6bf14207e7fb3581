"""Named projections (R4): a declared, typed subset of a table's columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs

from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = ["Projection"]

T = TypeVar("T")


def _column_names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):  # a bare string would silently become its characters
        raise ConfigurationError(
            f"projection columns must be a sequence of column names, got the string {value!r}.",
            fix=f"write columns=({value!r},).",
        )
    return tuple(value)


@attrs.frozen
class Projection(Generic[T]):
    """A named subset of a table's columns and the callable that builds a typed value from them.

    Declared once, on a :class:`~ship_sqla.TableRepository` (which checks that every column
    exists), and selected by this object (typed: ``Projection[T]`` gives ``Page[T]``) or by its
    name. A projection must read only its columns, never the whole row; ``into`` is called with
    exactly those columns as keyword arguments (an attrs class or a dataclass fits).
    """

    name: str
    columns: tuple[str, ...] = attrs.field(converter=_column_names)
    into: Callable[..., T]

    def __attrs_post_init__(self) -> None:
        if not _is_text(self.name):
            raise ConfigurationError(
                f"a projection needs a non-empty string name, got {self.name!r}.",
                fix="name it after what it is for, e.g. name='order_summary'.",
            )
        if not self.columns:
            raise ConfigurationError(
                f"projection {self.name!r} declares no columns.",
                fix="list the columns it reads, e.g. columns=('id', 'status').",
            )
        duplicates = sorted({c for c in self.columns if self.columns.count(c) > 1})
        if duplicates:
            raise ConfigurationError(
                f"projection {self.name!r} lists columns more than once: {duplicates}.",
                fix="list each column once.",
            )
        if not callable(self.into):
            raise ConfigurationError(
                f"projection {self.name!r}: into={self.into!r} is not callable.",
                fix="pass a class or function taking the columns as keyword arguments.",
            )

    def build(self, row: Mapping[Any, Any]) -> T:
        """The typed value for ``row`` (which must hold at least this projection's columns)."""
        return self.into(**{column: row[column] for column in self.columns})


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())
