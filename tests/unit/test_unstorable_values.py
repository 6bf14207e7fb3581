"""What PostgreSQL cannot store is refused before any SQL, with the path of the bad value (issue
25 D6), and a table's quoted name is never altered on its way into a statement (issue 25 D3).
Pure: no database (an engine that is never connected at most).

D6: a surrogate code point (``"\\ud800"``: not valid Unicode, no UTF-8 encoding) reached
PostgreSQL as the JSON escape ``\\ud800`` and came back as a raw ``DBAPIError: invalid input
syntax for type json``. The kernel's one rule (``ship_sqla.kernel._json_text``) now refuses it
wherever a NUL is refused: job payloads (``InvalidPayloadError``), outbox messages
(``OutboxPayloadError``), workflow values, keys and ids, webhook events, stored responses.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import MetaData, text
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    create_idempotency_store,
    create_outbox,
    define_job,
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
)
from ship_sqla._jobs._sql import JobStatements, claim
from ship_sqla._naming import fill, quoted_identifier, quoted_table, text_name
from ship_sqla._sql import _compacted, compact
from ship_sqla._sql.schema_probe import MISSING_RELATIONS
from ship_sqla._webhooks._store import check_webhook_json
from ship_sqla.errors import (
    ConfigurationError,
    IdempotencyKeyError,
    InvalidKeyError,
    InvalidPayloadError,
    OutboxPayloadError,
)
from ship_sqla.idempotency import StoredResponse
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json, unstorable_text
from ship_sqla.kernel._keys import require_key
from ship_sqla.kernel._plans.prepare import prepare_run
from ship_sqla.kernel._workflows import check_event_key, encode_event_payload

UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/ship_sqla_never_connected"


async def _noop(_ctx: Any, _payload: Any) -> None:
    return None


JOB = define_job("unstorable.job", _noop, payload=dict)


def _found(value: object) -> str | None:
    found = unstorable_json(value, encode_compact_json(value))
    return None if found is None else str(found)


# --- the kernel's rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem", "where"),
    [
        ({"x": "\ud800"}, "U+D800", "at payload['x']"),
        ({"x": ["ok", {"y": "a\udfffb"}]}, "U+DFFF", "at payload['x'][1]['y']"),
        ({"k\udc80": 1}, "U+DC80", "at the key 'k\\udc80' of payload"),
        ({"a": {"b": {"\ud83d": None}}}, "U+D83D", "at the key '\\ud83d' of payload['a']['b']"),
        (["\udbff"], "U+DBFF", "at payload[0]"),
        ("\ud800", "U+D800", "at payload"),
        ({"pair": "\ud83d\ude00"}, "U+D83D", "at payload['pair']"),  # two code points: not UTF-8
        ({"t": "a\x00b"}, "NUL", "at payload['t']"),
    ],
)
def test_a_string_jsonb_cannot_store_is_found_with_its_path(
    value: object, problem: str, where: str
) -> None:
    """D6 (issue 25): a NUL or a surrogate code point anywhere (a value or a key, at any
    depth) is found, and the finding names what it is and its path."""
    found = _found(value)
    assert found is not None
    assert problem in found
    assert found.endswith(where), found


@pytest.mark.parametrize(
    "value",
    [
        {"emoji": "😀", "accent": "tâches", "cjk": "漢字"},
        {"text": "\\ud800", "key\\udfff": "\\u0000"},  # the six characters, not the code points
        {"n": 1, "f": 1.5, "b": True, "none": None, 3: "int key"},
        [],
    ],
)
def test_storable_values_pass(value: object) -> None:
    """Valid Unicode, astral characters (escaped as surrogate PAIRS by the encoder) and the
    literal text ``\\ud800`` are storable."""
    assert _found(value) is None


def test_unstorable_text_names_what_it_holds() -> None:
    assert unstorable_text("plain") is None
    assert unstorable_text("tâches 😀") is None
    assert "NUL" in (unstorable_text("a\x00") or "")
    assert "U+D800" in (unstorable_text("a\ud800") or "")


# --- job payloads and keys ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"x": "\ud800"}, "payload['x']"),
        ({"x": [{"y\udfff": 1}]}, "the key 'y\\udfff' of payload['x'][0]"),
    ],
)
def test_a_job_payload_with_a_surrogate_is_invalid_payload(payload: Any, where: str) -> None:
    """J1/J2 enqueue, D6 (issue 25): a lone surrogate in a job payload is InvalidPayloadError
    (SHIP_SQLA_JOB_PAYLOAD_INVALID) from prepare_run, the one check every backend's enqueue
    makes before storing anything; the message names the path, the fix how to get valid
    text."""
    with pytest.raises(InvalidPayloadError) as caught:
        prepare_run(JOB, EnqueueRequest(payload))
    assert caught.value.code == "SHIP_SQLA_JOB_PAYLOAD_INVALID"
    assert where in caught.value.message
    assert "surrogate" in caught.value.message
    assert "surrogateescape" in (caught.value.fix or "")


async def test_the_in_memory_backend_refuses_it_too() -> None:
    """D6 (issue 25): the reference backend refuses the same payload with the same error and
    stores nothing (the rule is the kernel's)."""
    backend = InMemoryJobBackend()
    with pytest.raises(InvalidPayloadError, match="surrogate"):
        await backend.enqueue(JOB, {"x": "\udfff"})
    with pytest.raises(InvalidKeyError, match="surrogate"):
        await backend.enqueue(JOB, {}, run_id="r\ud800")
    assert (await backend.queue_depths([JOB.id]))[JOB.id].depth == 0


def test_a_key_with_a_surrogate_is_an_invalid_key() -> None:
    """D6 (issue 25): run ids, dedupe keys and every other caller-given key (require_key) must
    be text PostgreSQL can store; astral characters are fine."""
    with pytest.raises(InvalidKeyError, match="surrogate") as caught:
        require_key("a\ud800", "dedupe_key")
    assert caught.value.code == "SHIP_SQLA_KEY_INVALID"
    assert "dedupe_key" in caught.value.message
    assert require_key("😀" * 3, "dedupe_key") == "😀" * 3


# --- the outbox ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "headers", "where"),
    [
        ({"x": "\udfff"}, None, "payload['x']"),
        ({"ok": [1, {"k\ud800": 2}]}, None, "the key 'k\\ud800' of payload['ok'][1]"),
        ({}, {"h": "\ud800"}, "headers['h']"),
    ],
)
async def test_an_outbox_message_with_a_surrogate_is_refused_before_any_sql(
    payload: Any, headers: Any, where: str
) -> None:
    """O1, D6 (issue 25): a lone surrogate in an outbox payload or header is
    OutboxPayloadError naming its path, before any SQL (the engine is never connected)."""
    engine = create_async_engine(UNREACHABLE)
    try:
        outbox = create_outbox(database=engine, table=ship_outbox_table(MetaData()))
        with pytest.raises(OutboxPayloadError) as caught:
            await outbox.enqueue("o", "t", payload, headers=headers)
    finally:
        await engine.dispose()
    assert caught.value.code.startswith("SHIP_SQLA_OUTBOX_PAYLOAD")
    assert where in caught.value.message
    assert caught.value.fix


