"""Prices per PFLOP of training compute (6 · parameters · tokens), in integer token base units.

Pricing by compute instead of by time lets a fast and a slow device compete on one scale; rounding is
always up so escrow never falls short by a base unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from market.domain.rosters import SETTLE_BY_ROUNDS, SETTLE_BY_UNITS, settlement_of
from veritrain.messages import OrderSpec

FLOPS_PER_PFLOP = 10**15

# A rounds order escrows its R·M roster units and this many more: the budget of per-unit retries of its
# failed roster units. A failed unit's price and fee come back only at the roster's close, which waits for
# the round the retry belongs to, so without it the first retry could not be assigned (`NoUnitBudget`) and
# the order would wait for its deadline. One unit's escrow (k prices and a fee) pays one retry, or the fees
# of 1 + k·price/fee drawn ones; what is not spent comes back when the order closes. (A round-path order
# has no aggregate unit: the buyer runs the last outer step, apps/buyer.py.)
ROSTER_SPARE_UNITS = 1


def training_flops(parameters: int, tokens: int) -> int:
    """Forward + backward compute of a dense model: 6 · parameters · tokens (Kaplan et al. 2020)."""
    if parameters < 0 or tokens < 0:
        raise ValueError("parameters and tokens must be non-negative")
    return 6 * parameters * tokens


def price_for_flops(price_per_pflop: int, flops: int) -> int:
    """Cost of ``flops`` at ``price_per_pflop`` base units, rounded up."""
    return -(-price_per_pflop * flops // FLOPS_PER_PFLOP)


@dataclass(frozen=True, slots=True)
class EscrowPlan:
    """What the on-chain order must carry for a spec: the ``postOrder`` (``postAdaptiveOrder``) arguments
    and its total (escrow covers every unit at its most replicas)."""

    units: int
    replicas: int
    price_per_replica: int
    verifier_fee_per_unit: int
    min_replicas: int  # 1 for adaptive replication, else `replicas`
    trusted_streak: int  # 0 for fixed replication

    @property
    def total(self) -> int:
        return self.units * (self.replicas * self.price_per_replica + self.verifier_fee_per_unit)


def escrow_plan(spec: OrderSpec, flops_per_step: int, settlement: str | None = SETTLE_BY_UNITS) -> EscrowPlan:
    """Escrow at the buyer's max price: every unit paid for ``replicas`` replicas plus its verifier fee;
    settled on the round path (``settlement`` "rounds", or None where that is the market's default for the
    spec), its R·M roster units and ``ROSTER_SPARE_UNITS`` for retries instead of ``spec.unit_count``."""
    unit_flops = flops_per_step * spec.unit_steps
    by_rounds = settlement_of(spec, settlement) == SETTLE_BY_ROUNDS
    return EscrowPlan(
        units=spec.rounds * spec.shards + ROSTER_SPARE_UNITS if by_rounds else spec.unit_count,
        replicas=spec.replicas,
        price_per_replica=price_for_flops(spec.max_price_per_pflop, unit_flops),
        verifier_fee_per_unit=spec.verifier_fee_per_unit,
        min_replicas=1 if spec.adaptive_replication else spec.replicas,
        trusted_streak=spec.trusted_streak if spec.adaptive_replication else 0,
    )
