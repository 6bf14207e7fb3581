"""Durable workflows (SPEC §13): the values a workflow handler passes to and gets back from its
``ctx`` (``StepRetry``, ``WorkflowEvent``, ``ChildOutcome``...), and the steps operators list.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
