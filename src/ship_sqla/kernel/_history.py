"""Workflow histories as files (SPEC §13, D11): the versioned JSON format a run's history is
exported to, recorded in, and replayed from.

A history is what a run's handler has to agree with when it replays: the run (job, version,
payload as stored) and its stored steps in position order (D7), each with its encoded result as
the step's ``result=`` codec stored it. The file format is ``ship_sqla.history/1``; a reader
refuses any other format version with :class:`HistoryFormatError` (a newer ship_sqla's file is
never misread by an older one, nor the other way round).

One file per run::

    {
      "format": "ship_sqla.history/1",
      "source": "export",                  # or "recorded" (pytest --ship-record-histories)
      "redacted": false,                   # true when a redactor rewrote payload or results
      "run": {"run_id": ..., "job_id": ..., "version": null, "state": "waiting", "attempt": 1,
              "tenant": null, "parent_id": null, "created_at": "2026-12-06T18:00:00+00:00"},
      "payload": {...},                    # the stored (encoded) payload
      "steps": [{"position": 0, "name": "charge", "kind": "transaction", "status": "done",
                 "result": "charged 2500", "wake_at": null, "event_name": null,
                 "event_key": null, "created_at": "...", "finished_at": "..."}, ...],
      "events": [{"position": 2, "step": "shipped", "event_name": "order.shipped",
                  "event_key": "A-1", "event_id": 7, "timed_out": false}],
      "frontier": 4                        # the first position the history does not hold
    }

``events`` (the outcome of each event wait) and ``frontier`` are derived from ``steps``; a reader
checks them against it. The format is pure data: the kernel writes and reads it, the replayer
(:mod:`ship_sqla.testing`) answers a handler's calls from it, and the export
(:meth:`JobOperations.export_history <ship_sqla.kernel.JobOperations.export_history>`) fills it
from a backend.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import attrs

from ship_sqla.kernel._errors import ConfigurationError, UsageError
from ship_sqla.kernel._json_text import encode_compact_json
from ship_sqla.kernel._workflows import StepRecord

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ship_sqla.kernel._ports import ClaimedRun, RunRecord

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "History",
    "HistoryFormatError",
    "HistoryStep",
    "Redactor",
    "decode_history",
    "encode_history",
    "history_file_name",
    "history_of",
    "history_of_claim",
    "read_histories",
    "read_history",
    "write_history",
]

FORMAT_VERSION: Final = 1
"""The version of the history file format this ship_sqla writes and reads."""
_FORMAT_PREFIX: Final = "ship_sqla.history/"
FORMAT: Final = f"{_FORMAT_PREFIX}{FORMAT_VERSION}"
"""The ``format`` field of every history file this ship_sqla writes."""

HistorySource = Literal["export", "recorded"]
StepStatus = Literal["done", "waiting"]
_KINDS: Final = frozenset({"step", "transaction", "sleep", "event", "spawn", "children", "patch"})
_SAFE_NAME: Final = re.compile(r"[^A-Za-z0-9._-]")
_MAX_FILE_STEM: Final = 120
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

Redactor: TypeAlias = "Callable[[str, Any], Any]"
"""``redact(where, value) -> value``: applied to every payload (``where == "payload"``) and
every step result (``where == "result:<step name>"``) before a history is written; it returns
the JSON value to write instead. Redact leaves (names, e-mails, card numbers), never the values
the handler branches on: a replay of a history whose control fields were rewritten diverges
where the production run did not."""


class HistoryFormatError(UsageError, ValueError):
    """A history file is not one this ship_sqla reads (D11): not JSON, not a history, another
    format version, or a field of the wrong shape. Names the file and the field."""

    code = "SHIP_SQLA_HISTORY_FORMAT"


@attrs.frozen
class HistoryStep:
    """One stored step of a history (D11): its ``position`` (D7), ``name``, ``kind``,
    ``status`` (``done``, or ``waiting`` for a sleep or wait not over), ``result`` (the encoded
    JSON value its codec stored; None while waiting), and what a wait waits for."""

    position: int
    name: str
    kind: str
    status: StepStatus
    result: Any = None
    wake_at: datetime | None = None
    event_name: str | None = None
    event_key: str | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None

    def record(self, run_id: str) -> StepRecord:
        """The step as a store would answer it (never ``due``: a replay stops at a wait not
        over rather than ending it)."""
        return StepRecord(
            run_id=run_id,
            name=self.name,
            seq=self.position,
            kind=self.kind,  # type: ignore[arg-type]
            state=self.status,
            result_json=None if self.result is None else encode_compact_json(self.result),
            wake_at=self.wake_at,
            created_at=self.created_at or _EPOCH,
            finished_at=self.finished_at,
            event_name=self.event_name,
            event_key=self.event_key,
            due=False,
        )


@attrs.frozen
class History:
    """One run's history (D11): the run, its stored payload, and its steps in position order."""

    run_id: str
    job_id: str
    payload: Any
    steps: tuple[HistoryStep, ...] = ()
    version: int | None = None
    state: str | None = None
    attempt: int = 1
    tenant: str | None = None
    parent_id: str | None = None
    created_at: datetime | None = None
    source: HistorySource = "export"
    redacted: bool = False

    @property
    def frontier(self) -> int:
        """The first position the history does not hold: a replay is judged up to here."""
        held = {step.position for step in self.steps}
        position = 0
        while position in held:
            position += 1
        return position

    @property
    def events(self) -> list[dict[str, Any]]:
        """Each event wait's outcome (derived from the steps): its event, or its timeout, or
        nothing yet (``event_id`` None, ``timed_out`` false)."""
        found = []
        for step in self.steps:
            if step.kind != "event":
                continue
            result = step.result if isinstance(step.result, dict) else {}
            event = result.get("event") if isinstance(result.get("event"), dict) else None
            found.append(
                {
                    "position": step.position,
                    "step": step.name,
                    "event_name": step.event_name,
                    "event_key": step.event_key,
                    "event_id": None if event is None else event.get("id"),
                    "timed_out": result.get("timeout") is True,
                }
            )
        return found


