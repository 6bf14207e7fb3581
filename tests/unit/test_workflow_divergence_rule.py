"""D7/D8: the kernel's pure divergence rule (ship_sqla.kernel._evolution), the one the runtime,
the in-memory model and the replayer judge a workflow call by."""

from __future__ import annotations

import pickle

import pytest

from ship_sqla.errors import WorkflowChangedError, WorkflowDivergedError
from ship_sqla.kernel._evolution import (
    Divergence,
    StepCall,
    check_call,
    check_return,
    decode_recorded,
    divergence_of,
    patch_answer,
    patch_step_name,
)
from ship_sqla.workflows import Divergence as PublicDivergence

RUN = {"run_id": "r-1", "job_id": "wf.orders"}


def test_d7_a_call_replays_the_same_step_or_is_new_past_the_history() -> None:
    """D7: the same name and kind at the position replays; nothing stored there is a new call."""
    call = StepCall("charge", "transaction")
    assert divergence_of(**RUN, position=2, recorded=call, requested=call) is None
    assert divergence_of(**RUN, position=2, recorded=None, requested=call) is None


@pytest.mark.parametrize(
    ("recorded", "requested"),
    [
        (StepCall("charge", "transaction"), StepCall("reserve", "transaction")),  # rename
        (StepCall("charge", "transaction"), StepCall("charge", "step")),  # kind change
    ],
)
def test_d7_another_step_at_the_position_is_a_divergence_naming_all(
    recorded: StepCall, requested: StepCall
) -> None:
    """D7: another name or kind at the position is WorkflowDivergedError (a WorkflowChangedError,
    terminal) naming the run, the position, what was recorded, what was asked and file:line."""
    with pytest.raises(WorkflowDivergedError) as caught:
        check_call(**RUN, position=2, recorded=recorded, requested=requested, location="h.py:12")
    error = caught.value
    assert isinstance(error, WorkflowChangedError)
    assert error.code == "SHIP_SQLA_WORKFLOW_DIVERGED"
    assert error.divergence == Divergence(
        "r-1", "wf.orders", 2, "changed", recorded, requested, "h.py:12"
    )
    for part in ("'r-1'", "position 2", str(recorded), str(requested), "h.py:12", "Fix:"):
        assert part in str(error)


def test_d7_a_return_while_stored_steps_remain_is_a_divergence() -> None:
    """D7: a premature return: the history holds steps at and after the position reached."""
    check_return(**RUN, position=3, remaining=[])
    with pytest.raises(WorkflowDivergedError) as caught:
        check_return(
            **RUN,
            position=3,
            remaining=[StepCall("ship", "step"), StepCall("mail", "step")],
            location="h.py:1",
        )
    divergence = caught.value.divergence
    assert (divergence.reason, divergence.position, divergence.remaining) == ("returned", 3, 2)
    assert "returned" in str(caught.value)
    assert "2 more step(s)" in str(caught.value)


def test_d7_a_stored_result_the_codec_no_longer_decodes_is_a_divergence() -> None:
    """D7: the codec changed under a stored result: a ``codec`` divergence at the position."""
    call = StepCall("charge", "step")

    def strict(value: object) -> int:
        if not isinstance(value, int):
            raise TypeError("not an int")
        return value

    assert decode_recorded(strict, 5, **RUN, position=0, recorded=call) == 5
    with pytest.raises(WorkflowDivergedError) as caught:
        decode_recorded(strict, "five", **RUN, position=0, recorded=call)
    assert caught.value.divergence.reason == "codec"
    assert "not an int" in str(caught.value)


def test_d7_the_divergence_round_trips_json_and_pickle() -> None:
    """D7: a divergence survives JSON (a parked run's history, an export) and a pickle."""
    divergence = Divergence(
        "r", "j", 1, "changed", StepCall("a", "step"), StepCall("b", "sleep"), "f.py:3"
    )
    assert Divergence.from_json(divergence.to_json()) == divergence
    assert PublicDivergence is Divergence
    error = pickle.loads(pickle.dumps(WorkflowDivergedError(divergence)))  # noqa: S301
    assert error.divergence == divergence
    assert str(error) == str(WorkflowDivergedError(divergence))


def test_d8_patched_by_position_dbos_rule() -> None:
    """D8: its marker at the position: True (consumed); nothing there: new, True; another step
    there: the run passed the position before the patch existed, False."""
    marker = StepCall(patch_step_name("v2"), "patch")
    assert patch_answer(marker, "v2") == "marker"
    assert patch_answer(None, "v2") == "new"
    assert patch_answer(StepCall("charge", "step"), "v2") == "old"
    assert patch_answer(StepCall(patch_step_name("v1"), "patch"), "v2") == "old"
