"""The market's round set-aside prediction (market/domain/rosters.py) against the contract itself: for
rosters drawn by the market's roster draw, rounds with drawn, split and withheld units at a 50 % audit
rate, the units `predict_set_aside` names are exactly the `UnitSetAside` events of the revealing step."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from market.domain.rosters import draw_roster, predict_set_aside
from tests.chain.conftest import FEE, PRICE, TEST_PARAMS, TOKEN, World, build_world, reverted
from veritrain.chain import eip712
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import Reveal, Roster

pytestmark = pytest.mark.chain

RATE_PPM = 500_000
ROUNDS = 4
# Every set-aside unit locks its verifiers' collateral until a verdict, and no verdict is given here: at
# k = 1 all 4 x 4 units may be set aside, past the 10 locks VERIFIER_STAKE covers, so the two verifiers
# stake for every unit of the order (drawn units are random: too little stake failed about 1 run in 3).
VERIFIER_TOP_UP = 100 * TOKEN


@pytest.fixture(scope="module")
def audited_chain() -> Iterator[World]:
    params = replace(TEST_PARAMS, spot_check_ppm=RATE_PPM, solo_spot_check_ppm=RATE_PPM)
    with InProcessBackend() as backend:
        world = build_world(backend, params)
        for verifier in world.verifiers[:2]:
            world.client.stake(verifier, VERIFIER_TOP_UP)
        yield world


@pytest.fixture
def audited_world(audited_chain: World) -> Iterator[World]:
    """The module's market at a 50 % audit rate, inside a snapshot reverted after the test."""
    yield from reverted(audited_chain)


def _block_hash(world: World, number: int) -> str:
    return "0x" + bytes(world.client.w3.eth.get_block(number)["hash"]).hex()


def _open(world: World, replicas: int, units: int) -> tuple[int, Roster]:
    client = world.client
    order_id, _ = client.post_order(
        world.buyer, os.urandom(32), units * ROUNDS, replicas, PRICE, FEE, client.now() + 86_400
    )
    head = client.w3.eth.block_number
    stakes = {p.address: 300 for p in world.providers}
    capacity = {p.address: 3 for p in world.providers}  # 300 staked, 100 collateral a slot
    order_key = "0x" + os.urandom(32).hex()
    roster = draw_roster(_block_hash(world, head), order_key, stakes, capacity, replicas, units, ROUNDS)
    accounts = {p.address: p for p in world.providers}
    deadline = client.now() + 3600
    accepts = [client.sign_accept(accounts[p], order_id, roster.key, deadline) for p in roster.providers]
    client.open_roster(order_id, roster, accepts)
    return order_id, roster


def _run_rounds(
    world: World, order_id: int, roster: Roster, plans: list[dict[str, Any]]
) -> tuple[list[bool], int]:
    """Each round: commit every slot (a split unit's replica on another digest), then reveal with the
    operator's verifiers (a withheld slot after the reveal window); returns, per round, whether the
    prediction named exactly the set-aside units, and how many units were set aside in all."""
    client, accounts = world.client, {p.address: p for p in world.providers}
    deadline = client.now() + 86_400
    agreed, set_aside = [], 0
    for round_index, plan in enumerate(plans):
        openings, values, commitments = [], [], []
        for unit in range(roster.units_per_round):
            unit_id = eip712.round_unit_id(order_id, round_index, unit)
            digest = os.urandom(32)
            for replica in range(roster.replicas):
                provider = accounts[roster.provider_of(unit, replica)]
                mine = os.urandom(32) if (unit, replica) == plan.get("split") else digest
                salt = os.urandom(32)
                commitment = client.commitment(mine, salt, provider, unit_id)
                commitments.append(commitment)
                openings.append(Reveal(provider.address, mine, salt))
                values.append("0x" + mine.hex())
        signers = [accounts[p] for p in roster.providers]
        works = client.sign_round_work(signers, roster, order_id, round_index, commitments, deadline)
        committed = client.step_round(order_id, roster, [], deadline, works)
        withheld = 0
        if "withheld" in plan:
            slot = plan["withheld"]
            openings[slot] = Reveal(openings[slot].provider, commitments[slot], b"\0" * 32)
            values[slot] = None
            withheld = 1 << slot
            world.backend.advance_time(TEST_PARAMS.reveal_window + 1)
        revealed = client.step_round(
            order_id, roster, openings, deadline, None, withheld=withheld, verifiers=world.verifiers[:2]
        )
        actual = {event.args["unit"] for event in revealed.events_named("UnitSetAside")}
        seed = _block_hash(world, committed.block_number)
        predicted = predict_set_aside(roster, order_id, round_index, seed, RATE_PPM, values)
        agreed.append(set(predicted) == actual)
        set_aside += len(actual)
    return agreed, set_aside


@pytest.mark.parametrize("replicas", [3, 1])
def test_the_predicted_set_aside_units_are_the_contracts(audited_world: World, replicas: int) -> None:
    units = 3 if replicas == 3 else 4  # within the providers' stake: 3 slots each
    order_id, roster = _open(audited_world, replicas, units)
    plans: list[dict[str, Any]] = [{}, {}, {}, {}]
    if replicas == 3:
        plans[1] = {"split": (2, 1)}
        plans[2] = {"withheld": 2 * replicas + 2}
    else:
        plans[2] = {"withheld": 1}
    agreed, set_aside = _run_rounds(audited_world, order_id, roster, plans)
    assert agreed == [True] * ROUNDS
    # at a 50 % rate some units are drawn and some are not (all alike: p = 2^-11 at most)
    assert 0 < set_aside < units * ROUNDS
