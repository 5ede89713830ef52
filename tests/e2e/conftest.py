"""Fixtures of the end-to-end tests: a fresh PostgreSQL database and a private Celery queue per test."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def private_queue() -> str:
    """A Celery queue name no other test's worker consumes (the Redis server is shared)."""
    return f"veritrain-e2e-{uuid.uuid4().hex[:12]}"
