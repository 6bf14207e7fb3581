from ship_sqla._outbox import Outbox as Outbox
from ship_sqla._outbox import OutboxAdmin as OutboxAdmin
from ship_sqla._outbox import OutboxIntent as OutboxIntent
from ship_sqla._outbox import OutboxMessage as OutboxMessage
from ship_sqla._outbox import OutboxOperations as OutboxOperations
from ship_sqla._outbox import OutboxOutcome as OutboxOutcome
from ship_sqla._outbox import OutboxRecord as OutboxRecord
from ship_sqla._outbox import OutboxRelay as OutboxRelay
from ship_sqla._outbox import OutboxSink as OutboxSink
from ship_sqla._outbox import OutboxState as OutboxState
from ship_sqla._outbox import RedriveResult as RedriveResult
from ship_sqla._outbox import job_sink as job_sink

__all__ = (
    "Outbox",
    "OutboxAdmin",
    "OutboxIntent",
    "OutboxMessage",
    "OutboxOperations",
    "OutboxOutcome",
    "OutboxRecord",
    "OutboxRelay",
    "OutboxSink",
    "OutboxState",
    "RedriveResult",
    "job_sink",
)
