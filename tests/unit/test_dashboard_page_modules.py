"""Issue 36 (the "add a dashboard page" recipe, docs/architecture.md): page modules are found by
their name, carry their own routes and header link, and import nothing of the application."""

from __future__ import annotations

import ast
import inspect

from ship_sqla._dashboard._page import Nav, header_links, page_modules

CORE = (("", "Overview"), ("/dead", "Dead letters"), ("/upkeep", "Upkeep"))


def test_page_modules_are_found_by_name_with_their_routes() -> None:
    """Every ``_*_page`` module that defines ``routes`` is found (the search and bulk pages
    too, since they import ``_page``); none imports ``_app`` at run time."""
    modules = {m.__name__.rsplit(".", 1)[-1]: m for m in page_modules()}
    assert {"_audit_page", "_bulk_page", "_job_page", "_run_page", "_schedules_page"} <= set(
        modules
    )
    for name, module in modules.items():
        tree = ast.parse(inspect.getsource(module))
        runtime = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert all(n.module != "ship_sqla._dashboard._app" for n in runtime), name


def test_header_links_place_each_page_after_the_link_it_names() -> None:
    """A page module's ``NAV`` goes after the link it names (at the end when none has that
    path); a path already in the header is not added twice."""
    links = header_links(CORE, page_modules())
    paths = [path for path, _ in links]
    assert paths.index("/errors") == paths.index("/dead") + 1
    assert paths.index("/schedules") == paths.index("/errors") + 1
    assert paths[-1] == "/audit"
    assert len(paths) == len(set(paths))

    class Module:
        NAV = Nav("/slow", "Slow jobs", after="/nowhere")

    assert header_links(CORE, [Module, Module])[-1] == ("/slow", "Slow jobs")  # type: ignore[list-item]
    assert len(header_links(CORE, [Module, Module])) == len(CORE) + 1  # type: ignore[list-item]
