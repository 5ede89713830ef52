"""`veritrain bench protocol --json FILE`: scripted adversaries through the market and the real contracts,
each attack played ``--trials`` times; what the cheater gained and what honest parties lost is measured
from token balances, market credits and stake on chain, never asserted.

The stack: a real :class:`market.service.MarketService` on a fresh SQLite store per trial, over the
compiled JobMarket/StakeManager/VeriToken bytecode on a `hardhat node` this command starts and stops
(``--in-process``: the in-process EVM, py-evm, as fast here and without Node), deployed once with the
deployment's default parameters (``MarketParams()``: 5 % spot checks, probation for a provider's first 5
valid units, 50 VERI slash and withhold penalty, 10 VERI verifier collateral); each trial starts from an
EVM snapshot (every provider new again; for the canary attack, every provider past its probation and the
market replaying each verified unit as a canary). The market's worker is :meth:`ChainMarket.tick` (heartbeats,
sweep, outbox, event sync). Verifiers are scripted: an honest one signs the true outcomes (the verifier
core's own detection rate is `veritrain bench verification`'s figure), a lazy or colluding one signs what
the attack needs.

Accounting, per trial, over every party's tokens + market credit + bonded and unbonding stake (the
buyer closes its orders at the end, so unspent escrow is back in its tokens); gas is ETH and is reported
apart (``cheater_gas_wei``):

- ``cheater_net_gain``: the cheaters' change minus what the same parties would have got playing honestly
  in that trial (the price of each of their replicas whose result was correct; for a buyer, minus what it
  owed honest providers and verifiers; 0 for a verifier, which favours the cheater). The JSON figure is
  the sum over trials; ``worst_trial_gain`` is the cheater's best single trial and ``profitable_trials``
  counts trials with a gain above 0.
- ``honest_loss``: summed over trials: each honest provider's shortfall from the price it was owed for
  correct work, each honest verifier's loss, and the honest buyer's payment beyond what honest parties
  earned.
- ``detected``: trials in which the attack was caught or refused (the attack's own predicate: see each
  attack's docstring); ``refused_transactions``: the attacker's transactions the contracts reverted.
- ``targets_missed``: the attacks that miss issue 8's targets (a trial with gain >= 0, or honest loss).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from apps.protocol_harness import ChainMarket, HarnessStepFailed, Result, funded_accounts, result, word
from market.chain_adapter import ChainCanaryAccount
from market.store import MarketStore
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.backends import Backend, HardhatNode, InProcessBackend
from veritrain.chain.client import ChainClient, Reveal, UnitState
from veritrain.chain.deployment import MarketParams
from veritrain.chain.errors import FinalizeReserved, UnitUnderVerification

ACCEPT, FAULT, FRAUD = 0, 1, 2
SETTLED = (UnitState.FINALIZED, UnitState.VERDICTED, UnitState.EXPIRED)


@dataclass
class Trial:
    """One play of an attack: who cheated, whose work was correct, what the chain refused."""

    market: ChainMarket
    seed: int
    folder: Path  # this trial's scratch space
    cheaters: set[str] = field(default_factory=set)
    bystanders: set[str] = field(default_factory=set)  # other adversaries: neither cheater nor honest
    correct: Counter[str] = field(default_factory=Counter)  # replicas of each provider with the true result
    wrong: set[bytes] = field(default_factory=set)  # digests of the wrong results played
    refused: int = 0  # attack transactions the contract reverted
    detected: bool = False

    def work(self, providers: Iterable[LocalAccount]) -> None:
        """These providers each revealed the true result of one unit (they are owed its price)."""
        self.correct.update(p.address for p in providers)

    def wrong_result(self) -> Result:
        """A wrong result for this trial, which an honest verifier's re-execution calls fraud."""
        wrong = result(f"wrong-{self.seed}")
        self.wrong.add(word(wrong.digest))
        return wrong


@dataclass
class Figures:
    trials: int = 0
    cheater_net_gain: int = 0
    honest_loss: int = 0
    detected: int = 0
    worst_trial_gain: int | None = None
    profitable_trials: int = 0
    refused_transactions: int = 0
    cheater_gas_wei: int = 0

    def add(self, gain: int, loss: int, detected: bool, refused: int, gas: int) -> None:
        self.trials += 1
        self.cheater_net_gain += gain
        self.honest_loss += loss
        self.detected += int(detected)
        self.worst_trial_gain = gain if self.worst_trial_gain is None else max(self.worst_trial_gain, gain)
        self.profitable_trials += int(gain > 0)
        self.refused_transactions += refused
        self.cheater_gas_wei += gas


