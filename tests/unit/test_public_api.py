"""The public API (SPEC §0, issue #26 item 3): ``ship_sqla`` exports the few names an application
starts from, every other public name lives in one module by concern, each public module lists
its names once (``from ship_sqla._x import Y as Y`` lines and a tuple ``__all__``, in a stub
for the lazy ones), and every public exception is in ``ship_sqla.errors``."""

from __future__ import annotations

import ast
import importlib
import pickle
import pkgutil
import re
import types
from collections import Counter
from pathlib import Path

import pytest

import ship_sqla
import ship_sqla.errors
from ship_sqla.errors import ShipError
from ship_sqla.kernel._lazy import stub_exports

PUBLIC_MODULES = [
    "ship_sqla",
    *sorted(
        info.name
        for info in pkgutil.walk_packages(ship_sqla.__path__, prefix="ship_sqla.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ),
]
TOP_LEVEL_LIMIT = 40
CONCERN_BASES = (
    ship_sqla.errors.ConfigurationError,
    ship_sqla.errors.UsageError,
    ship_sqla.errors.StaleLeaseError,
    ship_sqla.errors.OutageError,
    ship_sqla.errors.RefusedError,
    ship_sqla.errors.JobAttemptError,
)


def _module_file(module: types.ModuleType) -> Path:
    assert module.__file__ is not None
    return Path(module.__file__)


def _listed_imports(module: types.ModuleType) -> dict[str, str]:
    """What a public module re-exports: ``name -> private module``, read from its stub when it
    has one (a lazy module), else from its own ``from M import N as N`` lines."""
    source = _module_file(module)
    stub = source.with_suffix(".pyi")
    if stub.exists():
        return stub_exports(stub)[0]
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return {
        alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__"
        for alias in node.names
        if alias.asname == alias.name
    }


def _ruff_order(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps ``__all__`` in: CONSTANTS, Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def _public_errors() -> list[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            value = getattr(module, attr)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.add(value)
    return sorted(found, key=lambda error: error.__name__)


def test_the_top_level_is_where_an_application_starts() -> None:
    """Issue #26: ``ship_sqla.__all__`` holds at most 40 names: the entry points."""
    assert len(ship_sqla.__all__) <= TOP_LEVEL_LIMIT, len(ship_sqla.__all__)
    for name in ("create_unit_of_work", "define_job", "create_job_backend", "start_job_runtime"):
        assert name in ship_sqla.__all__


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_a_sorted_tuple_of_exactly_the_reexported_names(name: str) -> None:
    """§0: ``__all__`` is a tuple in ruff's order without duplicates, equal to the names the
    module re-exports (each from a private module), every one of which resolves to the very
    object its private module defines; the module exposes nothing public besides."""
    module = importlib.import_module(name)
    exported = module.__all__
    assert isinstance(exported, tuple), f"{name}.__all__ is a {type(exported).__name__}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    assert list(exported) == sorted(exported, key=_ruff_order), f"{name}.__all__ is not sorted"
    imports = _listed_imports(module)
    assert set(exported) == set(imports), f"{name}: __all__ and its imports differ"
    for attr, source in imports.items():
        assert any(part.startswith("_") for part in source.split(".")[1:]), (attr, source)
        assert getattr(module, attr) is getattr(importlib.import_module(source), attr), attr
        imported: dict[str, object] = {}
        exec(f"from {name} import {attr} as value", imported)  # noqa: S102 - the import form
        assert imported["value"] is getattr(module, attr)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
    } - {"annotations"}
    assert public <= set(exported), f"{name} exposes unlisted names: {public - set(exported)}"


def test_no_name_is_listed_twice() -> None:
    """Issue #26: each public name is listed in exactly one ``__all__``."""
    listed = Counter(
        attr for name in PUBLIC_MODULES for attr in importlib.import_module(name).__all__
    )
    assert [attr for attr, count in listed.items() if count > 1] == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    """§0: the lazy hook answers only for listed names; anything else is the usual error, and
    a name that moved is not served from its old place."""
    for module in (ship_sqla, ship_sqla.errors):
        with pytest.raises(AttributeError, match="no attribute 'NotYetImplementedError'"):
            _ = module.NotYetImplementedError
    with pytest.raises(ImportError):
        exec("from ship_sqla import RetryPolicy", {})  # noqa: S102 - moved to ship_sqla.jobs
    assert set(ship_sqla.__all__) <= set(dir(ship_sqla))


def test_every_public_exception_is_in_ship_sqla_errors() -> None:
    """Issue #26: every public exception is listed by ``ship_sqla.errors`` alone, reports that
    module (tracebacks name it), derives from ShipError and carries its own ``code``."""
    errors = _public_errors()
    listed = {getattr(ship_sqla.errors, name) for name in ship_sqla.errors.__all__}
    assert set(errors) == listed
    for error in errors:
        assert error.__module__ == "ship_sqla.errors", error
        assert issubclass(error, ShipError), error
        assert error is ShipError or error.code != ShipError.code, error
        assert error.code.startswith("SHIP_SQLA_"), error


def test_no_private_error_claims_the_public_module() -> None:
    """Issue #26: an error that reports ``ship_sqla.errors`` is importable from it (pickles and
    tracebacks must not name what is not there): every error of a concern defined anywhere in
    ship_sqla is listed. An error of no concern (a command's own) keeps its private module."""
    for info in pkgutil.walk_packages(ship_sqla.__path__, prefix="ship_sqla."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    pending: list[type[ShipError]] = [ShipError]
    claiming: set[type[ShipError]] = set()
    while pending:
        error = pending.pop()
        pending.extend(error.__subclasses__())
        if error.__module__ == "ship_sqla.errors":
            claiming.add(error)
    assert {error.__name__ for error in claiming} == set(ship_sqla.errors.__all__)


def test_every_public_exception_belongs_to_one_concern() -> None:
    """Issue #26: the hierarchy fits one page: each error under exactly one concern base
    (configuration, usage, stale lease, outage, refused, job attempt); only ShipError has none."""
    for error in _public_errors():
        concerns = [base for base in CONCERN_BASES if issubclass(error, base)]
        if error is ShipError:
            assert concerns == []
            continue
        assert len(concerns) == 1, (error, concerns)
        assert error.concern == concerns[0].concern, error


def test_the_errors_page_lists_every_public_exception() -> None:
    """Issue #26: docs/errors.md is the one page of the hierarchy: every public error is on it,
    with its code."""
    page = (Path(__file__).parents[2] / "docs" / "errors.md").read_text(encoding="utf-8")
    for error in _public_errors():
        assert re.search(rf"^ *{error.__name__} +{error.code}$", page, re.MULTILINE), error  # type: ignore[attr-defined]


def test_codes_are_unique_up_to_refinement() -> None:
    """§0 errors: a code names one failure; a subclass may share its parent's code (it refines
    the same failure), unrelated errors may not."""
    by_code: dict[str, list[type[BaseException]]] = {}
    for error in _public_errors():
        by_code.setdefault(error.code, []).append(error)  # type: ignore[attr-defined]
    for code, errors in by_code.items():
        roots = [root for root in errors if all(issubclass(error, root) for error in errors)]
        assert roots, f"unrelated errors share the code {code}: {[e.__name__ for e in errors]}"


@pytest.mark.parametrize("error", _public_errors(), ids=lambda error: error.__name__)
def test_every_public_exception_pickles(error: type[ShipError]) -> None:
    """Issue #26: a public error survives a pickle round trip (a worker's error crossing a
    process boundary): same type, text, code, message, fix and attributes, whatever the
    arguments its own ``__init__`` takes."""
    instance = error.__new__(error)
    ShipError.__init__(instance, "what happened", fix="what to do")
    instance.detail = {"run_id": "r-1"}  # type: ignore[attr-defined]
    restored = pickle.loads(pickle.dumps(instance))  # noqa: S301 - our own bytes
    assert type(restored) is error
    assert str(restored) == str(instance)
    assert (restored.code, restored.message, restored.fix) == (
        error.code,
        "what happened",
        "what to do",
    )
    assert restored.detail == {"run_id": "r-1"}  # type: ignore[attr-defined]
    assert b"ship_sqla.errors" in pickle.dumps(instance)


def test_a_traceback_names_the_public_module() -> None:
    """Issue #26: errors print ``ship_sqla.errors.X``, never a private module path."""
    import traceback  # noqa: PLC0415 - only this test formats tracebacks

    try:
        raise ship_sqla.errors.TerminalError("the card was declined")
    except ShipError as exc:
        text = "".join(traceback.format_exception(exc))
    assert "ship_sqla.errors.TerminalError: SHIP_SQLA_JOB_TERMINAL" in text
    assert "_outcomes" not in text.splitlines()[-1]
