"""Jobs: the options of ``define_job`` (``RetryPolicy``, ``Concurrency``, ``Schedule``...), the
runtime, the operator gate (``JobOperations``) and the values they return, and the PostgreSQL
backend's type. Start from ``ship_sqla.define_job``, ``create_job_backend`` and
``start_job_runtime``; the errors are in :mod:`ship_sqla.errors`.
"""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
