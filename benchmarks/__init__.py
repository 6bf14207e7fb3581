"""Benchmarks of ship_sqla against raw asyncpg baselines measured in the same run.

Run ``nox -s bench`` or ``python -m benchmarks [names...] [--quick] [--rounds N] [--json-only]``;
BENCHMARKS.md has the latest figures and how to read them. Every figure is the median of several
rounds, and each round measures ship_sqla and its baseline back to back (alternating which goes
first), so a noisy shared machine moves both alike and the ratio stays meaningful.

Benchmarks are not tests: nothing here fails a build. A missed target is reported, not raised.
"""