def _redacted(redact: Redactor | None, where: str, value: Any) -> Any:  # noqa: ANN401 - JSON
    if redact is None or value is None:
        return value
    replaced = redact(where, value)
    try:
        encode_compact_json(replaced)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"the redactor returned {type(replaced).__name__} for {where}, which is not JSON:"
            f" {exc}.",
            fix="return a JSON-able value (dict, list, str, numbers, bool, None) from redact().",
        ) from exc
    return replaced


def _steps_of(steps: Iterable[StepRecord], redact: Redactor | None) -> tuple[HistoryStep, ...]:
    return tuple(
        HistoryStep(
            position=step.seq,
            name=step.name,
            kind=step.kind,
            status=step.state,
            result=_redacted(redact, f"result:{step.name}", step.result),
            wake_at=step.wake_at,
            event_name=step.event_name,
            event_key=step.event_key,
            created_at=step.created_at,
            finished_at=step.finished_at,
        )
        for step in sorted(steps, key=lambda s: s.seq)
    )


def _version_of(run: RunRecord | ClaimedRun) -> int | None:
    """The handler version a run recorded (D9), where the run's record carries one."""
    version = getattr(run, "handler_version", None)
    return version if isinstance(version, int) else None


def history_of(
    record: RunRecord,
    steps: Sequence[StepRecord],
    *,
    redact: Redactor | None = None,
    version: int | None = None,
) -> History:
    """A run's history (D11, ``source="export"``) from its record and its stored steps; its
    handler version is the record's (D9) unless ``version`` names one."""
    return History(
        run_id=record.run_id,
        job_id=record.job_id,
        payload=_redacted(redact, "payload", record.payload),
        steps=_steps_of(steps, redact),
        version=_version_of(record) if version is None else version,
        state=record.state,
        attempt=record.attempt,
        tenant=record.tenant,
        parent_id=record.parent_id,
        created_at=record.created_at,
        source="export",
        redacted=redact is not None,
    )


