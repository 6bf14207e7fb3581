"""D11: the workflow history file format (``ship_sqla.history/1``): a round trip keeps every
field, a redactor rewrites every payload and result, and a reader refuses anything else (another
format version above all) with a clear error naming the file. Pure: no database."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ship_sqla.errors import ConfigurationError, HistoryFormatError
from ship_sqla.kernel._history import (
    FORMAT,
    decode_history,
    encode_history,
    history_file_name,
    history_of,
)
from ship_sqla.kernel._ports import RunRecord
from ship_sqla.kernel._workflows import StepRecord
from ship_sqla.testing import History, HistoryStep, read_histories, read_history, write_history

T0 = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)


def _record(run_id: str = "order-1", payload: Any = None) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        job_id="orders.fulfil",
        state="waiting",
        payload={"order_id": "A-1", "email": "a@example.com"} if payload is None else payload,
        attempt=2,
        max_attempts=5,
        key=None,
        dedupe_key=None,
        run_at=T0,
        created_at=T0,
        updated_at=T0,
        finished_at=None,
        lease_expires_at=None,
        last_error=None,
        tenant="acme",
    )


def _steps() -> list[StepRecord]:
    def step(seq: int, name: str, kind: Any, result: Any, state: Any = "done") -> StepRecord:
        return StepRecord(
            run_id="order-1",
            name=name,
            seq=seq,
            kind=kind,
            state=state,
            result_json=None if result is None else json.dumps(result),
            wake_at=None,
            created_at=T0,
            finished_at=T0 if state == "done" else None,
        )

    return [
        # out of order on purpose: the history is in position order
        step(1, "reserve", "transaction", True),
        step(0, "charge", "transaction", {"charged": 2500, "card": "4242"}),
        StepRecord(
            run_id="order-1",
            name="shipped",
            seq=2,
            kind="event",
            state="waiting",
            result_json=None,
            wake_at=T0,
            created_at=T0,
            finished_at=None,
            event_name="order.shipped",
            event_key="A-1",
        ),
    ]


def test_d11_a_history_round_trips_through_its_file_text() -> None:
    """D11: every field of a history (run, payload, steps in position order, wait fields)
    survives encode -> decode, and the file says its format, its events and its frontier."""
    history = history_of(_record(), _steps())
    assert [step.position for step in history.steps] == [0, 1, 2]
    assert history.frontier == 3
    text = encode_history(history)
    data = json.loads(text)
    assert data["format"] == FORMAT == "ship_sqla.history/1"
    assert data["frontier"] == 3
    assert data["events"] == [
        {
            "position": 2,
            "step": "shipped",
            "event_name": "order.shipped",
            "event_key": "A-1",
            "event_id": None,
            "timed_out": False,
        }
    ]
    assert data["steps"][0]["result"] == {"charged": 2500, "card": "4242"}
    assert decode_history(text) == history


def test_d11_a_redactor_rewrites_every_payload_and_result() -> None:
    """D11: the export's redaction hook sees the payload and each step's result (named by
    ``where``), and what it returns is what the history holds; the file says it is redacted."""
    seen: list[str] = []

    def redact(where: str, value: Any) -> Any:
        seen.append(where)
        if where == "payload":
            return {**value, "email": "***"}
        if isinstance(value, dict) and "card" in value:
            return {**value, "card": "****"}
        return value

    history = history_of(_record(), _steps(), redact=redact)
    assert seen == ["payload", "result:charge", "result:reserve"]  # a waiting step holds none
    assert history.payload == {"order_id": "A-1", "email": "***"}
    assert history.steps[0].result == {"charged": 2500, "card": "****"}
    assert history.redacted
    assert decode_history(encode_history(history)).redacted


def test_d11_a_redactor_returning_what_is_not_json_is_refused() -> None:
    """D11: a redactor's answer must be JSON: anything else is a clear error with its fix."""
    with pytest.raises(ConfigurationError, match=r"redactor returned object for payload.*Fix:"):
        history_of(_record(), [], redact=lambda _where, _value: object())


def test_d11_another_format_version_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    """D11: a file of another format version (a newer ship_sqla's) is never misread: it is
    refused, naming the file, the version found, the one read, and the fix."""
    data = json.loads(encode_history(history_of(_record(), _steps())))
    data["format"] = "ship_sqla.history/2"
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(HistoryFormatError) as caught:
        read_history(path)
    text = str(caught.value)
    assert str(path) in text
    assert "format version is '2'" in text
    assert "reads version 1 only" in text
    assert "Fix:" in text
    assert caught.value.code == "SHIP_SQLA_HISTORY_FORMAT"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a ship_sqla history"),
        ('{"format": "temporal/1"}', "not a ship_sqla history"),
        ('{"format": "ship_sqla.history/1"}', "'run' is missing"),
        (
            '{"format": "ship_sqla.history/1", "run": {"run_id": 1, "job_id": "j"}, "steps": []}',
            "'run_id' is int, not str",
        ),
    ],
)
def test_d11_what_is_not_a_history_is_refused_naming_the_field(text: str, message: str) -> None:
    """D11: each refusal names the origin and what is wrong, with the fix."""
    with pytest.raises(HistoryFormatError, match=message) as caught:
        decode_history(text, origin="some.json")
    assert str(caught.value).startswith("SHIP_SQLA_HISTORY_FORMAT: some.json:")
    assert "Fix:" in str(caught.value)


def test_d11_steps_out_of_order_or_a_wrong_frontier_are_refused() -> None:
    """D11: positions are distinct and ascending, and the frontier agrees with them."""
    data = json.loads(encode_history(history_of(_record(), _steps())))
    data["frontier"] = 7
    with pytest.raises(HistoryFormatError, match="'frontier' is 7"):
        decode_history(json.dumps(data))
    data["frontier"] = 3
    data["steps"].reverse()
    with pytest.raises(HistoryFormatError, match="not distinct and ascending"):
        decode_history(json.dumps(data))
    data["steps"].reverse()
    data["steps"][0]["kind"] = "teleport"
    with pytest.raises(HistoryFormatError, match="kind 'teleport'"):
        decode_history(json.dumps(data))


def test_d11_the_frontier_is_the_first_position_not_held() -> None:
    """D11: a replay is judged up to the first position the history does not hold."""
    steps = (
        HistoryStep(0, "a", "step", "done", 1),
        HistoryStep(1, "b", "step", "done", 2),
        HistoryStep(3, "d", "step", "done", 4),
    )
    assert History("r", "j", None, steps).frontier == 2
    assert History("r", "j", None, ()).frontier == 0


def test_d11_one_file_per_run_with_safe_distinct_names(tmp_path: Path) -> None:
    """D11: each run is written to its own file in the directory, named from its job and run
    (a child run's id holds ``/``: the name stays one file, and distinct runs never share one);
    reading the directory gives them back in path order."""
    parent = history_of(_record("order-1"), _steps())
    child = history_of(_record("order-1/spawn/0"), [])
    other = history_of(_record("order-1_spawn_0"), [])
    names = {history_file_name(h) for h in (parent, child, other)}
    assert len(names) == 3
    assert all("/" not in name and name.endswith(".json") for name in names)
    assert history_file_name(parent) == "orders.fulfil__order-1.json"
    for history in (parent, child, other):
        write_history(tmp_path / "out", history)
    read = read_histories(tmp_path / "out")
    assert sorted(h.run_id for _, h in read) == sorted(
        ["order-1", "order-1/spawn/0", "order-1_spawn_0"]
    )
    assert {h.run_id: h for _, h in read}["order-1"] == parent
