"""Short targeted histories built from the state machine's own actions, for the mutation sanity check.

Why: a random run finds a seeded bug only when it happens to line up the few steps that expose it
(e.g. unbond, then get slashed beyond the bonded stake); these sequences line them up on purpose, in
a few dozen transactions, using exactly the machine's actions and invariant checks. On the real
contracts every scenario must trip nothing; on a mutant, the invariant named in mutants.json must trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.chain.invariants_harness import PANEL_OF_THREE, AppealParams
from tests.chain.invariants_machine import (
    AUDITORS_OF_THREE,
    REFEREE,
    REFEREES,
    SPARE_VERIFIERS,
    VERIFIERS,
    InvariantViolation,
    MarketMachine,
)
from tests.chain.invariants_model import ACCEPT, FAULT, FRAUD

Scenario = Callable[[MarketMachine], None]


def run_scenario(machine: MarketMachine, scenario: Scenario) -> frozenset[str]:
    """Run `scenario`, checking invariants after every action, then drain all funds; names of what tripped.

    A violation does not stop the run: later steps (and the final funds-exit check) still execute, so
    a mutant is judged on every invariant it breaks, not only the first.
    """
    tripped: set[str] = set()
    original_check = machine.check_step

    def check_and_record() -> None:
        try:
            original_check()
        except InvariantViolation as violation:
            tripped.update(violation.names)

    machine.check_step = check_and_record  # type: ignore[method-assign]
    scenario(machine)
    machine.drain_everything()
    return frozenset(tripped)


def _stake_everyone(m: MarketMachine, provider_stake: int = 2_500) -> None:
    for provider in ("provider0", "provider1", "provider2"):
        m.do_stake(provider, provider_stake)
        m.check_step()
    for verifier in VERIFIERS:
        m.do_stake(verifier, 1_000)
        m.check_step()


def _work_unit(m: MarketMachine, unit_id: int, deviant: tuple[bool, ...]) -> None:
    """Every replica commits (honest or deviant result), then reveals."""
    providers = [m.label_of[r.provider] for r in m.model.units[unit_id].replicas]
    for provider, is_deviant in zip(providers, deviant, strict=True):
        m.do_commit(unit_id, provider, deviant=is_deviant)
        m.check_step()
    for index in range(len(providers)):
        m.do_reveal(unit_id, index)
        m.check_step()


def _one_unit(m: MarketMachine, providers: list[str]) -> None:
    """Everyone staked; buyer0's one-unit order assigned to `providers` and every verifier (unit 1)."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 1, len(providers), 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, providers, list(VERIFIERS))
    m.check_step()


def finalize_once(m: MarketMachine) -> None:
    """One 3-replica unit, unanimous, finalized."""
    _one_unit(m, ["provider0", "provider1", "provider2"])
    _work_unit(m, 1, (False, False, False))
    m.do_finalize(1)
    m.check_step()


