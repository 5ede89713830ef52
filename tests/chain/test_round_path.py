"""The client's round path (JobMarketRounds) on both backends: a roster's order settles round by round in one
transaction each, its pure helpers agree with the contract, and bad steps are typed errors."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from earned import earned

from tests.chain.conftest import TEST_PARAMS, build_world, reverted
from veritrain.chain import eip712, errors
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import AuditRecord, Outcome, Reveal, Roster, RoundWork, audit_records_after
from veritrain.errors import InvalidInput

pytestmark = pytest.mark.chain

TOKEN = 10**18
PRICE = 10 * TOKEN
FEE = 3 * TOKEN
COLLATERAL = 100 * TOKEN  # tests/chain/conftest.py TEST_PARAMS


def _roster(world: Any, *, units_per_round: int = 2, rounds: int = 2) -> Roster:
    """Providers 0..2 on replicas 0..2 of every unit, but unit 1 swaps providers 0 and 3."""
    providers = tuple(p.address for p in world.providers[:4])
    slots = (0, 1, 2, 3, 1, 2, 0, 1, 2)[: units_per_round * 3]
    return Roster(providers, slots, 3, units_per_round, rounds)


def _open(world: Any, roster: Roster) -> int:
    client = world.client
    units = roster.units_per_round * roster.rounds
    order_id, _ = client.post_order(world.buyer, os.urandom(32), units, 3, PRICE, FEE, client.now() + 86_400)
    accounts = {p.address: p for p in world.providers}
    deadline = client.now() + 3600
    accepts = [client.sign_accept(accounts[p], order_id, roster.key, deadline) for p in roster.providers]
    client.open_roster(order_id, roster, accepts)
    return order_id


def _sign(
    world: Any, roster: Roster, order_id: int, round_index: int, commitments: list[bytes], deadline: int
) -> RoundWork:
    """The round's work: every slot's commitment with every roster provider's `RoundCommit` over its own."""
    accounts = {p.address: p for p in world.providers}
    signers = [accounts[p] for p in roster.providers]
    return world.client.sign_round_work(signers, roster, order_id, round_index, commitments, deadline)


def _round(
    world: Any, roster: Roster, order_id: int, round_index: int, digests: list[bytes], deadline: int
) -> tuple[RoundWork, list[Reveal]]:
    """The signed work for `round_index` (unit u's replicas on digests[u]) and its openings."""
    client, accounts = world.client, {p.address: p for p in world.providers}
    commitments, openings = [], []
    for unit in range(roster.units_per_round):
        unit_id = eip712.round_unit_id(order_id, round_index, unit)
        for replica in range(roster.replicas):
            provider = accounts[roster.provider_of(unit, replica)]
            salt = os.urandom(32)
            commitments.append(client.commitment(digests[unit], salt, provider, unit_id))
            openings.append(Reveal(provider.address, digests[unit], salt))
    return _sign(world, roster, order_id, round_index, commitments, deadline), openings


def test_a_roster_settles_each_round_in_one_step_and_pays_every_slot_at_close(world: Any) -> None:
    client = world.client
    deadline = client.now() + 3600
    roster = _roster(world)
    stake_before = {p: client.stake_of(p).locked for p in roster.providers}
    order_id = _open(world, roster)
    uses = {p: roster.slots.count(i) for i, p in enumerate(roster.providers)}
    assert {p: client.stake_of(p).locked - stake_before[p] for p in roster.providers} == {
        p: n * COLLATERAL for p, n in uses.items()
    }
    info = client.get_roster(order_id)
    assert (info.key, info.rounds, info.committed, info.closed) == (roster.key, 2, 0, False)

    digests = [[os.urandom(32), os.urandom(32)] for _ in range(2)]
    works0, openings0 = _round(world, roster, order_id, 0, digests[0], deadline)
    client.step_round(order_id, roster, [], deadline, works0)
    works1, openings1 = _round(world, roster, order_id, 1, digests[1], deadline)
    receipt = client.step_round(order_id, roster, openings0, deadline, works1)
    assert [bytes(d) for d in receipt.event("RoundRevealed").args["digests"]] == digests[0]
    assert client.get_roster(order_id).committed == 2
    with pytest.raises(errors.RosterNotClosable):
        client.close_roster(order_id, roster, sender=world.outsider)
    client.step_round(order_id, roster, openings1, deadline, None)

    credits_before = {p: earned(client, p) for p in roster.providers}
    valid_before = {p: client.reputation(p).valid for p in roster.providers}
    closed = client.close_roster(order_id, roster, sender=world.outsider)
    assert closed.event("RosterClosed").args["paid"] == 2 * 2 * 3 * PRICE
    for provider, n in uses.items():
        assert earned(client, provider) - credits_before[provider] == 2 * n * PRICE
        assert client.reputation(provider).valid - valid_before[provider] == 2 * n
        assert client.stake_of(provider).locked == stake_before[provider]
    order = client.get_order(order_id)
    assert (order.delivered, order.open_units, order.balance) == (4, 0, 4 * FEE)


