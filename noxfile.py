"""Developer and CI sessions. `nox -s ci` is what CI and the README's test command run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "examples"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
# Every runnable example, as a module name (`python -m examples.<name>`); schema.py is the
# example application's tables, imported by the others and by Alembic, not a program.
EXAMPLES = sorted(
    f"examples.{p.stem}"
    for p in (ROOT / "examples").glob("*.py")
    if not p.name.startswith("_") and p.stem != "schema"
)


def _install(session: nox.Session) -> None:
    if not isinstance(session.virtualenv, nox.virtualenv.PassthroughEnv):
        session.install("-e", ".[dev]")


@nox.session
def lint(session: nox.Session) -> None:
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    _install(session)
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite: unit, property (small Hypothesis budget), conformance, integration."""
    _install(session)
    session.run("pytest", *session.posargs)


@nox.session(name="tests_large")
def tests_large(session: nox.Session) -> None:
    """Property tests with the large Hypothesis budget."""
    _install(session)
    session.run(
        "pytest", "tests/property", *session.posargs, env={"SHIP_SQLA_HYPOTHESIS_PROFILE": "large"}
    )


@nox.session
def examples(session: nox.Session) -> None:
    """Every example runs as a test: it must exit 0."""
    _install(session)
    for example in EXAMPLES:
        session.run(
            sys.executable if session.virtualenv.venv_backend == "none" else "python", str(example)
        )


@nox.session
def ci(session: nox.Session) -> None:
    """lint, typecheck, tests and examples in one session (what .ci/run runs)."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("pytest", *session.posargs)
    _run_examples(session)


def _run_examples(session: nox.Session) -> None:
    python = (
        sys.executable
        if isinstance(session.virtualenv, nox.virtualenv.PassthroughEnv)
        else "python"
    )
    for example in EXAMPLES:
        session.run(python, "-m", example, env={"PYTHONUNBUFFERED": "1", **os.environ})
