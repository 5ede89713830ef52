"""The demo's money accounting: figures from JobMarket events, and checks that catch a wrong payout."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from apps.buyer import order_money
from apps.demo_report import Checks, Holdings, conservation_checks, write_loss_curve
from veritrain.chain.tx import Event

BUYER, P1, P2, CHEAT, V1 = "0xB", "0x1", "0x2", "0xC", "0xV"
PRICE, FEE, SLASH = 100, 10, 50


def _event(name: str, **args: object) -> Event:
    return Event(name=name, address="0xJobMarket", args=dict(args))


def _order_events() -> list[Event]:
    """One fast-path unit (P1, P2, CHEAT all accepted) and one verdict unit where CHEAT is fraud: held at
    the verdict, slashed once the verdict stood (HeldSettled), its price credited to the buyer."""
    return [
        _event(
            "OrderPosted",
            orderId=1,
            escrow=2 * (3 * PRICE + FEE),
            pricePerReplica=PRICE,
            verifierFeePerUnit=FEE,
        ),
        _event(
            "OrderPosted", orderId=2, escrow=999, pricePerReplica=1, verifierFeePerUnit=1
        ),  # another order
        _event("UnitAssigned", unitId=1, orderId=1, providers=[P1, P2, CHEAT], verifiers=[V1]),
        _event("UnitFinalized", unitId=1),
        _event("UnitAssigned", unitId=2, orderId=1, providers=[CHEAT, P1, P2], verifiers=[V1]),
        _event("ReplicaRevealed", unitId=2, provider=P1, resultDigest=b"\x01" * 32),
        _event("VerdictRecorded", unitId=2, outcomes=[2, 0, 0], verifiers=[V1]),
        _event("OrderClosed", orderId=1, refund=2 * (3 * PRICE + FEE) - 6 * PRICE - FEE),
        _event("ReplicaSlashed", unitId=2, provider=CHEAT, amount=SLASH),
        _event("HeldSettled", unitId=2, truth=[2, 0, 0]),
    ]


def _holdings(wallets: dict[str, int], stakes: dict[str, int], supply: int) -> Holdings:
    contracts = {"StakeManager": sum(stakes.values()), "JobMarket": 0}
    return Holdings(wallets=wallets, stakes=stakes, credits={}, contracts=contracts, total_supply=supply)


def test_order_money_from_events() -> None:
    lazy = _event("VerifierSlashed", unitId=2, verifier="0xL", amount=7, reporter="0xOperator")
    money, units = order_money([*_order_events(), lazy], order_id=1)
    assert units[1].slashed_verifiers == {"0xL": 7} and units[0].slashed_verifiers == {}
    assert money.deposit == 620 and money.refund == 620 - 6 * PRICE - FEE and money.held_refunds == PRICE
    assert money.payouts == {P1: 200, P2: 200, CHEAT: 100}
    assert money.verdict_fees == FEE and money.slashed == {CHEAT: SLASH}
    assert money.escrow_balanced()
    assert [u.settlement for u in units] == ["finalized (fast path)", "verdict"]
    assert (
        units[1].outcomes == ["fraud", "accept", "accept"] and units[1].result_digests[P1] == "0x" + "01" * 32
    )


def _snapshots(verifier_gets: int) -> tuple[Holdings, Holdings]:
    stake = 1000
    before = _holdings(
        {BUYER: 1000, P1: 0, P2: 0, CHEAT: 0, V1: 0},
        {P1: stake, P2: stake, CHEAT: stake, V1: stake},
        supply=5000,
    )
    buyer_after = 1000 - 620 + 110 + (SLASH + FEE - verifier_gets)
    after = _holdings(
        {BUYER: buyer_after, P1: 200, P2: 200, CHEAT: 100, V1: verifier_gets},
        {P1: stake, P2: stake, CHEAT: stake - SLASH, V1: stake},
        supply=5000,
    )
    return before, after


def test_conservation_holds_for_an_honest_ledger() -> None:
    money, _ = order_money(_order_events(), order_id=1)
    before, after = _snapshots(verifier_gets=35)
    checks = Checks()
    assert conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2, CHEAT], verifiers=[V1], checks=checks
    ), checks.details
    assert checks.all_ok


def test_conservation_holds_when_a_verifier_is_slashed() -> None:
    """A lazy verifier's collateral: the reporter's bounty and the buyer's rest net its loss to zero."""
    lazy, operator, collateral, bounty = "0xL", "0xOp", 40, 10
    events = [
        *_order_events(),
        _event("VerifierSlashed", unitId=2, verifier=lazy, amount=collateral, reporter=operator),
    ]
    money, _ = order_money(events, order_id=1)
    assert money.slashed_verifiers == {lazy: collateral} and money.reporters == {operator}
    before, after = _snapshots(verifier_gets=35)
    before.wallets.update({lazy: 0, operator: 0})
    before.stakes[lazy], after.stakes[lazy] = 500, 500 - collateral
    before.contracts["StakeManager"] += 500
    after.contracts["StakeManager"] += 500 - collateral
    before, after = (replace(h, total_supply=h.total_supply + 500) for h in (before, after))
    after.wallets.update({lazy: 0, operator: bounty})
    after.wallets[BUYER] += collateral - bounty
    checks = Checks()
    assert conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2, CHEAT], verifiers=[V1, lazy], checks=checks
    ), checks.details
    after.wallets[operator] += 1  # a bounty from nowhere
    checks = Checks()
    conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2, CHEAT], verifiers=[V1, lazy], checks=checks
    )
    assert {"fees_and_slashes_distributed", "parties_conserved"} <= set(checks.failed())