def test_the_clients_roster_key_and_round_unit_ids_are_the_contracts(world: Any) -> None:
    roster = _roster(world)
    market = world.client.market
    on_chain = market.functions.rosterKey(
        list(roster.providers), roster.layout, roster.replicas, roster.units_per_round, roster.rounds, []
    ).call()
    assert bytes(on_chain) == roster.key
    assert market.functions.roundUnitId(7, 3, 2).call() == eip712.round_unit_id(7, 3, 2)


def _first_round(world: Any) -> tuple[Roster, int, int, RoundWork, list[Reveal]]:
    """An opened roster with round 0 signed: (roster, order id, deadline, works, openings)."""
    deadline = world.client.now() + 3600
    roster = _roster(world)
    order_id = _open(world, roster)
    works, openings = _round(world, roster, order_id, 0, [os.urandom(32), os.urandom(32)], deadline)
    return roster, order_id, deadline, works, openings


def test_bad_steps_are_typed_errors_and_change_nothing(world: Any) -> None:
    client = world.client
    roster, order_id, deadline, works, openings = _first_round(world)
    sigs = works.signatures
    forged = RoundWork(works.commitments, (sigs[1], sigs[0], *sigs[2:]))  # provider 1's signature as 0's
    with pytest.raises(errors.InvalidSigner):
        client.step_round(order_id, roster, [], deadline, forged)
    with pytest.raises(errors.EntryCountMismatch):
        client.step_round(order_id, roster, [], deadline, RoundWork(works.commitments[:-1], sigs))
    with pytest.raises(errors.EntryCountMismatch):
        client.step_round(order_id, roster, [], deadline, RoundWork(works.commitments, sigs[:-1]))
    # a provider's round signature replayed in another round or order, or over another provider's slots
    providers = [{p.address: p for p in world.providers}[a] for a in roster.providers]
    own = [c for c, i in zip(works.commitments, roster.slots, strict=True) if i == 0]
    theirs = [c for c, i in zip(works.commitments, roster.slots, strict=True) if i == 1]
    for round_index, order, covered in ((1, order_id, own), (0, order_id + 1, own), (0, order_id, theirs)):
        replayed = client.sign_round_commit(providers[0], order, round_index, covered, deadline)
        with pytest.raises(errors.InvalidSigner):
            client.step_round(
                order_id, roster, [], deadline, RoundWork(works.commitments, (replayed, *sigs[1:]))
            )
    other = Roster(roster.providers, roster.slots[::-1], 3, 2, 2)
    with pytest.raises(errors.RosterMismatch):
        client.step_round(order_id, other, [], deadline, works)
    assert client.get_roster(order_id).committed == 0

    client.step_round(order_id, roster, [], deadline, works)
    tampered = [Reveal(openings[0].provider, os.urandom(32), openings[0].salt), *openings[1:]]
    with pytest.raises(errors.RoundHashMismatch):
        client.step_round(order_id, roster, tampered, deadline, None)
    split = _round(world, roster, order_id, 1, [os.urandom(32), os.urandom(32)], deadline)[1]
    with pytest.raises(errors.RoundHashMismatch):
        client.step_round(order_id, roster, split, deadline, None)
    assert client.get_roster(order_id).pending_block != 0
    with pytest.raises(errors.RosterExists):
        client.open_roster(order_id, roster, [])


