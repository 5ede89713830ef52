"""What a party holds of the market's money, for tests that measure its pay as a delta across a close.

A roster's close pays each of its providers and verifiers its whole credit directly and an order's close pays
the buyer its refund (a token transfer each, the credit kept only when the token refuses it); a withdrawal
moves a credit into tokens. So a party's pay is the delta of its credit plus its tokens: it reads the same
whether the money is still a credit or was paid, and a party paid the wrong amount still shows."""

from __future__ import annotations

from typing import Any


def earned(client: Any, account: Any) -> int:
    """`account`'s credit in the job market plus its tokens (`account` an address or a LocalAccount)."""
    return int(client.credits(account)) + int(client.token_balance(account))


__all__ = ["earned"]