class World:
    """One deployment (default parameters) with a buyer, 4 staked providers, 3 staked verifiers, 3 staked
    referees in the appeal pool (none of a unit's parties) and the operator's canary account; every trial
    starts from the same EVM snapshot (every provider new), or, for an attack that needs providers past
    their probation, from a snapshot taken after each provider worked `probationStreak` units honestly
    (:func:`work_probation`), with a fresh market store."""

    def __init__(self, backend: Backend, folder: Path) -> None:
        self.backend = backend
        self.folder = folder
        accounts = list(backend.dev_accounts(13))
        self.client = ChainClient.deploy(backend, accounts[0], params=MarketParams())
        funded_accounts(self.client, accounts)
        self.buyer, self.providers, self.verifiers = accounts[1], accounts[2:6], accounts[6:9]
        self.referees = accounts[9:12]
        self.canary = accounts[12]  # buys the market's canary orders (market/canary.py)
        for referee in self.referees:
            self.client.join_referee_pool(referee)
        self.operator = accounts[0]  # the market's sender: it earns the bounty when it relays a slash
        self.snapshot = backend.snapshot()
        self.mature_snapshot: int | None = None  # taken after work_probation; gone once reverted past
        self.played = 0

    def parties(self) -> list[LocalAccount]:
        return [self.buyer, *self.providers, *self.verifiers, *self.referees, self.canary]

    def _restore(self, snapshot: int) -> int:
        """Back to `snapshot`; the same state's new snapshot id (a hardhat node's evm_revert uses its
        snapshot up, and drops every snapshot taken after it)."""
        self.backend.revert(snapshot)
        self.client.transactor.forget_nonces()
        return self.backend.snapshot()

    def _revert(self, mature: bool) -> None:
        """Back to the fresh world, or to the one whose providers are past probation (built the first time
        it is needed after a revert to the fresh one)."""
        if mature and self.mature_snapshot is not None:
            self.mature_snapshot = self._restore(self.mature_snapshot)
            return
        self.snapshot = self._restore(self.snapshot)
        self.mature_snapshot = None
        if mature:
            work_probation(self.client, self.buyer, self.providers, self.verifiers)
            self.mature_snapshot = self.backend.snapshot()

    def market(self, seed: int, mature: bool = False) -> ChainMarket:
        self._revert(mature)
        self.played += 1
        store = MarketStore(f"sqlite:///{self.folder / f'trial-{self.played}.sqlite3'}")
        store.create_schema()
        salt = "0x" + random.Random(seed).randbytes(32).hex()  # new commitments: new seed blocks, new draws
        market = ChainMarket(self.client, store, self.buyer, self.providers, self.verifiers, salt=salt)
        market.service.config = replace(market.service.config, verifiers_per_unit=3)  # quorum 2 of 3
        market.referees = list(self.referees)
        if mature:  # every verified unit is replayed as a canary by the operator's account
            market.service.config = replace(market.service.config, canary_rate_ppm=1_000_000)
            market.service.canaries.account = ChainCanaryAccount(self.client, self.canary)
        return market

    def wealth(self, address: str) -> int:
        b = self.client.balances(address)
        return b.tokens + b.credits + b.bonded + b.unbonding

    def eth(self, address: str) -> int:
        return int(self.client.w3.eth.get_balance(to_checksum_address(address)))

    def play(self, attack: Callable[[Trial], None], seed: int, figures: Figures) -> None:
        market = self.market(seed, mature=attack in NEEDS_MATURE_PROVIDERS)
        try:
            addresses: list[str] = [p.address for p in (*self.parties(), self.operator)]
            before = {a: self.wealth(a) for a in addresses}
            eth_before = {a: self.eth(a) for a in addresses}
            orders_before = self.client.order_count()
            trial = Trial(market, seed, self.folder / f"trial-{self.played}")
            attack(trial)
            for order in range(orders_before + 1, self.client.order_count() + 1):
                info = self.client.get_order(order)
                if not info.closed:
                    closer = self.canary if info.buyer == self.canary.address else self.buyer
                    self.client.close_order(order, sender=closer)
            delta = {a: self.wealth(a) - before[a] for a in addresses}
            if sum(delta.values()) != 0:
                raise HarnessStepFailed(f"tokens not conserved among the parties: {delta}")
            price = self.client.get_order(self.client.order_count()).price_per_replica
            gain, loss = account(trial, delta, price, self.buyer.address, {p.address for p in self.providers})
            gas = sum(eth_before[a] - self.eth(a) for a in trial.cheaters)
            figures.add(gain, loss, trial.detected, trial.refused, gas)
        finally:
            market.store.dispose()


def work_probation(
    client: ChainClient, buyer: LocalAccount, providers: list[LocalAccount], verifiers: list[LocalAccount]
) -> None:
    """Each provider works `probationStreak` one-replica units honestly, straight on the contracts: each
    is drawn (the provider is on probation), re-executed and accepted by a verifier majority, so the
    provider ends past its probation (its units skip verification but for the spot check)."""
    streak = client.params.probation_streak
    price = fee = 10**15
    deadline = client.now() + 86_400
    client.approve(buyer, client.deployment.job_market, len(providers) * streak * (price + fee))
    order, _ = client.post_order(buyer, os.urandom(32), len(providers) * streak, 1, price, fee, deadline)
    for provider in providers:
        for _ in range(streak):
            key = os.urandom(32)
            accept = client.sign_accept(provider, order, key, deadline)
            unit, _ = client.assign(order, key, [provider], verifiers, [accept])
            digest, salt = os.urandom(32), os.urandom(32)
            client.commit(provider, unit, client.commitment(digest, salt, provider, unit))
            client.reveal(unit, provider, digest, salt)
            signed = [client.sign_verdict(v, unit, [ACCEPT], deadline) for v in verifiers[:2]]
            client.submit_verdict(unit, [ACCEPT], signed)
    client.close_order(order, sender=buyer)


