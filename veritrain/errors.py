"""One exception tree for all of Veritrain: callers catch `VeritrainError` or a precise subclass.

Each area adds its own subclasses in its own section below.
"""

from __future__ import annotations


class VeritrainError(Exception):
    """Base of every error Veritrain raises on purpose."""


class InvalidInput(VeritrainError):
    """Input from another party or a user is malformed, oversized or inconsistent."""
