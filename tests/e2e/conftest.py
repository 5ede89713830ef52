"""Fixtures of the end-to-end tests: a fresh PostgreSQL database and a private Celery queue per test."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if str(HERE) not in sys.path:  # helpers beside the tests (browser.py) are imported by name
    sys.path.insert(0, str(HERE))


@pytest.fixture
def private_queue() -> str:
    """A Celery queue name no other test's worker consumes (the Redis server is shared)."""
    return f"veritrain-e2e-{uuid.uuid4().hex[:12]}"