def account(
    trial: Trial, delta: dict[str, int], price: int, buyer: str, providers: set[str]
) -> tuple[int, int]:
    """(cheaters' gain over honest play, honest parties' loss) of one trial; see the module docstring."""
    owed = {a: price * trial.correct[a] for a in delta}
    honest = [a for a in delta if a not in trial.cheaters | trial.bystanders | {buyer}]
    honest_verifiers = [a for a in honest if a not in providers]
    loss = sum(max(0, owed[a] - delta[a]) if a in providers else max(0, -delta[a]) for a in honest)
    # what an honest buyer pays: the price of correct work (whoever did it) and honest verifiers' earnings
    paid_for_work = sum(min(owed[a], max(0, delta[a])) for a in providers)
    paid_for_work += sum(max(0, delta[a]) for a in honest_verifiers)
    baseline = sum(owed[a] for a in trial.cheaters)
    if buyer in trial.cheaters:
        baseline -= sum(owed[a] for a in providers) + sum(max(0, delta[a]) for a in honest_verifiers)
    elif buyer not in trial.bystanders:
        loss += max(0, -delta[buyer] - paid_for_work)
    gain = sum(delta[a] for a in trial.cheaters) - baseline
    return gain, loss


# ---------------------------------------------------------------------------------------------- steps


def start(trial: Trial) -> tuple[int, list[LocalAccount]]:
    """The buyer's one-unit order (3 replicas) matched, accepted and assigned on chain."""
    trial.market.post_order(rounds=1)
    unit, chosen = trial.market.match_and_accept()
    trial.market.send_outbox()
    return unit, chosen


def chain_order(market: ChainMarket, unit: int, chosen: list[LocalAccount]) -> list[LocalAccount]:
    """The unit's providers in the contract's replica order (the order outcomes are signed in)."""
    chain_unit = market.chain_unit(unit)
    by_address: dict[str, LocalAccount] = {p.address: p for p in chosen}
    return [by_address[market.client.replica(chain_unit, i).provider] for i in range(len(chosen))]


def settle(trial: Trial, unit: int) -> None:
    """Run the market until the unit is settled on chain: whenever a job is open, the verifiers that have
    not signed yet sign the true outcomes (:func:`truth`); time moves past each deadline the market
    waits on."""
    market = trial.market
    chain_unit = market.chain_unit(unit)
    for _ in range(12):
        market.tick()
        if market.open_job(unit) is not None:
            outcomes = truth(trial, unit)
            for verifier in market.verifiers:
                if market.open_job(unit) is None:
                    break
                market.sign_verdict(unit, verifier, outcomes)
            market.tick()
        info = market.client.get_unit(chain_unit)
        if info.state in SETTLED:
            market.tick()
            return
        now = market.client.now()
        deadline = min(
            (d for d in (info.commit_deadline, info.reveal_deadline, info.verdict_deadline) if d >= now),
            default=now,
        )
        market.client.advance_time(max(1, deadline - market.client.now() + 1))
    raise HarnessStepFailed(f"unit {unit} never settled: {market.client.get_unit(chain_unit)}")


def truth(trial: Trial, unit: int) -> list[int]:
    """What an honest verifier's re-execution finds, per replica in chain order: accept the true result,
    fraud for a wrong one, fault for a replica that never revealed."""
    chain_unit = trial.market.chain_unit(unit)
    outcomes = []
    for i in range(trial.market.client.get_unit(chain_unit).replicas):
        replica = trial.market.client.replica(chain_unit, i)
        wrong = replica.commitment_or_digest in trial.wrong
        outcomes.append(FAULT if not replica.revealed else FRAUD if wrong else ACCEPT)
    return outcomes


def commit_all(trial: Trial, unit: int, results: dict[str, Result], providers: list[LocalAccount]) -> None:
    for provider in providers:
        trial.market.commit(unit, provider, results[provider.address])
    trial.market.send_outbox()
    trial.market.send_held()  # the others' commits land even while a replica holds its own back


def reveal(trial: Trial, unit: int, results: dict[str, Result], providers: list[LocalAccount]) -> None:
    for provider in providers:
        trial.market.service.assignments.reveal(
            trial.market.reveal_submission(unit, provider, results[provider.address])
        )
    trial.market.send_outbox()
    trial.market.send_held()


def slashed(market: ChainMarket, account: str, bonded_before: int) -> bool:
    return market.client.stake_of(account).bonded < bonded_before


# --------------------------------------------------------------------------------------------- attacks


def reveal_withholding(trial: Trial) -> None:
    """One replica commits a wrong result, reads the honest reveals on chain and, seeing its digest
    differ, never reveals. Detected: it lost stake (the withhold penalty)."""
    unit, chosen = start(trial)
    cheater = chosen[-1]
    true, wrong = result(f"true-{trial.seed}"), trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong if p is cheater else true for p in chosen}
    trial.cheaters = {cheater.address}
    trial.work(chosen[:-1])
    bonded = trial.market.client.stake_of(cheater).bonded
    commit_all(trial, unit, results, chosen)
    reveal(trial, unit, results, chosen[:-1])
    chain_unit = trial.market.chain_unit(unit)
    on_chain = {trial.market.client.replica(chain_unit, i).commitment_or_digest.hex() for i in range(3)}
    if wrong.digest[2:] in on_chain:  # its digest matches the others: revealing would be paid
        reveal(trial, unit, results, [cheater])
    settle(trial, unit)
    trial.detected = slashed(trial.market, cheater.address, bonded)


