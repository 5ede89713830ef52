"""A provider's roster slots on the real contracts (veritrain.chain.slot_watch.SlotWatch): an opening the
market leaves out is published by the provider itself near the end of the round's reveal window, from what
the chain holds alone (the commit step's calldata, the pending audit chain), so the step that gives the slot
as withheld takes its result from the chain; and a slot whose unit is set aside is watched on the per-unit
path, so a verdict framing it is appealed."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.chain.conftest import TEST_PARAMS, build_world, reverted
from tests.chain.test_round_path import _open, _roster, _round
from tests.chain.test_verdict_watch import _referees
from veritrain.chain import eip712
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import AppealState, Outcome, Reveal, Roster, audit_records_after
from veritrain.chain.errors import ChainError
from veritrain.chain.slot_watch import SlotWatch

pytestmark = pytest.mark.chain

PRICE = 10 * 10**18  # tests/chain/test_round_path.py


def watch_of(world: Any, provider: Any, folder: Path) -> SlotWatch:
    verdicts = VerdictWatch(world.client, provider, folder / "appeals.json")
    return SlotWatch(world.client, provider, folder / "slots.json", verdicts)


def test_an_opening_the_market_leaves_out_is_published_near_the_window_end_and_counts(
    world: Any, tmp_path: Path
) -> None:
    client = world.client
    roster = _roster(world)
    order_id = _open(world, roster)
    deadline = client.now() + 3600
    works, openings = _round(world, roster, order_id, 0, [os.urandom(32), os.urandom(32)], deadline)
    client.step_round(order_id, roster, [], deadline, works)  # round 0 committed
    slot = 5  # replica 2 of unit 1: its provider opened to the market, which leaves it out
    accounts = {p.address: p for p in world.providers}
    provider = accounts[roster.provider_of(1, 2)]
    watch = watch_of(world, provider, tmp_path)
    mine = openings[slot]
    watch.opened(order_id, 0, 1, "0x" + mine.result_digest.hex(), "0x" + mine.salt.hex(), honest=True)
    assert watch.tick() == []  # early in the window: the market may still step with it
    window, margin = client.params.reveal_window, watch.margin_s
    world.backend.advance_time(window - margin - 30)
    assert watch.tick() == []
    world.backend.advance_time(60)
    restarted = watch_of(world, provider, tmp_path)  # what it remembers survives a restart
    assert restarted.tick() == [f"{order_id}:0:1"]
    (published,) = client.roster_events(order_id, ("OpeningPublished",))
    assert (published.args["slot"], bytes(published.args["resultDigest"])) == (slot, mine.result_digest)
    assert restarted.tick() == []  # published once

    world.backend.advance_time(margin + 1)  # the window ended: the market gives the slot as withheld
    given = list(openings)
    given[slot] = Reveal(openings[slot].provider, works.commitments[slot], bytes(32))
    receipt = client.step_round(order_id, roster, given, deadline, None, withheld=1 << slot)
    assert receipt.events_named("UnitSetAside") == []  # its result counted: unit 1 is unanimous, paid
    assert restarted.tick() == [] and restarted.slots == {}  # revealed: nothing left to do
    assert client.reputation(provider.address).fault == 0


def test_the_commitments_come_from_the_chain_not_from_whoever_asks(world: Any) -> None:
    """The commit step's calldata, sent alone or inside the operator's multicall; a round not committed is
    an error, not a guess."""
    client = world.client
    roster = _roster(world)
    order_id = _open(world, roster)
    deadline = client.now() + 3600
    works, _ = _round(world, roster, order_id, 0, [os.urandom(32), os.urandom(32)], deadline)
    with pytest.raises(ChainError, match="not committed"):
        client.round_commitments(order_id, 0)
    call = client.market_calldata(
        "stepRound",
        order_id,
        list(roster.providers),
        roster.layout,
        [],
        0,
        [],
        deadline,
        works.as_tuple(),
        (bytes(32), [], bytes(32), []),
    )
    client.multicall([call])
    assert client.round_commitments(order_id, 0) == list(works.commitments)
    assert client.opened_roster(order_id) == roster


@pytest.fixture(scope="module")
def drawing_world() -> Any:
    """Every unit drawn: rounds audited by the roster's verifiers, or set aside."""
    params = replace(TEST_PARAMS, spot_check_ppm=1_000_000, solo_spot_check_ppm=1_000_000)
    with InProcessBackend() as backend:
        yield from reverted(build_world(backend, params))


