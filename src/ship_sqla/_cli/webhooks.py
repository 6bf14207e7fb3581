"""``ship-sqla webhooks endpoints list|add|disable|enable|rotate-secret`` and ``ship-sqla webhooks
deliveries list|show|redeliver``: outbound webhooks at the shell (SPEC §16). The changes are
operator actions (S1: audited in --audit-table, never with a secret in the entry); ``add`` and
``rotate-secret`` print the new secret once, for the receiver. ``enable`` is W4's re-enable:
the endpoint's paused deliveries are enqueued again (as runs of --job-id, which a worker with the
application's sender serves).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar, get_args

import click
from sqlalchemy import MetaData

from ship_sqla._cli._database import command_engine, run_on_database
from ship_sqla._cli._operator import cli_actor
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
    name_option,
)
from ship_sqla._webhooks._operations import create_webhook_operations
from ship_sqla._webhooks._out_store import create_webhook_delivery_store
from ship_sqla._webhooks._out_tables import (
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)
from ship_sqla._webhooks._sender import DEFAULT_JOB_ID, create_webhook_sender
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._webhooks_out import DeliveryState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla._webhooks._operations import WebhookOperations
    from ship_sqla.kernel._webhooks_out import WebhookDeliveryRecord, WebhookEndpointRecord

__all__ = ["webhooks"]

T = TypeVar("T")
_C = TypeVar("_C", bound="Callable[..., None]")

ENDPOINTS_TABLE: Final = "ship_webhook_endpoints"
DELIVERIES_TABLE: Final = "ship_webhook_deliveries"


def _webhook_options(command: _C) -> _C:
    command = name_option(
        "--endpoints-table",
        "table",
        envvar="SHIP_SQLA_WEBHOOK_ENDPOINTS_TABLE",
        default=ENDPOINTS_TABLE,
        help="The endpoints table (in --schema), as given to ship_webhook_endpoints_table.",
    )(command)
    command = name_option(
        "--deliveries-table",
        "table",
        envvar="SHIP_SQLA_WEBHOOK_DELIVERIES_TABLE",
        default=DELIVERIES_TABLE,
        help="The deliveries table (in --schema), as given to ship_webhook_deliveries_table.",
    )(command)
    command = click.option(
        "--job-id",
        default=DEFAULT_JOB_ID,
        show_default=True,
        help="The delivery job's id (create_webhook_sender's job_id).",
    )(command)
    command = job_tables_options(with_state_table=False)(command)
    return database_url_option(command)


def _operate(
    options: dict[str, Any],
    operation: Callable[[WebhookOperations], Awaitable[T]],
    *,
    audit_table: str | None = None,
) -> T:
    tables: JobTables = options["tables"]
    database_url: URL = options["database_url"]
    schema = tables.runs.schema
    try:
        metadata = MetaData()
        endpoints = ship_webhook_endpoints_table(
            metadata, name=options["endpoints_table"], schema=schema
        )
        deliveries = ship_webhook_deliveries_table(
            metadata, name=options["deliveries_table"], schema=schema
        )
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from exc

    async def call() -> T:
        async with command_engine(database_url) as engine:
            audit = None if audit_table is None else tables.audit_log(engine, audit_table)
            store = create_webhook_delivery_store(
                database=engine, endpoints_table=endpoints, deliveries_table=deliveries
            )
            sender = create_webhook_sender(
                store=store, backend=await tables.backend(engine), job_id=options["job_id"]
            )
            ops = create_webhook_operations(
                sender,
                authorizer=lambda *_: True,  # the operator holding the URL is trusted
                audit=audit,
                actor=cli_actor(),
            )
            try:
                return await operation(ops)
            finally:
                await sender.aclose()

    return run_on_database(
        database_url,
        call(),
        failing="cannot reach the webhook tables",
        fix=f"check the URL and that the tables exist (here: {endpoints.name},"
        f" {deliveries.name}; `ship-sqla schema apply --only webhooks_out` creates them).",
        as_json=bool(options.get("as_json")),
    )


def _endpoint_document(endpoint: WebhookEndpointRecord) -> dict[str, Any]:
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "topics": list(endpoint.topics),
        "tenant": endpoint.tenant,
        "state": endpoint.state,
        "disabled_reason": endpoint.disabled_reason,
        "consecutive_failures": endpoint.consecutive_failures,
        "secrets": len(endpoint.secrets),
        "updated_at": endpoint.updated_at.isoformat(),
    }


def _delivery_document(delivery: WebhookDeliveryRecord, *, attempts: bool) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": delivery.id,
        "endpoint_id": delivery.endpoint_id,
        "topic": delivery.topic,
        "tenant": delivery.tenant,
        "state": delivery.state,
        "attempts": len(delivery.attempts),
        "created_at": delivery.created_at.isoformat(),
        "updated_at": delivery.updated_at.isoformat(),
    }
    if attempts:
        document["attempts"] = [a.to_json() for a in delivery.attempts]
        document["payload"] = delivery.payload
    return document


@click.group("webhooks")
def webhooks() -> None:
    """Outbound webhooks (SPEC §16): endpoints and deliveries."""


@webhooks.group("endpoints")
def endpoints_group() -> None:
    """The endpoints: list, add, disable, enable (resumes their deliveries), rotate-secret."""


@webhooks.group("deliveries")
def deliveries_group() -> None:
    """The deliveries: list, show (with every attempt), redeliver."""


@endpoints_group.command("list", epilog=OPERATOR_NOTE)
@_webhook_options
@json_option
def endpoints_list(**options: Any) -> None:  # noqa: ANN401
    """Every endpoint with its state, failure streak and topics (never its secrets)."""

    async def call(ops: WebhookOperations) -> list[WebhookEndpointRecord]:
        return await ops.list_endpoints()

    found = _operate(options, call)
    if options["as_json"]:
        click.echo(json.dumps({"endpoints": [_endpoint_document(e) for e in found]}, indent=2))
        return
    if not found:
        click.echo("no webhook endpoints.")
    for e in found:
        why = f" ({e.disabled_reason})" if e.disabled_reason else ""
        click.echo(
            f"{e.id}  {e.state}{why}  failures {e.consecutive_failures}  {e.url}"
            f"  topics {','.join(e.topics)}"
        )


@endpoints_group.command("add", epilog=OPERATOR_NOTE)
@click.argument("url")
@click.option("--topic", "topics", multiple=True, required=True, help="A topic (repeatable; *).")
@click.option("--id", "endpoint_id", default=None, help="The endpoint's id (default: generated).")
@click.option("--tenant", default=None, help="The tenant whose events it receives.")
@_webhook_options
@audit_options
@json_option
def endpoints_add(url: str, **options: Any) -> None:  # noqa: ANN401
    """Register an endpoint (enabled) and print its new secret, once: give it to the receiver."""

    async def call(ops: WebhookOperations) -> tuple[WebhookEndpointRecord, str]:
        return await ops.add_endpoint(
            url, options["topics"], endpoint_id=options["endpoint_id"], tenant=options["tenant"]
        )

    endpoint, secret = _operate(options, call, audit_table=options["audit_table"])
    if options["as_json"]:
        click.echo(json.dumps({**_endpoint_document(endpoint), "secret": secret}, indent=2))
    else:
        click.echo(f"endpoint {endpoint.id} added; its secret (shown once): {secret}")


@endpoints_group.command("disable", epilog=OPERATOR_NOTE)
@click.argument("endpoint_id")
@click.option("--reason", required=True, help="Why (shown with the endpoint, audited).")
@_webhook_options
@audit_options
@json_option
def endpoints_disable(endpoint_id: str, **options: Any) -> None:  # noqa: ANN401
    """Disable an endpoint: its deliveries wait (paused) until it is enabled (W4)."""

    async def call(ops: WebhookOperations) -> WebhookEndpointRecord:
        return await ops.disable_endpoint(endpoint_id, reason=options["reason"])

    endpoint = _operate(options, call, audit_table=options["audit_table"])
    if options["as_json"]:
        click.echo(json.dumps(_endpoint_document(endpoint), indent=2))
    else:
        click.echo(f"endpoint {endpoint_id} disabled: {endpoint.disabled_reason}")


@endpoints_group.command("enable", epilog=OPERATOR_NOTE)
@click.argument("endpoint_id")
@_webhook_options
@audit_options
@json_option
def endpoints_enable(endpoint_id: str, **options: Any) -> None:  # noqa: ANN401
    """Enable an endpoint (W4, audited): its failure streak back to 0 and its paused
    deliveries enqueued again."""

    async def call(ops: WebhookOperations) -> list[str]:
        return await ops.enable_endpoint(endpoint_id)

    resumed = _operate(options, call, audit_table=options["audit_table"])
    if options["as_json"]:
        click.echo(json.dumps({"id": endpoint_id, "resumed": resumed}, indent=2))
    else:
        click.echo(f"endpoint {endpoint_id} enabled; {len(resumed)} paused deliveries resumed.")


@endpoints_group.command("rotate-secret", epilog=OPERATOR_NOTE)
@click.argument("endpoint_id")
@click.option(
    "--overlap-hours",
    type=click.FloatRange(min=0),
    default=24.0,
    show_default=True,
    help="How long the old secrets keep signing beside the new one.",
)
@_webhook_options
@audit_options
@json_option
def endpoints_rotate_secret(endpoint_id: str, **options: Any) -> None:  # noqa: ANN401
    """Add a new secret (printed once); the old ones sign too until the overlap ends (W2)."""
    overlap = timedelta(hours=options["overlap_hours"])

    async def call(ops: WebhookOperations) -> str:
        return await ops.rotate_secret(endpoint_id, overlap=overlap)

    secret = _operate(options, call, audit_table=options["audit_table"])
    if options["as_json"]:
        click.echo(json.dumps({"id": endpoint_id, "secret": secret}, indent=2))
    else:
        click.echo(f"endpoint {endpoint_id}: new secret (shown once): {secret}")


@deliveries_group.command("list", epilog=OPERATOR_NOTE)
@click.option("--endpoint", "endpoint_id", default=None, help="Only this endpoint's.")
@click.option(
    "--state", type=click.Choice(get_args(DeliveryState)), default=None, help="Only this state."
)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@_webhook_options
@json_option
def deliveries_list(**options: Any) -> None:  # noqa: ANN401
    """The newest deliveries, with their state and attempt count."""

    async def call(ops: WebhookOperations) -> list[WebhookDeliveryRecord]:
        return await ops.list_deliveries(
            endpoint_id=options["endpoint_id"], state=options["state"], limit=options["limit"]
        )

    found = _operate(options, call)
    if options["as_json"]:
        body = {"deliveries": [_delivery_document(d, attempts=False) for d in found]}
        click.echo(json.dumps(body, indent=2))
        return
    if not found:
        click.echo("no webhook deliveries.")
    for d in found:
        click.echo(f"{d.id}  {d.state}  {d.topic}  to {d.endpoint_id}  attempts {len(d.attempts)}")


@deliveries_group.command("show", epilog=OPERATOR_NOTE)
@click.argument("delivery_id")
@_webhook_options
@json_option
def deliveries_show(delivery_id: str, **options: Any) -> None:  # noqa: ANN401
    """One delivery with its payload and every attempt (status, duration, body excerpt,
    error)."""

    async def call(ops: WebhookOperations) -> WebhookDeliveryRecord:
        return await ops.get_delivery(delivery_id)

    delivery = _operate(options, call)
    document = _delivery_document(delivery, attempts=True)
    if options["as_json"]:
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"{delivery.id}  {delivery.state}  {delivery.topic}  to {delivery.endpoint_id}")
    for n, attempt in enumerate(delivery.attempts, 1):
        status = attempt.status if attempt.status is not None else "-"
        click.echo(
            f"  attempt {n}  {attempt.at.isoformat()}  status {status}"
            f"  {attempt.duration:.3f} s  {attempt.error or ''}"
        )


@deliveries_group.command("redeliver", epilog=OPERATOR_NOTE)
@click.argument("delivery_id")
@_webhook_options
@audit_options
@json_option
def deliveries_redeliver(delivery_id: str, **options: Any) -> None:  # noqa: ANN401
    """Send a delivery again: pending, one new run, the same webhook-id."""

    async def call(ops: WebhookOperations) -> WebhookDeliveryRecord:
        return await ops.redeliver(delivery_id)

    _operate(options, call, audit_table=options["audit_table"])
    if options["as_json"]:
        click.echo(json.dumps({"id": delivery_id, "state": "pending"}, indent=2))
    else:
        click.echo(f"delivery {delivery_id} enqueued again.")
