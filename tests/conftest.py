"""Shared test configuration: service URLs for the tests that need real PostgreSQL / Redis."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

if str(Path(__file__).parent) not in sys.path:  # shared helpers beside this file (needs.py) by name
    sys.path.insert(0, str(Path(__file__).parent))

IN_CI = os.environ.get("CI", "").lower() == "true"
# The longest test files (measured under load on a 2-core AMD EPYC, 2026-11-29: the protocol bench's
# fixture ~5 min, the bench chain ~2.7 min (5.6 min on an Intel Xeon, load ~5, since it drives two M = 8
# orders through the market), the fresh Hardhat compile ~2.5 min, the invariant machine and the
# mutant check ~1.5 min now that the mutants' compiles come from the committed cache) go first: scripts/test
# hands files to its two workers in this order (--no-loadscope-reorder), so none of them starts last and
# becomes the run's tail.
LONGEST_FIRST = (
    "tests/market/test_bench_protocol.py",
    "tests/chain/test_cli.py",
    "tests/chain/test_compiled_data.py",
    "tests/chain/test_invariants.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest as is


def service_url(env_var: str) -> str:
    """URL of a real service for a test: skipped locally when unset, a failure in CI (services required)."""
    url = os.environ.get(env_var, "")
    if not url:
        if IN_CI:
            pytest.fail(f"{env_var} must be set in CI (see .ci/run)")
        pytest.skip(f"{env_var} not set; see scripts/test for how to run this test")
    return url


@pytest.fixture
def postgres_url() -> str:
    return service_url("VERITRAIN_TEST_POSTGRES_URL")


@pytest.fixture
def redis_url() -> str:
    return service_url("VERITRAIN_TEST_REDIS_URL")


@pytest.fixture
def fresh_postgres_url(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one test (ids restart, no state leaks between tests), dropped after."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(postgres_url)
    name = f"veritrain_test_{uuid.uuid4().hex[:12]}"
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