def test_a_slot_published_under_a_pending_audit_then_set_aside_and_framed_is_appealed_and_paid(
    drawing_world: Any, tmp_path: Path
) -> None:
    """Round 0's drawn units are left pending a posting, so round 1's round hash carries the pending audit
    chain: the provider publishes its round-1 opening with it. The operator's last step gives the slot as
    withheld and sets round 1's units aside; its verifiers call the provider's honest replica fraud, and the
    provider's own watch appeals and is paid."""
    world = drawing_world
    client = world.client
    referees = _referees(world)
    roster = Roster(
        tuple(p.address for p in world.providers[:3]),
        (0, 1, 2, 0, 1, 2),
        3,
        2,
        2,
        verifiers=tuple(v.address for v in world.verifiers),
    )
    order_id = _open(world, roster)
    deadline = client.now() + 3600
    works0, openings0 = _round(world, roster, order_id, 0, [os.urandom(32), os.urandom(32)], deadline)
    client.step_round(order_id, roster, [], deadline, works0)
    works1, openings1 = _round(world, roster, order_id, 1, [os.urandom(32), os.urandom(32)], deadline)
    receipt = client.step_round(order_id, roster, openings0, deadline, works1)  # round 0 pending an audit
    records = audit_records_after([], receipt)
    assert eip712.audit_chains([r.as_tuple() for r in records])[1] != bytes(32)

    victim = world.providers[0]  # replica 0 of unit 0
    watch = watch_of(world, victim, tmp_path)
    mine = openings1[0]
    watch.opened(order_id, 1, 0, "0x" + mine.result_digest.hex(), "0x" + mine.salt.hex(), honest=True)
    world.backend.advance_time(client.params.reveal_window - watch.margin_s + 1)
    assert watch.tick() == [f"{order_id}:1:0"]

    world.backend.advance_time(watch.margin_s)
    given = list(openings1)
    given[0] = Reveal(mine.provider, works1.commitments[0], bytes(32))
    framers = world.verifiers[:2]
    receipt = client.step_round(
        order_id, roster, given, deadline, None, withheld=1, verifiers=framers, audit_records=records
    )
    unit_id = next(int(e.args["unitId"]) for e in receipt.events_named("UnitSetAside") if e.args["unit"] == 0)
    assert client.set_aside_unit(order_id, 1, 0) == unit_id
    assert client.replica(unit_id, 0).revealed  # its published opening, not a withheld slot
    assert watch.tick() == [] and watch.slots == {}
    assert watch.verdicts.units == {unit_id: None}  # handed to the agent's verdict watch

    framing = [Outcome.FRAUD, Outcome.ACCEPT, Outcome.ACCEPT]
    check_by = client.now() + 3600
    client.submit_verdict(
        unit_id, framing, [client.sign_verdict(v, unit_id, framing, check_by) for v in framers]
    )
    credits, bonded = client.credits(victim.address), client.stake_of(victim.address).bonded
    verdicts = VerdictWatch(client, victim, tmp_path / "appeals.json")  # the agent after a restart
    assert verdicts.tick() == [unit_id]
    verdicts.tick()  # draws the panel
    truth = [Outcome.ACCEPT] * 3
    seated = {r.address: r for r in referees}
    for seat in client.get_appeal(unit_id).panel[:2]:
        client.vote(unit_id, truth, client.sign_referee_vote(seated[seat], unit_id, truth, check_by))
    verdicts.tick()  # resolves: the held replica is settled by the truth
    assert client.get_appeal(unit_id).state == AppealState.OVERTURNED and verdicts.units == {}
    assert client.credits(victim.address) == credits + PRICE
    assert client.stake_of(victim.address).bonded == bonded
    assert client.reputation(victim.address).fraud == 0
