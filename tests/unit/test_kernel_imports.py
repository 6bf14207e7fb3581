"""``ship_sqla.kernel`` is ORM-free: importing it loads neither SQLAlchemy nor asyncpg (SPEC §0)."""

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
loaded = sorted({{m for m in sys.modules if m.split(".")[0] in {forbidden!r}}})
print(json.dumps(loaded))
"""


def _loaded_after_import(prelude: str = "") -> list[str]:
    code = _REPORT_LOADED.format(prelude=textwrap.dedent(prelude), forbidden=FORBIDDEN)
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_import_ship_sqla_kernel_loads_no_orm_or_driver():
    """§0: ``import ship_sqla.kernel`` in a fresh interpreter loads no sqlalchemy/asyncpg."""
    assert _loaded_after_import() == []


def test_the_kernel_package_itself_loads_no_orm_or_driver():
    """§0: with the parent package reduced to a bare namespace, the whole kernel (runtime and
    in-memory backends included) imports without loading sqlalchemy or asyncpg."""
    prelude = f"""
    import types
    parent = types.ModuleType("ship_sqla")
    parent.__path__ = [{str(PACKAGE_DIR)!r}]
    sys.modules["ship_sqla"] = parent
    """
    assert _loaded_after_import(prelude) == []


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
    for path in sorted(KERNEL_DIR.glob("*.py")):
        for module in _imported_modules(path):
            top = module.split(".")[0]
            outside_kernel = top == "ship_sqla" and not module.startswith("ship_sqla.kernel")
            if top in FORBIDDEN or outside_kernel:
                offenders.append(f"{path.name}: {module}")
    assert offenders == []
