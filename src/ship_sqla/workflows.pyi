from ship_sqla.kernel._evolution import Divergence as Divergence
from ship_sqla.kernel._evolution import PatchFigure as PatchFigure
from ship_sqla.kernel._evolution import PatchReport as PatchReport
from ship_sqla.kernel._evolution import StepCall as StepCall
from ship_sqla.kernel._workflows import ChildOutcome as ChildOutcome
from ship_sqla.kernel._workflows import EventWait as EventWait
from ship_sqla.kernel._workflows import StepKind as StepKind
from ship_sqla.kernel._workflows import StepRecord as StepRecord
from ship_sqla.kernel._workflows import StepRetry as StepRetry
from ship_sqla.kernel._workflows import WorkflowEvent as WorkflowEvent

__all__ = (
    "ChildOutcome",
    "Divergence",
    "EventWait",
    "PatchFigure",
    "PatchReport",
    "StepCall",
    "StepKind",
    "StepRecord",
    "StepRetry",
    "WorkflowEvent",
)
