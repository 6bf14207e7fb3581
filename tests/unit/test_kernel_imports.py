"""``ship_sqla.kernel`` is ORM-free: importing it loads neither SQLAlchemy nor asyncpg (SPEC §0),
and the public modules are lazy (PEP 562): their kernel names load without the database layer."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import ship_sqla.kernel

KERNEL_DIR = Path(ship_sqla.kernel.__file__).parent
PACKAGE_DIR = KERNEL_DIR.parent
FORBIDDEN = ("sqlalchemy", "asyncpg")

_REPORT_LOADED = """
import json, sys
{prelude}
import ship_sqla.kernel
{epilogue}
loaded = sorted({{m for m in sys.modules if m.split(".")[0] in {forbidden!r}}})
print(json.dumps(loaded))
"""


def _loaded_after_import(prelude: str = "", epilogue: str = "") -> list[str]:
    code = _REPORT_LOADED.format(
        prelude=textwrap.dedent(prelude), epilogue=textwrap.dedent(epilogue), forbidden=FORBIDDEN
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_import_ship_sqla_kernel_loads_no_orm_or_driver():
    """§0: ``import ship_sqla.kernel`` in a fresh interpreter loads no sqlalchemy/asyncpg."""
    assert _loaded_after_import() == []


def test_the_whole_kernel_loads_no_orm_or_driver():
    """§0: with the parent package reduced to a bare namespace, every module under kernel/
    (runtime, plans and in-memory backends included) and every kernel name imports without
    loading sqlalchemy or asyncpg."""
    prelude = f"""
    import types
    parent = types.ModuleType("ship_sqla")
    parent.__path__ = [{str(PACKAGE_DIR)!r}]
    sys.modules["ship_sqla"] = parent
    """
    epilogue = f"""
    import importlib, pkgutil
    for info in pkgutil.walk_packages([{str(KERNEL_DIR)!r}], prefix="ship_sqla.kernel."):
        importlib.import_module(info.name)
    for name in ship_sqla.kernel.__all__:
        getattr(ship_sqla.kernel, name)
    """
    assert _loaded_after_import(prelude, epilogue) == []


def test_kernel_names_load_no_orm_or_driver_from_any_public_module():
    """§0, issue #11 item 7, issue #26: the public modules are lazy (PEP 562), so every name the
    kernel defines, taken from whichever public module lists it (``from ship_sqla import
    define_job``, ``from ship_sqla.jobs import RetryPolicy``, ``from ship_sqla.errors import
    TerminalError``...), loads neither sqlalchemy nor asyncpg."""
    epilogue = """
    import importlib, importlib.util, pkgutil
    from pathlib import Path
    import ship_sqla
    from ship_sqla.kernel._lazy import stub_exports
    # iter_modules, not walk_packages: walking imports every package, the eager ones too
    public = ["ship_sqla"] + [
        info.name for info in pkgutil.iter_modules(ship_sqla.__path__, prefix="ship_sqla.")
        if not info.name.split(".")[-1].startswith("_")
    ]
    taken = 0
    for name in public:
        stub = Path(importlib.util.find_spec(name).origin).with_suffix(".pyi")
        if not stub.exists():
            continue  # an eager module (testing): it may load what it needs
        module = importlib.import_module(name)
        for attr, source in stub_exports(stub)[0].items():
            if source.startswith("ship_sqla.kernel."):
                assert getattr(module, attr) is getattr(importlib.import_module(source), attr)
                taken += 1
    assert taken > 100, taken
    """
    assert _loaded_after_import(epilogue=epilogue) == []


def test_import_ship_sqla_loads_nothing_it_does_not_list():
    """§0: ``import ship_sqla`` alone runs no store, kernel contract or runtime module: only the
    two package files and the lazy-export helper (PEP 562)."""
    code = (
        "import json, sys; import ship_sqla;"
        " print(json.dumps(sorted(m for m in sys.modules if m.startswith('ship_sqla'))))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(completed.stdout.strip().splitlines()[-1])
    assert loaded == ["ship_sqla", "ship_sqla.kernel", "ship_sqla.kernel._lazy"]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_kernel_module_imports_the_orm_or_the_rest_of_ship_sqla():
    """§0: no file under kernel/ names sqlalchemy, asyncpg, or a non-kernel ship_sqla module,
    even under TYPE_CHECKING (the kernel must stay usable on its own)."""
    offenders = []
    paths = sorted(KERNEL_DIR.rglob("*.py"))
    assert KERNEL_DIR / "_runtime" / "runtime.py" in paths  # the folders are searched too
    for path in paths:
        for module in _imported_modules(path):
            top = module.split(".")[0]
            outside_kernel = top == "ship_sqla" and not module.startswith("ship_sqla.kernel")
            if top in FORBIDDEN or outside_kernel:
                offenders.append(f"{path.relative_to(KERNEL_DIR)}: {module}")
    assert offenders == []