# --- workflows, webhooks, idempotency --------------------------------------------------------


def test_workflow_values_and_event_keys_with_a_surrogate_are_refused() -> None:
    """J23, D6 (issue 25): a workflow value (an event payload; step results go through the
    same encoder) or an event key holding a surrogate is a ConfigurationError naming it,
    before any statement."""
    with pytest.raises(ConfigurationError, match=r"value\['x'\]"):
        encode_event_payload({"x": "\ud800"})
    with pytest.raises(ConfigurationError, match="NUL"):
        encode_event_payload(["\x00"])
    with pytest.raises(ConfigurationError, match="surrogate"):
        check_event_key("k\udfff")
    assert encode_event_payload({"e": "😀"}) == '{"e":"\\ud83d\\ude00"}'


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"x": "\ud800"}, r"surrogate code point \(U\+D800, .*\) at payload\['x'\]"),
        ({"x": "a\x00"}, r"NUL character .* at payload\['x'\]"),
        ({"x": float("nan")}, "not JSON"),
        ({"x": object()}, "not JSON"),
    ],
)
def test_a_webhook_event_jsonb_cannot_store_is_refused(value: object, problem: str) -> None:
    """§6 webhook store, D6 (issue 25): record() checks the payload and headers with the
    kernel's rule before any SQL (the receiver answers such a body 400 with it)."""
    with pytest.raises(ConfigurationError, match=problem):
        check_webhook_json(value, "payload")