def test_a_split_unit_is_set_aside_by_the_operators_step_and_settles_by_verdict(world: Any) -> None:
    client = world.client
    roster, order_id, deadline, works, openings = _first_round(world)
    # replica 2 of unit 1 commits to another digest
    accounts = {p.address: p for p in world.providers}
    cheater = accounts[roster.provider_of(1, 2)]
    salt, digest = os.urandom(32), os.urandom(32)
    unit_id = eip712.round_unit_id(order_id, 0, 1)
    commitment = client.commitment(digest, salt, cheater, unit_id)
    commitments = list(works.commitments)
    commitments[5] = commitment
    works = _sign(world, roster, order_id, 0, commitments, deadline)
    openings[5] = Reveal(cheater.address, digest, salt)
    client.step_round(order_id, roster, [], deadline, works)
    with pytest.raises(errors.RoundUnitNeedsVerdict) as refused:  # the operator's verifiers are needed
        client.step_round(order_id, roster, openings, deadline, None)
    assert (refused.value.arguments["unit"], refused.value.arguments["drawn"]) == (1, False)
    with pytest.raises(errors.RoundUnitNeedsVerdict):  # and only the operator picks them
        client.step_round(
            order_id, roster, openings, deadline, None, verifiers=world.verifiers[:2], sender=cheater
        )

    receipt = client.step_round(order_id, roster, openings, deadline, None, verifiers=world.verifiers[:2])
    (set_aside,) = receipt.events_named("UnitSetAside")
    assert (set_aside.args["round"], set_aside.args["unit"]) == (0, 1)
    unit = set_aside.args["unitId"]
    assert client.get_unit(unit).drawn
    assert [client.replica(unit, i).commitment_or_digest for i in range(3)] == [
        o.result_digest for o in openings[3:6]
    ]
    info = client.get_roster(order_id)
    assert (info.set_aside_units, info.open_set_aside, info.pending_block) == (1, 1, 0)

    verdict = (Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FRAUD)
    signed = [client.sign_verdict(v, unit, verdict, deadline) for v in world.verifiers[:2]]
    client.submit_verdict(unit, verdict, signed)
    assert client.get_roster(order_id).open_set_aside == 1  # its fraud is held until its truth is fixed
    world.backend.advance_time(
        client.params.verdict_window + client.deployment.appeal_params.appeal_window + 1
    )
    client.settle_verdict(unit, verdict)
    assert client.get_roster(order_id).open_set_aside == 0
    assert client.reputation(cheater).fraud == 1

    # round 1 on the roster path; at close every slot is paid but the set-aside unit's (its verdict paid it)
    works1, openings1 = _round(world, roster, order_id, 1, [os.urandom(32), os.urandom(32)], deadline)
    client.step_round(order_id, roster, [], deadline, works1)
    before = {p: earned(client, p) for p in roster.providers}
    receipt = client.step_round(order_id, roster, openings1, deadline, None, verifiers=world.verifiers[:2])
    assert receipt.events_named("UnitSetAside") == []  # the cheater's streak is 0 but the order needs none
    client.close_roster(order_id, roster)
    slots = {p: roster.slots.count(i) for i, p in enumerate(roster.providers)}
    in_unit_1 = {roster.provider_of(1, r) for r in range(3)}
    for provider, n in slots.items():
        assert earned(client, provider) - before[provider] == (2 * n - (provider in in_unit_1)) * PRICE
    order = client.get_order(order_id)
    assert (order.delivered, order.open_units) == (4, 0)


def _withheld_round(world: Any) -> tuple[Roster, int, int, list[RoundWork], list[Reveal], int]:
    """Round 0 committed, slot 5 (replica 2 of unit 1) the one whose opening is missing: returns the
    roster, order, deadline, works, openings and that slot."""
    roster, order_id, deadline, works, openings = _first_round(world)
    world.client.step_round(order_id, roster, [], deadline, works)
    return roster, order_id, deadline, works, openings, 5


