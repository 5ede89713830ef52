"""The buyer's view of a round-path order (apps/buyer.py): what its roster's close paid, read from events as
JobMarket `closeRoster` pays it, and each replica's own result digest of a unit the round path set aside."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from apps.buyer import RosterMismatch, _fetch_manifest, order_money, set_aside_digests
from apps.demo_report import Checks, Holdings, conservation_checks
from tests.apps.buyer_fixtures import FEE, LAYOUT, ORDER, PRICE, SPLIT, Plane, honest_manifest
from tests.apps.buyer_fixtures import event as _event
from veritrain.chain.client import AuditRecord
from veritrain.chain.tx import Event
from veritrain.errors import DigestMismatch

BUYER, P1, P2, CHEAT, V1, V2 = "0xB", "0x1", "0x2", "0xC", "0xV1", "0xV2"
SLASH = 50
# 2 units a round, 2 replicas (SLOTS): unit 0 on (P1, P2), unit 1 on (CHEAT, P1); SPLIT: the split unit
PROVIDERS = [P1, P2, CHEAT]


def _digest(byte: int) -> bytes:
    return bytes([byte]) * 32


def _posted_and_opened() -> list[Event]:
    """The order both event lists share: four units of k = 2, a roster of two rounds of two units."""
    return [
        _event(
            "OrderPosted",
            orderId=ORDER,
            escrow=4 * (2 * PRICE + FEE),
            pricePerReplica=PRICE,
            verifierFeePerUnit=FEE,
        ),
        _event(
            "RosterOpened",
            orderId=ORDER,
            providers=PROVIDERS,
            layout=LAYOUT,
            replicas=2,
            unitsPerRound=2,
            rounds=2,
        ),
    ]


def _rounds_order(cheat_digest: bytes = _digest(0xCC)) -> list[Event]:
    """Two rounds of two units, k = 2. Round 0 unanimous; in round 1 CHEAT (replica 0 of unit 1) and P1 split:
    the step set the unit aside, its verdict called CHEAT fraud (held, then slashed) and accepted P1. The
    roster's close paid every other slot of both rounds."""
    paid = (2 * 4 - 2) * PRICE  # 8 slots, less the split unit's 2
    return [
        *_posted_and_opened(),
        _event("RoundCommitted", orderId=ORDER, round=0),
        _event("RoundRevealed", orderId=ORDER, round=0, digests=[_digest(1), _digest(2)], audited=0),
        _event("RoundCommitted", orderId=ORDER, round=1),
        # the step names the split unit's replica 0's digest only (the cheat's)
        _event("RoundRevealed", orderId=ORDER, round=1, digests=[_digest(3), cheat_digest], audited=0),
        _event("UnitAssigned", unitId=SPLIT, orderId=ORDER, providers=[CHEAT, P1], verifiers=[V1]),
        _event("UnitSetAside", orderId=ORDER, round=1, unit=1, unitId=SPLIT),
        _event("VerdictRecorded", unitId=SPLIT, outcomes=[2, 0], verifiers=[V1]),
        _event("ReplicaSlashed", unitId=SPLIT, provider=CHEAT, amount=SLASH),
        _event("HeldSettled", unitId=SPLIT, truth=[2, 0]),
        _event("RosterClosed", orderId=ORDER, settledRounds=2, paid=paid),
        # left: the roster's 3 units' fees (its reserve less what it paid); the split unit's price and fee
        # went to P1, the verifier and (the cheat's price, held) the buyer
        _event("OrderClosed", orderId=ORDER, refund=3 * FEE),
    ]


def test_a_rounds_order_pays_each_provider_its_slots_at_the_roster_close() -> None:
    money, units = order_money(_rounds_order(), ORDER)
    # P1: slots 0 and 3 of 2 rounds less the split unit's (paid by its verdict instead); P2 slot 1; CHEAT
    # slot 2 of round 0 only
    assert money.payouts == {P1: 4 * PRICE, P2: 2 * PRICE, CHEAT: PRICE}
    assert money.verdict_fees == FEE and money.held_refunds == PRICE and money.audit_fees == 0
    assert money.escrow_balanced(), money
    assert [u.chain_unit_id for u in units] == [SPLIT] and units[0].round_unit == (1, 1)


def test_the_money_checks_hold_for_a_rounds_order() -> None:
    """apps/demo_report's checks (the chaos suite's escrow_balanced, providers_paid_exactly) on a rounds
    order: each provider's net change is its per-unit payouts plus what the roster's close paid it."""
    money, _ = order_money(_rounds_order(), ORDER)
    deposit = 4 * (2 * PRICE + FEE)
    wallets_before = {BUYER: 10_000, P1: 0, P2: 0, CHEAT: 0, V1: 0}
    stakes = {P1: 1_000, P2: 1_000, CHEAT: 1_000, V1: 1_000}
    wallets_after = {
        BUYER: 10_000 - deposit + 3 * FEE + PRICE + SLASH,  # refund, the cheat's held price, the slash
        P1: 4 * PRICE,
        P2: 2 * PRICE,
        CHEAT: PRICE,
        V1: FEE,
    }
    supply = sum(wallets_before.values()) + sum(stakes.values())

    def holdings(wallets: dict[str, int], staked: dict[str, int]) -> Holdings:
        contracts = {"StakeManager": sum(staked.values()), "JobMarket": 0}
        return Holdings(wallets=wallets, stakes=staked, credits={}, contracts=contracts, total_supply=supply)

    checks = Checks()
    ok = conservation_checks(
        money,
        holdings(wallets_before, stakes),
        holdings(wallets_after, {**stakes, CHEAT: 1_000 - SLASH}),
        buyer=BUYER,
        providers=[P1, P2, CHEAT],
        verifiers=[V1],
        checks=checks,
    )
    assert ok, checks.details