async def test_idempotency_keys_fingerprints_and_responses_with_a_surrogate_are_refused() -> None:
    """I1, D6 (issue 25): an idempotency key or fingerprint holding a surrogate is
    IdempotencyKeyError before any SQL (not UnicodeEncodeError from the driver), and a stored
    response whose header holds one is refused when it is made."""
    engine = create_async_engine(UNREACHABLE)
    try:
        store = create_idempotency_store(database=engine, table=ship_idempotency_table(MetaData()))
        with pytest.raises(IdempotencyKeyError):
            await store.begin("k\ud800", "fp")
        with pytest.raises(IdempotencyKeyError, match="surrogate"):
            await store.begin("k", "fp\udfff")
    finally:
        await engine.dispose()
    with pytest.raises(ConfigurationError, match="header 0's value"):
        StoredResponse(200, [("x-note", "\ud800")])
    with pytest.raises(ConfigurationError, match="NUL"):
        StoredResponse(200, {"x\x00": "v"})
    assert StoredResponse(200, {"x": "tâches 😀"}).headers == (("x", "tâches 😀"),)


# --- names in statements (D3) ------------------------------------------------------------------

ODD = ["jobs--v2", "a/*b*/c", 'q"uote', "it's", ":bind", "a\\:b", "pct%s", "{state}", "x::y"]


@pytest.mark.parametrize("name", ODD)
def test_a_quoted_name_reaches_the_compiled_statement_unaltered(name: str) -> None:
    """T1, D3 (issue 25): every job statement rendered for tables whose name and schema hold
    comment markers, quotes, colons (text()'s bind syntax), percent signs or a placeholder
    compiles, on asyncpg's dialect, to SQL holding the quoted names exactly as PostgreSQL
    quotes them, with the same bind parameters as for ordinary names (none made of a name)."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata, name=name, schema=name)
    state = ship_job_state_table(metadata, name=name + "_state", schema=name)
    runs_name, state_name = quoted_table(runs), quoted_table(state)
    assert "%%" not in runs_name
    dialect = PGDialect_asyncpg()  # type: ignore[no-untyped-call]
    odd = JobStatements.for_tables(runs, state)
    plain_metadata = MetaData()
    plain = JobStatements.for_tables(
        ship_job_runs_table(plain_metadata), ship_job_state_table(plain_metadata)
    )
    ordinary_statements = plain.every_statement()
    for statement_name, statement in odd.every_statement().items():
        compiled = statement.compile(dialect=dialect)
        ordinary = ordinary_statements[statement_name].compile(dialect=dialect)
        assert set(compiled.params) == set(ordinary.params), statement_name
        for table, quoted in (("ship_job_runs", runs_name), ("ship_job_state", state_name)):
            uses = str(ordinary).count(table) - str(ordinary).count(f"{table}_")
            assert str(compiled).count(quoted) >= uses, statement_name
    for quoted in (runs_name, state_name):
        assert str(text(text_name(quoted)).compile(dialect=dialect)) == quoted


def test_templates_are_compacted_before_names_are_put_in() -> None:
    """D3 (issue 25): for ordinary names, compacting the template first (what render does)
    sends the same text as compacting the filled statement (what it did before): only a name
    holding ``--`` differs, and is then kept whole. Compacting tracks double-quoted
    identifiers as well as literals."""
    metadata = MetaData()
    runs, state = ship_job_runs_table(metadata), ship_job_state_table(metadata)
    names = {"{runs}": quoted_table(runs), "{state}": quoted_table(state)}
    for template in (claim.CLAIM_FAIR_GATED_KEYED, MISSING_RELATIONS):
        assert fill(_compacted(template.sql), names) == compact(fill(template.sql, names))
    assert compact('SELECT "a--b" -- gone\n') == 'SELECT "a--b"\n'
    assert compact("SELECT 'it''s', \"q\"\"--x\" -- c\n") == "SELECT 'it''s', \"q\"\"--x\"\n"
    assert fill("{runs} {state} {other}", {"{runs}": "{state}", "{state}": "s"}) == (
        "{state} s {other}"
    )


@given(
    st.text(
        alphabet=st.sampled_from([*"ab_:\\\"'%$-;/*{}. é"]) | st.characters(codec="utf-8"),
        min_size=1,
        max_size=20,
    ).filter(lambda name: "\x00" not in name)
)
def test_text_name_is_exact_for_any_name(name: str) -> None:
    """D3 (issue 25): whatever a quoted name holds (colons before words, backslashes before
    colons, ``::``), text() compiles its escaped form back to the quoted name itself and finds
    no bind parameter in it."""
    quoted = quoted_identifier(name)
    statement = text("SELECT 1 FROM " + text_name(quoted) + " WHERE x = :x")
    compiled = statement.compile(dialect=PGDialect_asyncpg())  # type: ignore[no-untyped-call]
    assert str(compiled) == f"SELECT 1 FROM {quoted} WHERE x = $1"
    assert list(compiled.params) == ["x"]
