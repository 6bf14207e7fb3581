"""S1 (issue 33): every operator action is one permissioned operation, reachable from Python,
the CLI and the dashboard alike, and audited. The actions are declared once
(``ship_sqla.kernel._actions.OPERATOR_ACTIONS``: name, permission, CLI verb, dashboard route);
these tests check each surface against that declaration, both ways, so a new action cannot
skip a surface and a surface cannot grow an undeclared action. Pure: no database."""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

import click
import pytest
from starlette.routing import Match, Route

from ship_sqla._cli._main import cli
from ship_sqla._dashboard import _app as dashboard_app
from ship_sqla._dashboard import create_dashboard
from ship_sqla._outbox._operations import MANAGE_PERMISSION as OUTBOX_MANAGE
from ship_sqla._outbox._operations import OutboxOperations
from ship_sqla._webhooks._operations import MANAGE_PERMISSION as WEBHOOKS_MANAGE
from ship_sqla._webhooks._operations import WebhookOperations
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._actions import OPERATOR_ACTIONS, DashboardRoute, OperatorAction
from ship_sqla.kernel._backfill_operations import BackfillOperations
from ship_sqla.kernel._operations import MANAGE_PERMISSION as JOBS_MANAGE
from ship_sqla.kernel._operations import JobOperations

if TYPE_CHECKING:
    from collections.abc import Iterator

SURFACES: dict[str, tuple[type, str]] = {
    "jobs": (JobOperations, JOBS_MANAGE),
    "outbox": (OutboxOperations, OUTBOX_MANAGE),
    "backfills": (BackfillOperations, JOBS_MANAGE),
    "webhooks": (WebhookOperations, WEBHOOKS_MANAGE),
}
"""Each operations surface of the declaration's prefixes, and the permission its changes ask."""

NOT_ACTIONS: frozenset[tuple[str, ...]] = frozenset(
    {
        ("schema", "check"),
        ("schema", "apply"),
        ("schema", "sql"),
        ("demo",),
        ("worker",),
        ("outbox", "relay"),
        ("workers",),
        ("jobs", "dead"),
        ("jobs", "errors"),
        ("jobs", "find"),
        ("jobs", "show"),
        ("jobs", "paused"),
        ("jobs", "demand"),
        ("jobs", "stats"),
        ("jobs", "health"),
        # J17: the history's maintenance, the same pass the fleet's sampler runs unattended
        # (a schema tool, like schema apply; --migrate is the one-shot upgrade).
        ("jobs", "maintain"),
        # E8: the definitions SQL enqueuers read and the functions' install, what every
        # worker's start upserts (a schema tool, like schema apply).
        ("jobs", "sync-definitions"),
        ("enqueue",),
        ("dashboard",),
        ("backfill", "status"),
        ("backfill", "verify"),
        ("webhooks", "endpoints", "list"),
        ("webhooks", "deliveries", "list"),
        ("webhooks", "deliveries", "show"),
        ("workflows", "export"),
        ("workflows", "patches"),
        ("workflows", "versions"),
        ("workflows", "parked"),
        ("workflows", "replay"),
    }
)
"""The CLI's commands that are not operator actions: reads, the schema's tools, the worker and the
outbox relay (runners), the application's enqueue, and the dashboard (a surface: its actions are
the routes). A new command is either declared as an action or added here, on purpose."""

IDS = [action.operation for action in OPERATOR_ACTIONS]


def _method(action: OperatorAction) -> Any:
    surface, name = action.operation.split(".", 1)
    return getattr(SURFACES[surface][0], name, None)


def _source_with_helpers(method: Any) -> str:
    """The method's source and that of the ``self._helper(`` methods it calls (one level)."""
    source = inspect.getsource(method)
    owner = method.__qualname__.split(".")[0]
    cls = next(c for c, _ in SURFACES.values() if c.__name__ == owner)
    for helper in re.findall(r"self\.(_[a-z_]+)\(", source):
        found = getattr(cls, helper, None)
        if callable(found):
            source += inspect.getsource(found)
    return source


def _state_changing(cls: type) -> Iterator[str]:
    """The public coroutine methods of ``cls`` that ask the manage permission for themselves."""
    for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction):
        if not name.startswith("_") and f'self._authorize("{name}")' in inspect.getsource(member):
            yield name


