"""Both sides of an appeal, on the real contracts.

veritrain.chain.appeal_watch.VerdictWatch: the verifier appeals a verdict that contradicts what it signed,
and the provider one that calls its honest replica fraud, and each takes the appeal to its end (panel drawn,
resolved or lapsed); a verdict it agrees with is left alone.
verifier.refereeing.RefereeDuty: a referee in the pool finds its seats in the chain's panel draws, votes what
its re-execution found, once, and ends the appeal when nobody else does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from verifier.refereeing import RefereeDuty
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.backends import RpcBackend
from veritrain.chain.client import AppealState, Outcome, UnitState
from veritrain.chain.eip712 import outcomes_hash

pytestmark = pytest.mark.chain

TOKEN = 10**18
TRUTH = [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD]
COLLUDED = [Outcome.ACCEPT] * 3


def _colluded_unit(world: Any) -> int:
    """Replica 3 reveals a wrong digest; verifiers 2 and 3 settle accept-all (not yet when returned)."""
    client = world.client
    order_id = world.post_order()
    key, deadline = os.urandom(32), client.now() + 3600
    providers = world.providers[:3]
    accepts = [client.sign_accept(p, order_id, key, deadline) for p in providers]
    unit_id, _ = client.assign(order_id, key, providers, world.verifiers, accepts)
    honest = os.urandom(32)
    digests = [honest, honest, os.urandom(32)]
    world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
    return int(unit_id)


def _settle_colluded(world: Any, unit_id: int) -> None:
    client, deadline = world.client, world.client.now() + 3600
    signatures = [client.sign_verdict(v, unit_id, COLLUDED, deadline) for v in world.verifiers[1:]]
    client.submit_verdict(unit_id, COLLUDED, signatures)


def _referees(world: Any, count: int = 3, join: bool = True) -> list[Any]:
    client = world.client
    referees = list(world.backend.dev_accounts(10 + count)[10:])
    for referee in referees:
        client.mint(referee, 1_000 * TOKEN)
        client.approve(referee, client.deployment.stake_manager, 2**256 - 1)
        client.stake(referee, 100 * TOKEN)
        if join:
            client.join_referee_pool(referee)
    return referees


def test_the_outvoted_verifier_appeals_and_resolves_the_overturn(world: Any, tmp_path: Path) -> None:
    client = world.client
    honest = world.verifiers[0]
    referees = _referees(world)
    unit_id = _colluded_unit(world)
    watch = VerdictWatch(client, honest, tmp_path / "watch.json")
    watch.signed(unit_id, TRUTH)
    assert watch.tick() == [] and unit_id in watch.units  # not settled yet: nothing to contest
    _settle_colluded(world, unit_id)
    bonded = client.stake_of(honest).bonded
    assert VerdictWatch(client, honest, tmp_path / "watch.json").tick() == [unit_id]  # survives a restart
    watch = VerdictWatch(client, honest, tmp_path / "watch.json")
    appeal = client.get_appeal(unit_id)
    assert appeal.state == AppealState.PENDING and appeal.appellant == honest.address
    watch.tick()  # draws the panel
    panel = client.get_appeal(unit_id).panel
    assert len(panel) == 3
    seated = {r.address: r for r in referees}
    deadline = client.now() + 3600
    for seat in panel[:2]:
        client.vote(unit_id, TRUTH, client.sign_referee_vote(seated[seat], unit_id, TRUTH, deadline))
    cheat = client.replica(unit_id, 2).provider
    cheat_bonded = client.stake_of(cheat).bonded
    watch.tick()  # resolves the decided appeal
    assert client.get_appeal(unit_id).state == AppealState.OVERTURNED
    assert client.stake_of(cheat).bonded == cheat_bonded - client.params.slash_amount
    assert client.stake_of(honest).bonded == bonded and client.stake_of(honest).locked == 0
    assert watch.units == {}


def test_an_appeal_no_panel_decides_lapses_and_the_bond_returns(world: Any, tmp_path: Path) -> None:
    """No referee in the pool: the panel cannot be drawn, the appeal lapses at its vote deadline, the
    appellant's bond returns and nobody can be slashed for the unit (the outvoted verifier included)."""
    client = world.client
    honest = world.verifiers[0]
    unit_id, watch = _appeal_filed(world, tmp_path)
    assert client.stake_of(honest).locked == client.deployment.appeal_params.appeal_bond
    watch.tick()  # PanelUndrawable: tried again a minute of chain time later, not on every tick
    assert unit_id in watch.units and watch._retry_at[unit_id] > client.now()
    blocks = client.w3.eth.block_number
    watch.tick()
    assert client.w3.eth.block_number == blocks  # no transaction while it waits
    client.advance_time(client.get_appeal(unit_id).vote_deadline - client.now() + 1)
    watch.tick()
    assert client.get_appeal(unit_id).state == AppealState.LAPSED
    assert client.stake_of(honest).locked == 0 and watch.units == {}