def sybil_ring(trial: Trial) -> None:
    """One party runs all 3 replicas of the unit with fresh keys (operators are self-declared: finding 3)
    and reveals one wrong result. Its keys are on probation, so the chain drew the unit at assignment and
    verifiers decide it. (A ring whose every key first worked its probation honestly is drawn at the 5 %
    spot-check rate only: `veritrain bench economics` prices that career.) Detected: slashed (once the
    fraud verdict stood unappealed)."""
    unit, chosen = start(trial)
    wrong = trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong for p in chosen}
    trial.cheaters = {p.address for p in chosen}
    bonded = {p.address: trial.market.client.stake_of(p).bonded for p in chosen}
    commit_all(trial, unit, results, chosen)
    reveal(trial, unit, results, chosen)
    settle(trial, unit)
    let_the_verdict_stand(trial.market, unit)
    trial.detected = all(slashed(trial.market, a, b) for a, b in bonded.items())


def spot_check_timing(trial: Trial) -> None:
    """The ring of `sybil_ring`, whose last committer tries to reveal in the seed block itself (commit and
    reveal in one multicall: refused, RevealTooEarly), then simulates its reveal once the draw is fixed
    and withholds every replica when drawn (always, for fresh keys on probation). Detected: it lost
    stake."""
    market = trial.market
    unit, chosen = start(trial)
    wrong = trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong for p in chosen}
    trial.cheaters = {p.address for p in chosen}
    bonded = {p.address: market.client.stake_of(p).bonded for p in chosen}
    *first, last = chain_order(market, unit, chosen)
    commit_all(trial, unit, results, first)
    chain_unit = market.chain_unit(unit)
    deadline = market.client.now() + 3600
    commitment = market.client.commitment(wrong.digest, market.salt, last, chain_unit)
    signed = market.client.sign_unit_commit(last, chain_unit, commitment, deadline)
    reveals = [Reveal(p.address, word(wrong.digest), word(market.salt)) for p in chosen]
    same_block = [
        market.client.market_calldata("commitBatch", chain_unit, [signed.as_tuple()]),
        market.client.reveal_batch_calldata(chain_unit, reveals),
    ]
    try:
        market.client.multicall(same_block, sender=last)
    except Exception as refused:  # the contract's revert, surfaced as the client's typed error
        if "RevealTooEarly" not in f"{type(refused).__name__} {refused}":
            raise
        trial.refused += 1
    else:
        raise HarnessStepFailed("a reveal in the seed block was accepted: the draw can be timed")
    commit_all(trial, unit, results, [last])
    simulate = market.client.market.functions.revealBatch(chain_unit, [r.as_tuple() for r in reveals])
    if simulate.call({"from": last.address}, block_identifier="pending"):  # undrawn: it would finalize
        reveal(trial, unit, results, chosen)
    settle(trial, unit)
    let_the_verdict_stand(market, unit)
    trial.detected = all(slashed(market, a, b) for a, b in bonded.items())


def lazy_verifier(trial: Trial) -> None:
    """A verifier signs accept for every replica without re-executing, on a unit whose third replica
    cheats; the two honest verifiers settle it, and once the unit's appeal window passed unappealed (the
    verdict is then its truth) the market relays the lazy signature it collected to VerdictAppeals'
    `slashContradiction`. Detected: the lazy verifier was slashed."""
    market = trial.market
    unit, chosen = start(trial)
    lazy = market.verifiers[-1]
    true, wrong = result(f"true-{trial.seed}"), trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong if p is chosen[-1] else true for p in chosen}
    trial.cheaters, trial.bystanders = {lazy.address}, {chosen[-1].address}
    trial.work(chosen[:-1])
    bonded = market.client.stake_of(lazy).bonded
    commit_all(trial, unit, results, chosen)
    reveal(trial, unit, results, chosen)
    market.tick()
    market.sign_verdict(unit, lazy, [ACCEPT] * 3)
    settle(trial, unit)
    let_the_verdict_stand(market, unit)
    trial.detected = slashed(market, lazy.address, bonded)


