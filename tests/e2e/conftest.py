"""Fixtures of the end-to-end tests: a fresh PostgreSQL database and a private Celery queue per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def e2e_postgres_url(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database per run (a new chain restarts order ids at 1), dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(postgres_url)
    name = f"veritrain_e2e_{uuid.uuid4().hex[:12]}"
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def private_queue() -> str:
    """A Celery queue name no other test's worker consumes (the Redis server is shared)."""
    return f"veritrain-e2e-{uuid.uuid4().hex[:12]}"