def history_of_claim(
    run: ClaimedRun,
    steps: Iterable[StepRecord],
    *,
    state: str | None = None,
    redact: Redactor | None = None,
) -> History:
    """A run's history as one execution saw it (``source="recorded"``): what a test run's
    workflow loaded and stored (``pytest --ship-record-histories``)."""
    return History(
        run_id=run.run_id,
        job_id=run.job_id,
        payload=_redacted(redact, "payload", run.payload),
        steps=_steps_of(steps, redact),
        version=_version_of(run),
        state=state,
        attempt=run.attempt,
        tenant=run.tenant,
        created_at=run.created_at,
        source="recorded",
        redacted=redact is not None,
    )


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def history_json(history: History) -> dict[str, Any]:
    """``history`` as the JSON object its file holds."""
    return {
        "format": FORMAT,
        "source": history.source,
        "redacted": history.redacted,
        "run": {
            "run_id": history.run_id,
            "job_id": history.job_id,
            "version": history.version,
            "state": history.state,
            "attempt": history.attempt,
            "tenant": history.tenant,
            "parent_id": history.parent_id,
            "created_at": _when(history.created_at),
        },
        "payload": history.payload,
        "steps": [
            {
                "position": step.position,
                "name": step.name,
                "kind": step.kind,
                "status": step.status,
                "result": step.result,
                "wake_at": _when(step.wake_at),
                "event_name": step.event_name,
                "event_key": step.event_key,
                "created_at": _when(step.created_at),
                "finished_at": _when(step.finished_at),
            }
            for step in history.steps
        ],
        "events": history.events,
        "frontier": history.frontier,
    }


def encode_history(history: History) -> str:
    """The file text of ``history``: indented JSON, keys in a stable order (diffs stay small)."""
    return json.dumps(history_json(history), indent=2, ensure_ascii=False) + "\n"


