"""Pure domain core: state machines, matching constraints and declines, replication, rounds, pricing."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from pydantic import ValidationError

from market.domain.matching import (
    CandidatePool,
    DeclineReason,
    ProviderCandidate,
    UnitDemand,
    draw,
    match_unit,
)
from market.domain.pricing import FLOPS_PER_PFLOP, escrow_plan, price_for_flops, training_flops
from market.domain.replication import (
    ReplicationPolicy,
    Reputation,
    on_probation,
    replication_factor,
    spot_check_drawn,
)
from market.domain.rounds import (
    AcceptedReplica,
    RoundDecision,
    aggregates_after,
    decide_shards,
    final_aggregate,
    folded_round_state,
    folds,
    next_state,
    plan_aggregate,
    plan_round,
)
from market.domain.selection import selection_seed
from market.domain.states import (
    UNIT_TRANSITIONS,
    OrderState,
    ReplicaState,
    UnitState,
    advance,
    can_advance,
)
from veritrain.diloco import OuterConfig
from veritrain.errors import IllegalTransition, InvalidInput, MarketError
from veritrain.messages import OrderSpec, UnitKind


def candidate(i: int, **overrides: object) -> ProviderCandidate:
    base = ProviderCandidate(
        address=f"0x{i:040x}",
        operator=f"op{i}",
        memory_mb=4096,
        gflops=100,
        hardware_class="cpu",
        recipes=frozenset({"digits-mlp"}),
        free_stake=10**19,
        price_per_pflop=10**17,
        bonded_stake=10**19,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


BLOCK = "0x" + "5e" * 32  # the matching pass's block hash


def seed(n: int) -> str:
    """A unit's selection seed, as if block n's hash had been drawn."""
    return selection_seed(f"0x{n:064x}", f"0x{n + 1:064x}")


def demand(**overrides: object) -> UnitDemand:
    base = UnitDemand(
        unit_id=1,
        recipe="digits-mlp",
        min_memory_mb=1024,
        unit_flops=10**12,
        time_budget_s=100,
        max_price_per_pflop=10**18,
        collateral=10**18,
        needed=3,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


# --- state machines ---


def test_unit_lifecycle_fast_path_is_allowed() -> None:
    state = UnitState.PENDING
    for target in (
        UnitState.PROPOSED,
        UnitState.ASSIGNING,
        UnitState.COMMITTING,
        UnitState.REVEALING,
        UnitState.FINALIZING,
        UnitState.ACCEPTED,
    ):
        state = advance(state, target)
    assert state == UnitState.ACCEPTED


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (UnitState.ACCEPTED, UnitState.PENDING),  # a settled unit is never re-matched
        (UnitState.FAILED, UnitState.ACCEPTED),  # a failed unit is never paid
        (UnitState.PENDING, UnitState.COMMITTING),  # no assignment without signatures
        (UnitState.COMMITTING, UnitState.PROPOSED),  # on chain: cannot be taken back
    ],
)
def test_illegal_unit_transitions_raise_typed_error(current: UnitState, target: UnitState) -> None:
    with pytest.raises(IllegalTransition, match=f"{current.value} -> {target.value}"):
        advance(current, target, what="unit 9")


def test_terminal_states_have_no_exit_and_every_state_is_listed() -> None:
    assert set(UNIT_TRANSITIONS) == set(UnitState)
    assert not UNIT_TRANSITIONS[UnitState.ACCEPTED] and not UNIT_TRANSITIONS[UnitState.FAILED]
    assert not can_advance(OrderState.COMPLETED, OrderState.RUNNING)
    assert can_advance(ReplicaState.REVEALED, ReplicaState.FRAUD)
    assert not can_advance(ReplicaState.SIGNED, ReplicaState.FRAUD)  # fraud needs a revealed result


def test_advance_refuses_mixing_machines() -> None:
    with pytest.raises(IllegalTransition):
        advance(UnitState.PENDING, OrderState.RUNNING)  # type: ignore[type-var]


# --- matching ---


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"online": False}, DeclineReason.OFFLINE),
        ({"active_units": 1}, DeclineReason.AT_CAPACITY),
        ({"recipes": frozenset({"charlm-tiny"})}, DeclineReason.RECIPE_UNSUPPORTED),
        ({"memory_mb": 512}, DeclineReason.INSUFFICIENT_MEMORY),
        ({"gflops": 5}, DeclineReason.TOO_SLOW),  # 10^12 FLOP in 100 s needs 10 GFLOP/s
        ({"free_stake": 10**18 - 1}, DeclineReason.INSUFFICIENT_FREE_STAKE),
        ({"price_per_pflop": None}, DeclineReason.NO_OFFER),
        ({"price_per_pflop": 10**18 + 1}, DeclineReason.PRICE_ABOVE_MAX),
        ({"reputation": Reputation(valid=40, fraud=1)}, DeclineReason.FRAUD_RECORD),
    ],
)
def test_each_hard_constraint_declines_with_its_reason(
    override: dict[str, object], reason: DeclineReason
) -> None:
    bad = candidate(99, **override)
    good = [candidate(i) for i in range(3)]
    match = match_unit(demand(), [bad, *good])
    assert match.complete and bad.address not in match.selected
    assert (bad.address, reason) in match.declines


def test_replicas_of_one_unit_have_distinct_operators() -> None:
    same_operator = [candidate(i, operator="sybil", gflops=1000) for i in range(5)]
    honest = [candidate(10 + i) for i in range(3)]
    match = match_unit(demand(), [*same_operator, *honest])
    chosen_ops = [c.operator for c in [*same_operator, *honest] if c.address in match.selected]
    assert match.complete and len(set(chosen_ops)) == 3
    assert sum(1 for _, r in match.declines if r == DeclineReason.OPERATOR_ALREADY_ON_UNIT) == 4


def test_sybil_assignment_never_puts_two_replicas_under_one_owner() -> None:
    """SECURITY.md B6: 30 % of identities share one owner; no unit gets two of them."""
    rng = random.Random(3)
    pool = CandidatePool()
    for i in range(300):
        pool.upsert(
            candidate(
                i,
                operator="owner" if i % 10 < 3 else f"op{i}",
                gflops=rng.randint(20, 400),
                price_per_pflop=rng.randint(10**16, 10**18),
                capacity=100,
            )
        )
    for unit_id in range(1000):
        match = pool.match(demand(unit_id=unit_id), BLOCK, seed(unit_id))
        owners = [pool.get(a).operator for a in match.selected]  # type: ignore[union-attr]
        assert match.complete and owners.count("owner") <= 1


def test_price_speed_and_reputation_do_not_buy_a_place_in_the_draw() -> None:
    """The market does not rank: two candidates that differ only in price, speed or reputation are drawn
    in the same order as two that are alike."""
    cheap = candidate(1, price_per_pflop=10**16, gflops=10_000)
    trusted = candidate(2, reputation=Reputation(valid=50, consecutive_valid=50))
    plain = [candidate(1), candidate(2)]
    for n in range(20):
        drawn = [c.address for c in draw(BLOCK, seed(n), [cheap, trusted])]
        assert drawn == [c.address for c in draw(BLOCK, seed(n), plain)]


def test_replicas_prefer_one_hardware_class_and_mix_only_when_needed() -> None:
    gpu = [candidate(i, hardware_class="gpu", gflops=5000) for i in range(2)]
    cpu = [candidate(10 + i, hardware_class="cpu") for i in range(3)]
    match = match_unit(demand(), [*gpu, *cpu])
    assert match.selected == (gpu[0].address, gpu[1].address, cpu[0].address)
    assert (cpu[1].address, DeclineReason.OTHER_HARDWARE_CLASS) in match.declines
    # with three of the best class available, all three come from it
    gpu3 = [*gpu, candidate(2, hardware_class="gpu", gflops=5000)]
    match = match_unit(demand(), [*gpu3, *cpu])
    assert set(match.selected) == {c.address for c in gpu3}


def test_incomplete_match_reports_reasons_and_selects_nothing_in_pool() -> None:
    pool = CandidatePool()
    pool.upsert(candidate(1))
    pool.upsert(candidate(2, memory_mb=10))
    match = pool.match(demand(), BLOCK, seed(1))
    assert not match.complete and match.k == 3
    assert (candidate(2).address, DeclineReason.INSUFFICIENT_MEMORY) in match.declines


def test_pool_matches_like_a_draw_over_every_candidate_and_tracks_capacity() -> None:
    rng = random.Random(11)
    candidates = [
        candidate(
            i,
            gflops=rng.randint(1, 500),
            memory_mb=rng.choice([256, 2048, 8192]),
            price_per_pflop=rng.randint(10**16, 2 * 10**18),
            operator=f"op{i % 40}",
        )
        for i in range(200)
    ]
    pool = CandidatePool()
    for c in candidates:
        pool.upsert(c)
    expected = match_unit(demand(), draw(BLOCK, seed(1), candidates))
    got = pool.match(demand(), BLOCK, seed(1))
    assert got.selected == expected.selected
    for address in got.selected:  # reserved: not offered again until released
        assert pool.get(address).active_units == 1  # type: ignore[union-attr]
    again = pool.match(demand(unit_id=2), BLOCK, seed(1))
    assert not set(again.selected) & set(got.selected)
    pool.release(got.selected[0])
    assert got.selected[0] in [c.address for c in pool.available("digits-mlp")]


def test_adaptive_replication_follows_the_first_drawn_candidates_reputation() -> None:
    trusted = candidate(1, reputation=Reputation(valid=40, consecutive_valid=40), price_per_pflop=10**15)
    others = [candidate(10 + i) for i in range(5)]
    match = match_unit(demand(adaptive=True, needed=5), [trusted, *others])
    assert match.k == 1 and match.selected == (trusted.address,)
    newcomer_first = match_unit(demand(adaptive=True, needed=5), others)
    assert newcomer_first.k == 5 and newcomer_first.complete


def test_replication_factor_policy() -> None:
    assert replication_factor(Reputation(valid=25, consecutive_valid=25), 5) == 1
    assert replication_factor(Reputation(valid=19, consecutive_valid=19), 3) == 3  # one short of the streak
    assert replication_factor(Reputation(), 3) == 3
    assert replication_factor(Reputation(valid=100, fraud=1, consecutive_valid=90), 5) == 5
    assert replication_factor(Reputation(valid=30, fault=1, consecutive_valid=0), 4) == 4  # a fault resets
    strict = ReplicationPolicy(trusted_streak=50)  # an order's own streak
    assert replication_factor(Reputation(valid=25, consecutive_valid=25), 3, strict) == 3


def test_probation_is_the_contracts_rule() -> None:
    """JobMarket draws a unit with a provider below probationStreak consecutive valid units (the streak a
    fault or fraud resets), whatever its record before: the simulators use the same rule."""
    assert on_probation(Reputation())
    assert on_probation(Reputation(valid=4, consecutive_valid=4))
    assert not on_probation(Reputation(valid=5, consecutive_valid=5))
    assert on_probation(Reputation(valid=300, fault=1, consecutive_valid=0))
    assert not on_probation(Reputation(), ReplicationPolicy(probation_streak=0))


def test_spot_check_draw_is_deterministic_and_near_its_rate() -> None:
    randomness = "0x" + "11" * 32
    keys = [f"0x{i:064x}" for i in range(20_000)]
    drawn = [spot_check_drawn(randomness, key, 50_000) for key in keys]
    assert drawn == [spot_check_drawn(randomness, key, 50_000) for key in keys]
    assert 0.04 < sum(drawn) / len(keys) < 0.06
    other = [spot_check_drawn("0x" + "22" * 32, key, 50_000) for key in keys]
    assert other != drawn  # new randomness, new draw
    assert not any(spot_check_drawn(randomness, k, 0) for k in keys[:100])
    assert all(spot_check_drawn(randomness, k, 1_000_000) for k in keys[:100])


# --- pricing, rounds ---


def spec(**overrides: object) -> OrderSpec:
    fields: dict[str, object] = {
        "buyer": "0x" + "b" * 40,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "00" * 32,
        "total_steps": 100,
        "unit_steps": 25,
        "replicas": 3,
        "seed": 1,
        "max_price_per_pflop": 3 * 10**18,
        "deadline": 10**10,
        "verifier_fee_per_unit": 7,
    }
    fields.update(overrides)
    return OrderSpec.model_validate(fields)


def test_pricing_is_integer_per_pflop_and_rounds_up() -> None:
    assert training_flops(10**6, 1000) == 6 * 10**9
    assert price_for_flops(10**18, FLOPS_PER_PFLOP) == 10**18
    assert price_for_flops(3, FLOPS_PER_PFLOP + 1) == 4  # never short by a base unit
    plan = escrow_plan(spec(), flops_per_step=4 * 10**13)  # 25 steps → 1 PFLOP per unit
    assert plan.price_per_replica == 3 * 10**18 and plan.units == 4
    assert plan.total == 4 * (3 * 3 * 10**18 + 7)
    assert isinstance(plan.total, int)


def test_rounds_plan_and_next_state_of_sequential_training() -> None:
    order = spec()
    assert order.rounds == 4 and order.unit_count == 4
    assert [(u.shard, u.start_step) for r in range(4) for u in plan_round(order, r)] == [
        (0, 0),
        (0, 25),
        (0, 50),
        (0, 75),
    ]
    accepted = [
        AcceptedReplica(1, "a", "0xaa"),
        AcceptedReplica(1, "b", "0xbb"),
        AcceptedReplica(1, "c", "0xbb"),
    ]
    assert next_state(0, accepted) == "0xbb"  # majority of accepted states
    with pytest.raises(MarketError, match="no accepted replica"):
        next_state(0, [])
    with pytest.raises(MarketError, match="outside"):
        plan_round(order, 4)
    with pytest.raises(MarketError, match="aggregate"):
        plan_aggregate(order, 0)


def test_diloco_round_has_m_shard_units_and_one_aggregate_unit() -> None:
    order = spec(shards=3, total_steps=90, unit_steps=25, outer_step="unit")
    assert order.rounds == 4 and order.unit_count == 4 * 4  # 3 training + 1 aggregate per round
    assert [(u.shard, u.start_step, u.steps) for u in plan_round(order, 3)] == [
        (0, 75, 15),
        (1, 75, 15),
        (2, 75, 15),
    ]
    aggregate = plan_aggregate(order, 1)
    assert (aggregate.shard, aggregate.start_step, aggregate.steps, aggregate.kind) == (
        3,
        50,
        0,
        UnitKind.AGGREGATE,
    )


A, F, R = UnitState.ACCEPTED, UnitState.FAILED, UnitState.COMMITTING


def test_shards_wait_for_all_by_default_and_failed_shards_are_reassigned() -> None:
    order = spec(shards=3)
    assert decide_shards(order, {0: A, 1: R, 2: A}) == RoundDecision()  # a unit in flight: wait
    assert decide_shards(order, {0: A, 1: F, 2: R}) == RoundDecision(retry=(1,))
    assert decide_shards(order, {0: A, 1: F, 2: F}) == RoundDecision(retry=(1, 2))
    assert decide_shards(order, {0: A, 1: A, 2: A}) == RoundDecision(aggregate_over=(0, 1, 2))
    with pytest.raises(MarketError, match="shards"):
        decide_shards(order, {0: A, 1: A})


def test_shard_quorum_proceeds_without_failed_shards_once_reached() -> None:
    order = spec(shards=3, shard_quorum=2)
    assert decide_shards(order, {0: A, 1: F, 2: R}) == RoundDecision(retry=(1,))  # quorum not reached yet
    assert decide_shards(order, {0: A, 1: F, 2: A}) == RoundDecision(aggregate_over=(0, 2))
    assert decide_shards(order, {0: A, 1: A, 2: R}) == RoundDecision()  # never cuts a running unit
    assert decide_shards(order, {0: A, 1: A, 2: F}) == RoundDecision(aggregate_over=(0, 1))
    sequential = spec()
    assert decide_shards(sequential, {0: F}) == RoundDecision(retry=(0,))
    assert decide_shards(sequential, {0: A}) == RoundDecision(aggregate_over=(0,))


def test_diloco_spec_fields_are_checked_and_hashed() -> None:
    plain = spec()
    assert spec(shards=1).spec_hash() == plain.spec_hash()  # M = 1 hashes as before the fields existed
    two = spec(shards=2)
    assert two.quorum == 2 and two.outer_config().digest() == OuterConfig().digest()
    for change in (
        {"outer_lr": 0.5},
        {"outer_momentum": 0.8},
        {"outer_aggregation": "median"},
        {"shards": 3},
    ):
        assert spec(**{"shards": 2, **change}).spec_hash() != two.spec_hash()
    assert spec(shards=5, outer_aggregation="trimmed_mean", outer_trim=1, shard_quorum=3).quorum == 3
    for bad in (
        {"outer_lr": 0.5},  # outer fields need M >= 2
        {"shard_quorum": 1},
        {"shards": 2, "shard_quorum": 3},  # more than M
        {"shards": 4, "outer_aggregation": "trimmed_mean", "outer_trim": 1, "shard_quorum": 2},  # < 2·trim+1
        {"shards": 2, "outer_trim": 1},  # trim without trimmed_mean
        {"shards": 2, "outer_momentum": 1.0},
        {"shards": 2, "outer_lr": float("nan")},
        {"shards": 0},
    ):
        with pytest.raises(ValidationError):
            spec(**bad)


def test_a_folded_order_opens_no_aggregate_unit_except_after_its_last_round() -> None:
    folded, unit = spec(shards=3, total_steps=100, unit_steps=25), spec(shards=3, outer_step="unit")
    assert folded.outer_step == "folded"  # the default for M >= 2
    assert folded.rounds == 4 and folded.unit_count == 4 * 3 + 1  # one aggregate unit, after round 3
    assert [aggregates_after(folded, r) for r in range(4)] == [False, False, False, True]
    assert [folds(folded, r) for r in range(4)] == [False, True, True, True]  # round 0 starts from genesis
    assert all(aggregates_after(unit, r) and not folds(unit, r) for r in range(unit.rounds))
    assert not aggregates_after(spec(), 1)  # M = 1 has no outer step
    round_state = "0x" + "5e" * 32
    accepted = [
        AcceptedReplica(1, "0xa", "0x" + "01" * 32, round_state),
        AcceptedReplica(2, "0xb", "0x" + "02" * 32, "0x" + "66" * 32),  # a minority's report loses
        AcceptedReplica(3, "0xc", "0x" + "03" * 32, round_state),
    ]
    assert folded_round_state(2, accepted) == round_state
    with pytest.raises(MarketError, match="round 1"):
        folded_round_state(1, [AcceptedReplica(1, "0xa", "0x" + "01" * 32)])


def test_outer_step_is_hashed_only_when_folded_and_needs_shards() -> None:
    fields = {"buyer": "0x" + "12" * 20, "recipe": "digits-mlp", "dataset_digest": "0x" + "ab" * 32}
    fields |= {"total_steps": 10, "unit_steps": 5, "replicas": 3, "seed": 1, "max_price_per_pflop": 10}
    two = OrderSpec.model_validate({**fields, "deadline": 99, "shards": 2, "outer_step": "unit"})
    # the hash this M = 2 spec had before outer_step existed (computed with the code of d0d996e): naming
    # "unit" keeps it
    assert two.spec_hash() == "0xfed434a00fc0b72201b6dc37f26932ec2da126c3f07e9ad808c8b86e0651a71a"
    assert two.model_copy(update={"outer_step": "folded"}).spec_hash() != two.spec_hash()
    with pytest.raises(ValidationError, match="outer_step 'folded' needs shards >= 2"):
        spec(outer_step="folded")
    with pytest.raises(ValidationError):
        spec(shards=2, outer_step="sometimes")


def test_a_sharded_spec_naming_no_outer_step_is_folded_and_a_stored_one_keeps_its_hash() -> None:
    """The folded outer step is the default for M >= 2 (the round path's, issue 9); M = 1 and a spec naming
    "unit" are unchanged. Stored specs name every field (`model_dump_json`) and read back as hashed; one
    stored before `outer_step` existed (it names nothing) was a "unit" order and reads back as one
    (`OrderSpec.from_stored`), its hash the one its chain order escrows."""
    fields = {"buyer": "0x" + "12" * 20, "recipe": "digits-mlp", "dataset_digest": "0x" + "ab" * 32}
    fields |= {"total_steps": 10, "unit_steps": 5, "replicas": 3, "seed": 1, "max_price_per_pflop": 10}
    old = {**fields, "deadline": 99, "shards": 2}  # a spec of d0d996e's time: no outer_step
    old_hash = "0xfed434a00fc0b72201b6dc37f26932ec2da126c3f07e9ad808c8b86e0651a71a"
    fresh = OrderSpec.model_validate(old)
    assert fresh.outer_step == "folded" and fresh.spec_hash() != old_hash  # a new order naming nothing
    stored = OrderSpec.from_stored(json.dumps(old))
    assert stored.outer_step == "unit" and stored.spec_hash() == old_hash
    for spec_ in (fresh, stored, OrderSpec.model_validate({**old, "shards": 1})):
        assert '"outer_step"' in spec_.model_dump_json()  # what the market stores names it
        again = OrderSpec.from_stored(spec_.model_dump_json())
        assert again == spec_ and again.spec_hash() == spec_.spec_hash()
        assert OrderSpec.model_validate_json(spec_.model_dump_json()) == spec_
    assert OrderSpec.model_validate({**old, "shards": 1}).outer_step == "unit"  # M = 1: no outer step
    with pytest.raises(InvalidInput):
        OrderSpec.from_stored("{not json")


def test_escrow_covers_the_aggregate_units() -> None:
    plan = escrow_plan(spec(shards=2, outer_step="unit"), flops_per_step=4 * 10**13)
    assert plan.units == 4 * 3 and plan.total == 12 * (3 * 3 * 10**18 + 7)


def test_a_round_path_order_runs_no_final_aggregate_unit() -> None:
    # the buyer runs the last outer step itself (apps/buyer.py final_outer_step); per unit it stays, and the
    # escrow keeps that unit either way (the round path's reserve for a retry)
    folded = spec(shards=3, total_steps=100, unit_steps=25, outer_step="folded")
    assert [aggregates_after(folded, r, rounds_path=True) for r in range(4)] == [False] * 4
    assert [aggregates_after(folded, r, rounds_path=False) for r in range(4)] == [False, False, False, True]
    assert not final_aggregate(folded, rounds_path=True) and final_aggregate(folded, rounds_path=False)
    assert final_aggregate(spec(shards=2, outer_step="unit"), rounds_path=True)  # never on a roster
    assert not final_aggregate(spec(), rounds_path=False)  # M = 1 has no outer step
    assert escrow_plan(folded, 4 * 10**13).units == folded.unit_count == 4 * 3 + 1


def test_pool_keeps_unusable_providers_out_of_the_scan_and_says_why() -> None:
    pool = CandidatePool(collateral=10**18, recipe_memory_mb={"digits-mlp": 2048})
    usable = candidate(1)
    pool.upsert(usable)
    pool.upsert(candidate(2, online=False))
    pool.upsert(candidate(3, price_per_pflop=None))
    pool.upsert(candidate(4, free_stake=1))
    pool.upsert(candidate(5, memory_mb=1024))
    pool.upsert(candidate(6, reputation=Reputation(valid=40, fraud=1), price_per_pflop=1))
    assert [c.address for c in pool.available("digits-mlp")] == [usable.address]
    assert pool.unavailable_reason(candidate(2).address) == DeclineReason.OFFLINE
    assert pool.unavailable_reason(candidate(3).address) == DeclineReason.NO_OFFER
    assert pool.unavailable_reason(candidate(4).address) == DeclineReason.INSUFFICIENT_FREE_STAKE
    assert pool.unavailable_reason(candidate(5).address, "digits-mlp") == DeclineReason.INSUFFICIENT_MEMORY
    assert pool.unavailable_reason(candidate(6).address) == DeclineReason.FRAUD_RECORD
    pool.reserve(usable.address)
    assert pool.unavailable_reason(usable.address) == DeclineReason.AT_CAPACITY
    assert pool.get(usable.address).active_units == 1  # type: ignore[union-attr]
    pool.release(usable.address)
    assert pool.unavailable_reason(usable.address, "digits-mlp") is None