def colluding_verifier_majority(trial: Trial) -> None:
    """Two of the unit's three verifiers collude with a cheating replica and sign accept for all; the
    honest verifier signs the truth first. The majority settles the unit; the honest minority appeals, a
    panel of referees drawn from the pool re-executes (scripted: they vote the truth) and overturns the
    verdict; VerdictAppeals slashes the accepted cheat, and the market, seeing `AppealDecided`, relays the
    colluders' own signatures. Detected: the cheat and both colluders were slashed."""
    market = trial.market
    unit, chosen = start(trial)
    cheat = chosen[-1]
    honest_verifier, colluders = market.verifiers[0], market.verifiers[1:]
    true, wrong = result(f"true-{trial.seed}"), trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong if p is cheat else true for p in chosen}
    trial.cheaters = {cheat.address, *(v.address for v in colluders)}
    trial.work(chosen[:-1])
    bonded = {a: market.client.stake_of(a).bonded for a in trial.cheaters}
    commit_all(trial, unit, results, chosen)
    reveal(trial, unit, results, chosen)
    market.tick()
    market.sign_verdict(unit, honest_verifier, truth(trial, unit))
    for colluder in colluders:
        if market.open_job(unit) is not None:
            market.sign_verdict(unit, colluder, [ACCEPT] * 3)
    settle(trial, unit)
    appeal_by_referees(trial, unit, honest_verifier)
    market.tick()  # sync applies AppealDecided and queues the colluders' signatures; the outbox relays them
    market.tick()
    trial.detected = all(slashed(market, a, b) for a, b in bonded.items())


def framing(
    trial: Trial, colluders: list[LocalAccount]
) -> tuple[int, list[LocalAccount], list[int], list[int], dict[str, int]]:
    """A unit whose last replica reveals a wrong result and the others the true one, framed by
    `colluders` (the cheaters; the cheating replica is a bystander). Returns the unit, its providers, the
    truth, the framing outcomes (fraud for the first honest replica too) and the colluders' bonded stake."""
    market = trial.market
    unit, chosen = start(trial)
    cheat = chosen[-1]
    true, wrong = result(f"true-{trial.seed}"), trial.wrong_result()
    results: dict[str, Result] = {p.address: wrong if p is cheat else true for p in chosen}
    trial.cheaters, trial.bystanders = {v.address for v in colluders}, {cheat.address}
    trial.work(chosen[:-1])
    bonded = {a: market.client.stake_of(a).bonded for a in trial.cheaters}
    commit_all(trial, unit, results, chosen)
    reveal(trial, unit, results, chosen)
    market.tick()
    found = truth(trial, unit)
    framed = [FRAUD if i == found.index(ACCEPT) else outcome for i, outcome in enumerate(found)]
    return unit, chosen, found, framed, bonded


def verifier_majority_framing(trial: Trial) -> None:
    """Two of the unit's three verifiers frame an honest replica: on a unit whose third replica cheats they
    sign fraud for it and for the first replica, whose result is correct (so the verdict still looks like a
    catch). The verdict holds both replicas it calls fraud (collateral locked, price in escrow, no slash,
    no bounty: JobMarket.settleHeld); the honest minority appeals, the panel (scripted, as in
    `colluding_verifier_majority`) overturns, and its resolution settles the held replicas by the truth:
    the framed replica is paid and keeps its stake, the cheat is slashed with the bounty to the referees.
    The market relays the colluders' signatures (`verifierSlash` each). Detected: both colluders were
    slashed."""
    market = trial.market
    honest_verifier, colluders = market.verifiers[0], market.verifiers[1:]
    unit, _, found, framed, bonded = framing(trial, colluders)
    market.sign_verdict(unit, honest_verifier, found)
    for colluder in colluders:
        if market.open_job(unit) is not None:
            market.sign_verdict(unit, colluder, framed)
    settle(trial, unit)
    appeal_by_referees(trial, unit, honest_verifier)
    market.tick()  # sync applies AppealDecided and queues the colluders' signatures; the outbox relays them
    market.tick()
    trial.detected = all(slashed(market, a, b) for a, b in bonded.items())


def unanimous_verifier_framing(trial: Trial) -> None:
    """Every verifier of the unit frames an honest replica, as in `verifier_majority_framing`, so no
    honest minority is left to appeal. The framed provider's own watch appeals (its agent's code,
    veritrain.chain.appeal_watch: it vouches for the result it revealed), draws the panel and, once the
    scripted panel voted the truth, resolves: the held replica is paid and keeps its stake; the market
    relays the colluders' signatures (`verifierSlash` each; the verdict needs two, the third verifier signs
    nothing). The provider's appeal costs it gas (ETH, apart), and its bond comes back. Detected: every
    colluder that signed was slashed."""
    market = trial.market
    # every verifier is in the ring; those whose signature the verdict did not need signed nothing
    unit, chosen, found, framed, bonded = framing(trial, market.verifiers)
    chain_unit = market.chain_unit(unit)
    target = framed.index(FRAUD)
    victim = next(p for p in chosen if p.address == market.client.replica(chain_unit, target).provider)
    watch = VerdictWatch(market.client, victim, trial.folder / "appeals.json")
    watch.revealed(chain_unit)
    signers = []
    for colluder in market.verifiers:
        if market.open_job(unit) is not None:
            market.sign_verdict(unit, colluder, framed)
            signers.append(colluder.address)
    settle(trial, unit)
    watch.tick()  # appeals
    watch.tick()  # draws the panel
    panel_votes(trial, unit, found)
    watch.tick()  # resolves: the held replicas are settled by the truth
    if watch.units:
        raise HarnessStepFailed(f"the framed provider's appeal of unit {unit} did not end: {watch.units}")
    market.tick()  # sync applies AppealDecided and queues the colluders' signatures; the outbox relays them
    market.tick()
    trial.detected = all(slashed(market, a, bonded[a]) for a in signers)


