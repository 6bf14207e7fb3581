from ship_sqla.kernel._workflows import ChildOutcome as ChildOutcome
from ship_sqla.kernel._workflows import EventWait as EventWait
from ship_sqla.kernel._workflows import StepKind as StepKind
from ship_sqla.kernel._workflows import StepRecord as StepRecord
from ship_sqla.kernel._workflows import StepRetry as StepRetry
from ship_sqla.kernel._workflows import WorkflowEvent as WorkflowEvent

__all__ = (
    "ChildOutcome",
    "EventWait",
    "StepKind",
    "StepRecord",
    "StepRetry",
    "WorkflowEvent",
)