def finalize_twice(m: MarketMachine) -> None:
    """Two open units of one order; the first is finalized, then finalized again (must revert)."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 2, 2, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0", "provider1"], list(VERIFIERS))
    m.check_step()
    m.do_assign(1, ["provider2", "provider0"], list(VERIFIERS))
    m.check_step()
    _work_unit(m, 1, (False, False))
    m.do_finalize(1)
    m.check_step()
    m.do_finalize(1)
    m.check_step()


def expire_after_finalize(m: MarketMachine) -> None:
    """A unit settled by verdict and a finalized one, past their verdict deadlines, must not expire (a
    settled state is final). The verdicted one goes first: expiring a finalized unit meets the chain's
    `UnitFinalizable` check too, which would mask a missing settled-state check. A third unit of the same
    providers stays open, so the order's open-unit count and their locked collateral have room for a wrong
    expiry to take (else it would revert on an underflow, not show the bad transition)."""
    _stake_everyone(m, provider_stake=3_500)  # provider0 and the verifiers work three units at once
    for verifier in VERIFIERS:
        m.do_stake(verifier, 500)
        m.check_step()
    m.do_post_order("buyer0", 3, 2, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0", "provider1"], list(VERIFIERS))
    m.check_step()
    m.do_assign(1, ["provider2", "provider0"], list(VERIFIERS))
    m.check_step()
    m.do_assign(1, ["provider2", "provider0"], list(VERIFIERS))
    m.check_step()
    _work_unit(m, 1, (False, False))
    m.do_finalize(1)
    m.check_step()
    _work_unit(m, 2, (False, True))
    m.do_submit_verdict(2, [ACCEPT, FAULT], list(VERIFIERS))
    m.check_step()
    unit = m.model.units[2]
    m.chain.advance(unit.reveal_deadline + m.chain.params.verdict_window - m.chain.now() + 1)
    m.do_expire(2)
    m.check_step()
    m.do_expire(1)
    m.check_step()


def fraud_while_unbonding(m: MarketMachine) -> None:
    """A provider unbonds its free stake, loses most of its bonded stake to another market's slash, then
    is judged fraudulent and, once the appeal window closed, slashed: the market's slash must reach the
    unbonding stake (LIP-8, Celo #2887), and the slashed part must never come back out through withdraw."""
    m.do_stake("provider0", 1_500)
    m.check_step()
    for verifier in VERIFIERS:
        m.do_stake(verifier, 1_000)
        m.check_step()
    m.do_post_order("buyer0", 1, 1, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0"], list(VERIFIERS))
    m.check_step()
    m.do_request_unstake("provider0", 500)
    m.check_step()
    m.do_slash_directly("provider0", 700)
    m.check_step()
    _work_unit(m, 1, (True,))
    m.do_submit_verdict(1, [FRAUD], list(VERIFIERS))
    m.check_step()
    _settle_after_appeal_window(m, 1)
    m.chain.advance(m.chain.params.unbonding_period + 1)
    m.do_withdraw_stake("provider0")
    m.check_step()


def _settle_after_appeal_window(m: MarketMachine, unit_id: int) -> None:
    """Nobody appeals: past the appeal window from the verdict it stands, and settles what it held."""
    unit = m.model.units[unit_id]
    m.chain.advance(m.model.hold_ends(unit) - m.chain.now() + 1)
    m.do_settle_verdict(unit_id, list(unit.verdict or ()))
    m.check_step()


def _fraud_verdict(m: MarketMachine) -> None:
    """Unit 1: provider0 honest, provider1 deviant, the verdict rightly calls provider1 fraud (held)."""
    _one_unit(m, ["provider0", "provider1"])
    _work_unit(m, 1, (False, True))
    m.do_submit_verdict(1, [ACCEPT, FRAUD], list(VERIFIERS))
    m.check_step()


def fraud_held(m: MarketMachine) -> None:
    """A deviant replica judged fraud is held: no slash and no bounty at the verdict, its collateral
    locked and its price in escrow; settling before the appeal window closed is refused, after it the
    verdict stands and the fraud is slashed (bounty to the signers)."""
    _fraud_verdict(m)
    m.do_close_order(1)  # the held price stays in escrow past the order's close
    m.check_step()
    m.do_settle_verdict(1, [ACCEPT, FRAUD])  # TruthNotFixed
    m.check_step()
    _settle_after_appeal_window(m, 1)


def framed_overturned(m: MarketMachine) -> None:
    """A colluding majority calls an honest replica fraud; its provider appeals, the referee panel votes
    the truth and the verdict is overturned: the framed provider loses nothing and is paid."""
    _one_unit(m, ["provider0", "provider1", "provider2"])
    _work_unit(m, 1, (False, False, False))
    m.do_submit_verdict(1, [ACCEPT, ACCEPT, FRAUD], list(VERIFIERS))
    m.check_step()
    m.do_appeal(1, "provider2")
    m.check_step()
    m.do_draw_panel(1)
    m.check_step()
    m.do_vote(1, [ACCEPT, ACCEPT, ACCEPT], REFEREE)
    m.check_step()
    m.do_resolve(1, [ACCEPT, ACCEPT, FRAUD], [ACCEPT, ACCEPT, ACCEPT])
    m.check_step()


def appeal_confirmed(m: MarketMachine) -> None:
    """The fraud appeals a right verdict; the panel confirms it: the appellant's bond is slashed to the
    referee who voted the decision, and the decision settles the held fraud."""
    _fraud_verdict(m)
    m.do_appeal(1, "provider1")
    m.check_step()
    m.do_draw_panel(1)
    m.check_step()
    m.do_vote(1, [ACCEPT, FRAUD], REFEREE)
    m.check_step()
    m.do_resolve(1, [ACCEPT, FRAUD], [ACCEPT, FRAUD])
    m.check_step()


def panel_majority(m: MarketMachine) -> None:
    """A panel of three referees (PANEL_OF_THREE: the scenario's chain), two appeals each decided 2 to 1, the
    dissent cast first on one and between the majority's votes on the other: each is decided by the
    majority's second vote, never by the dissent nor before. Unit 1: a colluding majority calls an honest
    replica fraud, its provider appeals; referee0 votes the verdict, referee1 and referee2 the truth:
    overturned (then referee0 again: AlreadyDecided). Unit 2: the fraud appeals a right verdict; referee0
    votes it, referee1 dissents (accepts the fraud), referee2 votes it: confirmed, the bond to the two."""
    referee0, referee1, referee2 = REFEREES
    _stake_everyone(m)
    m.do_post_order("buyer0", 1, 3, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0", "provider1", "provider2"], list(VERIFIERS))
    m.check_step()
    m.do_post_order("buyer1", 1, 2, 100, 50, 3_000)
    m.check_step()
    m.do_assign(2, ["provider0", "provider1"], list(VERIFIERS))
    m.check_step()
    _work_unit(m, 1, (False, False, False))
    _work_unit(m, 2, (False, True))
    m.do_submit_verdict(1, [ACCEPT, ACCEPT, FRAUD], list(VERIFIERS))
    m.check_step()
    m.do_submit_verdict(2, [ACCEPT, FRAUD], list(VERIFIERS))
    m.check_step()
    m.do_appeal(1, "provider2")
    m.check_step()
    m.do_appeal(2, "provider1")
    m.check_step()
    for unit_id in (1, 2):
        m.do_draw_panel(unit_id)
        m.check_step()
    for unit_id, outcomes, referee in (
        (1, [ACCEPT, ACCEPT, FRAUD], referee0),  # the dissent first
        (1, [ACCEPT, ACCEPT, ACCEPT], referee1),
        (1, [ACCEPT, ACCEPT, ACCEPT], referee2),  # decides: overturned
        (1, [ACCEPT, ACCEPT, FRAUD], referee0),  # AlreadyDecided
        (2, [ACCEPT, FRAUD], referee0),
        (2, [ACCEPT, ACCEPT], referee1),  # the dissent between
        (2, [ACCEPT, FRAUD], referee2),  # decides: confirmed
    ):
        m.do_vote(unit_id, outcomes, referee)
        m.check_step()
    m.do_resolve(1, [ACCEPT, ACCEPT, FRAUD], [ACCEPT, ACCEPT, ACCEPT])
    m.check_step()
    m.do_resolve(2, [ACCEPT, FRAUD], [ACCEPT, FRAUD])
    m.check_step()


def appeal_lapsed(m: MarketMachine) -> None:
    """The fraud appeals to stall; the panel is drawn but nobody votes: a lapse before the vote deadline is
    refused, after it the appeal lapses (the bond released, no truth) and the verdict settles the held
    fraud."""
    _fraud_verdict(m)
    m.do_appeal(1, "provider1")
    m.check_step()
    m.do_draw_panel(1)
    m.check_step()
    m.do_lapse(1)  # AppealNotLapsed
    m.check_step()
    m.chain.advance(m.model.appeals[1].vote_deadline - m.chain.now() + 1)
    m.do_lapse(1)
    m.check_step()
    m.do_settle_verdict(1, [ACCEPT, FRAUD])
    m.check_step()


def appeal_too_late(m: MarketMachine) -> None:
    """Nobody appeals within the appeal window (the unit's verdict deadline + appealWindow): the verdict
    stands and settles the held fraud, and a later appeal is refused (AppealWindowClosed)."""
    _fraud_verdict(m)
    m.chain.advance(m.model.appeal_closes(m.model.units[1]) - m.chain.now() + 1)
    m.do_settle_verdict(1, [ACCEPT, FRAUD])
    m.check_step()
    m.do_appeal(1, "provider0")
    m.check_step()


def expire_unworked_unit(m: MarketMachine) -> None:
    """Nobody works an assigned unit; after its verdict deadline it expires and its budget must return."""
    _stake_everyone(m)
    m.do_post_order("buyer1", 1, 2, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider1", "provider2"], list(VERIFIERS))
    m.check_step()
    unit = m.model.units[1]
    m.chain.advance(unit.reveal_deadline + m.chain.params.verdict_window - m.chain.now() + 1)
    m.do_expire(1)
    m.check_step()


def commit_at_deadline(m: MarketMachine) -> None:
    """A commit in the last second of the commit window is on time (deadlines are inclusive)."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 1, 1, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0"], list(VERIFIERS))
    m.check_step()
    m.chain.advance(m.model.units[1].commit_deadline - m.chain.now())
    m.do_commit(1, "provider0")
    m.check_step()
    m.do_reveal(1, 0)
    m.check_step()
    m.do_submit_verdict(1, [ACCEPT], list(VERIFIERS))
    m.check_step()


def drawn_unit(m: MarketMachine) -> None:
    """A unanimous unit drawn for a spot check: finalize must revert, a verdict settles it."""
    _one_unit(m, ["provider0", "provider1"])
    _work_unit(m, 1, (False, False))
    m.do_request_verification(1)
    m.check_step()
    m.do_finalize(1)
    m.check_step()
    m.do_submit_verdict(1, [ACCEPT, ACCEPT], list(VERIFIERS))
    m.check_step()


def provider_finalizes(m: MarketMachine) -> None:
    """A unanimous unit its provider tries to finalize itself: refused until the verdict deadline (the
    operator checks canaries' answers first), then allowed; an expiry is refused in its place."""
    _one_unit(m, ["provider0", "provider1"])
    _work_unit(m, 1, (False, False))
    m.do_finalize(1, by_operator=False)
    m.check_step()
    m.chain.advance(m.model.units[1].reveal_deadline + m.chain.params.verdict_window - m.chain.now() + 1)
    m.do_expire(1)
    m.check_step()
    m.do_finalize(1, by_operator=False)
    m.check_step()


def withheld_reveal(m: MarketMachine) -> None:
    """Both replicas commit, one never reveals: the verdict after the reveal deadline costs it stake."""
    _one_unit(m, ["provider0", "provider1"])
    for provider in ("provider0", "provider1"):
        m.do_commit(1, provider)
        m.check_step()
    m.do_reveal(1, 0)
    m.check_step()
    m.chain.advance(m.model.units[1].reveal_deadline - m.chain.now() + 1)
    m.do_submit_verdict(1, [ACCEPT, FAULT], list(VERIFIERS))
    m.check_step()


def reduced_unit(m: MarketMachine) -> None:
    """An adaptive order (1..3 replicas, streak 1): a lone newcomer is refused, a full unit of three is
    assigned and finalized, then a lone provider with its streak of one valid unit is assigned."""
    _stake_everyone(m)
    m.do_post_adaptive_order("buyer0", 3, (1, 3), 1, 100, 50)
    m.check_step()
    m.do_assign(1, ["provider0"], list(VERIFIERS))  # ProviderNotTrusted
    m.check_step()
    m.do_assign(1, ["provider0", "provider1", "provider2"], list(VERIFIERS))
    m.check_step()
    _work_unit(m, 1, (False, False, False))
    m.do_finalize(1)
    m.check_step()
    m.do_assign(1, ["provider0"], list(VERIFIERS))
    m.check_step()
    if 2 in m.model.units:  # on a mutant the chain and the model may number units differently by now
        _work_unit(m, 2, (False,))


def _step(m: MarketMachine, order_id: int, **kwargs: Any) -> None:
    m.do_step_round(order_id, **kwargs)
    m.check_step()


def roster_rounds(m: MarketMachine) -> None:
    """A round-path order of 2 units x 2 replicas x 2 rounds: a step with a forged work is refused, each
    round commits and reveals in one step each, the roster cannot close early, a slot whose opening its
    provider published on chain counts as revealed though the step gives it as withheld; the close pays
    every slot, releases every lock, and the order closes."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 4, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(1, [["provider0", "provider1"], ["provider2", "provider0"]], 2)
    m.check_step()
    _step(m, 1, reveal=False, forged=1)  # InvalidSigner: provider2 signed provider1's work
    _step(m, 1, reveal=False)
    m.do_close_roster(1)  # RosterNotClosable
    m.check_step()
    _step(m, 1)  # round 0 revealed, round 1 committed
    m.do_publish_opening(1, 3)
    m.check_step()
    m.chain.advance(m.chain.params.reveal_window + 1)
    _step(m, 1, commit=False, withheld=1 << 3)
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


def roster_split(m: MarketMachine) -> None:
    """A round unit whose replicas disagree: a step by anyone but the operator cannot set it aside, the
    operator's does (with its verifiers); the verdict accepts the honest replica (paid, its collateral
    still the roster's) and holds the deviant one, settled as fraud after the appeal window (one slot of
    the roster's lock released before the slash); the next round is paid by the roster at close."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 2, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(1, [["provider0", "provider1"]], 2)
    m.check_step()
    _step(m, 1, reveal=False, deviant=frozenset({1}))
    _step(m, 1, sender="provider0")  # RoundUnitNeedsVerdict
    _step(m, 1)  # unit 1 set aside; round 1 committed
    m.do_submit_verdict(1, [ACCEPT, FRAUD], list(VERIFIERS))
    m.check_step()
    m.do_close_roster(1)  # a round pending, a set-aside unit holding fraud
    m.check_step()
    _settle_after_appeal_window(m, 1)
    _step(m, 1, commit=False)
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


def roster_withheld_then_drawn(m: MarketMachine) -> None:
    """An adaptive order (1..2 replicas, streak 1) whose roster has one replica a unit, for providers with
    the streak: provider1 does not open round 0 in time, so the operator's step past the reveal window
    gives its slot as withheld and sets the unit aside; the verdict calls it a fault (the withhold penalty
    slashed, one slot of the roster's lock released first). In round 1 provider1 is below the streak: its
    unit is drawn and set aside though unanimous, and its verdict pays it; at close the roster pays
    provider0's two slots and none of provider1's (its set-aside units settled them)."""
    _stake_everyone(m)
    m.do_post_adaptive_order("buyer0", 5, (1, 2), 1, 100, 150)
    m.check_step()
    m.do_assign(1, ["provider0", "provider1"], list(VERIFIERS))
    m.check_step()
    _work_unit(m, 1, (False, False))
    m.do_finalize(1)
    m.check_step()
    m.do_open_roster(1, [["provider0"], ["provider1"]], 2)
    m.check_step()
    _step(m, 1, reveal=False)
    m.chain.advance(m.chain.params.reveal_window + 1)
    _step(m, 1, withheld=1 << 1)  # unit 2: provider1's withheld slot; round 1 committed
    m.do_submit_verdict(2, [FAULT], list(VERIFIERS))
    m.check_step()
    _step(m, 1, commit=False)  # unit 3: provider1 below the streak, drawn
    m.do_submit_verdict(3, [ACCEPT], list(VERIFIERS))
    m.check_step()
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


def roster_overturn_slashes_missed_fraud(m: MarketMachine) -> None:
    """provider0 holds one slot of a roster and works an open per-unit unit (2,000 of its 2,500 locked). Its
    round replica is deviant; the set-aside unit's verdict misses that and frames its honest partner, whose
    appeal overturns it: JobMarket.settleHeld slashes provider0 for the fraud the verdict missed after
    releasing one slot of its roster lock (RosterLock), as for its own slashes of set-aside replicas. Then
    the roster closes; provider0's open unit keeps its collateral (test_invariants.py asserts it)."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 1, 2, 100, 50, 3_000)
    m.check_step()
    m.do_assign(1, ["provider0", "provider2"], list(VERIFIERS))  # unit 1 stays open
    m.check_step()
    m.do_post_order("buyer1", 1, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(2, [["provider0", "provider1"]], 1)
    m.check_step()
    _step(m, 2, reveal=False, deviant=frozenset({0}))
    _step(m, 2, commit=False)  # unit 2: set aside, split
    m.do_submit_verdict(2, [ACCEPT, FRAUD], list(VERIFIERS))  # wrong on both replicas
    m.check_step()
    m.do_appeal(2, "provider1")
    m.check_step()
    m.do_draw_panel(2)
    m.check_step()
    m.do_vote(2, [FRAUD, ACCEPT], REFEREE)
    m.check_step()
    m.do_resolve(2, [ACCEPT, FRAUD], [FRAUD, ACCEPT])  # overturned: provider0 slashed by settleHeld
    m.check_step()
    m.do_close_roster(2)
    m.check_step()


def roster_pending_way_out(m: MarketMachine) -> None:
    """Round audits with the chain's seed gone (every unit drawn): a roster of 1 unit x 2 replicas x 4 rounds
    with the two verifiers. A provider's step leaves round 0 pending; the operator's step pends round 1 and
    posts both (the verifiers sign the pending chain); round 2's units, pended by the operator, are set aside
    for a verdict with its verifiers while round 3 is committed; round 3 is left pending, nobody posts: a drop
    before the order's deadline + verdictWindow is refused, the close refuses pending records, then anyone
    drops them unpaid and the roster closes, the verifiers paid for the two posted units only."""
    _stake_everyone(m)
    m.do_post_order("buyer0", 4, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(1, [["provider0", "provider1"]], 4, verifiers=VERIFIERS)
    m.check_step()
    _step(m, 1, reveal=False)
    m.chain.mine(257)
    _step(m, 1, verifiers=(), sender="provider0")  # round 0 pending
    m.chain.mine(257)
    _step(m, 1, post=True)  # round 1 pending, both posted
    m.chain.mine(257)
    _step(m, 1, verifiers=())  # round 2 pending, round 3 committed
    m.do_set_aside_pending(1, 1)  # round 2's unit set aside: unit 1
    m.check_step()
    m.do_submit_verdict(1, [ACCEPT, ACCEPT], list(VERIFIERS))
    m.check_step()
    m.chain.mine(257)
    _step(m, 1, commit=False, verifiers=())  # round 3 pending
    m.do_set_aside_pending(1, 1, (), "buyer0")  # RosterNotClosable: before the deadline + verdictWindow
    m.check_step()
    m.chain.advance(m.model.orders[1].deadline + m.chain.params.verdict_window - m.chain.now() + 1)
    m.do_close_roster(1)  # AuditsPending
    m.check_step()
    m.do_set_aside_pending(1, 1, (), "buyer0")  # dropped
    m.check_step()
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


def roster_thin_posting(m: MarketMachine) -> None:
    """Round audits by three verifiers with the chain's seed gone (every unit drawn): a roster of 1 unit x 2
    replicas x 2 rounds. Round 0's pending unit is posted by one verifier (QuorumNotReached: a majority of
    three is two), then by a bare quorum (verifier0 and verifier2); round 1 is posted by all three; once the
    last posting's challenge window (verdictWindow) is over, the roster and the order close."""
    _stake_everyone(m)
    m.do_stake(AUDITORS_OF_THREE[2], 1_000)
    m.check_step()
    m.do_post_order("buyer0", 2, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(1, [["provider0", "provider1"]], 2, verifiers=AUDITORS_OF_THREE)
    m.check_step()
    _step(m, 1, reveal=False)  # round 0 committed
    m.chain.mine(257)
    _step(m, 1, commit=False, post=True, signers=0b100)  # QuorumNotReached: one signature of three
    _step(m, 1, post=True, signers=0b101)  # round 0 pending and posted by a bare quorum; round 1 committed
    m.chain.mine(257)
    _step(m, 1, commit=False, post=True)  # round 1 posted by all three
    m.chain.advance(m.chain.params.verdict_window + 1)
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


def roster_audit_challenged(m: MarketMachine) -> None:
    """The round audits' dispute path with the chain's seed gone (every unit drawn): a roster of 1 unit x 2
    replicas x 8 rounds audited by three verifiers (the last 4 never committed: the close after the deadline).
    Round 0's unit is a unanimous forgery of both providers; a bare quorum (verifier0, verifier1) posts it,
    the operator challenges it (verifier2 and verifier3, none a signer; again: NotAudited) and the verdict
    calls both replicas fraud. Round 1's honest unit, posted by verifier1 and verifier2, is challenged too
    (the records from its posting on) and accepted by its verdict. Round 2's forgery, posted by verifier0 and
    verifier1, is challenged and judged fraud; round 3, posted by all three, is challenged after its window
    (AuditChallengeClosed). Before the truth is fixed the slash is refused; after it, slashRoundAudit slashes
    verifier0 and verifier1 for round 0 (their roster collateral released first, while a per-unit unit keeps
    verifier0 and verifier1 locked), once (VerifierAlreadySlashed again), then again for round 2 (nothing left
    to release); the honest unit's is refused (AuditNotContradicted). The held fraud settles, the roster
    closes (verifier2 alone released there; each signer paid for the audited units no challenge took back) and
    the order closes."""
    _stake_everyone(m)
    for verifier in SPARE_VERIFIERS:
        m.do_stake(verifier, 2_000)
        m.check_step()
    m.do_post_order("buyer0", 8, 2, 100, 50, 3_000)
    m.check_step()
    m.do_open_roster(1, [["provider0", "provider1"]], 8, verifiers=AUDITORS_OF_THREE)
    m.check_step()
    _step(m, 1, reveal=False, colluding=frozenset({0}))  # round 0 committed: a unanimous forgery
    m.chain.mine(257)
    _step(m, 1, post=True, signers=0b011)  # round 0 pending and posted by verifier0 + verifier1
    m.do_challenge_audit(1, 0, 0, SPARE_VERIFIERS)  # unit 1
    m.check_step()
    m.do_challenge_audit(1, 0, 0, SPARE_VERIFIERS)  # NotAudited: taken back already
    m.check_step()
    m.do_submit_verdict(1, [FRAUD, FRAUD], list(SPARE_VERIFIERS))
    m.check_step()
    m.do_slash_round_audit(1, [FRAUD, FRAUD])  # TruthNotFixed
    m.check_step()
    m.chain.mine(257)
    _step(m, 1, post=True, signers=0b110, colluding=frozenset({0}))  # round 1 (honest) posted, round 2 forged
    m.do_challenge_audit(1, 2, 0, ["verifier0", "verifier3"], from_posting=True)  # unit 2
    m.check_step()
    m.do_submit_verdict(2, [ACCEPT, ACCEPT], ["verifier0", "verifier3"])
    m.check_step()
    m.chain.mine(257)
    _step(m, 1, post=True, signers=0b011)  # round 2 posted by verifier0 + verifier1, round 3 committed
    m.do_challenge_audit(1, 4, 0, SPARE_VERIFIERS)  # unit 3
    m.check_step()
    m.do_submit_verdict(3, [FRAUD, FRAUD], list(SPARE_VERIFIERS))
    m.check_step()
    m.chain.mine(257)
    _step(m, 1, commit=False, post=True)  # round 3 posted by all three
    m.chain.advance(m.chain.params.verdict_window + 1)
    m.do_challenge_audit(1, 6, 0, SPARE_VERIFIERS)  # AuditChallengeClosed
    m.check_step()
    m.do_post_order("buyer1", 1, 1, 100, 50, 3_000)  # a per-unit unit keeps verifier0 and verifier1 locked
    m.check_step()
    m.do_assign(2, ["provider2"], list(VERIFIERS))
    m.check_step()
    m.chain.advance(max(0, m.model.appeal_closes(m.model.units[3]) - m.chain.now() + 1))
    m.do_slash_round_audit(1, [FRAUD, FRAUD], "buyer1")  # verifier0, verifier1 released, then slashed
    m.check_step()
    m.do_slash_round_audit(1, [FRAUD, FRAUD])  # VerifierAlreadySlashed
    m.check_step()
    m.do_slash_round_audit(3, [FRAUD, FRAUD])  # slashed again, nothing left to release
    m.check_step()
    m.do_slash_round_audit(2, [ACCEPT, ACCEPT])  # AuditNotContradicted
    m.check_step()
    for unit_id in (1, 3):
        m.do_settle_verdict(unit_id, [FRAUD, FRAUD])
        m.check_step()
    m.chain.advance(
        m.model.orders[1].deadline - m.chain.now() + 1
    )  # rounds 4.. never committed: budget a wrong close could pay
    m.do_close_roster(1)
    m.check_step()
    m.do_close_order(1)
    m.check_step()


SCENARIOS: dict[str, Scenario] = {
    "finalize_once": finalize_once,
    "finalize_twice": finalize_twice,
    "expire_after_finalize": expire_after_finalize,
    "fraud_while_unbonding": fraud_while_unbonding,
    "expire_unworked_unit": expire_unworked_unit,
    "commit_at_deadline": commit_at_deadline,
    "drawn_unit": drawn_unit,
    "withheld_reveal": withheld_reveal,
    "provider_finalizes": provider_finalizes,
    "reduced_unit": reduced_unit,
    "fraud_held": fraud_held,
    "framed_overturned": framed_overturned,
    "appeal_confirmed": appeal_confirmed,
    "panel_majority": panel_majority,
    "appeal_lapsed": appeal_lapsed,
    "appeal_too_late": appeal_too_late,
    "roster_rounds": roster_rounds,
    "roster_split": roster_split,
    "roster_withheld_then_drawn": roster_withheld_then_drawn,
    "roster_overturn_slashes_missed_fraud": roster_overturn_slashes_missed_fraud,
    "roster_pending_way_out": roster_pending_way_out,
    "roster_thin_posting": roster_thin_posting,
    "roster_audit_challenged": roster_audit_challenged,
}
# The appeal parameters of a scenario's chain where not the default (a panel of one).
SCENARIO_APPEAL_PARAMS: dict[str, AppealParams] = {"panel_majority": PANEL_OF_THREE}


def appeal_params_of(scenario: str) -> AppealParams:
    """The VerdictAppeals parameters the chain that runs `scenario` must be deployed with."""
    return SCENARIO_APPEAL_PARAMS.get(scenario, AppealParams())
