"""Issue 36 item 1 (S2: every page bounded, measured): ``python -m benchmarks dashboard``
measures every GET route of the dashboard. Its page list is matched against the app's routes
as Starlette routes them; a GET route no measured path reaches is reported (the benchmark then
fails, ``--quick`` in CI's bench smoke too), so a page added later cannot go unmeasured."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from benchmarks.dashboard import UNMEASURED, _covered, _pages
from ship_sqla import create_dashboard
from ship_sqla.kernel import InMemoryJobBackend


def _app() -> Starlette:
    return create_dashboard(InMemoryJobBackend(), authorizer=lambda *_: True, audit=None)


def test_s2_every_get_route_of_the_dashboard_is_measured() -> None:
    """S2: the benchmark's pages reach every GET route but those it states it leaves out."""
    paths = [path for _, path in _pages(1_000_000)]
    assert _covered(_app(), paths) == []
    assert set(UNMEASURED) == {"/static"}


def test_s2_a_new_get_route_without_a_measurement_is_reported() -> None:
    """S2: a GET route added to the app and to no page of the benchmark is named (a POST route
    is not a page and is not asked for)."""
    app = _app()

    async def page(_request: object) -> PlainTextResponse:
        return PlainTextResponse("")

    app.router.routes.append(Route("/brand-new/{thing}", page, methods=["GET"]))
    app.router.routes.append(Route("/brand-new-action", page, methods=["POST"]))
    paths = [path for _, path in _pages(1_000_000)]
    assert _covered(app, paths) == ["/brand-new/{thing}"]
