"""The operator actions, declared once (S1, issue 33): each state-changing operator operation,
the permission it asks, its CLI verb and its dashboard route.

S1: every operator action is one permissioned operation, reachable from Python, the CLI and the
dashboard alike, and audited. This table is the list of those actions; the parity test
(``tests/unit/test_operator_parity.py``) checks the three surfaces against it:

- Python: each ``operation`` names a method of :class:`~ship_sqla.jobs.JobOperations`
  (``jobs.``), :class:`~ship_sqla.outbox.OutboxOperations` (``outbox.``) or
  :class:`~ship_sqla.backfills.BackfillOperations` (``backfills.``) or
  :class:`~ship_sqla.webhooks.WebhookOperations` (``webhooks.``) that asks
  ``permission``, and is the ``operation`` of the audit entry it writes; every
  state-changing method of those classes is declared here;
- the CLI: ``cli.command`` is a ``ship-sqla`` command taking ``cli.options`` and the audit
  options (``--audit-table``, ``--no-audit``); every CLI command that changes state is named
  here;
- the dashboard: ``dashboard.path`` (its ``{placeholders}`` filled) is a route of
  ``create_dashboard`` answering ``POST``, whose form's ``action`` field is
  ``dashboard.action`` when given; every POST route is named here.

A new operator action adds its line here, then its three surfaces: the test fails until each
has one. (Recipes: docs/architecture.md, "How to add an operator action".)
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["OPERATOR_ACTIONS", "CliVerb", "DashboardRoute", "OperatorAction"]


@attrs.frozen
class CliVerb:
    """A ``ship-sqla`` command (``("jobs", "cancel")``) and the options that select the action
    (``("--all", "--job")``); a bare argument selects it when ``options`` is empty."""

    command: tuple[str, ...]
    options: tuple[str, ...] = ()


@attrs.frozen
class DashboardRoute:
    """A dashboard route under its mount (``"/runs/{run_id}/retry"``) and, for a form that
    carries several actions, the value of its ``action`` field."""

    path: str
    action: str | None = None


@attrs.frozen
class OperatorAction:
    """One operator action: ``operation`` (``"jobs.cancel_many"``: the operations surface and
    its method, and the audit entry's operation), the ``permission`` it asks, and its CLI verb
    and dashboard route."""

    operation: str
    permission: str
    cli: CliVerb
    dashboard: DashboardRoute | None
    """None: the dashboard has no form for it, a known gap (or, for an action that answers with
    a secret, a choice) the parity test reports as an expected failure, never a silent one."""


_JOBS: Final = "ship.jobs:manage"
_OUTBOX: Final = "ship.outbox:manage"
_WEBHOOKS: Final = "ship.webhooks:manage"


def _jobs(operation: str, cli: CliVerb, dashboard: DashboardRoute | None) -> OperatorAction:
    return OperatorAction(f"jobs.{operation}", _JOBS, cli, dashboard)


def _outbox(operation: str, cli: CliVerb, dashboard: DashboardRoute) -> OperatorAction:
    return OperatorAction(f"outbox.{operation}", _OUTBOX, cli, dashboard)


def _webhooks(
    operation: str, cli: tuple[str, ...], dashboard: DashboardRoute | None
) -> OperatorAction:
    return OperatorAction(
        f"webhooks.{operation}", _WEBHOOKS, CliVerb(("webhooks", *cli)), dashboard
    )


def _backfills(operation: str, cli: CliVerb, dashboard: DashboardRoute | None) -> OperatorAction:
    # Backfills run as jobs: their operations ask the jobs' permission.
    return OperatorAction(f"backfills.{operation}", _JOBS, cli, dashboard)


OPERATOR_ACTIONS: Final[tuple[OperatorAction, ...]] = (
    # one run
    _jobs("retry", CliVerb(("jobs", "retry")), DashboardRoute("/runs/{run_id}/retry")),
    _jobs("discard", CliVerb(("jobs", "discard")), DashboardRoute("/runs/{run_id}/discard")),
    _jobs("cancel", CliVerb(("jobs", "cancel")), DashboardRoute("/runs/{run_id}/cancel")),
    _jobs(
        "rerun_from_step",
        CliVerb(("jobs", "rerun"), ("--from-step",)),
        DashboardRoute("/runs/{run_id}/rerun"),
    ),
    # D10: a run parked on a divergence
    _jobs("unpark", CliVerb(("workflows", "unpark")), DashboardRoute("/runs/{run_id}/unpark")),
    # D10: the dashboard has no form for it yet (it needs the registry's handlers to replay).
    OperatorAction("jobs.move_version", _JOBS, CliVerb(("workflows", "move-version")), None),
    # a whole job
    _jobs("pause", CliVerb(("jobs", "pause")), DashboardRoute("/jobs/{job_id}/pause")),
    _jobs("resume", CliVerb(("jobs", "resume")), DashboardRoute("/jobs/{job_id}/resume")),
    # a scheduled job's run now (issue 36): the Schedules page's button
    _jobs(
        "run_now",
        CliVerb(("jobs", "run-now"), ("--registry",)),
        DashboardRoute("/schedules/{job_id}/run-now"),
    ),
    # runs in bulk: named
    _jobs(
        "retry_many",
        CliVerb(("jobs", "retry-dead"), ("--id",)),
        DashboardRoute("/dead/bulk", "retry"),
    ),
    _jobs(
        "discard_many",
        CliVerb(("jobs", "discard-dead"), ("--id",)),
        DashboardRoute("/dead/bulk", "discard"),
    ),
    _jobs(
        "cancel_many",
        CliVerb(("jobs", "cancel"), ("--id",)),
        DashboardRoute("/runs/bulk", "cancel"),
    ),
    # runs in bulk: by filter. The dashboard asks first (issue 36: no action without a
    # confirmation): its "all matching" links preview and confirm the *_filtered operations
    # below, so these three have no dashboard form (the shell and Python keep them).
    _jobs(
        "retry_dead_matching",
        CliVerb(("jobs", "retry-dead"), ("--all", "--job", "--tenant")),
        None,
    ),
    _jobs(
        "discard_dead_matching",
        CliVerb(("jobs", "discard-dead"), ("--all", "--job", "--tenant")),
        None,
    ),
    _jobs(
        "cancel_matching",
        CliVerb(("jobs", "cancel"), ("--all", "--job", "--tenant", "--state", "--older-than")),
        None,
    ),
    # runs in bulk: by any filter, previewed and confirmed (issue 36): the search page's
    # "all matching" links, the dead and runs pages' too, lead to GET /bulk/<verb> (the
    # count and the confirmation), which posts here.
    _jobs(
        "retry_filtered",
        CliVerb(("jobs", "retry-matching"), ("--filter",)),
        DashboardRoute("/bulk/retry"),
    ),
    _jobs(
        "cancel_filtered",
        CliVerb(("jobs", "cancel-matching"), ("--filter",)),
        DashboardRoute("/bulk/cancel"),
    ),
    _jobs(
        "discard_filtered",
        CliVerb(("jobs", "discard-matching"), ("--filter",)),
        DashboardRoute("/bulk/discard"),
    ),
    # retention
    _jobs(
        "cleanup",
        CliVerb(("jobs", "cleanup"), ("--registry",)),
        DashboardRoute("/upkeep/cleanup"),
    ),
    _jobs(
        "delete_events",
        CliVerb(("jobs", "events-purge"), ("--older-than",)),
        DashboardRoute("/upkeep/events-purge"),
    ),
    # the outbox
    _outbox(
        "retry",
        CliVerb(("outbox", "redrive"), ("--id",)),
        DashboardRoute("/outbox/{outbox_id}/redrive", "selected"),
    ),
    _outbox(
        "retry_dead_matching",
        CliVerb(("outbox", "redrive"), ("--all", "--outbox-id", "--tenant", "--older-than")),
        DashboardRoute("/outbox/{outbox_id}/redrive", "all"),
    ),
    _outbox(
        "purge_delivered",
        CliVerb(("outbox", "purge"), ("--outbox-id", "--older-than")),
        DashboardRoute("/outbox/{outbox_id}/purge"),
    ),
    # backfills (C4, C5): the Consumers & backfills page's buttons
    _backfills(
        "start", CliVerb(("backfill", "start")), DashboardRoute("/backfills/{backfill_id}/start")
    ),
    _backfills(
        "cancel", CliVerb(("backfill", "cancel")), DashboardRoute("/backfills/{backfill_id}/cancel")
    ),
    # outbound webhooks (SPEC §16; W4's audited re-enable): the Webhooks page's buttons. Adding
    # an endpoint and rotating its secret answer with the new secret, which the dashboard never
    # shows (no secret is rendered anywhere): they stay at the shell and in Python, on purpose.
    _webhooks("add_endpoint", ("endpoints", "add"), None),
    _webhooks(
        "disable_endpoint",
        ("endpoints", "disable"),
        DashboardRoute("/webhooks/endpoints/{endpoint_id}/disable"),
    ),
    _webhooks(
        "enable_endpoint",
        ("endpoints", "enable"),
        DashboardRoute("/webhooks/endpoints/{endpoint_id}/enable"),
    ),
    _webhooks("rotate_secret", ("endpoints", "rotate-secret"), None),
    _webhooks(
        "redeliver",
        ("deliveries", "redeliver"),
        DashboardRoute("/webhooks/deliveries/{delivery_id}/redeliver"),
    ),
)
"""Every operator action (S1), by concern and kind."""