def test_a_replica_that_never_opens_is_set_aside_unrevealed_and_loses_the_withhold_penalty(
    world: Any,
) -> None:
    client = world.client
    roster, order_id, deadline, works, openings, slot = _withheld_round(world)
    accounts = {p.address: p for p in world.providers}
    silent = accounts[roster.provider_of(1, 2)]
    given = list(openings)
    given[slot] = Reveal(silent.address, works.commitments[slot], bytes(32))  # its commitment, as signed
    with pytest.raises(errors.RoundRevealWindowOpen):
        client.step_round(
            order_id, roster, given, deadline, None, withheld=1 << slot, verifiers=world.verifiers[:2]
        )
    world.backend.advance_time(client.params.reveal_window + 1)
    with pytest.raises(errors.InvalidLayout):  # a bit past the round's 6 slots names no slot
        client.step_round(
            order_id, roster, given, deadline, None, withheld=1 << 6, verifiers=world.verifiers[:2]
        )
    receipt = client.step_round(
        order_id, roster, given, deadline, None, withheld=1 << slot, verifiers=world.verifiers[:2]
    )
    (set_aside,) = receipt.events_named("UnitSetAside")
    unit = set_aside.args["unitId"]
    replica = client.replica(unit, 2)
    assert (replica.committed, replica.revealed, replica.commitment_or_digest) == (
        True,
        False,
        works.commitments[slot],
    )
    assert client.replica(unit, 0).revealed and client.replica(unit, 1).revealed

    bonded, locked = client.stake_of(silent).bonded, client.stake_of(silent).locked
    verdict = (Outcome.ACCEPT, Outcome.ACCEPT, Outcome.FAULT)
    signed = [client.sign_verdict(v, unit, verdict, client.now() + 3600) for v in world.verifiers[:2]]
    client.submit_verdict(unit, verdict, signed)
    penalty = client.params.withhold_penalty
    after = client.stake_of(silent)
    assert (after.bonded, after.locked) == (bonded - penalty, locked - COLLATERAL)  # one slot released first
    assert client.reputation(silent).fault == 1
    assert client.get_roster(order_id).open_set_aside == 0


def test_an_opening_published_on_chain_cannot_be_given_as_withheld(world: Any) -> None:
    client = world.client
    roster, order_id, deadline, works, openings, slot = _withheld_round(world)
    commitments = list(works.commitments)
    bad = Reveal(openings[slot].provider, openings[slot].result_digest, os.urandom(32))
    with pytest.raises(errors.RevealMismatch):
        client.publish_opening(order_id, roster, slot, bad, commitments)
    with pytest.raises(errors.RoundHashMismatch):
        client.publish_opening(order_id, roster, slot, openings[slot], commitments[::-1])
    client.publish_opening(order_id, roster, slot, openings[slot], commitments, sender=world.outsider)

    world.backend.advance_time(client.params.reveal_window + 1)
    given = list(openings)
    given[slot] = Reveal(openings[slot].provider, works.commitments[slot], bytes(32))
    receipt = client.step_round(order_id, roster, given, deadline, None, withheld=1 << slot)
    assert receipt.events_named("UnitSetAside") == []  # the published opening counts: the unit is unanimous
    assert [bytes(d) for d in receipt.event("RoundRevealed").args["digests"]][1] == openings[
        slot
    ].result_digest


def test_a_roster_refuses_bad_shapes_before_sending() -> None:
    providers = ("0x" + "11" * 20, "0x" + "22" * 20)
    with pytest.raises(InvalidInput):
        Roster(providers, (0, 1), 3, 1, 1)  # 2 slots for 1 unit x 3 replicas
    with pytest.raises(InvalidInput):
        Roster(providers, (0, 2), 2, 1, 1)  # provider index 2 of 2
    assert Roster(providers, (1, 0), 2, 1, 1).layout == 1


@pytest.fixture(scope="module")
def drawing_world() -> Any:
    """A market whose audit rates draw every unit, so every revealed round has units to audit."""
    params = replace(TEST_PARAMS, spot_check_ppm=1_000_000, solo_spot_check_ppm=1_000_000)
    with InProcessBackend() as backend:
        yield from reverted(build_world(backend, params))


