"""The job tables: runs (one row per run), state (one row per job id) and workers (one row per
live worker runtime, F6).

Every index is partial and serves a named statement in :mod:`ship_sqla._jobs._sql`; the
predicates below are the exact words those statements use, because PostgreSQL uses a partial
index only when the query's predicate implies the index's (and a generic prepared plan can prove
that only from literals, never from ``$1``). Every name is explicit, derived from the table name
and wrapped in ``conv()`` so an application's naming convention cannot rename it (T1).

Queue tables churn: each run is inserted, updated two or three times and deleted by ``cleanup``.
So every factory here declares the autovacuum options its table needs (J21,
:mod:`ship_sqla._storage_options`: a fixed vacuum threshold instead of a fraction of the table,
no cost delay; the state table's HOT updates get a fillfactor), which ``create_all``, ``schema
apply`` and Alembic's ``op.create_table`` set and the schema check compares. Avoid long
transactions on the database all the same: dead tuples are kept for the oldest open snapshot,
and the claim's index scans walk over them (J22 reports it: ``ship.db.horizon.age``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP
from sqlalchemy.schema import CreateIndex

from ship_sqla._jobs._history_ddl import HISTORY_INFO, declare_history_retention
from ship_sqla._naming import derived_name, derived_names
from ship_sqla._storage_options import (
    CHURN_OPTIONS,
    HOT_ROW_OPTIONS,
    LIVE_RUNS_OPTIONS,
    declare_storage_options,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._ports import FINISHED_STATES, RUN_STATES

if TYPE_CHECKING:
    from ship_sqla.kernel._jobs import Retention

__all__ = [
    "DEDUPE_PREDICATE",
    "DUE_PREDICATE",
    "FINISHED_PREDICATE",
    "LEASE_PREDICATE",
    "PARENT_PREDICATE",
    "PARKED_PREDICATE",
    "PROGRESS_PREDICATE",
    "RUN_STATES",
    "SAMPLER_PREDICATE",
    "VERSION_PREDICATE",
    "WAIT_PREDICATE",
    "fair_claims_ddl",
    "fair_claims_index_name",
    "partitioned_claims_ddl",
    "partitioned_claims_index_names",
    "ship_job_events_table",
    "ship_job_history_table",
    "ship_job_runs_table",
    "ship_job_state_table",
    "ship_job_steps_table",
    "ship_job_workers_table",
]

_TERMINAL = ", ".join(f"'{state}'" for state in FINISHED_STATES)

DUE_PREDICATE = "state = 'waiting'"
"""``<runs>_due_idx``: waiting runs (due or delayed) of one job in ``(priority, run_at, seq)``
order (the claim walks its priority levels from the highest down, K6)."""
LEASE_PREDICATE = "state = 'running'"
"""``<runs>_lease_idx``: running runs of one job in ``lease_expires_at`` order."""
DEDUPE_PREDICATE = "dedupe_key IS NOT NULL AND state IN ('waiting', 'running')"
"""``<runs>_dedupe_idx`` (unique): one non-terminal run per (job, dedupe key) (J1)."""
FINISHED_PREDICATE = f"state IN ({_TERMINAL})"
"""``<runs>_finished_idx``: terminal runs of one job in ``finished_at`` order, for cleanup;
``<runs>_browse_idx``: terminal runs of one state and job in ``created_at`` order, for the
dashboard's pages of finished runs (S2)."""
PARENT_PREDICATE = "parent_id IS NOT NULL"
"""``<runs>_parent_idx``: child runs of a workflow run by state (D5: the live-children check,
the outcomes a parent reads)."""
WAIT_PREDICATE = "wait_for IS NOT NULL"
"""``<runs>_wait_idx``: suspended workflow runs by what they wait for (D4: a publish wakes its
waiters through it, not by scanning steps)."""
PARKED_PREDICATE = "wait_for = '#diverged'"
"""``<runs>_parked_idx``: the runs parked on a divergence (D10), by (job, id)."""
VERSION_PREDICATE = "handler_version IS NOT NULL AND state IN ('waiting', 'running')"
"""``<runs>_version_idx``: the live runs of versioned jobs by (job, handler version, state), for
D9's gauges and deploy check (VERSION_COUNTS); an unversioned job's runs never enter it."""
PROGRESS_PREDICATE = "progress IS NOT NULL"
"""``<runs>_progress_idx``: the runs that recorded a consumer's progress (C3), by job and key,
newest first: the dashboard's Consumers page reads each key's latest."""

_TSTZ = TIMESTAMP(timezone=True)