def test_a_roster_close_that_paid_other_than_its_slots_is_refused() -> None:
    events = [
        replace_args(e, paid=int(e.args["paid"]) + PRICE) if e.name == "RosterClosed" else e
        for e in _rounds_order()
    ]
    with pytest.raises(RosterMismatch):
        order_money(events, ORDER)


def replace_args(event: Event, **args: object) -> Event:
    return Event(name=event.name, address=event.address, args={**event.args, **args})


def test_an_open_roster_has_paid_nothing_yet() -> None:
    events = [e for e in _rounds_order() if e.name not in ("RosterClosed", "OrderClosed")]
    money, _ = order_money(events, ORDER)
    assert money.payouts == {P1: PRICE}  # the split unit's verdict only


def test_the_roster_verifiers_audit_fees_count_as_verifier_fees() -> None:
    """Two roster verifiers; round 0's two units audited and posted (both sign), round 1's two audited and
    posted by V1 alone, its unit 1 then challenged (set aside): each signer is paid FEE / 2 per unit it
    signed that no challenge took back."""
    round0 = AuditRecord.of_round(0, 0b11, [_digest(1), _digest(2)])
    posting0 = (1 << 255) | (0b11 << 64)
    round1 = AuditRecord.of_round(1, 0b11, [_digest(3), _digest(4)])
    posting1 = (1 << 255) | (0b01 << 64)
    events = [
        *_posted_and_opened(),
        _event("RosterVerifiers", orderId=ORDER, verifiers=[V1, V2]),
        _event("RoundRevealed", orderId=ORDER, round=0, digests=[_digest(1), _digest(2)], audited=0b11),
        _event("AuditPosted", orderId=ORDER, info=posting0, records=b"\x00" * 32),
        _event("RoundRevealed", orderId=ORDER, round=1, digests=[_digest(3), _digest(4)], audited=0b11),
        _event("AuditPosted", orderId=ORDER, info=posting1, records=b"\x00" * 32),
        _event("UnitAssigned", unitId=SPLIT, orderId=ORDER, providers=[CHEAT, P1], verifiers=[V2]),
        _event(
            "AuditChallenged", orderId=ORDER, round=1, unit=1, unitId=SPLIT, info=round1.info | (0b10 << 112)
        ),
        _event("UnitSetAside", orderId=ORDER, round=1, unit=1, unitId=SPLIT),
        _event("VerdictRecorded", unitId=SPLIT, outcomes=[0, 0], verifiers=[V2]),
        _event("RosterClosed", orderId=ORDER, settledRounds=2, paid=6 * PRICE),
    ]
    assert round0.info == 0b11 and round1.round == 1
    money, _ = order_money(events, ORDER)
    # round 0: 2 units x 2 signers; round 1: 1 unchallenged unit x 1 signer; FEE / 2 each
    assert money.audit_fees == (2 * 2 + 1) * (FEE // 2)
    assert money.verifier_fees == money.verdict_fees + money.audit_fees == FEE + 5 * (FEE // 2)
    assert money.payouts == {P1: 4 * PRICE, P2: 2 * PRICE, CHEAT: 2 * PRICE}


# --- the split unit's replicas, each by its own digest -------------------------------------------------


@dataclass(frozen=True)
class _Replica:
    provider: str
    commitment_or_digest: bytes
    committed: bool = True
    revealed: bool = True


class _Chain:
    """The chain's state of the set-aside unit: each replica's revealed digest (what `ChainClient.replica`
    reads)."""

    def __init__(self, replicas: dict[tuple[int, int], _Replica]) -> None:
        self.replicas = replicas

    def replica(self, unit_id: int, index: int) -> _Replica:
        return self.replicas[(unit_id, index)]


def test_the_buyer_fetches_a_split_units_honest_replica_by_its_own_digest() -> None:
    """A cheat holds replica 0 of a split unit: `RoundRevealed` names its digest only, the verdict accepted
    the honest replica 1, whose manifest hashes to its own digest (on chain in the unit's replica)."""
    # a manifest whose transcript hashes to its root, which with its state its result digest binds
    manifest = honest_manifest(1, 1, (2.0, 1.5), checkpoint_every=1)
    honest = bytes.fromhex(manifest.result_digest.removeprefix("0x"))
    _, units = order_money(_rounds_order(), ORDER)
    (split,) = units
    assert split.accepted == [P1]
    assert split.result_digests == {CHEAT: "0x" + _digest(0xCC).hex()}  # no guess for P1
    plane = Plane({"p1-peer": {manifest.result_digest: manifest}})  # the cheat serves nothing
    peers = {P1: "p1-peer", CHEAT: "cheat-peer"}
    with pytest.raises(DigestMismatch):
        _fetch_manifest(plane, split, peers)  # type: ignore[arg-type]
    chain = _Chain({(SPLIT, 0): _Replica(CHEAT, _digest(0xCC)), (SPLIT, 1): _Replica(P1, honest)})
    set_aside_digests(chain, units)  # type: ignore[arg-type]
    assert split.result_digests == {CHEAT: "0x" + _digest(0xCC).hex(), P1: manifest.result_digest}
    assert _fetch_manifest(plane, split, peers).to_bytes() == manifest.to_bytes()  # type: ignore[arg-type]


def test_a_replica_that_never_opened_has_no_result_digest() -> None:
    _, units = order_money(_rounds_order(), ORDER)
    chain = _Chain(
        {(SPLIT, 0): _Replica(CHEAT, _digest(0xEE), revealed=False), (SPLIT, 1): _Replica(P1, _digest(0xAA))}
    )
    set_aside_digests(chain, units)  # type: ignore[arg-type]
    assert units[0].result_digests == {P1: "0x" + _digest(0xAA).hex()}  # the commitment is no result