def appeal_by_referees(trial: Trial, unit: int, appellant: LocalAccount) -> None:
    """`appellant` appeals the unit's verdict; the panel drawn from the pool votes what re-execution finds
    (:func:`truth`) and the decision's stakes move. The verdict's outcomes come from its chain event."""
    market = trial.market
    client, chain_unit = market.client, market.chain_unit(unit)
    verdict = next(
        [int(o) for o in e.args["outcomes"]]
        for e in client.events()
        if e.name == "VerdictRecorded" and int(e.args["unitId"]) == chain_unit
    )
    client.appeal(chain_unit, appellant)
    client.draw_panel(chain_unit)
    client.resolve_appeal(chain_unit, verdict, panel_votes(trial, unit, truth(trial, unit)))


def panel_votes(trial: Trial, unit: int, found: list[int]) -> list[int]:
    """The drawn panel's seats vote `found` (what re-execution finds) until a majority decided; returns it."""
    client, chain_unit = trial.market.client, trial.market.chain_unit(unit)
    seated: dict[str, LocalAccount] = {r.address: r for r in trial.market.referees}
    deadline = client.now() + 3600
    for seat in client.get_appeal(chain_unit).panel:
        if client.get_appeal(chain_unit).decided != bytes(32):
            break
        client.vote(chain_unit, found, client.sign_referee_vote(seated[seat], chain_unit, found, deadline))
    return found


def let_the_verdict_stand(market: ChainMarket, unit: int) -> None:
    """Move chain time past the unit's appeal window, unappealed: its verdict becomes the truth, and the
    market relays what waited for it (the held fraud's settlement, contradicting verifiers' signatures)."""
    info = market.client.get_unit(market.chain_unit(unit))
    if info.state != UnitState.VERDICTED:
        return
    closes = info.verdict_deadline + market.client.deployment.appeal_params.appeal_window
    market.client.advance_time(max(1, closes - market.client.now() + 1))
    market.tick()  # the outbox relays the entries sync queued at the verdict
    market.tick()  # and sync applies what they did


def buyer_expire_griefing(trial: Trial) -> None:
    """The buyer calls `expireUnit` at every step of an honest unit, and once more the moment the verdict
    deadline passes, hoping to take back the escrow of work done. Detected: every attempt reverted."""
    market = trial.market
    unit, chosen = start(trial)
    true = result(f"true-{trial.seed}")
    results: dict[str, Result] = {p.address: true for p in chosen}
    trial.cheaters = {market.buyer.address}
    trial.work(chosen)
    chain_unit = market.chain_unit(unit)
    attempts = 0

    def grief() -> None:
        nonlocal attempts
        attempts += 1
        try:
            market.client.expire_unit(chain_unit, sender=market.buyer)
        except Exception as refused:
            if not any(e in str(refused) for e in ("UnitNotExpired", "UnitAlreadySettled")):
                raise
            trial.refused += 1

    grief()
    commit_all(trial, unit, results, chosen)
    grief()
    reveal(trial, unit, results, chosen)
    grief()
    settle(trial, unit)
    info = market.client.get_unit(chain_unit)
    market.client.advance_time(max(1, info.verdict_deadline - market.client.now() + 1))
    grief()
    market.tick()
    trial.detected = trial.refused == attempts


def event_sync_staller(trial: Trial) -> None:
    """A provider reveals its own replica straight on chain (around the market), so its reveal and
    `UnitFinalized` (by the market's batch of the others' reveals; the provider's own finalize is refused
    until the verdict deadline) arrive while the market still holds it as committed (finding 5). The
    market must reconcile and keep syncing; a stake made afterwards must reach the market. Detected: the
    market ended where the chain is, with its event cursor at the head."""
    market = trial.market
    unit, chosen = start(trial)
    staller, *others = chain_order(market, unit, chosen)
    true = result(f"true-{trial.seed}")
    results: dict[str, Result] = {p.address: true for p in chosen}
    trial.cheaters = {staller.address}
    trial.work(chosen)
    chain_unit = market.chain_unit(unit)
    commit_all(trial, unit, results, chosen)
    market.client.reveal(chain_unit, staller, true.digest, market.salt, sender=staller)
    reveal(trial, unit, results, others)
    on_chain = market.client.get_unit(chain_unit)
    if on_chain.state == UnitState.REVEALING and not on_chain.drawn:  # else the market's reveal batch did
        try:  # the fast path is the operator's until the verdict deadline
            market.client.finalize(chain_unit, sender=staller)
        except FinalizeReserved:
            trial.refused += 1
    late = market.providers[-1]
    market.client.approve(late, market.client.deployment.stake_manager, 10**18)
    market.client.stake(late, 10**18)
    settle(trial, unit)
    with market.store.transaction() as session:
        cursor = market.store.cursor(session).next_block
        free_stake = market.store.get_agent(session, late.address).free_stake
    settled_as = {UnitState.FINALIZED: "accepted", UnitState.VERDICTED: "accepted"}
    trial.detected = (
        market.unit(unit).state == settled_as.get(market.client.get_unit(chain_unit).state)
        and cursor == market.client.w3.eth.block_number + 1
        and free_stake == market.client.free_stake(late)
    )


