"""Every public module's ``__all__`` is honest: it lists exactly the public names it exposes."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import ship_sqla

PUBLIC_MODULES = sorted(
    {"ship_sqla", "ship_sqla.kernel", "ship_sqla.testing"}
    | {
        info.name
        for info in pkgutil.walk_packages(ship_sqla.__path__, prefix="ship_sqla.")
        if not any(part.startswith("_") for part in info.name.split("."))
    }
)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what the module lacks: {missing}"
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and attr != "annotations"
    }
    unlisted = sorted(public - set(exported))
    assert not unlisted, f"{name} exposes names missing from __all__: {unlisted}"


def test_public_objects_live_in_private_modules_or_say_so() -> None:
    """Public names are re-exported from private modules: the implementation stays private."""
    for attr in ship_sqla.__all__:
        value = getattr(ship_sqla, attr)
        module = getattr(value, "__module__", None)
        if module is not None and module.startswith("ship_sqla"):
            private = any(part.startswith("_") for part in module.split(".")[1:])
            assert private, f"{attr} is defined in public module {module}"


def test_lazy_exports_match_the_type_checking_imports() -> None:
    """The lazy table and the imports type checkers read name the same objects."""
    import ast  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    tree = ast.parse(Path(ship_sqla.__file__).read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom) and sub.module:
                    checked.update({a.asname or a.name: sub.module for a in sub.names})
    assert checked == ship_sqla._EXPORTS
    assert set(checked) == set(ship_sqla.__all__)
