"""The public API: every public module's ``__all__`` is honest, ``ship_sqla`` is the one place an
application imports from (the kernel's names included), and each package's names are listed
once (SPEC §0: "Public API is what ``__all__`` exports ... A test keeps ``__all__`` honest")."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest
import sync_exports

import ship_sqla
import ship_sqla.kernel

PUBLIC_MODULES = sorted(
    {"ship_sqla", "ship_sqla.kernel", "ship_sqla.testing"}
    | {
        info.name
        for info in pkgutil.walk_packages(ship_sqla.__path__, prefix="ship_sqla.")
        if not any(part.startswith("_") for part in info.name.split("."))
    }
)
LAZY_PACKAGES = sync_exports.PUBLIC_PACKAGES


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    """§0: ``__all__`` is unique and sorted, names only what the module has, and the module
    exposes nothing public that ``__all__`` leaves out."""
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    assert list(exported) == sorted(exported), f"{name}.__all__ is not sorted"
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


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_listed_name_is_importable_from_its_private_module(package: str) -> None:
    """§0: each name of the one list resolves, through the package, to the very object its
    private module defines; ``__all__`` is exactly the list."""
    module = importlib.import_module(package)
    exports = sync_exports.export_list(package)
    assert set(module.__all__) == set(exports)
    for name, source in exports.items():
        assert _is_private(source), f"{package}.{name} is listed from public module {source}"
        assert getattr(module, name) is getattr(importlib.import_module(source), name), name
        imported: dict[str, object] = {}
        exec(f"from {package} import {name} as value", imported)  # noqa: S102 - the import form
        assert imported["value"] is getattr(module, name)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_type_checking_imports_follow_the_one_list(package: str) -> None:
    """§0: the ``TYPE_CHECKING`` imports type checkers read are written from the export list
    (``tests/support/sync_exports.py``), never kept by hand: they must name the same objects."""
    written = sync_exports.type_checking_imports(sync_exports.package_file(package))
    assert written == sync_exports.export_list(package), (
        f"{package}'s TYPE_CHECKING block drifted from _EXPORTS:"
        " run `.venv/bin/python tests/support/sync_exports.py`"
    )


def test_every_kernel_name_is_reachable_from_ship_sqla() -> None:
    """§0 / issue #11: an application imports from one place: ``ship_sqla`` re-exports every
    kernel name (the very same objects), listed once, in the kernel's list."""
    kernel_exports = sync_exports.export_list("ship_sqla.kernel")
    top_exports = sync_exports.export_list("ship_sqla")
    assert set(ship_sqla.kernel.__all__) <= set(ship_sqla.__all__)
    for name in ship_sqla.kernel.__all__:
        assert top_exports[name] == kernel_exports[name], f"{name} is listed twice"
        assert getattr(ship_sqla, name) is getattr(ship_sqla.kernel, name), name


def test_public_objects_live_in_private_modules() -> None:
    """§0: public names are re-exported from private modules: the implementation stays private."""
    for package in LAZY_PACKAGES:
        module = importlib.import_module(package)
        for attr in module.__all__:
            defined_in = getattr(getattr(module, attr), "__module__", None)
            if isinstance(defined_in, str) and defined_in.startswith("ship_sqla"):
                assert _is_private(defined_in), f"{attr} is defined in public module {defined_in}"


def test_an_unknown_name_is_an_attribute_error() -> None:
    """§0: the lazy hook answers only for listed names; anything else is the usual error."""
    for package in (ship_sqla, ship_sqla.kernel):
        with pytest.raises(AttributeError, match="no attribute 'NotYetImplementedError'"):
            _ = package.NotYetImplementedError  # type: ignore[attr-defined]
        with pytest.raises(ImportError):
            exec(f"from {package.__name__} import create_job_operationz", {})  # noqa: S102
    assert set(ship_sqla.__all__) <= set(dir(ship_sqla))


def test_public_errors_carry_a_stable_unique_code() -> None:
    """§0 errors: every exported exception is a ShipError whose ``code`` names it alone (a
    subclass may share its parent's code: it refines the same failure)."""
    by_code: dict[str, list[type[BaseException]]] = {}
    for name in ship_sqla.__all__:
        value = getattr(ship_sqla, name)
        if not (isinstance(value, type) and issubclass(value, BaseException)):
            continue
        assert issubclass(value, ship_sqla.ShipError), f"{name} is not a ShipError"
        assert value.code.startswith("SHIP_SQLA_"), f"{name}.code = {value.code!r}"
        by_code.setdefault(value.code, []).append(value)
    for code, errors in by_code.items():
        roots = [root for root in errors if all(issubclass(error, root) for error in errors)]
        assert roots, f"unrelated errors share the code {code}: {[e.__name__ for e in errors]}"
