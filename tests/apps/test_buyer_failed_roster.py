"""`order fetch` of a round-path order whose roster failed before it opened (market/rosters.py `fall_back`:
the roster's state is "failed", nothing of it is on chain, and every unit ran matched and assigned on the
per-unit path). The market still settles it without a final aggregate unit (market/orders.py: a roster row,
failed or not, means the round path's `final_aggregate` rule), so the buyer runs the last outer step itself,
as for any round-path order, but over the per-unit chain units of the last round (its latest accepted
attempt per shard, attempt 0 included), and its loss curve is those chain units' losses, round by round.

The chain, its events and the peers are fakes; the spec, states, manifests, transcripts and digests, and the
outer step, are the real ones."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors import safe_open

from apps.buyer import (
    collect_training,
    order_money,
    round_path_final,
    round_path_units,
    set_aside_digests,
)
from market.orders import unit_key_for
from tests.apps.buyer_fixtures import FEE, ORDER, PRICE, Plane, Replica, honest_manifest, layout
from tests.apps.buyer_fixtures import event as _event
from veritrain.agentkit import UnitManifest
from veritrain.chain.tx import Event
from veritrain.diloco import AggregateInputs, aggregate, order_genesis, outer_step
from veritrain.errors import DigestMismatch
from veritrain.messages import OrderSpec, OrderStatus, RosterStatus
from veritrain.pol import State, state_digest
from veritrain.recipes import get_recipe

P1, P2, P3, V1 = "0x1", "0x2", "0x3", "0xV1"
PEERS = {P1: "peer-1", P2: "peer-2", P3: "peer-3"}
STEPS = 4
SPEC = OrderSpec.model_validate(
    {
        "buyer": "0x" + "b" * 40,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "00" * 32,
        "total_steps": 2 * STEPS,
        "unit_steps": STEPS,
        "replicas": 2,
        "shards": 2,
        "seed": 1,
        "max_price_per_pflop": 3 * 10**18,
        "deadline": 10**10,
        "verifier_fee_per_unit": FEE,
    }
)
CONFIG = SPEC.outer_config()
GENESIS = order_genesis(get_recipe(SPEC.recipe), SPEC.seed, SPEC.shards)


def _trained(round_state: State, shift: float) -> State:
    """A shard's trained state from the round's: its weights moved (what the outer step reads)."""
    return {name: tensor + shift for name, tensor in round_state.items() if name.startswith("model.")}


# round 0's results, round 1's state (their outer step, folded into round 1's units), round 1's results
RESULTS = {(0, 0): _trained(GENESIS, 0.01), (0, 1): _trained(GENESIS, -0.02)}
ROUND0 = AggregateInputs(0, GENESIS, (RESULTS[(0, 0)], RESULTS[(0, 1)]), CONFIG)
ROUND1_STATE = outer_step(GENESIS, ROUND0.results, CONFIG)  # type: ignore[arg-type]
RESULTS |= {(1, 0): _trained(ROUND1_STATE, 0.03), (1, 1): _trained(ROUND1_STATE, 0.05)}


def _hex(raw: bytes) -> str:
    return "0x" + raw.hex()


def _manifest(round_index: int, shard: int, first_loss: float) -> UnitManifest:
    """An honest manifest of unit (round, shard) (the spec's recipe, seed and shards): a transcript ending
    at its result state, and for round 1 the fold its result binds (round 1's state and round 0's inputs
    commitment)."""
    return honest_manifest(
        round_index,
        shard,
        [first_loss - 0.1 * step for step in range(STEPS)],
        state=state_digest(RESULTS[(round_index, shard)]),
        fold=(_hex(state_digest(ROUND1_STATE)), _hex(ROUND0.commitment())) if round_index else None,
    )


GOOD = {key: _manifest(*key, first_loss=3.0 - key[0] - 0.5 * key[1]) for key in RESULTS}
WRONG = "0x" + "ee" * 32  # a faulty replica's digest


@dataclass(frozen=True)
class _Unit:
    """A per-unit chain unit of the order: its (round, shard, attempt), providers and each replica's
    revealed result digest."""

    unit_id: int
    round_index: int
    shard: int
    attempt: int
    providers: tuple[str, str]
    digests: tuple[str, str]


UNITS = [
    _Unit(11, 0, 0, 0, (P1, P2), (GOOD[(0, 0)].result_digest,) * 2),
    _Unit(12, 0, 1, 0, (P2, P3), (GOOD[(0, 1)].result_digest,) * 2),
    _Unit(13, 1, 0, 0, (P3, P1), (WRONG, WRONG)),  # a fault for both replicas: shard 0 is retried
    _Unit(14, 1, 1, 0, (P2, P3), (WRONG, GOOD[(1, 1)].result_digest)),  # P2 cheated: fraud, P3 accepted
    _Unit(15, 1, 0, 1, (P1, P2), (GOOD[(1, 0)].result_digest,) * 2),  # shard 0's retry
]


def _events() -> list[Event]:
    """The order as the chain has it: posted, then five units assigned and settled one by one (no roster
    event: the roster never opened)."""
    events = [
        _event(
            "OrderPosted",
            orderId=ORDER,
            specHash=bytes.fromhex(SPEC.spec_hash().removeprefix("0x")),
            escrow=SPEC.unit_count * (2 * PRICE + FEE),
            pricePerReplica=PRICE,
            verifierFeePerUnit=FEE,
        )
    ]
    for unit in UNITS:
        key = unit_key_for(ORDER, unit.round_index, unit.shard, unit.attempt)
        events.append(
            _event(
                "UnitAssigned",
                unitId=unit.unit_id,
                orderId=ORDER,
                unitKey=bytes.fromhex(key.removeprefix("0x")),
                providers=list(unit.providers),
                verifiers=[V1],
            )
        )
        for provider, digest in zip(unit.providers, unit.digests, strict=True):
            events.append(
                _event("ReplicaRevealed", unitId=unit.unit_id, provider=provider, resultDigest=digest)
            )
        if unit.unit_id == 13:
            events.append(_event("VerdictRecorded", unitId=13, outcomes=[1, 1], verifiers=[V1]))
        elif unit.unit_id == 14:
            events.append(_event("VerdictRecorded", unitId=14, outcomes=[2, 0], verifiers=[V1]))
            events.append(_event("HeldSettled", unitId=14, truth=[2, 0]))
        else:
            events.append(_event("UnitFinalized", unitId=unit.unit_id, resultDigest=unit.digests[0]))
    return events


SLOTS = [0, 1, 1, 2]  # the roster's slots: unit 0 on (P1, P2), unit 1 on (P2, P3)
LAYOUT = layout(SLOTS)


def _roster_events() -> list[Event]:
    """The same training on a roster that opened and closed (slots: unit 0 on P1, P2, unit 1 on P2, P3):
    its steps paid three units; round 1's unit 1 was set aside as chain unit 14, P2 cheated (replica 0, whose
    digest alone `RoundRevealed` names) and the verdict accepted P3."""
    posted, *_ = _events()
    digests = [[GOOD[(r, 0)].result_digest, GOOD[(r, 1)].result_digest] for r in range(2)]
    digests[1][1] = WRONG
    return [
        posted,
        _event(
            "RosterOpened",
            orderId=ORDER,
            providers=[P1, P2, P3],
            layout=LAYOUT,
            replicas=2,
            unitsPerRound=2,
            rounds=2,
        ),
        _event("RoundCommitted", orderId=ORDER, round=0),
        _event("RoundRevealed", orderId=ORDER, round=0, digests=digests[0], audited=0),
        _event("RoundCommitted", orderId=ORDER, round=1),
        _event("RoundRevealed", orderId=ORDER, round=1, digests=digests[1], audited=0),
        _event(
            "UnitAssigned", unitId=14, orderId=ORDER, unitKey=b"\x01" * 32, providers=[P2, P3], verifiers=[V1]
        ),
        _event("UnitSetAside", orderId=ORDER, round=1, unit=1, unitId=14),
        _event("VerdictRecorded", unitId=14, outcomes=[2, 0], verifiers=[V1]),
        _event("HeldSettled", unitId=14, truth=[2, 0]),
        _event("RosterClosed", orderId=ORDER, settledRounds=2, paid=6 * PRICE),
    ]


class _Chain:
    """What the buyer reads by call, counted: the order's roster (closed with both rounds revealed, or, as
    for a failed one, none: zero key, never closed) and each unit's replicas."""

    def __init__(self, roster: bool = False) -> None:
        self.roster = roster
        self.roster_reads = 0
        self.replica_reads = 0

    def get_roster(self, order_id: int) -> SimpleNamespace:
        assert order_id == ORDER
        self.roster_reads += 1
        if self.roster:
            return SimpleNamespace(key=b"\x09" * 32, closed=True, committed=2)
        return SimpleNamespace(key=bytes(32), closed=False, committed=0)

    def replica(self, unit_id: int, index: int) -> Replica:
        self.replica_reads += 1
        unit = next(u for u in UNITS if u.unit_id == unit_id)
        return Replica(bytes.fromhex(unit.digests[index].removeprefix("0x")))


