"""The roster draw and the round set-aside prediction (market/domain/rosters.py), as pure logic; the
prediction's agreement with the contract is tests/chain/test_round_prediction.py."""

from __future__ import annotations

import pytest

from market.domain.rosters import (
    CLOSE_ACTION,
    MAX_ROSTER_PROVIDERS,
    SETTLE_BY_ROUNDS,
    SETTLE_BY_UNITS,
    RosterProgress,
    SetAsideReason,
    StepPlan,
    action_landed,
    draw_roster,
    next_roster_action,
    predict_set_aside,
    roster_refusal,
    roster_shape,
    settlement_of,
    step_landed,
)
from tests.market.test_domain import spec
from veritrain.chain.client import Roster
from veritrain.errors import InvalidInput, InvalidOrderSpec, MarketError
from veritrain.messages import OrderSpec

BLOCK = "0x" + "ab" * 32
ORDER_KEY = "0x" + "cd" * 32
ZERO = "0x" + "00" * 32


def _candidates(count: int, stake: int = 100) -> dict[str, int]:
    return {f"0x{index + 1:040x}": stake for index in range(count)}


def _units(roster: Roster) -> list[list[str]]:
    return [[roster.provider_of(u, r) for r in range(roster.replicas)] for u in range(roster.units_per_round)]


def test_each_unit_gets_distinct_providers_and_the_same_inputs_draw_the_same_roster() -> None:
    stakes = _candidates(6)
    capacity = dict.fromkeys(stakes, 8)
    roster = draw_roster(BLOCK, ORDER_KEY, stakes, capacity, 3, 8, 10)
    assert (roster.replicas, roster.units_per_round, roster.rounds) == (3, 8, 10)
    assert all(len(set(unit)) == 3 for unit in _units(roster))
    assert draw_roster(BLOCK, ORDER_KEY, stakes, capacity, 3, 8, 10) == roster
    other = draw_roster("0x" + "ef" * 32, ORDER_KEY, stakes, capacity, 3, 8, 10)
    assert _units(other) != _units(roster)  # another block, another draw (6^24 layouts: no coincidence)


def test_no_provider_holds_more_slots_than_its_capacity_and_too_few_candidates_is_an_error() -> None:
    stakes = _candidates(4)
    capacity = {address: 2 for address in stakes}
    for seed in range(20):
        roster = draw_roster(BLOCK, f"0x{seed:064x}", stakes, capacity, 2, 3, 1)
        assert all(roster.slots.count(i) <= 2 for i in range(len(roster.providers)))
    with pytest.raises(MarketError, match="free stake"):  # 10 slots, 8 collateralized
        draw_roster(BLOCK, ORDER_KEY, stakes, capacity, 2, 5, 1)
    with pytest.raises(MarketError):
        draw_roster(BLOCK, ORDER_KEY, _candidates(2), dict.fromkeys(_candidates(2), 9), 3, 1, 1)
    with pytest.raises(InvalidInput):
        draw_roster(BLOCK, ORDER_KEY, stakes, capacity, 6, 1, 1)


def test_a_roster_names_at_most_32_providers_and_unstaked_candidates_are_never_drawn() -> None:
    stakes = {**_candidates(60), "0x" + "ff" * 20: 0}
    capacity = dict.fromkeys(stakes, 5)
    roster = draw_roster(BLOCK, ORDER_KEY, stakes, capacity, 5, 10, 1)
    assert len(roster.providers) <= MAX_ROSTER_PROVIDERS
    assert all(len(set(unit)) == 5 for unit in _units(roster))
    assert "0x" + "ff" * 20 not in roster.providers


def _roster(replicas: int = 3) -> Roster:
    providers = tuple(f"0x{index + 1:040x}" for index in range(4))
    slots = tuple((unit + replica) % 4 for unit in range(4) for replica in range(replicas))
    return Roster(providers, slots, replicas, 4, 2)


