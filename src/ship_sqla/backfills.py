"""Paced backfills (SPEC §15, C4, C5): one pass over a table in key order, a page at a time, at a
declared rate, checkpointed per page, with a ledger, status and a deploy gate."""

from ship_sqla.kernel._lazy import attach_stub as _attach_stub

__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
