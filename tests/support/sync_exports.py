"""Write the ``if TYPE_CHECKING:`` imports of the public packages from their export lists.

``ship_sqla`` and ``ship_sqla.kernel`` list their public names once, in ``_EXPORTS`` (name ->
private module; see ``ship_sqla/kernel/_lazy.py``). Type checkers cannot follow a lazy
``__getattr__``, so each package also carries one ``from <module> import <name> as <name>``
per name under ``if _typing.TYPE_CHECKING:``. That block is never edited by hand: after
changing an export list, run

    .venv/bin/python tests/support/sync_exports.py

which rewrites the block of both packages from their lists (then sorts and formats it with
ruff). ``tests/unit/test_public_api.py`` fails while a block and its list disagree.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

PUBLIC_PACKAGES = ("ship_sqla.kernel", "ship_sqla")


def package_file(package: str) -> Path:
    module = importlib.import_module(package)
    assert module.__file__ is not None
    return Path(module.__file__)


def export_list(package: str) -> dict[str, str]:
    """The package's one list: public name -> the private module defining it."""
    return dict(importlib.import_module(package)._EXPORTS)


def _type_checking_block(tree: ast.Module) -> ast.If:
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "_typing.TYPE_CHECKING",
            "TYPE_CHECKING",
        ):
            return node
    msg = "no top-level `if _typing.TYPE_CHECKING:` block to write the imports into"
    raise LookupError(msg)


def type_checking_imports(path: Path) -> dict[str, str]:
    """What the package's ``TYPE_CHECKING`` block imports: name -> module (``as`` names must
    repeat the name, the explicit re-export form strict type checkers require)."""
    block = _type_checking_block(ast.parse(path.read_text(encoding="utf-8")))
    imported: dict[str, str] = {}
    for statement in block.body:
        if isinstance(statement, ast.Pass):
            continue
        assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
        assert statement.module is not None
        for alias in statement.names:
            assert alias.asname == alias.name, f"import {alias.name} as {alias.name}"
            assert alias.name not in imported, f"{alias.name} is imported twice"
            imported[alias.name] = statement.module
    return imported


def render_block(exports: dict[str, str]) -> str:
    lines = ["if _typing.TYPE_CHECKING:"]
    lines += [
        f"    from {module} import {name} as {name}"
        for name, module in sorted(exports.items(), key=lambda item: (item[1], item[0]))
    ]
    return "\n".join(lines) + "\n"


def write_block(package: str) -> Path:
    path = package_file(package)
    source = path.read_text(encoding="utf-8")
    block = _type_checking_block(ast.parse(source))
    lines = source.splitlines(keepends=True)
    assert block.end_lineno is not None
    rewritten = (
        "".join(lines[: block.lineno - 1])
        + render_block(export_list(package))
        + "".join(lines[block.end_lineno :])
    )
    path.write_text(rewritten, encoding="utf-8")
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--quiet", "--select", "I001", "--fix", str(path)], check=True)
    subprocess.run([*ruff, "format", "--quiet", str(path)], check=True)
    return path


def main() -> None:
    for package in PUBLIC_PACKAGES:
        path = write_block(package)
        assert type_checking_imports(path) == export_list(package), path
        print(f"{path}: {len(export_list(package))} names")  # noqa: T201 - a command-line tool


if __name__ == "__main__":
    main()