def test_the_prediction_names_each_reason_the_most_telling_first() -> None:
    roster = _roster()
    same = ["0x" + "11" * 32] * 3
    values: list[str | None] = [*same, *same, *same, *same]
    assert predict_set_aside(roster, 7, 0, BLOCK, 0, values) == {}
    values[1] = None  # unit 0: a replica did not open
    values[4] = "0x" + "22" * 32  # unit 1: replicas disagree
    weak = frozenset({roster.provider_of(2, 0).upper().replace("0X", "0x")})  # unit 2: case is not identity
    reasons = predict_set_aside(roster, 7, 0, BLOCK, 0, values, weak)
    assert reasons[0] is SetAsideReason.WITHHELD and reasons[1] is SetAsideReason.SPLIT
    assert reasons[2] is SetAsideReason.WEAK_PROVIDER
    assert set(reasons) <= {0, 1, 2, 3}
    everything = predict_set_aside(roster, 7, 0, BLOCK, 1_000_000, [*same, *same, *same, *same])
    assert everything == dict.fromkeys(range(4), SetAsideReason.DRAWN)
    assert predict_set_aside(roster, 7, 0, ZERO, 0, [*same, *same, *same, *same]) == everything


def test_the_draw_is_per_round_unit_and_a_bad_slot_count_is_refused() -> None:
    roster = _roster(replicas=1)
    values: list[str | None] = ["0x" + "11" * 32] * 4
    draws = [set(predict_set_aside(roster, 7, r, BLOCK, 500_000, values)) for r in range(8)]
    assert len({frozenset(d) for d in draws}) > 1  # the unit id names the round: draws differ by round
    with pytest.raises(InvalidInput, match="slot values"):
        predict_set_aside(roster, 7, 0, BLOCK, 0, values[:3])


def _spec(**fields: object) -> OrderSpec:
    """tests/market/test_domain.py's spec as a folded 4-shard order of 3 rounds."""
    folded: dict[str, object] = {"total_steps": 30, "unit_steps": 10, "shards": 4, "outer_step": "folded"}
    return spec(**{**folded, **fields})


def test_a_round_path_order_is_folded_fixed_k_and_fits_the_layout() -> None:
    shape = roster_shape(_spec())
    assert (shape.replicas, shape.units_per_round, shape.rounds) == (3, 4, 3)
    with pytest.raises(InvalidOrderSpec, match="folded"):
        roster_shape(_spec(outer_step="unit"))
    with pytest.raises(InvalidOrderSpec, match="fixed replication"):
        roster_shape(_spec(adaptive_replication=True))
    with pytest.raises(InvalidOrderSpec, match="1 to 5 replicas"):  # past the spec's own check
        roster_shape(_spec().model_copy(update={"replicas": 6}))
    with pytest.raises(InvalidOrderSpec, match="51 replica slots"):
        roster_shape(_spec(shards=13, replicas=4))


def test_the_round_path_is_the_default_for_every_spec_that_can_have_a_roster_and_only_for_those() -> None:
    assert settlement_of(_spec(), None) == SETTLE_BY_ROUNDS
    assert settlement_of(_spec(replicas=1), None) == SETTLE_BY_ROUNDS
    # the per-unit path by default where a roster cannot serve: an outer step per round as a unit, M = 1,
    # adaptive replication (its k changes per unit), more slots a round than the layout holds
    for cannot in (
        _spec(outer_step="unit"),
        spec(),
        _spec(adaptive_replication=True),
        _spec(shards=13, replicas=4),
    ):
        assert roster_refusal(cannot) is not None
        assert settlement_of(cannot, None) == SETTLE_BY_UNITS
    assert settlement_of(_spec(), SETTLE_BY_UNITS) == SETTLE_BY_UNITS  # asked: per unit
    assert settlement_of(spec(), SETTLE_BY_ROUNDS) == SETTLE_BY_ROUNDS  # asked: roster_shape refuses it


def test_more_than_32_providers_is_a_typed_error() -> None:
    providers = tuple(f"0x{i + 1:040x}" for i in range(33))
    with pytest.raises(InvalidInput, match="1 to 32 providers"):
        Roster(providers, tuple(range(33)) + (0,) * 3, 3, 12, 1)