FLOODERS, FLOOD_REQUESTS = 1, 16  # throwaway keys per trial, requests each


def blob_flood(trial: Trial) -> None:
    """Throwaway keys (no stake) flood an honest provider's blob server over libp2p while its unit is
    audited (the operator's `requestVerification`); the server's `PartyAccess` asks the chain for stake.
    Each assigned verifier then fetches the PoL blob itself and signs accept if it got it, fault ("PoL
    manifest unavailable") if not. The flooder holds nothing, so it can lose nothing in tokens: its gain
    is 0 by construction and its cost is bandwidth, not gas. Detected: every flood request refused and
    every verifier served."""
    from eth_account import Account

    from veritrain.blobstore import BlobStore
    from veritrain.errors import RequestDenied
    from veritrain.p2p import P2PNode, PartyAccess

    market = trial.market
    unit, chosen = start(trial)
    true = result(f"true-{trial.seed}")
    results: dict[str, Result] = {p.address: true for p in chosen}
    trial.work(chosen)
    blobs = BlobStore(trial.folder / "blobs")
    blob = random.Random(trial.seed).randbytes(64 * 1024)  # the PoL manifest the verifiers must fetch
    digest = blobs.put(blob)
    access = PartyAccess(lambda address: market.client.stake_of(address).bonded > 0)
    commit_all(trial, unit, results, chosen)
    market.client.request_verification(market.chain_unit(unit))
    reveal(trial, unit, results, chosen)
    market.tick()
    served: dict[str, bool] = {}
    denied = 0
    with P2PNode(chosen[0], store=blobs, authorize=access) as server:
        for _ in range(FLOODERS):
            with P2PNode(Account.create()) as flooder:
                for _ in range(FLOOD_REQUESTS):
                    try:
                        flooder.fetch(server.address, digest, timeout=20)
                    except RequestDenied:
                        denied += 1
        for verifier in market.verifiers:
            with P2PNode(verifier) as fetcher:
                try:
                    served[verifier.address] = fetcher.fetch(server.address, digest, timeout=20) == blob
                except RequestDenied:
                    served[verifier.address] = False
    for verifier in market.verifiers:
        if market.open_job(unit) is not None:
            market.sign_verdict(unit, verifier, [ACCEPT if served[verifier.address] else FAULT] * 3)
    settle(trial, unit)
    trial.detected = denied == FLOODERS * FLOOD_REQUESTS and all(served.values())


def verdict_replay(trial: Trial) -> None:
    """A provider keeps the verifiers' accept-all `Verdict` signatures of an audited unit it did honestly,
    then cheats on its next unit and relays those signatures to settle it before the verifiers look
    (refused: a Verdict signs its unit id), and the honest verifiers slash it. Detected: refused and
    slashed."""
    market = trial.market
    first, chosen = start(trial)
    true = result(f"true-{trial.seed}")
    results: dict[str, Result] = {p.address: true for p in chosen}
    commit_all(trial, first, results, chosen)
    market.client.request_verification(market.chain_unit(first))  # an operator audit
    reveal(trial, first, results, chosen)
    market.tick()
    kept = [market.sign_verdict(first, v, [ACCEPT] * 3) for v in market.verifiers[:2]]
    trial.work(chosen)
    settle(trial, first)

    second, chosen = start(trial)
    cheater = chain_order(market, second, chosen)[0]
    wrong = trial.wrong_result()
    results = {p.address: wrong if p is cheater else result(f"true2-{trial.seed}") for p in chosen}
    trial.cheaters = {cheater.address}
    trial.work(p for p in chosen if p is not cheater)
    bonded = market.client.stake_of(cheater).bonded
    commit_all(trial, second, results, chosen)
    reveal(trial, second, results, chosen)
    try:
        market.client.submit_verdict(market.chain_unit(second), [ACCEPT] * 3, kept, sender=cheater)
    except Exception as refused:
        if "InvalidSigner" not in f"{type(refused).__name__} {refused}":
            raise
        trial.refused += 1
    else:
        raise HarnessStepFailed("another unit's verdict signatures settled this unit")
    settle(trial, second)
    let_the_verdict_stand(market, second)
    trial.detected = trial.refused == 1 and slashed(market, cheater.address, bonded)


