"""Developer and CI sessions. ``nox -s ci`` is what CI and the README's test command run.

With ``--no-venv`` the sessions use the interpreter nox runs under (the project's .venv, where
``pip install -e '.[dev]'`` put everything); otherwise nox builds its own virtualenv per session.
Tools are run as modules (``python -m ruff``) so both ways find them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "docs", "tests", "examples"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
# Every runnable example, as a module name (`python -m examples.<name>`); schema.py is the
# example application's tables, imported by the others and by Alembic, not a program.
EXAMPLES = sorted(
    f"examples.{p.stem}"
    for p in (ROOT / "examples").glob("*.py")
    if not p.name.startswith("_") and p.stem != "schema"
)


def _python(session: nox.Session) -> str:
    """The interpreter with the project installed; installs it into nox's own venv if needed."""
    if isinstance(session.virtualenv, nox.virtualenv.PassthroughEnv):
        return sys.executable
    session.install("-e", ".[dev]")
    return "python"


def _lint(session: nox.Session, python: str) -> None:
    session.run(python, "-m", "ruff", "check", ".")
    session.run(python, "-m", "ruff", "format", "--check", ".")
    # The import-layer contracts of pyproject's [tool.importlinter].
    session.run(str(Path(python).with_name("lint-imports")), external=True)


def _examples(session: nox.Session, python: str) -> None:
    for example in EXAMPLES:
        session.run(python, "-m", example, env={"PYTHONUNBUFFERED": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    _lint(session, _python(session))


@nox.session
def typecheck(session: nox.Session) -> None:
    session.run(_python(session), "-m", "mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite: unit, property (small Hypothesis budget), conformance, integration."""
    session.run(_python(session), "-m", "pytest", *session.posargs)


@nox.session(name="tests_large")
def tests_large(session: nox.Session) -> None:
    """Property tests with the large Hypothesis budget."""
    session.run(
        _python(session),
        "-m",
        "pytest",
        "tests/property",
        *session.posargs,
        env={"SHIP_SQLA_HYPOTHESIS_PROFILE": "large"},
    )


@nox.session
def chaos(session: nox.Session) -> None:
    """The chaos tests at full size, on worker processes killed with ``kill -9``: 1,000 workflow
    runs (issue 14; the ``chaos:`` line, BENCHMARKS.md), 10,000 transactional runs against a
    plain-handler control (issue 37; the ``tx chaos:`` line), and consumers and a backfill
    through 12 kills mid-batch and a PostgreSQL crash (issue 28, the ``stream faults:`` line);
    the failover matrix (issue 34: a primary killed, hung or switched over to a streaming
    standby, under sync and async replication; one ``failover:`` line per cell, the figures of
    docs/production.md's "Failover" section); and partitioned limits through a kill a second
    (issue 35, the ``partition chaos:`` line); and a rolling deploy with an incompatible build
    and its rollback (issue 38, the ``rolling deploy:`` line); each prints its figures."""
    python = _python(session)
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration/test_workflow_chaos.py",
        "tests/integration/test_transactional_chaos.py",
        "-s",
        *session.posargs,
        env={"SHIP_SQLA_CHAOS_RUNS": "1000", "SHIP_SQLA_TX_CHAOS_RUNS": "10000"},
    )
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration/test_consumer_backfill_faults.py",
        "-s",
        *session.posargs,
        env={"SHIP_SQLA_STREAM_FAULTS_SIZE": "large"},
    )
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration/test_failover.py",
        "-s",
        *session.posargs,
        env={"SHIP_SQLA_FAILOVER_MATRIX": "1"},
    )
    # F8/F9 under kill -9 (issue 35): 1,800 runs over six tenants, per-tenant rate and cap
    # audited from the stored history (the ``partition chaos:`` line).
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration/test_partition_chaos.py",
        "-s",
        *session.posargs,
        env={"SHIP_SQLA_PARTITION_CHAOS_RUNS": "150"},
    )
    # D7/D9/D10 through a rolling deploy (issue 38 item 6): 1,000 five-step workflow runs on
    # four workers, builds v1 -> v2 -> an incompatible v2 -> the rollback, a SIGKILL per
    # replaced worker (the ``rolling deploy:`` line).
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration/test_workflow_rolling_deploy.py",
        "-s",
        *session.posargs,
        env={"SHIP_SQLA_ROLLING_DEPLOY_RUNS": "1000"},
    )


@nox.session
def examples(session: nox.Session) -> None:
    """Every example runs as a test: it must exit 0."""
    _examples(session, _python(session))


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks (not part of ci): ``nox -s bench -- [names...] [--quick] [--rounds N]``."""
    session.run(_python(session), "-m", "benchmarks", *session.posargs)


def _docs(session: nox.Session, python: str) -> None:
    # The site (mkdocs.yml) with warnings as errors: a broken link, anchor or API reference
    # (a `::: ship_sqla.name` that does not resolve) fails the build. About ten seconds.
    session.run(
        python, "-m", "mkdocs", "build", "--strict", "--quiet", env={"NO_MKDOCS_2_WARNING": "1"}
    )


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, built into site/ with warnings as errors (``mkdocs serve`` to
    read it while writing)."""
    _docs(session, _python(session))


def _bench_smoke(session: nox.Session, python: str) -> None:
    # Every benchmark once at its quick size: that each still runs (a schema change broke five
    # of them once, unseen); its figures are not read here (benchmarks are not tests).
    session.run(python, "-m", "benchmarks", "--quick", "--rounds", "1", "--json-only")
    # Opt-in ones whose quick size is a smoke test too (history: a day partition of 20,000
    # runs dropped, J17; dashboard: every page over 20,000 seeded runs, issue 36; a few
    # seconds each).
    session.run(
        python,
        "-m",
        "benchmarks",
        "history",
        "dashboard",
        "--quick",
        "--rounds",
        "1",
        "--json-only",
    )
    # steady --quick: issue 39's CI smoke, 200,000 runs at 2,500/s under a 60 s held snapshot
    # (about 100 s; ship's side only unless pgqueuer is installed; claim costs need
    # pg_stat_statements, NaN without it).
    session.run(python, "-m", "benchmarks", "steady", "--quick", "--rounds", "1", "--json-only")


@nox.session(name="bench_smoke")
def bench_smoke(session: nox.Session) -> None:
    """Each default benchmark once at its quick size (about a minute): that it runs."""
    _bench_smoke(session, _python(session))


@nox.session
def ci(session: nox.Session) -> None:
    """lint, typecheck, the docs site, tests, examples and the benchmarks' smoke run in one
    session (what .ci/run runs)."""
    python = _python(session)
    _lint(session, python)
    session.run(python, "-m", "mypy")
    _docs(session, python)
    session.run(python, "-m", "pytest", *session.posargs)
    _examples(session, python)
    _bench_smoke(session, python)