def _progress(
    committed: int,
    pending: bool,
    works: set[int],
    openings: set[int],
    held: frozenset[int] = frozenset(),
    **rest: int,
) -> RosterProgress:
    return RosterProgress(
        rounds=3,
        committed=committed,
        pending=pending,
        closed=bool(rest.get("closed", 0)),
        works_ready=frozenset(works),
        openings_ready=frozenset(openings),
        open_set_aside=rest.get("open_set_aside", 0),
        held=held,
        expired=bool(rest.get("expired", 0)),
    )


def test_one_step_per_round_reveals_the_last_round_and_commits_the_next_together() -> None:
    assert next_roster_action(_progress(0, False, set(), set())) is None  # no works yet
    assert next_roster_action(_progress(0, False, {0}, set())) == StepPlan(0, None, 0)
    assert next_roster_action(_progress(1, True, {0}, {0})) is None  # round 1's works not in
    assert next_roster_action(_progress(1, True, {0, 1}, set())) is None  # round 0's openings not in
    assert next_roster_action(_progress(1, True, {0, 1}, {0})) == StepPlan(1, 0, 1)
    assert next_roster_action(_progress(3, True, {2}, {2})) == StepPlan(3, 2, None)  # the last step
    assert next_roster_action(_progress(3, False, set(), set())) == CLOSE_ACTION
    assert next_roster_action(_progress(3, False, set(), set(), open_set_aside=1)) is None
    assert next_roster_action(_progress(3, False, set(), set(), closed=1)) is None
    assert StepPlan(1, 0, 1).action == "step:1"
    with pytest.raises(MarketError):
        next_roster_action(_progress(0, True, set(), set()))


def test_a_step_landed_once_the_chain_committed_past_it_or_revealed_the_last_round() -> None:
    assert not step_landed(1, 3, 1, True)
    assert step_landed(1, 3, 2, True)
    assert not step_landed(3, 3, 3, True)
    assert step_landed(3, 3, 3, False)


def test_a_held_round_is_revealed_by_a_step_of_its_own_and_the_next_round_committed_after() -> None:
    # round 0 holds a unit the chain sets aside: round 1 cannot start from it, so the step reveals alone,
    # whether or not works of round 1 are in (the training plane never hands them out before its verdict)
    assert next_roster_action(_progress(1, True, {0}, {0}, frozenset({0}))) == StepPlan(1, 0, None, held=True)
    assert next_roster_action(_progress(1, True, {0, 1}, {0}, frozenset({0}))) == StepPlan(
        1, 0, None, held=True
    )
    assert next_roster_action(_progress(1, True, {0}, set(), frozenset({0}))) is None  # openings not ready
    assert StepPlan(1, 0, None, held=True).action == "reveal:0"
    assert next_roster_action(_progress(1, False, {1}, set())) == StepPlan(1, None, 1)  # then round 1 alone
    # the last round's reveal is the last step whether held or not
    assert next_roster_action(_progress(3, True, {2}, {2}, frozenset({2}))) == StepPlan(3, 2, None)
    assert not action_landed("reveal:0", 3, 1, True)
    assert action_landed("reveal:0", 3, 1, False) and action_landed("reveal:0", 3, 2, True)
    assert action_landed("step:1", 3, 2, True) and not action_landed("step:1", 3, 1, False)


def test_past_the_deadline_a_pending_round_is_revealed_alone_and_nothing_committed() -> None:
    # the chain commits no round past the order's deadline, and its close pays nothing for a pending round:
    # the pending round is revealed alone (its next round's works in or not), once its openings are ready
    assert next_roster_action(_progress(1, True, {0}, {0}, expired=1)) == StepPlan(1, 0, None, held=True)
    assert next_roster_action(_progress(1, True, {0, 1}, {0}, expired=1)) == StepPlan(1, 0, None, held=True)
    assert next_roster_action(_progress(1, True, {0}, set(), expired=1)) is None  # openings not ready
    assert next_roster_action(_progress(3, True, {2}, {2}, expired=1)) == StepPlan(3, 2, None)  # the last
    # nothing pending: no commit (the market plans the close at the deadline)
    assert next_roster_action(_progress(1, False, {1}, set(), expired=1)) is None
    assert next_roster_action(_progress(3, False, set(), set(), expired=1)) == CLOSE_ACTION
