"""Issue 27, item 12: the documentation site's build fails on a broken reference, and it is part
of ``nox -s ci``.

Each case builds a one-page site with the project's own mkdocs.yml settings (theme, validation,
hooks, mkdocstrings) and one broken reference of a kind, and expects ``mkdocs build --strict``
to fail naming it; the same site with the reference intact builds, so the failure is the
reference's. The full site is built by the ``docs`` nox session.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]

INTACT = """\
# A page

[The other page](other.md), [its section](other.md#a-section), a repository file
([the script](../examples/real.py)) and an API name,
[`OutboxMessage`][ship_sqla.outbox.OutboxMessage].

::: ship_sqla.outbox.OutboxMessage
"""

# (what the intact page says, what the broken one says instead, what the failure names)
WARNED = [  # MkDocs warns of each, and --strict fails the build at its end: one build for all
    ("(other.md)", "(gone.md)", "gone.md"),  # a page that does not exist
    ("#a-section", "#no-such-section", "no-such-section"),  # an anchor that does not exist
    ("real.py", "gone.py", "gone.py"),  # a repository file that does not exist
    (  # an API cross-reference that does not resolve
        "ship_sqla.outbox.OutboxMessage]",
        "ship_sqla.outbox.NoSuchName]",
        "ship_sqla.outbox.NoSuchName",
    ),
]
# An API object that does not exist stops the build at once.
MISSING_OBJECT = (
    "::: ship_sqla.outbox.OutboxMessage",
    "::: ship_sqla.outbox.NoSuchMessage",
    "NoSuchMessage",
)


def _build(tmp_path: Path, page: str) -> subprocess.CompletedProcess[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(page, encoding="utf-8")
    (docs / "other.md").write_text("# Other\n\n## A section\n", encoding="utf-8")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "real.py").write_text("", encoding="utf-8")
    config |= {
        "docs_dir": str(docs),
        "site_dir": str(tmp_path / "site"),
        "nav": ["index.md", "other.md"],
        "hooks": [str(ROOT / "docs" / "_hooks.py")],
    }
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT / "src")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_with_intact_references_builds(tmp_path: Path) -> None:
    """The control: the one-page site builds with warnings as errors."""
    result = _build(tmp_path, INTACT)
    assert result.returncode == 0, result.stderr


def test_friction_12_broken_links_anchors_and_references_fail_the_build(tmp_path: Path) -> None:
    """A broken link, anchor, repository file or API cross-reference fails ``mkdocs build
    --strict``, and the output names each."""
    page = INTACT
    for old, new, _ in WARNED:
        assert old in page
        page = page.replace(old, new)
    result = _build(tmp_path, page)
    assert result.returncode != 0
    for _, _, named in WARNED:
        assert named in result.stderr + result.stdout


def test_a_missing_api_object_fails_the_build(tmp_path: Path) -> None:
    """A ``::: name`` that names no object fails the build, naming it."""
    old, new, named = MISSING_OBJECT
    result = _build(tmp_path, INTACT.replace(old, new))
    assert result.returncode != 0
    assert named in result.stderr + result.stdout


def test_nox_ci_builds_the_docs() -> None:
    """``nox -s ci`` runs the docs build (the ``_docs`` step) after lint and types."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    ci = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "ci")
    called = [
        n.func.id for n in ast.walk(ci) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    ]
    assert "_docs" in called


def test_every_public_module_has_an_api_page() -> None:
    """Each module a ``.pyi`` stub declares (``ship_sqla``, ``ship_sqla.jobs``...) has its page
    in the API reference (``::: module``, which renders every name of its ``__all__``), and the
    site's navigation lists it: a new public module cannot be left out of the reference."""
    src = ROOT / "src"
    modules = {
        ".".join(stub.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for stub in (src / "ship_sqla").rglob("*.pyi")
    }
    pages = ROOT / "docs" / "reference" / "api"
    documented = {
        line.removeprefix("::: ").strip()
        for page in pages.glob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("::: ")
    }
    assert modules <= documented, sorted(modules - documented)
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in pages.glob("*.md"):
        assert f"reference/api/{page.name}" in nav, page.name