def _plane() -> Plane:
    """Every peer serves the manifests of the units it was accepted for, and the states: round 1's and
    the last round's results (what the buyer's outer step reads)."""
    served: dict[str, dict[str, UnitManifest]] = {peer: {} for peer in PEERS.values()}
    accepted = {(0, 0): [P1, P2], (0, 1): [P2, P3], (1, 0): [P1, P2], (1, 1): [P3]}
    for key, providers in accepted.items():
        for provider in providers:
            served[PEERS[provider]][GOOD[key].result_digest] = GOOD[key]
    return Plane(served, [ROUND1_STATE, *RESULTS.values()])


def _status(roster_state: str = "failed") -> OrderStatus:
    """The market's word on the order (its API model): completed, its current state round 1's (no aggregate
    unit followed the last round), its roster "failed" (no providers, no slots, nothing committed) or
    "closed"."""
    failed = roster_state == "failed"
    roster = RosterStatus(
        order_id=1,
        chain_order_id=ORDER,
        state=roster_state,
        roster_key="" if failed else "0x" + "09" * 32,
        providers=() if failed else (P1, P2, P3),
        slots=() if failed else tuple(SLOTS),
        replicas=2,
        units_per_round=2,
        rounds=2,
        works_deadline=0,
        committed=0 if failed else 2,
        revealed=0 if failed else 2,
    )
    return OrderStatus(
        order_id=1,
        chain_order_id=ORDER,
        state="completed",
        rounds_total=2,
        rounds_accepted=2,
        current_state_digest=_hex(state_digest(ROUND1_STATE)),
        units=(),
        roster=roster,
        spec=SPEC,
    )