def _leaves(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def _cli_command(path: tuple[str, ...]) -> click.Command | None:
    command: click.Command | None = cli
    for word in path:
        if not isinstance(command, click.Group):
            return None
        command = command.commands.get(word)
    return command


def _options(command: click.Command) -> set[str]:
    return {option for param in command.params for option in param.opts}


def _routes() -> list[Route]:
    app = create_dashboard(InMemoryJobBackend(), authorizer=lambda *_: True, audit=None)
    return [route for route in app.routes if isinstance(route, Route)]


def _matches(route: Route, path: str, method: str) -> bool:
    scope = {"type": "http", "path": path, "method": method}
    return route.matches(scope)[0] == Match.FULL


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


NO_DASHBOARD_FORM: dict[str, str] = {
    "webhooks.add_endpoint": "answers with the new secret, which the dashboard never shows",
    "webhooks.rotate_secret": "answers with the new secret, which the dashboard never shows",
    # issue 36: every destructive action asks first. The dashboard's "all matching" links
    # preview the count and confirm through jobs.retry_filtered / discard_filtered /
    # cancel_filtered (state=dead, or the runs page's state) instead.
    "jobs.retry_dead_matching": "the dashboard previews and confirms jobs.retry_filtered",
    "jobs.discard_dead_matching": "the dashboard previews and confirms jobs.discard_filtered",
    "jobs.cancel_matching": "the dashboard previews and confirms jobs.cancel_filtered",
}
"""Actions the dashboard offers no form for, on purpose (the shell and Python have them)."""


def _route_or_known_gap(action: OperatorAction) -> DashboardRoute:
    """The declared route; an action declared without one (None) is a known gap: an expected
    failure that says so, never a pass."""
    if action.dashboard is None:
        if action.operation in NO_DASHBOARD_FORM:
            pytest.xfail(f"{action.operation}: {NO_DASHBOARD_FORM[action.operation]}")
        pytest.xfail(f"{action.operation}: no dashboard form yet")
    return action.dashboard


def test_s1_the_declaration_names_each_action_once() -> None:
    """S1: one line per operator action; its permission is its surface's manage permission."""
    assert len(set(IDS)) == len(IDS)
    for action in OPERATOR_ACTIONS:
        surface = action.operation.split(".", 1)[0]
        assert surface in SURFACES, action
        assert action.permission == SURFACES[surface][1], action


@pytest.mark.parametrize("action", OPERATOR_ACTIONS, ids=IDS)
def test_s1_each_declared_action_is_a_python_operation_that_asks_its_permission_and_the_audit(
    action: OperatorAction,
) -> None:
    """S1: the declared operation is a method of its operations surface that asks its own
    permission (``_authorize("<name>")``) and S1's audit rule before its first change
    (``_audit_ready()``, itself or through the helper it calls)."""
    method = _method(action)
    assert method is not None, f"{action.operation}: no such method"
    assert inspect.iscoroutinefunction(method)
    name = action.operation.split(".", 1)[1]
    source = _source_with_helpers(method)
    assert f'self._authorize("{name}")' in source, action.operation
    assert "self._audit_ready()" in source, f"{action.operation} skips the audit rule"


def test_s1_every_state_changing_python_operation_is_declared() -> None:
    """S1: a method of JobOperations or OutboxOperations that asks the manage permission for
    itself changes state: it is declared (so its CLI verb and dashboard route are checked)."""
    declared = set(IDS)
    for surface, (cls, _) in SURFACES.items():
        for name in _state_changing(cls):
            assert f"{surface}.{name}" in declared, f"{surface}.{name} is not declared"


@pytest.mark.parametrize("action", OPERATOR_ACTIONS, ids=IDS)
def test_s1_each_declared_action_has_its_cli_verb_with_the_audit_options(
    action: OperatorAction,
) -> None:
    """S1: ``ship-sqla <command>`` exists, takes the options that select the action, and the
    audit options (S1's one rule at the shell: --audit-table, and --no-audit, the explicit
    opt-out)."""
    command = _cli_command(action.cli.command)
    assert command is not None, f"{action.operation}: no command {' '.join(action.cli.command)}"
    options = _options(command)
    missing = set(action.cli.options) - options
    assert not missing, f"{action.operation}: {' '.join(action.cli.command)} lacks {missing}"
    assert {"--audit-table", "--no-audit"} <= options, action.operation


def test_s1_every_cli_command_is_an_action_or_known_not_to_be_one() -> None:
    """S1: every command that takes the audit options (it changes state) is declared, and every
    other command is listed as not an action: a new command is classified on purpose."""
    declared = {action.cli.command for action in OPERATOR_ACTIONS}
    for path, command in _leaves(cli):
        if path in NOT_ACTIONS:
            continue
        assert path in declared, f"ship-sqla {' '.join(path)} is neither declared nor a read"
        assert "--no-audit" in _options(command), path
    assert not NOT_ACTIONS & declared


@pytest.mark.parametrize("action", OPERATOR_ACTIONS, ids=IDS)
def test_s1_each_declared_action_has_its_dashboard_route(action: OperatorAction) -> None:
    """S1: the dashboard answers ``POST`` at the declared route; a form with several actions
    names the declared one (its ``action`` value is one the dashboard's handlers read)."""
    declared = _route_or_known_gap(action)
    path = _concrete(declared.path)
    assert any(_matches(route, path, "POST") for route in _routes()), action.operation
    if declared.action is not None:
        source = inspect.getsource(dashboard_app)
        assert f'"{declared.action}"' in source, action.operation


def test_s1_every_dashboard_post_route_is_a_declared_action() -> None:
    """S1: no dashboard route changes state without being declared (every POST route is named
    by at least one action)."""
    declared = [
        _concrete(action.dashboard.path)
        for action in OPERATOR_ACTIONS
        if action.dashboard is not None
    ]
    for route in _routes():
        if "POST" not in (route.methods or ()):
            continue
        assert any(_matches(route, path, "POST") for path in declared), route.path


SECRET = b"s" * 32
SESSION = "session-1"


@pytest.mark.parametrize("action", OPERATOR_ACTIONS, ids=IDS)
async def test_s1_each_declared_dashboard_route_runs_its_declared_operation(
    action: OperatorAction, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1: a manager's POST to the declared route (with the declared ``action`` field) reaches
    exactly the declared operation of the operations surface (a spy stands in for it and
    refuses, so nothing changes): the route and the declaration cannot drift apart."""
    declared = _route_or_known_gap(action)
    import httpx  # noqa: PLC0415 - the dashboard extra
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    from ship_sqla import create_outbox, create_outbox_operations  # noqa: PLC0415
    from ship_sqla._dashboard import _csrf  # noqa: PLC0415
    from ship_sqla.errors import JobOperationRefusedError  # noqa: PLC0415
    from ship_sqla.kernel import InMemoryBackfillLedger  # noqa: PLC0415
    from ship_sqla.kernel._jobs import define_job  # noqa: PLC0415
    from ship_sqla.kernel._memory.webhooks_out import (  # noqa: PLC0415
        InMemoryWebhookDeliveryStore,
    )
    from ship_sqla.operators import InMemoryAuditLog  # noqa: PLC0415
    from ship_sqla.webhooks import create_webhook_sender  # noqa: PLC0415

    calls: list[str] = []
    for surface, (cls, _) in SURFACES.items():
        for name in _state_changing(cls):

            async def spy(*_args: Any, _name: str = f"{surface}.{name}", **_kw: Any) -> Any:
                calls.append(_name)
                raise JobOperationRefusedError("spied", fix="none")

            monkeypatch.setattr(cls, name, spy)

    async def _noop(payload: dict[str, Any]) -> None:
        return None

    job = define_job("parity.job", _noop, payload=dict)
    backend = InMemoryJobBackend()
    run_id = (await backend.enqueue(job, {})).run_id
    audit = InMemoryAuditLog()
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")  # never used
    outbox = create_outbox_operations(
        create_outbox(database=engine), authorizer=lambda *_: True, audit=audit
    )
    app = create_dashboard(
        backend,
        authorizer=lambda *_: True,
        audit=audit,
        outbox=outbox,
        outbox_ids=["main"],
        definitions=[job],
        secret=SECRET,
        backfills=InMemoryBackfillLedger(),
        webhooks=create_webhook_sender(backend=backend, store=InMemoryWebhookDeliveryStore()),
    )
    path = declared.path.format(
        run_id=run_id,
        job_id=job.id,
        outbox_id="main",
        backfill_id="parity.backfill",
        endpoint_id="parity.endpoint",
        delivery_id="parity.delivery",
    )
    form = {
        _csrf.FIELD: _csrf.form_token(SECRET, SESSION),
        "id": [run_id] if action.operation.startswith("jobs.") else [str(_uuid())],
        "step": "a",
        "older_than_days": "7",
        "state": "waiting",
        "reason": "parity",
    }
    if declared.action is not None:
        form["action"] = declared.action
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://app",
        cookies={_csrf.COOKIE: SESSION},
    )
    async with client:
        answer = await client.post(path, data=form)
    await engine.dispose()
    assert answer.status_code == 303, answer.text
    assert "spied" in answer.headers["location"]
    assert calls == [action.operation]


def _uuid() -> Any:
    import uuid  # noqa: PLC0415

    return uuid.uuid4()