def test_an_appeal_lapses_at_its_deadline_though_no_block_was_mined_since(world: Any, tmp_path: Path) -> None:
    """On a chain that mines only on transactions the latest block's time stops when nobody sends one: the
    watch compares deadlines with the pending block's time (what its lapse would execute at), or it would
    wait forever for a block nobody else sends."""
    if not isinstance(world.backend, RpcBackend):
        pytest.skip("the in-process EVM's clock moves only with a mined block")
    client = world.client
    unit_id, watch = _appeal_filed(world, tmp_path)
    world.backend._dev_call("evm_increaseTime", [client.get_appeal(unit_id).vote_deadline - client.now() + 1])
    watch.tick()  # no block since the appeal: only the pending block knows the deadline passed
    assert client.get_appeal(unit_id).state == AppealState.LAPSED and watch.units == {}


def test_a_verdict_the_verifier_signed_is_not_appealed(world: Any, tmp_path: Path) -> None:
    client = world.client
    colluder = world.verifiers[1]
    unit_id = _colluded_unit(world)
    watch = VerdictWatch(client, colluder, tmp_path / "watch.json")
    watch.signed(unit_id, COLLUDED)
    _settle_colluded(world, unit_id)
    assert watch.tick() == []
    assert client.get_appeal(unit_id).state == AppealState.NONE and watch.units == {}


def test_a_provider_framed_by_every_verifier_appeals_itself_and_is_paid(world: Any, tmp_path: Path) -> None:
    """All three verifiers sign that replica 1 (honest) is fraud, so no verifier appeals; the provider's own
    watch does, and the panel's overturn pays it with its stake intact. The other honest provider, whose
    replica the verdict accepted, has nothing to appeal."""
    client = world.client
    referees = _referees(world)
    unit_id = _colluded_unit(world)
    framed, spared = world.providers[0], world.providers[1]
    watch = VerdictWatch(client, framed, tmp_path / "framed.json")
    watch.revealed(unit_id)
    other = VerdictWatch(client, spared, tmp_path / "spared.json")
    other.revealed(unit_id)
    framing = [Outcome.FRAUD, Outcome.ACCEPT, Outcome.FRAUD]
    deadline = client.now() + 3600
    client.submit_verdict(
        unit_id, framing, [client.sign_verdict(v, unit_id, framing, deadline) for v in world.verifiers]
    )
    position = client.stake_of(framed)
    credits = client.credits(framed)
    assert position.locked == client.params.provider_collateral  # held: collateral locked, unpaid
    assert other.tick() == [] and other.units == {}
    assert VerdictWatch(client, framed, tmp_path / "framed.json").tick() == [unit_id]  # after a restart too
    appeal = client.get_appeal(unit_id)
    assert appeal.state == AppealState.PENDING and appeal.appellant == framed.address
    watch = VerdictWatch(client, framed, tmp_path / "framed.json")
    watch.tick()  # draws the panel
    seated = {r.address: r for r in referees}
    for seat in client.get_appeal(unit_id).panel[:2]:
        client.vote(unit_id, TRUTH, client.sign_referee_vote(seated[seat], unit_id, TRUTH, deadline))
    watch.tick()  # resolves: the held replica is settled by the truth
    assert client.get_appeal(unit_id).state == AppealState.OVERTURNED
    assert client.stake_of(framed).bonded == position.bonded and client.stake_of(framed).locked == 0
    price = client.get_order(client.get_unit(unit_id).order_id).price_per_replica
    assert client.credits(framed) == credits + price
    assert watch.units == {}


