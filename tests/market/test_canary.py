"""Canary units (issue 9 item 2): the domain rules, and the market replaying a verified unit on the real
contracts (in-process EVM), where a wrong answer is sent to the verifiers and a right one settles as usual."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from earned import earned
from eth_account.signers.local import LocalAccount
from sqlmodel import select

from apps.protocol_harness import ChainMarket, Result, funded_accounts, result
from market.canary import CANARY_CLAIM_S
from market.chain_adapter import ChainCanaryAccount
from market.domain.canary import Replay, canary_spec, differs_from_known, replay_of, replayable
from market.domain.pricing import EscrowPlan
from market.store import CanaryRow, MarketStore
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import ChainClient, UnitState
from veritrain.chain.deployment import MarketParams
from veritrain.chain.errors import FinalizeReserved, UnitUnderVerification
from veritrain.errors import InvalidInput
from veritrain.messages import CANARY_REASON, OrderSpec, ReplicaOutcome, UnitKind

SPEC = OrderSpec(
    buyer="0x" + "11" * 20,
    recipe="digits-mlp",
    dataset_digest="0x" + "cd" * 32,
    total_steps=30,
    unit_steps=10,
    replicas=3,
    adaptive_replication=True,
    trusted_streak=1,
    seed=3,
    max_price_per_pflop=10**18,
    deadline=2_000_000_000,
)
DIGEST = "0x" + "ab" * 32


# --- domain rules -----------------------------------------------------------------------------------------


def test_only_a_round_0_training_unit_of_one_shard_with_one_accepted_result_is_replayable() -> None:
    assert replayable(SPEC, UnitKind.TRAIN, 0, [DIGEST, DIGEST.upper()], 7).result_digest == DIGEST  # type: ignore[union-attr]
    assert replayable(SPEC, UnitKind.TRAIN, 1, [DIGEST], 7) is None  # its start state would need custody
    assert replayable(SPEC, UnitKind.AGGREGATE, 0, [DIGEST], 7) is None
    sharded = SPEC.model_copy(update={"shards": 2})
    assert replayable(sharded, UnitKind.TRAIN, 0, [DIGEST], 7) is None
    assert replayable(SPEC, UnitKind.TRAIN, 0, [DIGEST, "0x" + "cd" * 32], 7) is None  # no single answer
    assert replayable(SPEC, UnitKind.TRAIN, 0, [], 7) is None


def test_a_canary_spec_asks_for_the_source_units_work_under_the_canary_buyer() -> None:
    replay = canary_spec(SPEC, "0x" + "22" * 20, 1_900_000_000)
    assert replay.rounds == 1 and replay.buyer == "0x" + "22" * 20 and replay.deadline == 1_900_000_000
    same = (
        "recipe",
        "dataset_digest",
        "unit_steps",
        "seed",
        "replicas",
        "adaptive_replication",
        "trusted_streak",
    )
    assert all(getattr(replay, name) == getattr(SPEC, name) for name in same)
    assert replay.checkpoint_every_for(10) == SPEC.checkpoint_every_for(10)
    assert replay.spec_hash() != SPEC.spec_hash()


def test_the_canary_draw_follows_the_rate_and_refuses_rates_out_of_range() -> None:
    assert replay_of(0, 0, 0) == Replay.NONE
    assert replay_of(1_000_000, 0, 999_999) == Replay.CANARY
    assert replay_of(50_000, 0, 49_999) == Replay.CANARY and replay_of(50_000, 0, 50_000) == Replay.NONE
    with pytest.raises(InvalidInput):
        replay_of(1_000_001, 0, 0)
    with pytest.raises(InvalidInput):
        replay_of(50_000, 0, 1_000_000)


def test_a_reveal_differs_from_the_known_answer_whatever_its_case() -> None:
    assert not differs_from_known(DIGEST, DIGEST.upper().replace("0X", "0x"))
    assert differs_from_known(DIGEST, "0x" + "cd" * 32)


# --- the market on the contracts ----------------------------------------------------------------------------


@contextmanager
def canary_chain(
    tmp_path: Path, accounts: int
) -> Iterator[tuple[ChainClient, list[LocalAccount], MarketStore]]:
    """A deployment where the chain draws no spot check (only the market's known answer can audit a solo
    unit), ``accounts`` dev accounts: the deployer, the buyer, staked parties, and last the canary account
    (funded, unstaked); and a fresh market store."""
    params = MarketParams(min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=0, probation_streak=0)
    with InProcessBackend() as backend:
        parties = list(backend.dev_accounts(accounts))
        client = ChainClient.deploy(backend, parties[0], params=params)
        funded_accounts(client, parties[:-1])
        client.mint(parties[-1], 1_000 * 10**18)
        store = MarketStore(f"sqlite:///{tmp_path / 'market.sqlite3'}")
        store.create_schema()
        try:
            yield client, parties, store
        finally:
            store.dispose()


@pytest.fixture
def canary_market(tmp_path: Path) -> Iterator[tuple[ChainMarket, LocalAccount]]:
    """3 staked providers, 2 verifiers and a funded canary account replaying every verified unit."""
    with canary_chain(tmp_path, 8) as (client, accounts, store):
        canary = accounts[7]
        market = ChainMarket(client, store, accounts[1], accounts[2:5], accounts[5:7])
        market.service.config = replace(market.service.config, canary_rate_ppm=1_000_000)
        market.service.canaries.account = ChainCanaryAccount(client, canary)
        yield market, canary


def verified_round_0(market: ChainMarket, rounds: int = 1, *, adaptive: bool = True) -> Result:
    """A buyer's order (`auto`, or k = 3 fixed) whose round-0 unit three providers (newcomers, for `auto`)
    finalize unanimously; its result."""
    if adaptive:
        market.post_order(rounds=rounds, adaptive_replication=True, trusted_streak=1)
    else:
        market.post_order(rounds=rounds)
    unit_id, chosen = market.match_and_accept()
    assert len(chosen) == 3
    market.send_outbox()
    answer = result("round-0")
    for provider in chosen:
        market.commit(unit_id, provider, answer)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, answer))
    market.send_outbox()
    market.service.sync.sync_chain_events()  # the providers' streaks reach the candidate pool
    market.service.orders.advance_orders()
    return answer


def _solo_canary_unit(market: ChainMarket, canary: LocalAccount) -> tuple[int, LocalAccount]:
    """The canary order the market posts for the verified unit, matched to one trusted provider."""
    assert market.service.canaries.run() == 1
    with market.store.transaction() as session:
        (row,) = market.store.canaries_in(session, ["registered"])
        order = market.store.get_order(session, row.order_id or 0)
    assert (
        order.buyer == canary.address
        and market.client.get_order(order.chain_order_id).buyer == canary.address
    )
    unit_id, (solo,) = market.match_and_accept()
    assert market.unit(unit_id).order_id == order.id and market.unit(unit_id).k == 1
    market.send_outbox()
    return unit_id, solo


def _forged_canary_commit(market: ChainMarket, canary: LocalAccount) -> tuple[int, LocalAccount, Result]:
    """A solo canary unit after a verified round 0, whose provider committed a forged result (unrevealed)."""
    verified_round_0(market)
    unit_id, cheater = _solo_canary_unit(market, canary)
    forged = result("forged")
    market.commit(unit_id, cheater, forged)
    return unit_id, cheater, forged


def _majority_signs_fraud(market: ChainMarket, unit_id: int) -> None:
    """A majority of the unit's assigned verifiers sign fraud for its one replica."""
    assigned = market.client.verifiers_of(market.chain_unit(unit_id))
    for address in assigned[: len(assigned) // 2 + 1]:
        verifier = next(v for v in market.verifiers if v.address == address)
        market.sign_verdict(unit_id, verifier, [int(ReplicaOutcome.FRAUD)])


@pytest.mark.chain
def test_a_wrong_canary_result_is_sent_to_the_verifiers_and_slashed_as_fraud(
    canary_market: tuple[ChainMarket, LocalAccount],
) -> None:
    market, canary = canary_market
    client = market.client
    unit_id, cheater, forged = _forged_canary_commit(market, canary)
    market.service.assignments.reveal(market.reveal_submission(unit_id, cheater, forged))
    assert list(market.outbox_states(unit_id)).index("verify") < list(market.outbox_states(unit_id)).index(
        f"reveal:{cheater.address}"
    )
    market.send_outbox()
    chain_unit = market.chain_unit(unit_id)
    on_chain = client.get_unit(chain_unit)
    assert on_chain.drawn and on_chain.state == UnitState.REVEALING  # not finalized by its lone reveal
    assert market.unit(unit_id).state == "verifying" and market.open_job(unit_id) is not None
    with market.store.transaction() as session:  # the verifiers re-execute a missed canary in full
        assert market.store.get_job(session, market.open_job(unit_id) or 0).reason == CANARY_REASON
    bonded = client.stake_of(cheater.address).bonded
    _majority_signs_fraud(market, unit_id)
    market.send_outbox()
    assert client.get_unit(chain_unit).state == UnitState.VERDICTED
    assert client.stake_of(cheater.address).bonded == bonded  # held until the verdict stands
    market.service.sync.sync_chain_events()
    assert market.replica_states(unit_id) == ["fraud"]
    appeal_closes = (
        client.get_unit(chain_unit).verdict_deadline + client.deployment.appeal_params.appeal_window
    )
    client.advance_time(appeal_closes - client.now() + 1)
    assert market.send_outbox() == ["sent"]  # the market's settle_held: unappealed, the cheat is slashed
    assert client.stake_of(cheater.address).bonded < bonded
    assert client.reputation(cheater.address).fraud == 1


@pytest.mark.chain
def test_a_wrong_canary_result_revealed_around_the_market_is_checked_and_sent_to_the_verifiers(
    canary_market: tuple[ChainMarket, LocalAccount],
) -> None:
    """The canary's provider reveals its forged result straight on chain, around the market's known-answer
    check. Its reveal cannot finalize the unit (only the operator's relay does, until the verdict deadline),
    nor can its own finalize; the market's sync sees the reveal, finds it is not the known answer and draws
    the unit for its verifiers, whose verdict settles it."""
    market, canary = canary_market
    client = market.client
    unit_id, cheater, forged = _forged_canary_commit(market, canary)
    market.send_outbox()  # the commit lands
    chain_unit = market.chain_unit(unit_id)
    assert not market.reveal_on_chain(unit_id, {cheater.address: forged}, sender=cheater)
    with pytest.raises(FinalizeReserved):
        client.finalize(chain_unit, sender=cheater)
    assert client.get_unit(chain_unit).state == UnitState.REVEALING
    market.service.sync.sync_chain_events()
    assert market.unit(unit_id).state == "verifying" and market.open_job(unit_id) is not None
    with market.store.transaction() as session:
        assert market.store.get_job(session, market.open_job(unit_id) or 0).reason == CANARY_REASON
    assert market.send_outbox() == ["sent"]  # requestVerification
    assert client.get_unit(chain_unit).drawn
    with pytest.raises(UnitUnderVerification):  # drawn: no finalize, even past the verdict deadline
        client.finalize(chain_unit, sender=cheater)
    _majority_signs_fraud(market, unit_id)
    market.send_outbox()
    assert client.get_unit(chain_unit).state == UnitState.VERDICTED
    market.service.sync.sync_chain_events()
    assert market.replica_states(unit_id) == ["fraud"]


@pytest.mark.chain
def test_a_right_canary_result_settles_on_the_fast_path_without_verifiers(
    canary_market: tuple[ChainMarket, LocalAccount],
) -> None:
    market, canary = canary_market
    answer = verified_round_0(market)
    unit_id, honest = _solo_canary_unit(market, canary)
    posted = earned(market.client, canary.address)  # its escrow spent: the close pays the rest back
    market.commit(unit_id, honest, answer)
    market.service.assignments.reveal(market.reveal_submission(unit_id, honest, answer))
    market.send_outbox()
    on_chain = market.client.get_unit(market.chain_unit(unit_id))
    assert on_chain.state == UnitState.FINALIZED and not on_chain.drawn
    assert "verify" not in market.outbox_states(unit_id) and market.open_job(unit_id) is None
    assert market.unit(unit_id).state == "accepted"
    market.service.sync.sync_chain_events()
    market.service.orders.advance_orders()  # the canary order completes ...
    assert market.service.canaries.run() == 0  # ... a canary's own verified unit is never drawn ...
    with market.store.transaction() as session:
        rows = session.exec(select(CanaryRow)).all()
    assert [(r.drawn_unit_id, r.state) for r in rows] == [(1, "closed")]
    # ... and its account closes it: the close pays the canary account back the two replicas the solo unit
    # did not need and the unused verifier fee
    order = market.client.get_order(rows[0].chain_order_id or 0)
    assert order.closed and order.balance == 0
    refund = 2 * order.price_per_replica + order.verifier_fee_per_unit
    assert earned(market.client, canary.address) - posted == refund


class CrashAfterPost:
    """A canary account whose post lands on chain but whose answer is lost, once (the RPC connection
    dropped, or the worker died before recording it)."""

    def __init__(self, inner: ChainCanaryAccount) -> None:
        self.inner = inner
        self.address = inner.address
        self.crashed = False

    def posted_order(self, spec_hash: str) -> int | None:
        return self.inner.posted_order(spec_hash)

    def post_order(self, spec_hash: str, plan: EscrowPlan, deadline: int) -> int:
        order_id = self.inner.post_order(spec_hash, plan, deadline)
        if not self.crashed:
            self.crashed = True
            raise ConnectionError("the connection died before the answer came back")
        return order_id


@pytest.mark.chain
def test_a_canary_post_that_crashed_after_landing_is_found_on_chain_not_posted_again(
    canary_market: tuple[ChainMarket, LocalAccount],
) -> None:
    market, canary = canary_market
    verified_round_0(market)
    account = CrashAfterPost(ChainCanaryAccount(market.client, canary))
    market.service.canaries.account = account
    assert market.service.canaries.run() == 0 and account.crashed
    with market.store.transaction() as session:
        (row,) = market.store.canaries_in(session, ["planned"])
        assert row.chain_order_id is None and "died" in (row.last_error or "")
    assert market.service.canaries.run() == 0  # a failed post waits before it is tried again
    market.offset += CANARY_CLAIM_S
    assert market.service.canaries.run() == 1
    posted = [
        e for e in market.client.events() if e.name == "OrderPosted" and e.args["buyer"] == canary.address
    ]
    assert len(posted) == 1
    with market.store.transaction() as session:
        rows = session.exec(select(CanaryRow)).all()
    assert [(r.state, r.chain_order_id) for r in rows] == [("registered", int(posted[0].args["orderId"]))]


@pytest.mark.chain
def test_every_verified_unit_is_drawn_once_and_replays_its_orders_round_0_unit(
    canary_market: tuple[ChainMarket, LocalAccount],
) -> None:
    """At the rate of 1: round 1 (worked alone, its start state in nobody's custody here) is drawn too, and
    its canary replays round 0, whose answer is known (a second order of its own, so a distinct spec)."""
    market, _ = canary_market
    service = market.service
    answer = verified_round_0(market, rounds=2)
    unit_id, (solo,) = market.match_and_accept()
    market.send_outbox()
    market.commit(unit_id, solo, result("round-1"))
    service.assignments.reveal(market.reveal_submission(unit_id, solo, result("round-1")))
    market.send_outbox()
    service.sync.sync_chain_events()
    service.orders.advance_orders()
    assert service.canaries.run() == 2
    with market.store.transaction() as session:
        rows = session.exec(select(CanaryRow)).all()
    assert [(r.drawn_unit_id, r.source_unit_id, r.state) for r in rows] == [
        (1, 1, "registered"),
        (unit_id, 1, "registered"),
    ]
    assert {r.known_result_digest for r in rows} == {answer.digest}