def test_deferred_round_audits_pay_drawn_units_and_a_challenge_sets_one_aside(drawing_world: Any) -> None:
    world = drawing_world
    client, verifiers = world.client, world.verifiers
    roster = Roster(
        tuple(p.address for p in world.providers[:3]),
        (0, 1, 2, 0, 1, 2),
        3,
        2,
        2,
        verifiers=tuple(v.address for v in verifiers),
    )
    on_chain = client.market.functions.rosterKey(
        list(roster.providers), roster.layout, 3, 2, 2, list(roster.verifiers)
    ).call()
    assert bytes(on_chain) == roster.key != replace(roster, verifiers=()).key
    order_id = _open(world, roster)
    assert all(client.stake_of(v.address).locked == client.params.verifier_collateral for v in verifiers)
    deadline = client.now() + 3600
    digests0 = [os.urandom(32), os.urandom(32)]
    works0, openings0 = _round(world, roster, order_id, 0, digests0, deadline)
    client.step_round(order_id, roster, [], deadline, works0)
    works1, openings1 = _round(world, roster, order_id, 1, [os.urandom(32), os.urandom(32)], deadline)
    # any step without verifiers leaves round 0's drawn units pending, unposted: only a posting pays them
    receipt = client.step_round(order_id, roster, openings0, deadline, works1, sender=world.outsider)
    assert receipt.events_named("UnitSetAside") == [] and receipt.events_named("AuditPosted") == []
    records = audit_records_after([], receipt)
    assert records == [AuditRecord.of_round(0, 0b11, digests0)]
    assert int(receipt.event("RoundRevealed").args["audited"]) == 0b11

    # the last step reveals round 1 and posts both rounds: two of three verifiers sign the pending chain
    digests1 = [o.result_digest for o in openings1[0::3]]
    covered = [*records, AuditRecord.of_round(1, 0b11, digests1)]
    with pytest.raises(InvalidInput):
        client.sign_round_audit(world.outsider, roster, order_id, covered)
    audits = [client.sign_round_audit(v, roster, order_id, covered) for v in verifiers[:2]]
    with pytest.raises(errors.RoundHashMismatch):  # the step must carry the pending chain
        client.step_round(order_id, roster, openings1, deadline, None, audits=audits, sender=world.outsider)
    receipt = client.step_round(
        order_id,
        roster,
        openings1,
        deadline,
        None,
        audits=audits,
        audit_records=records,
        sender=world.outsider,
    )
    posted = receipt.event("AuditPosted").args
    records = audit_records_after(records, receipt)
    assert [r.posting for r in records] == [False, False, True]
    info = int(posted["info"])
    assert (info >> 255, (info >> 64) & 0xFF) == (1, 0b011)
    assert bytes(posted["records"]) == eip712.audit_chains([r.as_tuple() for r in covered])[1]

    # the operator challenges unit 1 of round 0: set aside with verifiers that did not sign, its signers
    # recorded
    challenge_verifiers = [verifiers[2], world.providers[3]]
    receipt = client.challenge_audit(order_id, roster, 0, 1, records, digests0, challenge_verifiers)
    (set_aside,) = receipt.events_named("UnitSetAside")
    unit = set_aside.args["unitId"]
    assert client.market.functions.auditSignersOf(unit).call() == list(roster.verifiers[:2])
    with pytest.raises(errors.AuditMismatch):  # the record as it was before the challenge
        client.challenge_audit(order_id, roster, 0, 1, records, digests0, challenge_verifiers)
    updated = audit_records_after(records, receipt)
    assert updated[0].info == records[0].info | (0b10 << 112)
    records = updated
    with pytest.raises(errors.NotAudited):
        client.challenge_audit(order_id, roster, 0, 1, records, digests0, challenge_verifiers)
    with pytest.raises(InvalidInput):
        client.challenge_audit(order_id, roster, 2, 1, records, digests0, challenge_verifiers)
    accept = (Outcome.ACCEPT,) * 3
    client.submit_verdict(
        unit, accept, [client.sign_verdict(v, unit, accept, deadline) for v in challenge_verifiers]
    )

    with pytest.raises(errors.RosterNotClosable):
        client.close_roster(order_id, roster, records)
    credits = [earned(client, v.address) for v in verifiers]
    world.backend.advance_time(client.params.verdict_window + 1)
    with pytest.raises(errors.AuditorsMismatch):  # every record, in order
        client.close_roster(order_id, roster, records[1:])
    client.close_roster(order_id, roster, records)
    share = FEE // 3
    # verifiers 0 and 1 signed the posting of 4 units, one of which was challenged; verifier 2 signed nothing
    assert [earned(client, v.address) - c for v, c in zip(verifiers, credits, strict=True)] == [
        3 * share,
        3 * share,
        0,
    ]
    assert all(client.stake_of(v.address).locked == 0 for v in verifiers)