def test_a_provider_finalizes_its_unanimous_unit_itself_when_nobody_did_by_the_verdict_deadline(
    world: Any, tmp_path: Path
) -> None:
    """The operator never finalizes (it may, alone, until the verdict deadline): past it the provider's
    watch finalizes the unit and the provider is paid; a unit drawn for verification is left alone."""
    client = world.client
    order_id = world.post_order(units=2)
    provider = world.providers[0]
    units = []
    for _ in range(2):
        key, deadline = os.urandom(32), client.now() + 3600
        providers = world.providers[:3]
        accepts = [client.sign_accept(p, order_id, key, deadline) for p in providers]
        unit_id, _ = client.assign(order_id, key, providers, world.verifiers, accepts)
        digests = [b"\x05" * 32] * 3
        world.reveal_all(unit_id, digests, world.commit_all(unit_id, digests))
        units.append(int(unit_id))
    unanimous, drawn = units
    client.request_verification(drawn)
    watch = VerdictWatch(client, provider, tmp_path / "watch.json")
    for unit_id in units:
        watch.revealed(unit_id)
    watch.tick()
    assert client.get_unit(unanimous).state == UnitState.REVEALING  # the operator's, until the deadline
    client.advance_time(client.get_unit(unanimous).verdict_deadline - client.now() + 1)
    credit = client.credits(provider)
    watch.tick()
    assert client.get_unit(unanimous).state == UnitState.FINALIZED and unanimous not in watch.units
    assert client.credits(provider) > credit
    assert client.get_unit(drawn).state == UnitState.REVEALING and drawn in watch.units


def test_a_planted_cheat_appeals_the_verdict_that_accepted_it_and_the_panel_fixes_the_truth(
    world: Any, tmp_path: Path
) -> None:
    """Replica 3 is the operator's planted cheat (a verifier canary): two verifiers accept it without
    re-executing, so its own watch appeals; the panel's truth calls it fraud, the plant pays the slash the
    operator budgets for, and every signer of the verdict is now slashable for contradicting that truth.
    A plant whose verdict called it fraud has nothing to appeal."""
    client = world.client
    referees = _referees(world)
    unit_id = _colluded_unit(world)
    plant = world.providers[2]
    watch = VerdictWatch(client, plant, tmp_path / "plant.json")
    watch.planted(unit_id)
    _settle_colluded(world, unit_id)
    bonded = client.stake_of(plant).bonded
    assert VerdictWatch(client, plant, tmp_path / "plant.json").tick() == [unit_id]  # after a restart too
    assert client.get_appeal(unit_id).appellant == plant.address
    watch = VerdictWatch(client, plant, tmp_path / "plant.json")
    watch.tick()  # draws the panel
    seated = {r.address: r for r in referees}
    deadline = client.now() + 3600
    for seat in client.get_appeal(unit_id).panel[:2]:
        client.vote(unit_id, TRUTH, client.sign_referee_vote(seated[seat], unit_id, TRUTH, deadline))
    watch.tick()  # resolves
    assert client.get_appeal(unit_id).state == AppealState.OVERTURNED
    assert client.stake_of(plant).bonded == bonded - client.params.slash_amount
    assert client.truth_of(unit_id) == outcomes_hash(TRUTH) and watch.units == {}

    caught = _colluded_unit(world)
    watch.planted(caught)
    client.submit_verdict(
        caught, TRUTH, [client.sign_verdict(v, caught, TRUTH, deadline) for v in world.verifiers[:2]]
    )
    assert watch.tick() == [] and client.get_appeal(caught).state == AppealState.NONE and watch.units == {}


class Judge:
    """A referee's re-execution, counted: it returns `found` (None: cannot decide yet)."""

    def __init__(self, found: list[int] | None = TRUTH) -> None:
        self.found = found
        self.calls: list[int] = []

    def __call__(self, unit_id: int) -> list[int] | None:
        self.calls.append(unit_id)
        return self.found


def _appeal_filed(world: Any, tmp_path: Path) -> tuple[int, VerdictWatch]:
    """A colluded unit, settled; the outvoted honest verifier's watch has appealed."""
    unit_id = _colluded_unit(world)
    watch = VerdictWatch(world.client, world.verifiers[0], tmp_path / "watch.json")
    watch.signed(unit_id, TRUTH)
    _settle_colluded(world, unit_id)
    assert watch.tick() == [unit_id]
    return unit_id, watch