class _Reader:
    """Reads one history's JSON object, every refusal naming the file and the field."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, what: str, fix: str) -> HistoryFormatError:
        return HistoryFormatError(f"{self.origin}: {what}", fix=fix)

    def field(self, data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:  # noqa: ANN401
        if name not in data:
            raise self.fail(f"the field {name!r} is missing.", fix=_REEXPORT)
        value = data[name]
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise self.fail(
                f"the field {name!r} is {type(value).__name__}, not {_kind_name(kind)}.",
                fix=_REEXPORT,
            )
        return value

    def optional(self, data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:  # noqa: ANN401
        if data.get(name) is None:
            return None
        return self.field(data, name, kind)

    def when(self, data: dict[str, Any], name: str) -> datetime | None:
        text = self.optional(data, name, str)
        if text is None:
            return None
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            raise self.fail(
                f"the field {name!r} is {text!r}, not an ISO-8601 time.", fix=_REEXPORT
            ) from None


_REEXPORT: Final = (
    "export the run again (`ship-sqla workflows export`) or record it again (`pytest"
    " --ship-record-histories DIR`); a history file is written by ship_sqla, not by hand."
)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _check_format(reader: _Reader, data: object) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("format"), str):
        raise reader.fail(
            "not a ship_sqla history (no 'format' field).",
            fix=f"pass a file written by `ship-sqla workflows export` ({FORMAT}).",
        )
    given = data["format"]
    if not given.startswith(_FORMAT_PREFIX):
        raise reader.fail(
            f"the format is {given!r}, not a ship_sqla history.",
            fix=f"pass a file written by `ship-sqla workflows export` ({FORMAT}).",
        )
    if given != FORMAT:
        raise reader.fail(
            f"the history format version is {given.removeprefix(_FORMAT_PREFIX)!r}; this"
            f" ship_sqla reads version {FORMAT_VERSION} only ({FORMAT}).",
            fix="replay it with the ship_sqla release that wrote it, or export the run again"
            " with this one.",
        )
    return data


def _step_of(reader: _Reader, data: object) -> HistoryStep:
    if not isinstance(data, dict):
        raise reader.fail(f"a step is {type(data).__name__}, not an object.", fix=_REEXPORT)
    kind = reader.field(data, "kind", str)
    status = reader.field(data, "status", str)
    if kind not in _KINDS or status not in ("done", "waiting"):
        raise reader.fail(
            f"step {data.get('name')!r} has kind {kind!r} and status {status!r}; kinds are"
            f" {sorted(_KINDS)}, statuses done and waiting.",
            fix=_REEXPORT,
        )
    return HistoryStep(
        position=reader.field(data, "position", int),
        name=reader.field(data, "name", str),
        kind=kind,
        status=status,
        result=data.get("result"),
        wake_at=reader.when(data, "wake_at"),
        event_name=reader.optional(data, "event_name", str),
        event_key=reader.optional(data, "event_key", str),
        created_at=reader.when(data, "created_at"),
        finished_at=reader.when(data, "finished_at"),
    )


def _history_from(reader: _Reader, data: dict[str, Any]) -> History:
    run = reader.field(data, "run", dict)
    steps = tuple(_step_of(reader, step) for step in reader.field(data, "steps", list))
    positions = [step.position for step in steps]
    if positions != sorted(set(positions)) or any(p < 0 for p in positions):
        raise reader.fail(
            f"the steps' positions {positions} are not distinct and ascending.", fix=_REEXPORT
        )
    source = data.get("source", "export")
    attempt = reader.optional(run, "attempt", int)
    history = History(
        run_id=reader.field(run, "run_id", str),
        job_id=reader.field(run, "job_id", str),
        payload=data.get("payload"),
        steps=steps,
        version=reader.optional(run, "version", int),
        state=reader.optional(run, "state", str),
        attempt=1 if attempt is None else attempt,
        tenant=reader.optional(run, "tenant", str),
        parent_id=reader.optional(run, "parent_id", str),
        created_at=reader.when(run, "created_at"),
        source="recorded" if source == "recorded" else "export",
        redacted=data.get("redacted") is True,
    )
    frontier = data.get("frontier", history.frontier)
    if frontier != history.frontier:
        raise reader.fail(
            f"the field 'frontier' is {frontier!r}, but the steps hold positions up to"
            f" {history.frontier}.",
            fix=_REEXPORT,
        )
    return history


def decode_history(text: str | bytes, *, origin: str = "history") -> History:
    """The history a file's ``text`` holds; :class:`HistoryFormatError` (naming ``origin``) for
    anything else, another format version included."""
    reader = _Reader(origin)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise reader.fail(f"not JSON ({exc}).", fix=_REEXPORT) from None
    return _history_from(reader, _check_format(reader, data))


def _safe(text: str) -> str:
    safe = _SAFE_NAME.sub("_", text)
    if safe == text and len(text) <= _MAX_FILE_STEM // 2:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[: _MAX_FILE_STEM // 2 - 11]}-{digest}"


def history_file_name(history: History) -> str:
    """The file name of ``history`` in an export directory: ``<job>__<run>.json``, made of
    letters, digits and ``._-`` (a run id with other characters gets a digest, so two runs never
    share a file)."""
    return f"{_safe(history.job_id)}__{_safe(history.run_id)}.json"


def write_history(directory: str | Path, history: History) -> Path:
    """Write ``history`` to its file in ``directory`` (created when missing); the file's
    path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / history_file_name(history)
    path.write_text(encode_history(history), encoding="utf-8")
    return path


def read_history(path: str | Path) -> History:
    """The history in the file at ``path`` (:class:`HistoryFormatError` naming it otherwise)."""
    file = Path(path)
    return decode_history(file.read_bytes(), origin=str(file))


def read_histories(directory: str | Path, pattern: str = "*.json") -> list[tuple[Path, History]]:
    """Every history file matching ``pattern`` under ``directory``, in path order."""
    return [(path, read_history(path)) for path in sorted(Path(directory).glob(pattern))]