def ship_job_runs_table(
    metadata: MetaData,
    name: str = "ship_job_runs",
    schema: str | None = None,
    *,
    fair_claims: bool = False,
    partitioned_claims: bool = False,
    partition_keys: bool = False,
) -> Table:
    """The job runs table, added to ``metadata`` so Alembic autogenerate sees it.

    ``partitioned_claims=True`` (F8, F9) adds what claims of a job with a per-tenant limit
    (``RateLimit(..., partition="tenant")``, ``Concurrency(max=N, partition="tenant")``) read:
    ``<runs>_tenant_idx`` (as ``fair_claims=True``) and ``<runs>_running_idx``
    (``job_id, tenant_id`` over running runs: each tenant's running runs, counted up to its
    cap). A backend refuses such a job on a runs table without them, naming their DDL.
    ``partition_keys=True`` adds the same two for limits per partition key (``partition="key"``):
    ``<runs>_part_idx`` (``job_id, partition_key, run_at, seq`` over waiting runs) and
    ``<runs>_part_run_idx`` (``job_id, partition_key`` over running runs).

    ``fair_claims=True`` adds ``<runs>_tenant_idx`` (``job_id, tenant_id, run_at, seq`` over
    waiting runs), which claims of a job with ``fairness=`` read (F2) and nothing else does.
    Every waiting run of every job enters it, at about a quarter of a bulk enqueue's server
    time, so it is off unless asked for: declare it when some job on the table is fair. A
    backend refuses a fair job on a runs table without it (:class:`ConfigurationError`, before
    the worker claims anything), naming the DDL that adds it.

    Columns: ``id`` text pk (a uuid, or a durable ``<job_id>/<occurrence>``); ``seq`` (identity:
    creation order, the claim's tie-break); ``job_id``;
    ``state`` (waiting | running | completed | dead | discarded | cancelled); ``payload`` jsonb;
    ``key`` (single-runner key) and ``dedupe_key`` text null; ``attempt`` (attempts started) and
    ``max_attempts``; ``run_at`` (due time), ``created_at``, ``updated_at``, ``finished_at``;
    the lease: ``lease_expires_at``, ``lease_token`` (the fencing token, new at every claim),
    ``claimed_by``; ``last_error`` and ``history`` (jsonb array, one entry per failed attempt);
    ``priority`` (smallint, higher first, K6) and ``trace_context`` (jsonb null: the enqueue's
    W3C trace context, K7); ``snoozes`` (int, the run's snoozes, K4); ``cancel_requested_at``
    (when an operator asked to cancel the running run, K2); ``tenant_id`` (text null: the tenant
    it was enqueued for, F2); ``parent_id`` (text null: the workflow run that spawned it, D5);
    ``wait_for`` (text null: what a suspended workflow run waits for, D4, D5); ``lapses`` and
    ``consecutive_lapses`` (int: the claims that found the run's lease lapsed, in all and since
    its handler last settled it, J15); ``progress`` (jsonb null: a consumer's per-key run's
    last committed batch, C3: ``lag``, ``last_batch_at``, ``batches``, ``items``, written in the
    batch's transaction and kept when the run ends); ``partition_key`` (text null: the run's
    partition key, for a job whose limits are per key, F8/F9); ``handler_version`` (integer
    null: the handler version the run was enqueued under, D9; NULL for an unversioned job's run).
    """
    n = derived_names(
        name,
        (
            "_pkey",
            "_state_check",
            "_due_idx",
            "_lease_idx",
            "_dedupe_idx",
            "_finished_idx",
            "_tenant_idx",
            "_running_idx",
            "_part_idx",
            "_part_run_idx",
            "_parent_idx",
            "_wait_idx",
            "_browse_idx",
            "_progress_idx",
            "_version_idx",
            "_parked_idx",
        ),
        "job runs",
        schema=schema,
    )
    states = ", ".join(f"'{s}'" for s in RUN_STATES)
    table = Table(
        name,
        metadata,
        Column("id", Text, nullable=False),
        # Creation order, for FIFO among runs due at the same instant (durable and caller-given
        # ids do not sort in creation order; this does, across processes).
        Column("seq", BigInteger, Identity(always=False), nullable=False),
        Column("job_id", Text, nullable=False),
        Column("state", Text, nullable=False, server_default=text("'waiting'")),
        Column("payload", JSONB, nullable=False),
        Column("key", Text, nullable=True),
        Column("dedupe_key", Text, nullable=True),
        Column("attempt", Integer, nullable=False, server_default=text("0")),
        Column("max_attempts", Integer, nullable=False),
        Column("run_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("finished_at", _TSTZ, nullable=True),
        Column("lease_expires_at", _TSTZ, nullable=True),
        Column("lease_token", BigInteger, nullable=True),
        Column("claimed_by", Text, nullable=True),
        Column("last_error", Text, nullable=True),
        Column("history", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
        # K2: when an operator asked to cancel the run while it was running (NULL otherwise).
        Column("cancel_requested_at", _TSTZ, nullable=True),
        # K6: higher first; bounded by the kernel (MIN_PRIORITY..MAX_PRIORITY).
        Column("priority", SmallInteger, nullable=False, server_default=text("0")),
        # K7: the W3C trace context of the enqueue ({"traceparent": ..., "tracestate": ...});
        # NULL when no span was current.
        Column("trace_context", JSONB, nullable=True),
        # K4: how many times the run snoozed (no attempt spent); the kernel bounds it.
        Column("snoozes", Integer, nullable=False, server_default=text("0")),
        # F2: the tenant of the unit of work (or run) that enqueued it; NULL for none.
        Column("tenant_id", Text, nullable=True),
        # D5: the workflow run that spawned this one; D4, D5: what a suspended run waits for.
        Column("parent_id", Text, nullable=True),
        Column("wait_for", Text, nullable=True),
        # J15: the claims that found the run's lease lapsed (its holder died), in all and since
        # its handler last settled it (RetryPolicy.max_lapses bounds the second).
        Column("lapses", Integer, nullable=False, server_default=text("0")),
        Column("consecutive_lapses", Integer, nullable=False, server_default=text("0")),
        # C3: a consumer's per-key run's last committed batch (lag, time, counts), written in
        # the batch's own transaction; NULL for every other run.
        Column("progress", JSONB, nullable=True),
        # F8/F9: the run's partition key (text null), for a job whose limits are per key.
        Column("partition_key", Text, nullable=True),
        # D9: the handler version the run was enqueued under; NULL for an unversioned job.
        Column("handler_version", Integer, nullable=True),
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        CheckConstraint(f"state IN ({states})", name=n["_state_check"]),
        # Serves CLAIM's walk over the priority levels (K6: the next lower level, one entry;
        # then that level's due runs, run_at <= now, ORDER BY run_at, seq: creation order breaks
        # ties) and ENQUEUE's bounded depth count (J2): both read only this job's waiting
        # entries.
        Index(
            n["_due_idx"],
            "job_id",
            "priority",
            "run_at",
            "seq",
            postgresql_where=text(DUE_PREDICATE),
        ),
        # Serves CLAIM's lapsed-lease scan and its count of live leases (concurrency.max).
        Index(
            n["_lease_idx"], "job_id", "lease_expires_at", postgresql_where=text(LEASE_PREDICATE)
        ),
        # Serves ENQUEUE's ON CONFLICT (J1) and its lookup of the existing run.
        Index(
            n["_dedupe_idx"],
            "job_id",
            "dedupe_key",
            unique=True,
            postgresql_where=text(DEDUPE_PREDICATE),
        ),
        # Serves CLEANUP's bounded deletes of finished runs past retention.
        Index(
            n["_finished_idx"], "job_id", "finished_at", postgresql_where=text(FINISHED_PREDICATE)
        ),
        # Serves WAKE_PARENTS' and SUSPEND_RUN's live-children check and CHILDREN (D5).
        Index(n["_parent_idx"], "parent_id", "state", postgresql_where=text(PARENT_PREDICATE)),
        # Serves PUBLISH_EVENT's wake of the runs waiting for the event (D4).
        Index(n["_wait_idx"], "wait_for", postgresql_where=text(WAIT_PREDICATE)),
        # Serves the dashboard's pages of finished runs (S2, LIST_FINISHED_*): one finished
        # state's runs of one job newest first, and the loose scan over the jobs with runs in
        # that state. Partial on the finished states, so a run enters it once, when it finishes:
        # the hot path (enqueue, claim, heartbeat) never writes it. The live states' pages read
        # the indexes their claims keep: waiting <runs>_due_idx (claim order, LIST_WAITING_*),
        # running <runs>_lease_idx (lease order, LIST_RUNNING_*).
        Index(
            n["_browse_idx"],
            "state",
            "job_id",
            "created_at",
            "id",
            postgresql_where=text(FINISHED_PREDICATE),
        ),
        # Serves the dashboard's Consumers page (C3, CONSUMER_PROGRESS): the loose scan over
        # the (consumer, key) pairs with progress and each key's latest such run. Only
        # consumer runs that committed a batch enter it.
        Index(
            n["_progress_idx"],
            "job_id",
            "key",
            "seq",
            postgresql_where=text(PROGRESS_PREDICATE),
        ),
        # Serves VERSION_COUNTS (D9: live runs per job, version and state, an index-only loose
        # scan) and the deploy check. Only versioned jobs' live runs enter it.
        Index(
            n["_version_idx"],
            "job_id",
            "handler_version",
            "state",
            postgresql_where=text(VERSION_PREDICATE),
        ),
        # Serves LIST_PARKED, UNPARK_BATCH (D10): only runs parked on a divergence enter it.
        Index(n["_parked_idx"], "job_id", "id", postgresql_where=text(PARKED_PREDICATE)),
        schema=schema,
        comment="ship_sqla job runs (ship_job_runs_table)",
    )
    if fair_claims or partitioned_claims:
        # Serves a fair claim (F2, CLAIM_FAIR*) and a partitioned one (F8/F9,
        # CLAIM_PARTITIONED*): the loose scan over the tenants with waiting runs, each tenant's
        # count of due runs and its oldest due runs (run_at, seq order).
        Index(
            n["_tenant_idx"],
            table.c.job_id,
            table.c.tenant_id,
            table.c.run_at,
            table.c.seq,
            postgresql_where=text(DUE_PREDICATE),
        )
    if partitioned_claims:
        # Serves a partitioned claim's count of each tenant's running runs, up to its cap (F9,
        # CLAIM_PARTITIONED*).
        Index(
            n["_running_idx"],
            table.c.job_id,
            table.c.tenant_id,
            postgresql_where=text(LEASE_PREDICATE),
        )
    if partition_keys:
        # Serves a claim of a job whose limits are per partition key (F8/F9,
        # CLAIM_PARTITIONED_BY_KEY*): as the two tenant indexes above, on partition_key.
        Index(
            n["_part_idx"],
            table.c.job_id,
            table.c.partition_key,
            table.c.run_at,
            table.c.seq,
            postgresql_where=text(DUE_PREDICATE),
        )
        Index(
            n["_part_run_idx"],
            table.c.job_id,
            table.c.partition_key,
            postgresql_where=text(LEASE_PREDICATE),
        )
    # J21: no update of a run can be HOT (each changes an indexed column), so no fillfactor;
    # every vacuum cleans the indexes (LIVE_RUNS_OPTIONS).
    return declare_storage_options(table, LIVE_RUNS_OPTIONS)


def partitioned_claims_index_names(runs: Table, *, by_key: bool = False) -> tuple[str, str]:
    """``<runs>_tenant_idx`` and ``<runs>_running_idx`` (``by_key``: ``<runs>_part_idx`` and
    ``<runs>_part_run_idx``): the indexes a partitioned claim reads (F8, F9), as
    ``ship_job_runs_table(..., partitioned_claims=True)`` (``partition_keys=True``) names
    them."""
    if by_key:
        return (
            str(derived_name(runs.name, "_part_idx")),
            str(derived_name(runs.name, "_part_run_idx")),
        )
    return (
        str(derived_name(runs.name, "_tenant_idx")),
        str(derived_name(runs.name, "_running_idx")),
    )


def partitioned_claims_ddl(runs: Table, *, by_key: bool = False) -> tuple[str, str]:
    """``CREATE INDEX CONCURRENTLY`` of each index :func:`partitioned_claims_index_names`
    names, rendered from the factory's own declaration (F8, F9)."""
    table = ship_job_runs_table(
        MetaData(), runs.name, runs.schema, partitioned_claims=True, partition_keys=True
    )
    dialect = postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
    ddl = []
    for name in partitioned_claims_index_names(runs, by_key=by_key):
        [index] = [index for index in table.indexes if index.name == name]
        text_ = str(CreateIndex(index).compile(dialect=dialect))
        ddl.append(text_.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1))
    return ddl[0], ddl[1]


HISTORY_BROWSE_PREDICATE = "state <> 'completed'"
"""``<history>_browse_idx``: the ended runs that are not completed (dead, cancelled,
discarded: few), in creation order. Completed runs, nearly every row, never enter it (J18:
they page in finish order through ``<history>_job_idx``, which deduplicates a settle batch's
one ``finished_at``); a statement that reads it with the state as a parameter repeats this
predicate word for word, so a generic plan can prove it."""
HISTORY_PARENT_PREDICATE = "parent_id IS NOT NULL"
"""``<history>_parent_idx``: ended child runs of a workflow run (D5: the outcomes a parent
reads once its children have left the runs table)."""

_HISTORY_SUFFIXES = (
    "_state_check",
    "_id_idx",
    "_job_idx",
    "_browse_idx",
    "_parent_idx",
    "_progress_idx",
    # The partitions' names (J17): the longest a class's day or default partition takes.
    "_completed_20000101",
    "_completed_default",
)


def ship_job_history_table(
    metadata: MetaData,
    name: str = "ship_job_history",
    schema: str | None = None,
    *,
    retention: Retention | None = None,
) -> Table:
    """The run history (J16, J17, J18): the runs that ended, one slim row each, added to
    ``metadata`` so Alembic autogenerate sees the parent.

    Partitioned by state class (``PARTITION BY LIST (state)``: ``completed``, ``dead``,
    ``ended`` = cancelled and discarded) and, inside each class, by UTC day of ``finished_at``
    (``PARTITION BY RANGE``). The partitions are not in the metadata: ``create_all`` /
    ``schema apply`` / ``op.create_table`` create, per class, the class partition, its DEFAULT
    partition (strays: reported when not empty) and today's plus three days ahead
    (:mod:`ship_sqla._jobs._history_ddl`); maintenance (``ship-sqla jobs maintain``, the
    sampler-lease holder) creates the next days and drops the expired ones, each class with its
    retention: the longest of ``retention`` (default :class:`Retention`: completed 1 day, dead
    30, cancelled and discarded 7) and the registered jobs' that maintenance knows of. Declare
    here the longest any job of the fleet needs: a worker knows only its own jobs. Alembic's
    autogenerate must not see the partitions: pass ``ship_include_object(metadata)``
    (:mod:`ship_sqla.schema`) as ``include_object``; the schema check ignores them.

    No primary key (a partitioned table's unique keys must hold the partition key): a run's id
    is unique because it is in exactly one of the runs and history tables (J16), and looked up
    through the hash index ``<history>_id_idx``.

    Columns (J18's slim row): ``id``, ``seq`` (the run's creation order), ``job_id``, ``state``
    (completed | dead | discarded | cancelled); ``payload`` jsonb null (kept for dead, cancelled
    and discarded runs, and for completed ones on request); ``key``, ``dedupe_key`` (kept so a
    retried dead run moves back as it was); ``attempt``, ``max_attempts``, ``priority``;
    ``run_at`` (due), ``created_at``, ``started_at`` (its last attempt's start: run time and
    queue wait), ``finished_at`` (the partition key); ``claimed_by`` (its last attempt's
    worker); ``last_error``; ``history`` (jsonb array, one entry per failed attempt, each with
    its start and worker); ``trace_context`` jsonb null (K7); ``snoozes``, ``lapses``;
    ``tenant_id`` (F2); ``parent_id`` (D5); ``progress`` jsonb null (a consumer run's last
    committed batch, C3); ``consecutive_lapses`` (J15), ``handler_version`` (D9) and
    ``partition_key`` (F8/F9), each null when there is none.
    """
    n = derived_names(name, _HISTORY_SUFFIXES, "job history", schema=schema)
    states = ", ".join(f"'{s}'" for s in FINISHED_STATES)
    # J21: a partitioned parent takes no storage options; its leaves are created with
    # HISTORY_PARTITION_OPTIONS (insert thresholds only: append-only).
    table = Table(
        name,
        metadata,
        # J18: the fixed-width columns first, widest alignment first, then the variable-width
        # ones (no alignment padding between them: 8 B less per row, the byte budget's margin).
        Column("seq", BigInteger, nullable=False),
        Column("run_at", _TSTZ, nullable=False),
        Column("created_at", _TSTZ, nullable=False),
        Column("started_at", _TSTZ, nullable=True),
        Column("finished_at", _TSTZ, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("snoozes", Integer, nullable=False, server_default=text("0")),
        Column("lapses", Integer, nullable=False, server_default=text("0")),
        Column("priority", SmallInteger, nullable=False, server_default=text("0")),
        Column("id", Text, nullable=False),
        Column("job_id", Text, nullable=False),
        Column("state", Text, nullable=False),
        Column("claimed_by", Text, nullable=True),
        # NULL: no entries (a run that never failed): 5 B less than '[]' on most rows (J18).
        Column("history", JSONB, nullable=True),
        Column("payload", JSONB, nullable=True),
        Column("key", Text, nullable=True),
        Column("dedupe_key", Text, nullable=True),
        Column("last_error", Text, nullable=True),
        Column("trace_context", JSONB, nullable=True),
        Column("tenant_id", Text, nullable=True),
        Column("parent_id", Text, nullable=True),
        Column("progress", JSONB, nullable=True),
        # J15: the run's lapses in a row when it ended; NULL for none (no bytes on most rows).
        Column("consecutive_lapses", Integer, nullable=True),
        # D9 and F8/F9: kept so a run moved back (a retried dead run) keeps its handler version
        # and its partition key; NULL for an unversioned, unpartitioned job (no bytes).
        Column("handler_version", Integer, nullable=True),
        Column("partition_key", Text, nullable=True),
        CheckConstraint(f"state IN ({states})", name=n["_state_check"]),
        # Serves every read of one run by id (get-run, durable-id dedupe, retry of a dead run):
        # a hash index, about half a btree's size on random ids, one probe per partition.
        Index(n["_id_idx"], "id", postgresql_using="hash"),
        # Serves the dead-letter pages (one state of one job, newest finished first) and the
        # completed pages (J18: newest finished first, keyset on (finished_at, id), the ties
        # of one settle batch sorted by id in an incremental sort over that batch's group).
        # A settle batch shares one finished_at: btree deduplication keeps it ~9 B a row.
        Index(n["_job_idx"], "job_id", "state", "finished_at"),
        # Serves the pages of the other ended states in creation order (J16: dead, cancelled,
        # discarded; one job or all, newest created first, keyset on (created_at, id)): one
        # backward scan per day partition, merged. Partial (J18): the text id makes every key
        # unique (no deduplication, ~100 B a row), so completed runs stay out of it.
        Index(
            n["_browse_idx"],
            "job_id",
            "state",
            "created_at",
            "id",
            postgresql_where=text(HISTORY_BROWSE_PREDICATE),
        ),
        # Serves CHILDREN's ended children (D5).
        Index(
            n["_parent_idx"],
            "parent_id",
            "state",
            postgresql_where=text(HISTORY_PARENT_PREDICATE),
        ),
        # Serves CONSUMER_PROGRESS_EITHER (C3, J16): the ended consumer runs that committed a
        # batch (no other run enters it), by (consumer, key), newest first.
        Index(
            n["_progress_idx"], "job_id", "key", "seq", postgresql_where=text(PROGRESS_PREDICATE)
        ),
        schema=schema,
        comment="ship_sqla job history (ship_job_history_table)",
        postgresql_partition_by="LIST (state)",
        info={HISTORY_INFO: True},
    )
    declare_history_retention(table, retention)
    return table


def declared_history(runs: Table) -> Table | None:
    """J16: the history table declared beside ``runs`` (by :func:`ship_job_history_table`, in
    its metadata and schema), else None; two of them there is ambiguous (ConfigurationError:
    give ``history_table=``)."""
    found = [
        t
        for t in runs.metadata.tables.values()
        if t.info.get(HISTORY_INFO) and t.schema == runs.schema
    ]
    if len(found) > 1:
        names = ", ".join(sorted(t.name for t in found))
        raise ConfigurationError(
            f"the metadata of the runs table {runs.name!r} declares several history tables"
            f" ({names}).",
            fix="pass the one this backend moves its ended runs to: history_table=...",
        )
    return found[0] if found else None


def fair_claims_index_name(runs: Table) -> str:
    """``<runs>_tenant_idx``: the name ``ship_job_runs_table(..., fair_claims=True)`` gives the
    index fair claims read (F2); PostgreSQL keeps an index in its table's schema."""
    return str(derived_name(runs.name, "_tenant_idx"))


def fair_claims_ddl(runs: Table) -> str:
    """``CREATE INDEX CONCURRENTLY`` of ``<runs>_tenant_idx`` on ``runs``, rendered from the
    factory's own declaration (a table of ``runs``' name and schema with ``fair_claims=True``,
    on a metadata of its own): what a backend's refusal of a fair job names (F2)."""
    table = ship_job_runs_table(MetaData(), runs.name, runs.schema, fair_claims=True)
    name = fair_claims_index_name(runs)
    [index] = [index for index in table.indexes if index.name == name]
    # paramstyle "named": this DDL is for psql; a "format" one would print "a%b" as "a%%b".
    dialect = postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
    ddl = str(CreateIndex(index).compile(dialect=dialect))
    return ddl.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)


StateRowKind: TypeAlias = Literal["paused", "claim-gate", "enqueue-gate", "unparked-by"]
"""The rows a job may have in the state table beside its schedule's (which is ``<job_id>``):
its pause (K3), its claim gate (F1, F3), its enqueue gate (J2), the last build that unparked
its parked runs (D10, in ``trigger``)."""


def state_row(job_id: str, kind: StateRowKind) -> str:
    """The state-table row of ``job_id`` for ``kind``: ``<job_id>#<kind>``."""
    return f"{job_id}#{kind}"


def ship_job_state_table(
    metadata: MetaData, name: str = "ship_job_state", schema: str | None = None
) -> Table:
    """One row per job id: the schedule's ``next_at`` and ``trigger`` text, and ``updated_at``.

    Schedules (J9) upsert it and lock due rows with SKIP LOCKED; it is keyed by ``job_id`` alone,
    so it needs no index beyond its primary key. A backend with ``queue_depth_limit`` also keeps
    one gate row per enqueued job, ``<job_id>#enqueue-gate`` (J2's hard cap: ENQUEUE_GATE), and
    a paused job has a row ``<job_id>#paused`` (K3, ``updated_at``: when it was paused), which
    every claim of the job reads, and a job with a ``concurrency.max`` or a ``RateLimit`` its
    claim gate ``<job_id>#claim-gate`` (F1: ``claim_granted``, ``claim_grant``; F3:
    ``rate_at``, ``rate_n``; CLAIM_GATED), which its claims upsert.
    """
    n = derived_names(name, ("_pkey",), "job state", schema=schema)
    table = Table(
        name,
        metadata,
        Column("job_id", Text, nullable=False),
        Column("next_at", _TSTZ, nullable=True),
        Column("trigger", Text, nullable=True),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        # F1: a gated job's claim gate row (<job_id>#claim-gate): the total of due runs its
        # claims were ever granted, and the last claim's grant (CLAIM_GATED). NULL elsewhere.
        Column("claim_granted", BigInteger, nullable=True),
        Column("claim_grant", Integer, nullable=True),
        # F3: a rate-limited job's recent starts on its gate row, (time, count) pairs.
        Column("rate_at", ARRAY(_TSTZ), nullable=True),
        Column("rate_n", ARRAY(Integer), nullable=True),
        PrimaryKeyConstraint("job_id", name=n["_pkey"]),
        schema=schema,
        comment="ship_sqla per-job state (ship_job_state_table)",
    )
    # J21: its gate and schedule rows are updated in place without touching an index (HOT).
    return declare_storage_options(table, HOT_ROW_OPTIONS)


SAMPLER_PREDICATE = "sampler_until IS NOT NULL"
"""``<workers>_sampler_idx``: the entry that holds (or last held) the queue-sampler lease (F5)."""


def ship_job_workers_table(
    metadata: MetaData, name: str = "ship_job_workers", schema: str | None = None
) -> Table:
    """The worker registry (F6): one row per worker runtime, heartbeated every 10 s and pruned
    once not seen for 30 s; also where the fleet's queue-sampler lease is held (F5). Optional: a
    backend whose workers table is absent runs its runtimes unregistered (each logs so once)
    and every worker samples its own queues, as before the registry.

    Columns: ``id`` text pk (the runtime's ``worker_id``); ``host``, ``pid``; ``started_at``
    and ``last_seen_at`` (its last heartbeat, the database's clock); ``job_ids`` text[] (the
    jobs it runs); ``in_flight`` (runs it holds); ``draining`` (``stop()`` was called: it
    claims nothing); ``sampler_until`` (null unless it holds the queue-sampler lease, F5);
    ``job_versions`` text[] (the handler versions it serves, ``<job_id>:<version>``, D9).
    """
    n = derived_names(name, ("_pkey", "_seen_idx", "_sampler_idx"), "job workers", schema=schema)
    table = Table(
        name,
        metadata,
        Column("id", Text, nullable=False),
        Column("host", Text, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("started_at", _TSTZ, nullable=False),
        Column("last_seen_at", _TSTZ, nullable=False),
        Column("job_ids", ARRAY(Text), nullable=False),
        Column("in_flight", Integer, nullable=False),
        Column("draining", Boolean, nullable=False),
        Column("sampler_until", _TSTZ, nullable=True),
        # D9: the handler versions the worker serves, "<job_id>:<version>" per versioned job.
        Column("job_versions", ARRAY(Text), nullable=False, server_default=text("'{}'")),
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        # Serves PRUNE_STALE_WORKERS: the entries not seen for the bound, oldest first.
        Index(n["_seen_idx"], "last_seen_at"),
        # Serves HOLD_SAMPLER_IF_FREE's check that no other entry holds a live lease.
        Index(n["_sampler_idx"], "sampler_until", postgresql_where=text(SAMPLER_PREDICATE)),
        schema=schema,
        comment="ship_sqla job workers (ship_job_workers_table)",
    )
    return declare_storage_options(table, CHURN_OPTIONS)  # J21


STEP_STATES = ("done", "waiting")
PATCH_PREDICATE = "kind = 'patch'"
"""``<steps>_patch_idx``: D8's patch markers by name and creation time."""


def ship_job_steps_table(
    metadata: MetaData,
    name: str = "ship_job_steps",
    schema: str | None = None,
    *,
    runs_table: str = "ship_job_runs",
    runs_fkey: bool | None = None,
) -> Table:
    """The stored steps of workflow runs (SPEC §13, D1): one row per (run, step name).

    Columns: ``run_id`` (a foreign key to ``runs_table``, the runs table's name in the same
    ``metadata``, ON DELETE CASCADE: a run's cleanup takes its steps), ``name``, ``seq`` (the
    step's position in the handler: re-running from a step drops it and every later one, D6),
    ``kind`` (step | transaction | sleep | event | spawn | children | patch), ``state`` (done |
    waiting), ``result`` (jsonb: the encoded result), ``wake_at`` (a sleep's wake time, a wait's
    timeout), ``event_name`` / ``event_key`` (what an event wait waits for), ``snapshot`` (the
    ``pg_snapshot`` an event wait began in, as text: an event matches when its transaction is
    not visible in it, D4), ``created_at``, ``finished_at``. ``runs_fkey=False``: no foreign key
    (a backend with a history table, J16: a run that ends leaves the runs table and keeps its
    steps); the default (None) declares it only when ``metadata`` declares no history table in
    ``schema`` (:func:`declared_history`): declare the history table first. Index
    ``<name>_patch_idx`` ``(name, created_at) WHERE kind = 'patch'``: D8's patch markers (no
    other step enters it).
    """
    n = derived_names(
        name, ("_pkey", "_state_check", "_run_fkey", "_patch_idx"), "job steps", schema=schema
    )
    states = ", ".join(f"'{s}'" for s in STEP_STATES)
    target = f"{schema}.{runs_table}.id" if schema else f"{runs_table}.id"
    table = Table(
        name,
        metadata,
        Column("run_id", Text, nullable=False),
        Column("name", Text, nullable=False),
        Column("seq", Integer, nullable=False),
        Column("kind", Text, nullable=False),
        Column("state", Text, nullable=False),
        Column("result", JSONB, nullable=True),
        Column("wake_at", _TSTZ, nullable=True),
        Column("event_name", Text, nullable=True),
        Column("event_key", Text, nullable=True),
        Column("snapshot", Text, nullable=True),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("finished_at", _TSTZ, nullable=True),
        # Serves LOAD_STEPS, SAVE_STEP's ON CONFLICT and MATCH_EVENT's step lookup.
        PrimaryKeyConstraint("run_id", "name", name=n["_pkey"]),
        # Serves PATCH_IDS and PATCH_LACKING's first marker (D8): patch markers only, so no
        # other step write touches it.
        Index(n["_patch_idx"], "name", "created_at", postgresql_where=text(PATCH_PREDICATE)),
        CheckConstraint(f"state IN ({states})", name=n["_state_check"]),
        schema=schema,
        comment="ship_sqla workflow steps (ship_job_steps_table)",
    )
    if runs_fkey is None:
        runs_fkey = not any(
            t.info.get(HISTORY_INFO) and t.schema == schema for t in metadata.tables.values()
        )
    if runs_fkey:
        table.append_constraint(
            ForeignKeyConstraint(["run_id"], [target], name=n["_run_fkey"], ondelete="CASCADE")
        )
    return declare_storage_options(table, CHURN_OPTIONS)  # J21


def ship_job_events_table(
    metadata: MetaData, name: str = "ship_job_events", schema: str | None = None
) -> Table:
    """Workflow events (SPEC §13, D4): one row per ``publish_event``, written in the
    publisher's transaction.

    Columns: ``id`` (identity), ``name``, ``key`` (``''`` for none), ``payload`` jsonb, ``xid``
    (the publishing transaction's id, ``pg_current_xact_id()``: a wait matches the events whose
    transaction its snapshot does not see), ``created_at`` (for retention).
    """
    n = derived_names(name, ("_pkey", "_match_idx", "_created_idx"), "job events", schema=schema)
    table = Table(
        name,
        metadata,
        Column("id", BigInteger, Identity(always=False), nullable=False),
        Column("name", Text, nullable=False),
        Column("key", Text, nullable=False, server_default=text("''")),
        Column("payload", JSONB, nullable=False),
        Column("xid", BigInteger, nullable=False),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        # Serves MATCH_EVENT and SUSPEND_RUN's check: the events of one (name, key) from the
        # wait snapshot's xmin on.
        Index(n["_match_idx"], "name", "key", "xid", "id"),
        # Serves DELETE_OLD_EVENTS (retention).
        Index(n["_created_idx"], "created_at"),
        schema=schema,
        comment="ship_sqla workflow events (ship_job_events_table)",
    )
    return declare_storage_options(table, CHURN_OPTIONS)  # J21
