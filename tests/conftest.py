"""Shared test configuration: service URLs for the tests that need real PostgreSQL / Redis."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


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
