"""Lazy public modules (PEP 562), their names written once in a stub.

Each public module of ship_sqla (``ship_sqla``, ``ship_sqla.kernel``, ``ship_sqla.errors``,
``ship_sqla.jobs``...) keeps its names in a stub beside it (``__init__.pyi``, ``jobs.pyi``):
one ``from ship_sqla._private import Name as Name`` per name and a tuple ``__all__``. Type
checkers and editors read the stub; at run time the module reads it too, with
:func:`attach_stub`, the scheme of scientific-python's ``lazy_loader`` (SPEC 1) in a few lines:
a name's private module is imported on its first use, so ``import ship_sqla.kernel`` and
``from ship_sqla.errors import TerminalError`` load neither SQLAlchemy nor asyncpg.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["attach_stub", "stub_exports"]


def stub_exports(stub: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """``(name -> module, __all__)`` of a stub: its ``from M import N as N`` lines and its
    ``__all__`` tuple. Anything else in the stub (another import form, an alias that renames)
    is a ``ValueError``: the stub is the one list, and it must say exactly what it exports."""
    tree = ast.parse(stub.read_text(encoding="utf-8"), filename=str(stub))
    exports: dict[str, str] = {}
    listed: tuple[str, ...] | None = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.asname != alias.name:
                    msg = f"{stub}: write `{alias.name} as {alias.name}` (line {node.lineno})"
                    raise ValueError(msg)
                exports[alias.name] = node.module
        elif (
            isinstance(node, ast.Assign)
            and [ast.unparse(target) for target in node.targets] == ["__all__"]
            and isinstance(node.value, ast.Tuple)
        ):
            listed = tuple(ast.literal_eval(node.value))
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            msg = f"{stub}, line {node.lineno}: only `from M import N as N` and an __all__ tuple"
            raise ValueError(msg)
    if listed is None:
        msg = f"{stub} has no `__all__ = (...)` tuple"
        raise ValueError(msg)
    return exports, listed


def attach_stub(
    package: str, file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], tuple[str, ...]]:
    """``(__getattr__, __dir__, __all__)`` for the module named ``package`` whose source is
    ``file``, read from the stub beside it (``file`` with the suffix ``.pyi``).

    ``__getattr__`` imports a listed name's module on first use and caches the value in the
    module (so it runs once per name); any other name is the usual ``AttributeError``.
    """
    exports, listed = stub_exports(Path(file).with_suffix(".pyi"))
    if set(listed) != set(exports):
        msg = f"{package}: __all__ and the stub's imports differ: {set(listed) ^ set(exports)}"
        raise ValueError(msg)

    def __getattr__(name: str) -> Any:  # noqa: ANN401, N807 - any exported object; PEP 562 hook
        module = exports.get(name)
        if module is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg, name=name, obj=sys.modules.get(package))
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807 - PEP 562 hook
        return sorted({*vars(sys.modules[package]), *listed})

    return __getattr__, __dir__, listed
