"""How ``ship-sqla worker`` and ``ship-sqla outbox relay`` print their log: handlers and
formats only.

The lines themselves are written where the outcomes are known, on the ``ship_sqla.jobs`` logger
(``kernel/_runtime/run_log.py``; S3); the commands' own lines (started, stopping, absorbed
errors, the relay's failed publishes) on ``ship_sqla.worker`` and ``ship_sqla.relay``. This
module puts one stderr handler on the ``ship_sqla`` logger, the parent of all, in one of two
formats:

- ``text``: ``<UTC time> <LEVEL> <logger>: <message>``, one line per record (a traceback, at
  DEBUG only, follows on its own lines);
- ``json``: one JSON object per line for log shippers: ``ts`` (ISO-8601 UTC), ``level``,
  ``logger``, ``message``, then the record's facts (``event``, ``job_id``, ``run_id``,
  ``attempt``, ``max_attempts``, ``error``...) as top-level keys, and ``exception`` for a
  record logged with one.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, Literal

from ship_sqla.kernel._runtime.run_log import RECORD_FIELD

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "LogFormat", "configure_logging"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")

ROOT_LOGGER: Final = "ship_sqla"


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message_of(record),
        }
        facts = getattr(record, RECORD_FIELD, None)
        if isinstance(facts, dict):
            document.update({k: v for k, v in facts.items() if k not in document})
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def _message_of(record: logging.LogRecord) -> str:
    """The message without a traceback the text format appends (the JSON has its own key)."""
    message = record.getMessage()
    facts = getattr(record, RECORD_FIELD, None)
    if isinstance(facts, dict) and facts.get("traceback"):
        message = message.split("\n", 1)[0]
    return message


def configure_logging(level: str, log_format: LogFormat) -> logging.Handler:
    """One stderr handler on the ``ship_sqla`` logger at ``level``; returns it (to remove)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger(ROOT_LOGGER)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The lines are the worker's output: not also the application's root handlers'.
    root.propagate = False
    return handler