def _fetch(chain: _Chain, events: list[Event], out: Path, roster_state: str = "failed") -> Any:
    """What `order fetch` (apps/order.py `run_fetch`) does with the order, from its events on."""
    status = _status(roster_state)
    _, units = order_money(events, ORDER)
    set_aside_digests(chain, units)  # type: ignore[arg-type]
    plane = _plane()
    round_units = round_path_units(chain, status, units, events)  # type: ignore[arg-type]
    final = round_path_final(plane, PEERS, status, events, round_units)
    assert final is not None
    return collect_training(
        plane,  # type: ignore[arg-type]
        units,
        PEERS,
        out / "w.safetensors",
        recipe=SPEC.recipe,
        final_digest=str(status.current_state_digest),
        final=final,
        round_units=round_units,
    )


# the final state: the outer step over round 1's state and its accepted results (for a failed roster's
# order, shard 0's retry's)
EXPECTED = aggregate(AggregateInputs(1, ROUND1_STATE, (RESULTS[(1, 0)], RESULTS[(1, 1)]), CONFIG))
LOSSES = [float(loss) for key in [(0, 0), (0, 1), (1, 0), (1, 1)] for loss in GOOD[key].transcript["losses"]]


def test_a_failed_rosters_order_is_fetched_from_its_per_unit_chain_units(tmp_path: Path) -> None:
    chain = _Chain()
    training = _fetch(chain, _events(), tmp_path)
    assert training.final_state_digest == _hex(EXPECTED.output_digest)
    with safe_open(str(tmp_path / "w.safetensors"), "pt") as saved:
        assert saved.metadata()["state_digest"] == _hex(EXPECTED.output_digest)
        for name in saved.keys():  # noqa: SIM118 (safe_open is not a mapping)
            assert torch.equal(saved.get_tensor(name), EXPECTED.output_state["model." + name])
    # the loss curve: each accepted chain unit's, round by round, shard by shard
    assert training.losses == LOSSES and training.round_boundaries == [2 * STEPS]
    assert chain.roster_reads == 0  # no roster on chain to read
    # each accepted replica of units 11, 12, 15 (two each) and 14 (one) read once, not again for round 1
    assert chain.replica_reads == 7


def test_a_closed_rosters_order_reads_each_round_from_the_chain_once(tmp_path: Path) -> None:
    """The same order on its roster: the final step takes the last round's units `round_path_units` read
    (a get_roster per round, the set-aside unit's accepted replica once), not reading them again."""
    chain = _Chain(roster=True)
    training = _fetch(chain, _roster_events(), tmp_path, roster_state="closed")
    assert training.final_state_digest == _hex(EXPECTED.output_digest)
    assert training.losses == LOSSES and training.round_boundaries == [2 * STEPS]
    assert chain.roster_reads == SPEC.rounds
    assert chain.replica_reads == 2 + 1  # set_aside_digests' two, then its accepted replica's digest


def test_the_chain_accepted_units_of_a_failed_rosters_order_are_its_latest_accepted_attempts() -> None:
    events = _events()
    _, units = order_money(events, ORDER)
    found = round_path_units(_Chain(), _status(), units, events)  # type: ignore[arg-type]
    assert found is not None
    assert [(u.round_index, u.shard, u.result_digest, u.providers) for u in found] == [
        (0, 0, GOOD[(0, 0)].result_digest, (P1, P2)),
        (0, 1, GOOD[(0, 1)].result_digest, (P2, P3)),
        (1, 0, GOOD[(1, 0)].result_digest, (P1, P2)),  # the retry (attempt 1), not the faulted attempt 0
        (1, 1, GOOD[(1, 1)].result_digest, (P3,)),  # the verdict's accepted replica only
    ]


def test_a_roster_the_market_calls_failed_but_the_chain_opened_is_refused(tmp_path: Path) -> None:
    """The market's "failed" is checked against the chain: a roster it opened is read only as a roster
    (closed, its rounds revealed), never from per-unit units alone."""
    opened = _event(
        "RosterOpened", orderId=ORDER, providers=[P1, P2, P3], layout=0, replicas=2, unitsPerRound=2, rounds=2
    )
    events = _events()
    events.insert(1, opened)
    with pytest.raises(DigestMismatch, match="roster opened on chain"):
        _fetch(_Chain(), events, tmp_path)