def test_pending_round_audits_are_set_aside_by_the_operator_or_dropped_by_anyone_after_the_deadline(
    drawing_world: Any,
) -> None:
    world = drawing_world
    client, verifiers = world.client, world.verifiers
    providers = tuple(p.address for p in world.providers[:3])
    roster = Roster(providers, (0, 1, 2, 0, 1, 2), 3, 2, 2, verifiers=tuple(v.address for v in verifiers))
    order_id = _open(world, roster)
    credits = [earned(client, p) for p in providers]
    deadline = client.now() + 3600
    digests0 = [os.urandom(32), os.urandom(32)]
    works0, openings0 = _round(world, roster, order_id, 0, digests0, deadline)
    client.step_round(order_id, roster, [], deadline, works0)
    works1, openings1 = _round(world, roster, order_id, 1, [os.urandom(32), os.urandom(32)], deadline)
    receipt = client.step_round(order_id, roster, openings0, deadline, works1, sender=world.outsider)
    records = audit_records_after([], receipt)
    assert records == [AuditRecord.of_round(0, 0b11, digests0)]

    # the verifiers will not sign round 0: the operator sets its units aside with verifiers of its choice
    unit_verifiers = [verifiers[2], world.providers[3]]
    with pytest.raises(InvalidInput):
        client.set_aside_pending(order_id, roster, records, 2)
    with pytest.raises(errors.AuditMismatch):  # round 1 is committed: the round hash holds its commitments
        client.set_aside_pending(order_id, roster, records, 1, digests=[digests0], verifiers=unit_verifiers)
    receipt = client.set_aside_pending(
        order_id,
        roster,
        records,
        1,
        digests=[digests0],
        verifiers=unit_verifiers,
        commitments=list(works1.commitments),
    )
    set_aside = [int(e.args["unitId"]) for e in receipt.events_named("UnitSetAside")]
    assert len(set_aside) == 2 and all(set_aside)
    records = audit_records_after(records, receipt)
    assert records == []
    accept = (Outcome.ACCEPT,) * 3
    for unit in set_aside:
        client.submit_verdict(
            unit, accept, [client.sign_verdict(v, unit, accept, deadline) for v in unit_verifiers]
        )

    # round 1 revealed (pending), and nobody posts: after the deadline and verdictWindow anyone drops it
    receipt = client.step_round(order_id, roster, openings1, deadline, None, sender=world.outsider)
    records = audit_records_after(records, receipt)
    assert len(records) == 1
    with pytest.raises(errors.RosterNotClosable):
        client.set_aside_pending(order_id, roster, records, 1, sender=world.outsider)
    world.backend.advance_time(86_400 + client.params.verdict_window + 1)
    with pytest.raises(errors.AuditsPending):
        client.close_roster(order_id, roster, records)
    receipt = client.set_aside_pending(order_id, roster, records, 1, sender=world.outsider)
    assert [int(e.args["unitId"]) for e in receipt.events_named("UnitSetAside")] == [0, 0]
    records = audit_records_after(records, receipt)
    assert records == []
    client.close_roster(order_id, roster, records)
    # each provider was paid its two round-0 slots by their verdicts, nothing for round 1; every lock released
    assert [earned(client, p) - c for p, c in zip(providers, credits, strict=True)] == [2 * PRICE] * 3
    assert all(client.stake_of(a).locked == 0 for a in (*providers, *roster.verifiers))