def canary_around_the_market(trial: Trial) -> None:
    """A provider past its probation works a canary unit alone (the operator's canary account replays the
    buyer's verified round-0 unit; k = 1 for a trusted provider) and reveals a wrong result straight on
    chain, around the market, then tries to finalize it: refused, the fast path is the operator's until the
    verdict deadline. The market's event sync sees the reveal, checks it against the canary's known answer
    and draws the unit (`requestVerification`); the verifiers re-execute (scripted: the truth) and the
    fraud verdict stands. Detected: the cheater was slashed."""
    market = trial.market
    market.post_order(rounds=1, adaptive_replication=True, trusted_streak=1)
    source, chosen = market.match_and_accept()
    market.send_outbox()
    true = result(f"true-{trial.seed}")
    results: dict[str, Result] = {p.address: true for p in chosen}
    trial.work(chosen)
    commit_all(trial, source, results, chosen)
    reveal(trial, source, results, chosen)
    settle(trial, source)
    market.service.orders.advance_orders()
    if market.service.canaries.run() != 1:
        raise HarnessStepFailed(f"unit {source} was verified but not replayed as a canary")
    unit, (cheater,) = market.match_and_accept()
    market.send_outbox()
    wrong = trial.wrong_result()
    trial.cheaters = {cheater.address}
    bonded = market.client.stake_of(cheater).bonded
    market.commit(unit, cheater, wrong)
    market.send_outbox()
    chain_unit = market.chain_unit(unit)
    if market.reveal_on_chain(unit, {cheater.address: wrong}, sender=cheater):
        raise HarnessStepFailed("a provider's own reveal finalized its canary unit unchecked")
    try:
        market.client.finalize(chain_unit, sender=cheater)
    except (FinalizeReserved, UnitUnderVerification):  # the chain's own spot check may have drawn it
        trial.refused += 1
    else:
        raise HarnessStepFailed("a provider finalized its canary unit before the verdict deadline")
    settle(trial, unit)
    let_the_verdict_stand(market, unit)
    market.service.orders.advance_orders()
    market.service.canaries.run()  # closes the ended canary order: its unspent escrow back to the account
    trial.detected = slashed(market, cheater.address, bonded)


ATTACKS: dict[str, Callable[[Trial], None]] = {
    "reveal_withholding": reveal_withholding,
    "sybil_ring": sybil_ring,
    "spot_check_timing": spot_check_timing,
    "lazy_verifier": lazy_verifier,
    "colluding_verifier_majority": colluding_verifier_majority,
    "verifier_majority_framing": verifier_majority_framing,
    "unanimous_verifier_framing": unanimous_verifier_framing,
    "buyer_expire_griefing": buyer_expire_griefing,
    "event_sync_staller": event_sync_staller,
    "blob_flood": blob_flood,
    "verdict_replay": verdict_replay,
    "canary_around_the_market": canary_around_the_market,
}
# attacks played in the world whose providers are past their probation (World.market(mature=True))
NEEDS_MATURE_PROVIDERS = frozenset({canary_around_the_market})


def run_benchmark(
    trials: int, attacks: list[str] | None = None, seed: int = 1, hardhat: bool = True
) -> dict[str, object]:
    """Every attack (or those named) ``trials`` times on one fresh deployment; the JSON document."""
    figures: dict[str, Figures] = {}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="veritrain-bench-protocol-"))
        if hardhat:
            backend: Backend = stack.enter_context(stack.enter_context(HardhatNode()).backend())
        else:
            backend = stack.enter_context(InProcessBackend())
        world = World(backend, Path(tmp))
        for name in attacks or list(ATTACKS):
            figures[name] = Figures()
            for trial in range(trials):
                world.play(ATTACKS[name], seed * 1_000_003 + trial, figures[name])
        params = world.client.params
        appeals = world.client.deployment.appeal_params
    return {
        "attacks": {name: vars(f) for name, f in figures.items()},
        # issue 8's targets: every trial costs the cheater (gain < 0) and no honest party loses
        "targets_missed": [
            name
            for name, f in figures.items()
            if f.worst_trial_gain is None or f.worst_trial_gain >= 0 or f.honest_loss != 0
        ],
        "trials_per_attack": trials,
        "units": "token base units (1 VERI = 10**18); gas apart, in wei of ETH",
        "chain": ("hardhat node" if hardhat else "in-process EVM (py-evm)")
        + " running the compiled contracts, default MarketParams and AppealParams",
        "params": {
            "spot_check_ppm": params.spot_check_ppm,
            "probation_streak": params.probation_streak,
            "slash_amount": params.slash_amount,
            "withhold_penalty": params.withhold_penalty,
            "verifier_collateral": params.verifier_collateral,
            "verifier_slash": appeals.verifier_slash,
            "appeal_bond": appeals.appeal_bond,
            "panel_size": appeals.panel_size,
            "verifiers_per_unit": 3,
            "quorum": 2,
        },
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine(),
    }


def machine() -> str:
    """The CPU model and core count (what docs/BENCHMARKS.md names a figure's machine by)."""
    model = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
            break
    return f"{model}, {os.cpu_count()} CPUs"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--trials", type=int, default=20, help="trials per attack (default 20)")
    parser.add_argument("--quick", action="store_true", help="2 trials per attack (CI)")
    parser.add_argument("--attack", action="append", choices=sorted(ATTACKS), help="only this attack")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--in-process", action="store_true", help="run on the in-process EVM (default: a `hardhat node`)"
    )


def run(args: argparse.Namespace) -> int:
    output = run_benchmark(2 if args.quick else args.trials, args.attack, args.seed, not args.in_process)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(output, indent=2) + "\n")
    print(json.dumps(output, indent=2))
    missed = output["targets_missed"]
    if missed:  # a measurement, not a failure: say it where nobody can miss it
        target = "gain < 0 in every trial, honest loss 0"
        print(f"bench protocol: target ({target}) missed by {missed}", file=sys.stderr)
    return 0
