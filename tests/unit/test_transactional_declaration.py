"""J13's declaration: what ``define_job(..., transaction=, inbox=)`` accepts and refuses, the
in-memory unit of work's all-or-nothing rule, and the worker's connection-budget warning."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, Inbox
from ship_sqla.kernel import InMemoryInbox, InMemoryUnitOfWork
from ship_sqla.kernel._memory.transactions import InMemoryCommitError, active_transaction
from ship_sqla.kernel._runtime.runtime import warn_connection_budget
from ship_sqla.kernel._transactional import payload_fingerprint


async def handler(ctx, payload, repositories):
    pass


def test_j13_an_inbox_needs_a_transaction():
    """J13: an inbox mark must commit with something, so an inbox without transaction= is
    refused at definition, naming the fix."""
    with pytest.raises(ConfigurationError, match="an inbox needs transaction="):
        define_job("j13.noinbox", handler, inbox=Inbox(InMemoryInbox(), key=str))


def test_j13_transaction_must_be_a_unit_of_work():
    """J13: transaction= is anything with an async run(handler); other values are refused."""
    with pytest.raises(ConfigurationError, match="must be a unit of work"):
        define_job("j13.bad", handler, transaction=object())  # type: ignore[arg-type]


def test_j13_inbox_arguments_are_checked():
    """J13: an Inbox needs an inbox store and a key function; a bad ttl or prefix is refused."""
    with pytest.raises(ConfigurationError, match="inbox store"):
        Inbox(object(), key=str)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="key must be a function"):
        Inbox(InMemoryInbox(), key="order")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ttl"):
        Inbox(InMemoryInbox(), key=str, ttl=0)
    with pytest.raises(ConfigurationError, match="prefix"):
        Inbox(InMemoryInbox(), key=str, prefix=" ")
    inbox = Inbox(InMemoryInbox(), key=str, ttl=timedelta(days=1))
    assert inbox.ttl == 86400.0
    assert inbox.prefix_for("orders.charge") == "job:orders.charge"


def test_j13_the_default_fingerprint_ignores_key_order():
    """J13: the default inbox fingerprint hashes the stored payload as canonical JSON."""
    assert payload_fingerprint({"a": 1, "b": [1, 2]}) == payload_fingerprint({"b": [1, 2], "a": 1})
    assert payload_fingerprint({"a": 1}) != payload_fingerprint({"a": 2})


async def test_u1_the_in_memory_unit_of_work_undoes_a_raising_run():
    """U1, U4: writes registered in an in-memory run are undone when it raises, and its
    after-commit callbacks never run; a committed run keeps them and runs its callbacks."""
    rows: list[str] = []
    after: list[str] = []
    uow = InMemoryUnitOfWork()

    async def write(tx):
        rows.append("x")
        tx.on_rollback(rows.pop)

        async def later() -> None:
            after.append("ran")

        tx.after_commit(later)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await uow.run(write)
    assert (rows, after, uow.rollbacks) == ([], [], 1)

    async def ok(tx):
        rows.append("y")
        tx.on_rollback(rows.pop)
        assert active_transaction() is tx

        async def later() -> None:
            after.append("ran")

        tx.after_commit(later)

    await uow.run(ok)
    assert (rows, after, uow.commits) == (["y"], ["ran"], 1)
    assert active_transaction() is None


async def test_the_in_memory_commit_fault_models_a_lost_commit():
    """J13: ``commit_fault="after"`` commits and then raises (the COMMIT's answer lost);
    ``"before"`` raises and commits nothing."""
    rows: list[str] = []
    uow = InMemoryUnitOfWork()

    async def write(tx):
        rows.append("z")
        tx.on_rollback(rows.pop)

    uow.commit_fault = "before"
    with pytest.raises(InMemoryCommitError):
        await uow.run(write)
    assert rows == []
    uow.commit_fault = "after"
    with pytest.raises(InMemoryCommitError):
        await uow.run(write)
    assert rows == ["z"]


class _Sized:
    def __init__(self, capacity: int | None) -> None:
        self.connection_capacity = capacity

    async def run(self, handler):  # pragma: no cover - never run here
        return await handler(None)


def test_j13_the_worker_warns_when_transactional_jobs_outgrow_the_pool(caplog):
    """J13: a worker whose transactional jobs (sharing one unit of work) may hold as many
    connections at once as that unit of work's pool has warns, naming the jobs; within the
    budget, or with no bound known, it says nothing."""
    small = _Sized(5)
    jobs = [
        define_job("j13.a", handler, transaction=small, concurrency=Concurrency(max=3)),
        define_job("j13.b", handler, transaction=small, concurrency=Concurrency(max=3)),
    ]
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        warn_connection_budget(jobs, max_in_flight=100)
    [record] = caplog.records
    assert "j13.a, j13.b" in record.getMessage()
    assert "6 handlers" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        warn_connection_budget(jobs, max_in_flight=4)
        warn_connection_budget(
            [define_job("j13.c", handler, transaction=_Sized(None))], max_in_flight=100
        )
    assert caplog.records == []
