"""Adaptive replication and spot checks (BOINC's adaptive replication plus random audits).

A provider with a long streak of valid units and no fraud earns k = 1 with a raised audit rate; everyone
else gets the order's most replicas (3 for a buyer's `auto`): the JobMarket assigns fewer than an adaptive
order's most only when every provider has the order's streak of consecutive valid units, and a fault or
fraud resets a streak to 0. On the marketplace the JobMarket contract draws spot checks itself (its
`spotCheckPpm` / `soloSpotCheckPpm`, from the last commit's block hash, and every unit with a provider on
probation); `audit_rate_ppm`, `on_probation` and `spot_check_drawn` are the same rules for the simulators."""

from __future__ import annotations

from dataclasses import dataclass

from eth_utils import keccak

from veritrain.messages import PROBATION_STREAK, TRUSTED_STREAK

PPM = 1_000_000


@dataclass(frozen=True, slots=True)
class Reputation:
    """On-chain reputation counters (JobMarket.reputationOf)."""

    valid: int = 0
    fault: int = 0
    fraud: int = 0
    consecutive_valid: int = 0


@dataclass(frozen=True, slots=True)
class ReplicationPolicy:
    trusted_streak: int = TRUSTED_STREAK  # consecutive valid units for k = 1 (an order states its own)
    base_audit_ppm: int = 50_000  # 5 % of units with k > 1 go to a verifier anyway
    trusted_audit_ppm: int = 200_000  # 20 % of k = 1 units are audited
    probation_streak: int = PROBATION_STREAK  # below it every unit of the provider is audited


DEFAULT_POLICY = ReplicationPolicy()
NO_REPUTATION = Reputation()


def trusted(reputation: Reputation, policy: ReplicationPolicy = DEFAULT_POLICY) -> bool:
    """Past the streak (as the contract counts it) with no fraud on record: may work a unit alone."""
    return reputation.fraud == 0 and reputation.consecutive_valid >= policy.trusted_streak


def replication_factor(reputation: Reputation, max_k: int, policy: ReplicationPolicy = DEFAULT_POLICY) -> int:
    """Replicas a unit needs when ``reputation`` belongs to its first drawn candidate: 1 for a trusted one,
    else the order's max (never a count between, which the contract would refuse for untrusted providers)."""
    return 1 if trusted(reputation, policy) else max_k


def audit_rate_ppm(k: int, policy: ReplicationPolicy = DEFAULT_POLICY) -> int:
    """Spot-check probability in parts per million; single-replica units are audited more often."""
    return policy.trusted_audit_ppm if k == 1 else policy.base_audit_ppm


def on_probation(reputation: Reputation, policy: ReplicationPolicy = DEFAULT_POLICY) -> bool:
    """Too short a streak for its units to skip verification: the contract draws every unit it works
    (a ring of fresh keys is always checked; a fault or fraud starts probation again)."""
    return reputation.consecutive_valid < policy.probation_streak


def spot_check_drawn(randomness: str, unit_key: str, rate_ppm: int) -> bool:
    """Deterministic draw: keccak(randomness ‖ unit_key) mod 10⁶ < rate. ``randomness`` must be fixed
    after the unit's commit phase (a block hash after the last commit), so nobody can grind it."""
    if not 0 <= rate_ppm <= PPM:
        raise ValueError(f"rate_ppm must be within [0, {PPM}], got {rate_ppm}")
    digest = keccak(bytes.fromhex(randomness.removeprefix("0x")) + bytes.fromhex(unit_key.removeprefix("0x")))
    return int.from_bytes(digest, "big") % PPM < rate_ppm
