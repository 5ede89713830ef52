"""Tests that need something of the machine: skipped locally without it, a failure in CI (CI=true)."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(missing: str | None, how_to_get_it: str) -> None:
    """Skip (locally) or fail (in CI) when `missing` names what is not there."""
    if missing is None:
        return
    message = f"{missing}; {how_to_get_it}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)
