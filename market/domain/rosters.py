"""Rosters, the round path's fixed assignment (docs/studies/round-settlement/PLAN.md, step 5): who holds an
order's replica slots for all its rounds, and which units of a revealed round the contract sets aside for
a verdict. Pure, no IO.

Why the market predicts the set-aside: the step that reveals a round must carry verifiers exactly when one
of its units will be set aside (the contract refuses it otherwise, `RoundUnitNeedsVerdict`), and a market
that starts round r before round r-1 is revealed on chain must know what the chain will decide. The rules
are JobMarketRounds `_revealRound`'s, read from public data: the draw `keccak(blockhash(commit block) ‖
roundUnitId) mod 10⁶ < rate` (every unit once that block hash is gone, 256 blocks on), a provider below the
roster's required streak, replicas that disagree, a replica that did not open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from eth_hash.auto import keccak

from market.domain.replication import spot_check_drawn
from market.domain.selection import ROLE_REPLICAS, sample, selection_seed
from veritrain.chain.client import Roster
from veritrain.chain.eip712 import round_unit_id
from veritrain.errors import InvalidInput, InvalidOrderSpec, MarketError
from veritrain.messages import OrderSpec

MAX_ROSTER_PROVIDERS = 32  # the contract's layout gives each slot a 5-bit provider index
MAX_ROSTER_VERIFIERS = 5  # the contract's MAX_VERIFIERS
MAX_ROSTER_SLOTS = 51  # units_per_round x replicas: the layout's 5-bit indices in one 256-bit word
SETTLE_BY_UNITS = "units"  # the per-unit path (assign, commitBatch, revealBatch, finalize / verdict)
SETTLE_BY_ROUNDS = "rounds"  # the round path (openRoster, stepRound, closeRoster)


@dataclass(frozen=True)
class RosterShape:
    """What a round-path order's roster covers: `rounds` rounds of `units_per_round` units, `replicas` each
    (the order's last aggregate unit is not in it: it settles on the per-unit path)."""

    replicas: int
    units_per_round: int
    rounds: int


def roster_refusal(spec: OrderSpec) -> str | None:
    """Why a spec cannot have a roster, or None when it can: the outer step must be folded (no aggregate
    unit between rounds, whose inputs a step could not carry), replication fixed (an adaptive order's k
    changes per unit; a roster's is fixed), k in 1..5 and at most 51 replica slots per round."""
    if spec.outer_step != "folded":
        return (
            f"settlement {SETTLE_BY_ROUNDS!r} needs outer_step 'folded' (shards >= 2), got "
            f"{spec.outer_step!r} with {spec.shards} shard(s)"
        )
    if spec.adaptive_replication:
        return f"settlement {SETTLE_BY_ROUNDS!r} needs fixed replication, not adaptive"
    if not 1 <= spec.replicas <= 5:
        return f"a roster unit has 1 to 5 replicas, got {spec.replicas}"
    if spec.shards * spec.replicas > MAX_ROSTER_SLOTS:
        return (
            f"a roster has at most {MAX_ROSTER_SLOTS} replica slots per round, got {spec.shards} shards x "
            f"{spec.replicas} replicas"
        )
    return None


def roster_shape(spec: OrderSpec) -> RosterShape:
    """The roster a spec settled on the round path needs; InvalidOrderSpec (`roster_refusal`'s reason)
    when the spec cannot have one."""
    refusal = roster_refusal(spec)
    if refusal is not None:
        raise InvalidOrderSpec(refusal)
    return RosterShape(spec.replicas, spec.shards, spec.rounds)


def settlement_of(spec: OrderSpec, asked: str | None) -> str:
    """How the market settles an order: as the buyer asked, else by default on the round path whenever the
    spec can have a roster (its gas per unit is a tenth of the per-unit path's, docs/BENCHMARKS.md), else
    per unit (M = 1, an outer step as a unit per round, adaptive replication). An explicit "rounds" the
    spec cannot take is refused by `roster_shape`, not quietly settled per unit."""
    if asked is not None:
        return asked
    return SETTLE_BY_UNITS if roster_refusal(spec) is not None else SETTLE_BY_ROUNDS


@dataclass(frozen=True)
class RosterProgress:
    """What the roster's next action depends on: the chain's counters (rounds committed, whether the last
    committed one awaits its reveal, closed) and what the market holds off chain (the rounds whose every
    slot's signed work, resp. opening, it has; set-aside units not settled yet)."""

    rounds: int
    committed: int
    pending: bool
    closed: bool
    works_ready: frozenset[int]
    openings_ready: frozenset[int]
    open_set_aside: int = 0
    # rounds with a unit the next round may not start from before its verdict (the chain will set it
    # aside: drawn, split, a weak provider, a slot given as withheld): the step revealing one commits nothing
    held: frozenset[int] = frozenset()
    # rounds whose drawn units the roster's verifiers are still auditing (market/round_audits.py): the step
    # revealing one waits, since it leaves the units pending only with the audit signed
    auditing: frozenset[int] = frozenset()
    # the order's deadline passed: the chain commits no round any more (`OrderExpired`), so a pending round is
    # revealed alone rather than waiting for the next round's works (the close pays nothing for it)
    expired: bool = False


@dataclass(frozen=True)
class StepPlan:
    """Step `index`: reveal round `reveal` (None: none pending) and commit round `commit` (None: the last
    round was committed, or the revealed round is held) in one transaction. Its outbox action is
    `step:<index>`, which landed once the chain committed `index + 1` rounds (or, for the last step,
    revealed all); a reveal-only step before the last is `reveal:<round>` (the commit of the next round is
    then `step:<index>` of its own), landed once that round is revealed."""

    index: int
    reveal: int | None
    commit: int | None
    # it reveals a round before the last alone (held, or past the order's deadline), and commits nothing
    held: bool = False

    @property
    def action(self) -> str:
        return f"{REVEAL_PREFIX}{self.reveal}" if self.held else f"step:{self.index}"


CLOSE_ACTION = "close"
OPEN_ACTION = "open"
REVEAL_PREFIX = "reveal:"


def next_roster_action(progress: RosterProgress) -> StepPlan | str | None:
    """The roster's next outbox action, or None while it waits (for works, openings or set-aside units).

    One step per round (PLAN "Step 5 revised", finding 3): step r reveals round r-1 and commits round r
    together, so it waits until the market holds both round r-1's openings and round r's works; the last
    step only reveals. A held round (one of its units waits for a verdict: round r cannot start from it
    before) is revealed alone, as soon as its openings are ready (every slot opened, or the reveal window
    passed: the rest are given as withheld), so that its set-aside units exist and can be judged; round r
    is then committed by a step of its own once its works are in. Past the order's deadline (`expired`) no
    round is committed: a pending round is revealed alone as a held one is, and with none pending nothing is
    planned here (market/rosters.py plans the close at the deadline). A round whose drawn units the roster's
    verifiers are auditing waits for the audit's answer. Then the close, once no set-aside unit is
    open (the chain refuses it before)."""
    if progress.closed:
        return None
    if not 0 <= progress.committed <= progress.rounds or (progress.pending and progress.committed == 0):
        raise MarketError(f"roster progress out of range: {progress}")
    revealed = progress.committed - (1 if progress.pending else 0)
    if revealed == progress.rounds:
        return CLOSE_ACTION if progress.open_set_aside == 0 else None
    reveal = progress.committed - 1 if progress.pending else None
    commit = progress.committed if progress.committed < progress.rounds else None
    if reveal is not None and (reveal not in progress.openings_ready or reveal in progress.auditing):
        return None
    if reveal is not None and commit is not None and (reveal in progress.held or progress.expired):
        return StepPlan(progress.committed, reveal, None, held=True)
    if progress.expired and reveal is None:
        return None
    if commit is not None and commit not in progress.works_ready:
        return None
    return StepPlan(progress.committed, reveal, commit)


def step_landed(plan_index: int, rounds: int, committed: int, pending: bool) -> bool:
    """Whether the chain already shows step `plan_index` done (so it must not be sent again): a committing
    step once `plan_index + 1` rounds are committed, the last (reveal-only) step once nothing is pending
    after the last round."""
    if plan_index < rounds:
        return committed > plan_index
    return committed == rounds and not pending


def action_landed(action: str, rounds: int, committed: int, pending: bool) -> bool:
    """Whether the chain shows the step action `action` (`step:<index>` or `reveal:<round>`) done."""
    if action.startswith(REVEAL_PREFIX):
        revealed = committed - (1 if pending else 0)
        return revealed > int(action.removeprefix(REVEAL_PREFIX))
    return step_landed(int(action.split(":", 1)[1]), rounds, committed, pending)


class SetAsideReason(StrEnum):
    """Why a round's unit goes to its verifiers, the most telling first when several hold."""

    WITHHELD = "withheld"  # a replica did not open within the reveal window (and published no opening)
    SPLIT = "split"  # its replicas revealed different results
    WEAK_PROVIDER = "weak_provider"  # a provider below the roster's required streak
    DRAWN = "drawn"  # the spot-check draw, or the commit block's hash is no longer readable


def draw_roster(
    block_hash: str,
    order_key: str,
    stakes: Mapping[str, int],
    capacity: Mapping[str, int],
    replicas: int,
    units_per_round: int,
    rounds: int,
) -> Roster:
    """Each unit's `replicas` providers by the stake-weighted draw of market/domain/selection.py, seeded per
    unit from `block_hash` and the order's 32-byte `order_key`: distinct within a unit, none over its
    `capacity` (the slots its free stake can collateralize), at most 32 providers in all (the first 32
    drawn; later units draw among them). The same draw for every round: the roster holds for the order."""
    if not 1 <= replicas <= 5:
        raise InvalidInput(f"a unit has 1 to 5 replicas, got {replicas}")
    seed = selection_seed(block_hash, order_key)
    providers: list[str] = []
    used: dict[str, int] = {}
    slots: list[int] = []
    for unit in range(units_per_round):
        unit_seed = "0x" + keccak(bytes.fromhex(seed[2:]) + unit.to_bytes(32, "big")).hex()

        def eligible(address: str) -> bool:
            if used.get(address, 0) >= capacity.get(address, 0):
                return False
            return address in used or len(providers) < MAX_ROSTER_PROVIDERS

        chosen = sample(block_hash, unit_seed, ROLE_REPLICAS, stakes, replicas, eligible)
        if len(chosen) < replicas:
            raise MarketError(
                f"unit {unit} of the roster found {len(chosen)} of {replicas} providers with free stake "
                "for a slot"
            )
        for address in chosen:
            if address not in used:
                providers.append(address)
            used[address] = used.get(address, 0) + 1
            slots.append(providers.index(address))
    return Roster(tuple(providers), tuple(slots), replicas, units_per_round, rounds)


def predict_set_aside(
    roster: Roster,
    order_id: int,
    round_index: int,
    commit_block_hash: str,
    rate_ppm: int,
    values: Sequence[str | None],
    weak: frozenset[str] = frozenset(),
) -> dict[int, SetAsideReason]:
    """The units of round `round_index` that the step revealing it sets aside, with why. `values`: per
    replica slot the digest it opened (or published), None for a slot that did not open; `rate_ppm`: the
    contract's rate for the roster's replica count (`soloSpotCheckPpm` when it is 1, else
    `spotCheckPpm`); `commit_block_hash`: the hash of the block whose step committed the round (zero once
    unreadable); `weak`: the roster's providers below its required streak now."""
    k = roster.replicas
    if len(values) != roster.units_per_round * k:
        raise InvalidInput(f"expected {roster.units_per_round * k} slot values, got {len(values)}")
    unreadable = int(commit_block_hash, 16) == 0
    weak_lower = {address.lower() for address in weak}
    reasons: dict[int, SetAsideReason] = {}
    for unit in range(roster.units_per_round):
        opened = values[unit * k : (unit + 1) * k]
        providers = {roster.provider_of(unit, replica).lower() for replica in range(k)}
        unit_key = f"0x{round_unit_id(order_id, round_index, unit):064x}"
        if any(value is None for value in opened):
            reasons[unit] = SetAsideReason.WITHHELD
        elif len({value.lower() for value in opened if value is not None}) > 1:
            reasons[unit] = SetAsideReason.SPLIT
        elif providers & weak_lower:
            reasons[unit] = SetAsideReason.WEAK_PROVIDER
        elif unreadable or spot_check_drawn(commit_block_hash, unit_key, rate_ppm):
            reasons[unit] = SetAsideReason.DRAWN
    return reasons
