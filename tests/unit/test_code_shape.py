"""The shape issue 26 asked of the source: no function over 80 lines (the table factories, one
declaration each, excepted), so a reader sees each one whole."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "ship_sqla"
MAX_LINES = 80
TABLE_FACTORY = "_table"
"""``ship_*_table``: one SQLAlchemy ``Table(...)`` declaration each, read as a schema."""


def test_no_function_in_src_is_over_80_lines() -> None:
    """Every function and method of ``src/ship_sqla`` (from its ``def``: signature, docstring
    and body; a click command's option decorators are declarations, not counted) is at most 80
    lines long, except the ``ship_*_table`` factories."""
    long: list[str] = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("ship_") and node.name.endswith(TABLE_FACTORY):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(SOURCE)}:{node.lineno} {node.name} ({lines})")
    assert long == [], "functions over 80 lines: " + ", ".join(long)