def test_held_fraud_counts_once_the_truth_settles_it() -> None:
    """A verdict's fraud moves no money until the unit's truth settles it: still held, the escrow does not
    balance; overturned (the truth accepts the framed replica), the replica is paid its price."""
    held = [e for e in _order_events() if e.name not in ("ReplicaSlashed", "HeldSettled")]
    money, units = order_money(held, order_id=1)
    assert money.held_replicas == 1 and units[1].held == [0] and not money.escrow_balanced()
    overturned = [*held, _event("HeldSettled", unitId=2, truth=[0, 0, 0])]
    money, units = order_money(overturned, order_id=1)
    assert money.payouts == {P1: 200, P2: 200, CHEAT: 200} and money.held_refunds == 0
    assert units[1].outcomes == ["accept"] * 3 and money.escrow_balanced()


def test_a_withheld_reveal_penalty_counts_as_slashed_and_balances() -> None:
    """Regression (bench chaos, a provider partitioned between its commit and its reveal past the reveal
    window): the RevealWithheld penalty was left out of the order's money, so an honest ledger failed
    providers_paid_exactly and the bench counted no slash. An expired unit credits it to the buyer."""
    penalty = 30
    events = [
        _event(
            "OrderPosted", orderId=1, escrow=2 * PRICE + FEE, pricePerReplica=PRICE, verifierFeePerUnit=FEE
        ),
        _event("UnitAssigned", unitId=1, orderId=1, providers=[P1, P2], verifiers=[V1]),
        _event("ReplicaRevealed", unitId=1, provider=P2, resultDigest=b"\x02" * 32),
        _event("RevealWithheld", unitId=1, provider=P1, amount=penalty),
        _event("UnitExpired", unitId=1),
        _event("OrderClosed", orderId=1, refund=2 * PRICE + FEE),
    ]
    money, units = order_money(events, order_id=1)
    assert money.slashed == {P1: penalty} and units[0].slashed == {P1: penalty}
    assert units[0].settlement == "expired" and money.payouts == {}
    stake = 1000
    before = _holdings({BUYER: 1000, P1: 0, P2: 0, V1: 0}, {P1: stake, P2: stake, V1: stake}, supply=4000)
    after = _holdings(
        {BUYER: 1000 + penalty, P1: 0, P2: 0, V1: 0}, {P1: stake - penalty, P2: stake, V1: stake}, supply=4000
    )
    checks = Checks()
    assert conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2], verifiers=[V1], checks=checks
    ), checks.details


def test_a_payout_to_the_wrong_account_is_caught() -> None:
    money, _ = order_money(_order_events(), order_id=1)
    before, after = _snapshots(verifier_gets=35)
    after.wallets[P1] -= 1
    after.wallets[P2] += 1
    checks = Checks()
    assert not conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2, CHEAT], verifiers=[V1], checks=checks
    )
    assert checks.failed() == ["providers_paid_exactly"]


def test_minted_or_vanished_tokens_are_caught() -> None:
    money, _ = order_money(_order_events(), order_id=1)
    before, after = _snapshots(verifier_gets=35)
    after.wallets[V1] += 7  # tokens from nowhere
    checks = Checks()
    conservation_checks(
        money, before, after, buyer=BUYER, providers=[P1, P2, CHEAT], verifiers=[V1], checks=checks
    )
    assert {"fees_and_slashes_distributed", "parties_conserved", "supply_conserved"} <= set(checks.failed())


def test_loss_curve_png(tmp_path: Path) -> None:
    path = tmp_path / "curve.png"
    write_loss_curve([5.0, 4.0, 3.5, 3.0], [2], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
