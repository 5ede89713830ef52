"""Prices per PFLOP of training compute (6 · parameters · tokens), in integer token base units.

Pricing by compute instead of by time lets a fast and a slow device compete on one scale; rounding is
always up so escrow never falls short by a base unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from market.domain.rosters import SETTLE_BY_ROUNDS, SETTLE_BY_UNITS, settlement_of
from veritrain.messages import OrderSpec

FLOPS_PER_PFLOP = 10**15

# A rounds order escrows this many units more than it runs: the verifier fees of per-unit retries of its
# failed roster units. A retry is one verification more than the order's units, and a roster's close pays
# a fee back only for a unit it paid without a verdict, so an order whose every roster unit was set aside
# could not otherwise pay its last unit (`NoUnitBudget`). One unit's escrow (k prices and a fee) pays the
# fees of 1 + k·price/fee drawn retries; what is not spent comes back when the order closes.
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
    spec), ``ROSTER_SPARE_UNITS`` more units for its retries' fees."""
    unit_flops = flops_per_step * spec.unit_steps
    spare = ROSTER_SPARE_UNITS if settlement_of(spec, settlement) == SETTLE_BY_ROUNDS else 0
    return EscrowPlan(
        units=spec.unit_count + spare,
        replicas=spec.replicas,
        price_per_replica=price_for_flops(spec.max_price_per_pflop, unit_flops),
        verifier_fee_per_unit=spec.verifier_fee_per_unit,
        min_replicas=1 if spec.adaptive_replication else spec.replicas,
        trusted_streak=spec.trusted_streak if spec.adaptive_replication else 0,
    )