def _appealed(world: Any, tmp_path: Path) -> tuple[int, VerdictWatch]:
    """`_appeal_filed`, and the watch has drawn the panel."""
    unit_id, watch = _appeal_filed(world, tmp_path)
    watch.tick()  # draws the panel
    assert len(world.client.get_appeal(unit_id).panel) == 3
    return unit_id, watch


def test_seated_referees_vote_what_they_found_and_overturn_a_colluded_verdict(
    world: Any, tmp_path: Path
) -> None:
    client = world.client
    referees = _referees(world, count=4, join=False)
    judges = {r.address: Judge() for r in referees}
    duties = {
        r.address: RefereeDuty(client, r, tmp_path / f"{r.address}.json", judges[r.address]) for r in referees
    }
    assert all(duty.join_pool() for duty in duties.values())
    assert all(duty.join_pool() for duty in duties.values())  # already in: no second entry
    stake = client.deployment.appeal_params.referee_stake
    assert all(client.stake_of(r.address).locked == stake for r in referees)
    unit_id, watch = _appealed(world, tmp_path)
    panel = client.get_appeal(unit_id).panel
    (unseated,) = [a for a in duties if a not in panel]
    cheat = client.replica(unit_id, 2).provider
    cheat_bonded = client.stake_of(cheat).bonded
    voted = {address: duty.tick() for address, duty in duties.items()}
    appeal = client.get_appeal(unit_id)
    # the first two seats in tick order decide; the third finds the panel decided and resolves it
    assert appeal.state == AppealState.OVERTURNED
    assert sorted(a for a, units in voted.items() if units == [unit_id]) == sorted(
        [a for a in duties if a in panel][:2]
    )
    assert voted[unseated] == [] and judges[unseated].calls == []
    assert client.stake_of(cheat).bonded == cheat_bonded - client.params.slash_amount
    blocks = client.w3.eth.block_number
    assert [duty.tick() for duty in duties.values()] == [[]] * 4  # the appeal has ended: seats dropped
    assert all(duty.seats == {} for duty in duties.values()) and client.w3.eth.block_number == blocks
    watch.tick()
    assert watch.units == {} and client.stake_of(world.verifiers[0].address).locked == 0


def test_a_referee_votes_once_across_restarts_and_waits_while_it_cannot_decide(
    world: Any, tmp_path: Path
) -> None:
    client = world.client
    referees = _referees(world)
    unit_id, _ = _appealed(world, tmp_path)
    seat = next(r for r in referees if r.address == client.get_appeal(unit_id).panel[0])
    path = tmp_path / "referee.json"
    undecided = Judge(found=None)
    assert RefereeDuty(client, seat, path, undecided).tick() == []  # evidence not there yet: no vote
    assert undecided.calls == [unit_id] and client.get_appeal(unit_id).votes[0] == bytes(32)
    judge = Judge()
    assert RefereeDuty(client, seat, path, judge).tick() == [unit_id]  # a restart keeps the seat
    assert client.get_appeal(unit_id).votes[0] != bytes(32)
    restarted = RefereeDuty(client, seat, path, judge)
    blocks = client.w3.eth.block_number
    assert restarted.tick() == [] and restarted.seats == {unit_id: TRUTH}
    assert judge.calls == [unit_id] and client.w3.eth.block_number == blocks  # neither re-run nor re-sent


def test_a_referee_lapses_an_appeal_its_panel_left_undecided(world: Any, tmp_path: Path) -> None:
    client = world.client
    referees = _referees(world)
    unit_id, _ = _appealed(world, tmp_path)
    seat = next(r for r in referees if r.address == client.get_appeal(unit_id).panel[0])
    duty = RefereeDuty(client, seat, tmp_path / "referee.json", Judge())
    assert duty.tick() == [unit_id]  # one vote of three: no majority
    client.advance_time(client.get_appeal(unit_id).vote_deadline - client.now() + 1)
    duty.tick()
    assert client.get_appeal(unit_id).state == AppealState.LAPSED and duty.seats == {}
    assert client.stake_of(world.verifiers[0].address).locked == 0  # the appellant's bond is back
