"""Lazy re-exports (PEP 562) for the public packages ``ship_sqla`` and ``ship_sqla.kernel``.

A public package lists its names ONCE, as a mapping ``public name -> private module that
defines it``. Everything else follows from that mapping: ``__all__`` (its sorted keys), the
module ``__getattr__`` that imports a name's module on first use, ``__dir__`` (both made here),
and the ``if TYPE_CHECKING:`` imports type checkers read (written from the mapping by
``tests/support/sync_exports.py``; ``tests/unit/test_public_api.py`` fails when they drift).

Loading a name imports only its own module, so ``from ship_sqla import define_job`` loads the
kernel and neither SQLAlchemy nor asyncpg.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: MutableMapping[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of the package whose ``globals()`` is ``namespace``.

    ``__getattr__`` imports the module ``exports`` names for an attribute, caches the value in
    ``namespace`` (so it runs once per name) and raises ``AttributeError`` for any other name.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:  # noqa: ANN401, N807 - any exported object; PEP 562 hook
        module = exports.get(name)
        if module is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg, name=name, obj=sys.modules.get(package))
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807 - PEP 562 hook
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
