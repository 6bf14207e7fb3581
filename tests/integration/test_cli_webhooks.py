"""`ship-sqla webhooks endpoints ...` and `ship-sqla webhooks deliveries ...` driven as an
operator would (SPEC §16, S1): `python -m ship_sqla` in a subprocess against a real database."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cli_runner import ship_sqla
from sqlalchemy import MetaData, text

from ship_sqla import ship_audit_table
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel import WebhookDeliveryRecord
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def _json(*args: str, cwd: Path) -> Any:
    code, out, err = await ship_sqla(*args, "--json", cwd=cwd)
    assert code == 0, err
    return json.loads(out)


async def test_w4_operator_verbs_add_disable_enable_resumes_rotate_redeliver_all_audited(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """W4 and S1: the endpoint verbs (add prints the secret once; list never shows it),
    disable, enable (the audited re-enable: the paused delivery pending again with a run
    enqueued), rotate-secret, and the delivery verbs (list, show with its attempts,
    redeliver); every change writes one audit entry, none holding a secret."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    audit = ship_audit_table(metadata)
    endpoints = ship_webhook_endpoints_table(metadata)
    deliveries = ship_webhook_deliveries_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    store = create_webhook_delivery_store(
        database=ship_engine, endpoints_table=endpoints, deliveries_table=deliveries
    )
    url = ("--database-url", ship_engine_url)

    added = await _json(
        "webhooks", "endpoints", "add", "https://example.test/hooks", "--topic", "order.paid",
        "--id", "ep1", *url, cwd=tmp_path,
    )  # fmt: skip
    secret = added["secret"]
    assert secret.startswith("whsec_")
    listed = await _json("webhooks", "endpoints", "list", *url, cwd=tmp_path)
    assert [(e["id"], e["state"], e["secrets"]) for e in listed["endpoints"]] == [
        ("ep1", "enabled", 1)
    ]
    assert secret not in json.dumps(listed)

    disabled = await _json(
        "webhooks", "endpoints", "disable", "ep1", "--reason", "maintenance", *url, cwd=tmp_path
    )
    assert (disabled["state"], disabled["disabled_reason"]) == ("disabled", "maintenance")
    now = (await store.get_endpoint("ep1")).updated_at
    waiting = WebhookDeliveryRecord(
        id="msg_1",
        endpoint_id="ep1",
        topic="order.paid",
        payload={"order": 1},
        tenant=None,
        state="pending",
        attempts=(),
        created_at=now,
        updated_at=now,
    )
    await store.insert_deliveries([waiting])
    await store.set_delivery_state("msg_1", "paused")

    enabled = await _json("webhooks", "endpoints", "enable", "ep1", *url, cwd=tmp_path)
    assert enabled["resumed"] == ["msg_1"]
    assert (await store.get_delivery("msg_1")).state == "pending"
    async with ship_engine.connect() as connection:
        payloads = (await connection.execute(text(f"SELECT payload FROM {runs.name}"))).scalars()
        assert list(payloads) == [{"delivery_id": "msg_1"}]

    rotated = await _json("webhooks", "endpoints", "rotate-secret", "ep1", *url, cwd=tmp_path)
    assert rotated["secret"] != secret
    assert len((await store.get_endpoint("ep1")).secrets) == 2

    found = await _json("webhooks", "deliveries", "list", "--endpoint", "ep1", *url, cwd=tmp_path)
    assert [(d["id"], d["state"]) for d in found["deliveries"]] == [("msg_1", "pending")]
    shown = await _json("webhooks", "deliveries", "show", "msg_1", *url, cwd=tmp_path)
    assert (shown["payload"], shown["attempts"]) == ({"order": 1}, [])
    await _json("webhooks", "deliveries", "redeliver", "msg_1", *url, cwd=tmp_path)
    code, _, err = await ship_sqla("webhooks", "deliveries", "show", "nope", *url, cwd=tmp_path)
    assert code == 1
    assert "SHIP_SQLA_WEBHOOK_ENDPOINT_UNKNOWN" in err

    async with ship_engine.connect() as connection:
        rows = (
            await connection.execute(text(f"SELECT operation, details FROM {audit.name}"))
        ).all()
    assert sorted(r.operation for r in rows) == [
        "webhooks.add_endpoint",
        "webhooks.disable_endpoint",
        "webhooks.enable_endpoint",
        "webhooks.redeliver",
        "webhooks.rotate_secret",
    ]
    dumped = json.dumps([r.details for r in rows])
    assert secret not in dumped
    assert rotated["secret"] not in dumped
