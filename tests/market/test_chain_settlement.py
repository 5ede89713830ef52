"""The market service settling on the real contracts (in-process EVM) through `market.chain_adapter`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from apps.protocol_harness import ChainMarket, funded_accounts, result
from market.store import MarketStore
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import ChainClient, UnitState
from veritrain.chain.deployment import MarketParams
from veritrain.errors import OrderMismatch
from veritrain.messages import Heartbeat, OrderRequest, sign_message

pytestmark = pytest.mark.chain


@contextmanager
def chain_market(
    tmp_path: Path, params: MarketParams, providers: int, *, round_audits: bool = True
) -> Iterator[ChainMarket]:
    """A market on freshly deployed contracts with ``providers`` staked providers and 2 staked verifiers
    (``round_audits``: rosters open with them as their verifiers)."""
    with InProcessBackend() as backend:
        accounts = list(backend.dev_accounts(4 + providers))
        client = ChainClient.deploy(backend, accounts[0], params=params)
        funded_accounts(client, accounts)
        store = MarketStore(f"sqlite:///{tmp_path / 'market.sqlite3'}")
        store.create_schema()
        yield ChainMarket(
            client,
            store,
            accounts[1],
            accounts[2 : 2 + providers],
            accounts[2 + providers :],
            round_audits=round_audits,
        )
        store.dispose()


@pytest.fixture(params=[0])
def market(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChainMarket]:
    """A market on the contracts with the chain's spot-check rate `request.param` (ppm; 0: never drawn),
    4 staked providers and 2 staked verifiers."""
    rate = int(request.param)
    with chain_market(
        tmp_path,
        MarketParams(min_verifiers=1, spot_check_ppm=rate, solo_spot_check_ppm=rate, probation_streak=0),
        4,
    ) as m:
        yield m


def unanimous_unit(market: ChainMarket) -> tuple[int, int, list[LocalAccount]]:
    """One 3-replica unit whose replicas all committed and revealed one result through the market (the
    outbox relays them when drained); returns (order id, unit id, its providers). A spec that is not the
    chain order's is refused first."""
    order_id = market.post_order(rounds=1)
    with market.store.transaction() as session:
        chain_order = market.store.get_order(session, order_id).chain_order_id
    other_spec = market.order_spec(1).model_copy(update={"seed": 4})
    with pytest.raises(OrderMismatch, match="spec_hash"):  # the chain order escrows another spec
        market.service.orders.post_order(OrderRequest(spec=other_spec, chain_order_id=chain_order))
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()
    assert market.client.get_unit(market.chain_unit(unit_id)).state == UnitState.COMMITTING
    same = result("unanimous")
    for provider in chosen:
        market.commit(unit_id, provider, same)
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, same))
    return order_id, unit_id, chosen


def price_per_replica(market: ChainMarket, unit_id: int) -> int:
    return market.client.get_order(market.order_chain_id(market.unit(unit_id))).price_per_replica


def test_order_settles_on_the_contracts_and_pays_every_replica(market: ChainMarket) -> None:
    order_id, unit_id, chosen = unanimous_unit(market)
    service, client = market.service, market.client
    assert service.orders.order_status(order_id).units[0].state == "finalizing"
    market.send_outbox()
    assert service.outbox.pending_outbox() == []
    assert client.get_unit(market.chain_unit(unit_id)).state == UnitState.FINALIZED
    for provider in chosen:
        assert client.credits(provider) == price_per_replica(market, unit_id)
    assert service.sync.sync_chain_events() > 0
    assert service.outbox.pending_outbox() == []
    assert service.orders.advance_orders() == 1
    assert service.orders.order_status(order_id).state == "completed"
    # a heartbeat after settlement carries no more work for the providers
    beat = Heartbeat(agent=chosen[0].address, nonce=10**6, timestamp=market.now())
    assert service.agents.heartbeat(sign_message(beat, chosen[0].key, client.chain_id)).assignments == ()


@pytest.mark.parametrize("market", [1_000_000], indirect=True)
def test_a_unit_the_chain_draws_goes_to_verifiers_and_settles_by_verdict(market: ChainMarket) -> None:
    """Unanimous reveals, but the contract drew the unit at its first reveal: the market's finalize is
    refused, a verifier job opens, and the verdict pays every replica."""
    order_id, unit_id, chosen = unanimous_unit(market)
    service, client = market.service, market.client
    market.send_outbox()
    status = service.orders.order_status(order_id).units[0]
    chain_unit = market.chain_unit(unit_id)
    on_chain = client.get_unit(chain_unit)
    assert on_chain.drawn and on_chain.state == UnitState.REVEALING
    assert status.state == "verifying"
    with service.ctx.store.transaction() as session:
        job = service.ctx.store.job_for_unit(session, unit_id)
        assert job is not None and job.reason == "spot_check"
    unit_verifiers = client.verifiers_of(chain_unit)
    # a majority of the unit's assigned verifiers signs the same outcomes (their reasons differ)
    for index, address in enumerate(unit_verifiers[: len(unit_verifiers) // 2 + 1]):
        verifier = next(v for v in market.verifiers if v.address == address)
        market.sign_verdict(unit_id, verifier, [0, 0, 0], reasons_hash="0x" + f"{index + 1:02x}" * 32)
    market.send_outbox()
    assert client.get_unit(chain_unit).state == UnitState.VERDICTED
    for provider in chosen:
        assert client.credits(provider) == price_per_replica(market, unit_id)
    assert service.orders.order_status(order_id).units[0].state == "accepted"


def test_a_fraud_verdict_is_slashed_by_the_markets_relay_once_the_appeal_window_passed(
    market: ChainMarket,
) -> None:
    """Truth before money: the verdict that calls a replica fraud pays the honest ones and holds the cheat
    (collateral locked, stake whole, no bounty). The market's sync queues `settle_held`, its outbox waits
    without a transaction while the unit's appeal window is open, then relays settleVerdict: the cheat is
    slashed and the verdict's signers get the bounty; HeldSettled confirms the entry."""
    service, client = market.service, market.client
    market.post_order(rounds=1)
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # assign
    results = [result("honest"), result("honest"), result("cheat")]
    for provider, res in zip(chosen, results, strict=True):
        market.commit(unit_id, provider, res)
    for provider, res in zip(chosen, results, strict=True):
        service.assignments.reveal(market.reveal_submission(unit_id, provider, res))
    market.send_outbox()  # commits and reveals land; the unit waits for its verifiers
    chain_unit, cheat = market.chain_unit(unit_id), chosen[2]
    order = client.get_order(market.order_chain_id(market.unit(unit_id)))
    bonded = client.stake_of(cheat).bonded
    assigned = client.verifiers_of(chain_unit)
    signers = assigned[: len(assigned) // 2 + 1]
    by_address = {v.address: v for v in market.verifiers}
    verdict = [0, 0, 2]
    for address in signers:
        market.sign_verdict(unit_id, by_address[address], verdict)
    assert market.send_outbox() == ["sent"]  # the verdict
    held = client.stake_of(cheat)
    assert (held.bonded, held.locked) == (bonded, client.params.provider_collateral)
    fee_credits = {a: client.credits(a) for a in signers}
    buyer_credit = client.credits(order.buyer)

    service.sync.sync_chain_events()  # the chain's verdict: the held fraud's settlement is queued
    assert market.outbox_states(unit_id)["settle_held"] == "pending"
    operator = client.relayer
    assert operator is not None
    nonce = client.w3.eth.get_transaction_count(operator.address)
    assert market.send_outbox() == []  # TruthNotFixed by a free read: no transaction
    assert market.outbox_states(unit_id)["settle_held"] == "retrying"
    assert client.w3.eth.get_transaction_count(operator.address) == nonce
    assert market.unit(unit_id).state == "accepted"  # the unit does not wait: only the money does

    appeal_closes = (
        client.get_unit(chain_unit).verdict_deadline + client.deployment.appeal_params.appeal_window
    )
    client.advance_time(appeal_closes - client.now() + 1)
    assert market.send_outbox() == ["sent"]
    slash = client.params.slash_amount
    settled = client.stake_of(cheat)
    assert (settled.bonded, settled.locked) == (bonded - slash, 0)
    assert client.reputation(cheat).fraud == 1
    bounty_share = slash * client.params.bounty_bps // 10_000 // len(signers)
    assert {a: client.credits(a) - fee_credits[a] for a in signers} == {a: bounty_share for a in signers}
    refund_and_slash = order.price_per_replica + slash - bounty_share * len(signers)
    assert client.credits(order.buyer) == buyer_credit + refund_and_slash
    service.sync.sync_chain_events()
    assert market.outbox_states(unit_id)["settle_held"] == "confirmed"
    with market.store.transaction() as session:  # matching sees the slashed stake and the fraud
        agent = market.store.get_agent(session, cheat.address)
        assert (agent.bonded_stake, agent.free_stake, agent.rep_fraud) == (bonded - slash, bonded - slash, 1)
    assert market.send_outbox() == []  # settled once


# --- batched settlement (issue 9): the outbox relays a unit's commits and reveals one batch each ---------


def transactions(market: ChainMarket, chain_unit: int, *names: str) -> set[str]:
    """The transactions that emitted the unit's events called ``names``."""
    return {
        e.tx_hash for e in market.client.events() if e.name in names and e.args.get("unitId") == chain_unit
    }


def outbox_of(market: ChainMarket, unit_id: int) -> dict[str, tuple[str, str | None]]:
    """Each of the unit's intents: (state, transaction hash)."""
    with market.store.transaction() as session:
        rows = market.store.outbox_in(session, ["sent", "confirmed", "pending", "retrying", "reverted"], 1000)
        return {r.action: (r.state, r.tx_hash) for r in rows if r.unit_id == unit_id}


def test_a_units_commits_and_reveals_land_in_one_transaction_each(market: ChainMarket) -> None:
    """Three replicas, three transactions in all: assign, one commitBatch, one revealBatch that also
    finalizes (the single-message path took eight: assign, 3 commits, 3 reveals, finalize)."""
    _, unit_id, chosen = unanimous_unit(market)
    operator = market.client.relayer
    assert operator is not None
    sent_before = market.client.w3.eth.get_transaction_count(operator.address)
    market.send_outbox()
    assert market.client.w3.eth.get_transaction_count(operator.address) == sent_before + 2
    chain_unit = market.chain_unit(unit_id)
    assert market.client.get_unit(chain_unit).state == UnitState.FINALIZED
    assert len(transactions(market, chain_unit, "ReplicaCommitted")) == 1
    (reveal_tx,) = transactions(market, chain_unit, "ReplicaRevealed", "UnitFinalized")
    intents = outbox_of(market, unit_id)
    assert intents["finalize"] == ("sent", reveal_tx)  # done by the reveal batch, never sent itself
    assert {intents[f"reveal:{p.address}"] for p in chosen} == {("sent", reveal_tx)}


def test_a_replica_that_never_commits_does_not_hold_the_others_past_their_deadline(
    market: ChainMarket,
) -> None:
    """Two replicas commit, the third stays silent: the market holds their commits for it, then sends them
    in one batch well before the commit deadline; after it their reveals go out together at once."""
    market.post_order(rounds=1)
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()
    chain_unit = market.chain_unit(unit_id)
    working = chosen[:2]  # the third stays silent
    honest = result("honest")
    signed_at = market.client.now()
    for provider in working:  # signed for 600 s as node agents do, in a 3600 s commit window
        market.commit(unit_id, provider, honest, ttl_s=600)
    assert market.send_outbox() == []  # held for the third replica
    assert transactions(market, chain_unit, "ReplicaCommitted") == set()
    market.send_held()  # time passes until the market stops waiting
    commit_deadline = market.client.get_unit(chain_unit).commit_deadline
    assert market.client.now() < min(commit_deadline, signed_at + 600)  # both signatures still valid
    assert len(transactions(market, chain_unit, "ReplicaCommitted")) == 1
    assert market.client.get_unit(chain_unit).state == UnitState.COMMITTING

    market.client.advance_time(commit_deadline - market.client.now() + 1)
    market.tick()  # the market closes the commit phase: the two committed replicas reveal
    for provider in working:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
    assert market.send_outbox() == ["sent"]  # not held: the silent replica has nothing to reveal
    (reveal_tx,) = transactions(market, chain_unit, "ReplicaRevealed")
    assert sum(1 for e in market.client.events() if e.tx_hash == reveal_tx) == 2
    on_chain = market.client.get_unit(chain_unit)  # open, for verifiers to decide (fault for the third)
    assert on_chain.revealed_mask == 0b011 and on_chain.state == UnitState.COMMITTING


def test_a_batch_sent_again_or_refused_for_one_replica_moves_nothing_twice(market: ChainMarket) -> None:
    """A provider commits straight on chain while the market holds its form: the market's batch is refused
    for that replica alone and the others land in one batch. A worker that crashed after sending retries
    the batch: refused, and the chain events confirm every intent; nothing lands twice."""
    market.post_order(rounds=1)
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()
    chain_unit = market.chain_unit(unit_id)
    honest = result("honest")
    for provider in chosen:
        market.commit(unit_id, provider, honest)
    early = chosen[0]
    commitment = market.client.commitment(honest.digest, market.salt, early, chain_unit)
    signed = market.client.sign_unit_commit(early, chain_unit, commitment, market.client.now() + 3600)
    market.client.commit_batch(chain_unit, [signed], relayer=early)
    market.send_outbox()
    intents = outbox_of(market, unit_id)
    assert intents[f"commit:{early.address}"][0] == "retrying"
    batch = {intents[f"commit:{p.address}"] for p in chosen[1:]}
    assert len(batch) == 1 and next(iter(batch))[0] == "sent"
    assert len(transactions(market, chain_unit, "ReplicaCommitted")) == 2  # its own, then the market's
    with market.store.transaction() as session:  # the crash: sent, never recorded
        for entry in market.store.outbox_of_kind(session, unit_id, "commit"):
            entry.state, entry.next_attempt_at = "pending", 0
            session.add(entry)
    market.send_outbox()
    market.service.sync.sync_chain_events()
    assert {state for action, (state, _) in outbox_of(market, unit_id).items() if "commit" in action} == {
        "confirmed"
    }
    assert sum(1 for e in market.client.events() if e.name == "ReplicaCommitted") == 3
    for provider in chosen:
        market.service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
    market.tick()
    assert market.client.get_unit(chain_unit).state == UnitState.FINALIZED
    assert market.unit(unit_id).state == "accepted"


# --- adaptive replication (issue 9): k = 3 for newcomers, k = 1 past the streak, solo units audited ------


@pytest.fixture
def adaptive_market(tmp_path: Path) -> Iterator[ChainMarket]:
    """3 staked providers and 2 verifiers, where the chain draws every unit of one replica for a spot
    check and no unit of more."""
    params = MarketParams(
        min_verifiers=1, spot_check_ppm=0, solo_spot_check_ppm=1_000_000, probation_streak=0
    )
    with chain_market(tmp_path, params, 3) as market:
        yield market


def test_an_adaptive_order_gives_newcomers_three_replicas_and_a_trusted_provider_one_audited(
    adaptive_market: ChainMarket,
) -> None:
    market, client = adaptive_market, adaptive_market.client
    service = market.service
    order_id = market.post_order(rounds=2, adaptive_replication=True, trusted_streak=1)
    chain_order = client.get_order(market.order_chain_id(market.unit(1)))
    assert (chain_order.min_replicas, chain_order.replicas, chain_order.trusted_streak) == (1, 3, 1)
    price, fee = chain_order.price_per_replica, chain_order.verifier_fee_per_unit

    # round 0: three newcomers (no valid unit on chain yet) share the unit, which finalizes unanimously
    unit_id, chosen = market.match_and_accept()
    assert len(chosen) == 3 and market.unit(unit_id).k == 3
    market.send_outbox()
    for provider in chosen:
        market.commit(unit_id, provider, result("round-0"))
    for provider in chosen:
        service.assignments.reveal(market.reveal_submission(unit_id, provider, result("round-0")))
    market.send_outbox()
    assert client.get_unit(market.chain_unit(unit_id)).state == UnitState.FINALIZED
    service.sync.sync_chain_events()  # the finalize's reputations reach the candidate pool
    assert service.orders.advance_orders() == 1

    # round 1: every provider is past the order's streak of 1, so the first drawn works alone
    solo_id, (solo,) = market.match_and_accept()
    assert market.unit(solo_id).k == 1
    market.send_outbox()
    chain_unit = market.chain_unit(solo_id)
    assert client.get_unit(chain_unit).replicas == 1
    market.commit(solo_id, solo, result("round-1"))
    service.assignments.reveal(market.reveal_submission(solo_id, solo, result("round-1")))
    market.send_outbox()
    on_chain = client.get_unit(chain_unit)
    assert on_chain.drawn and on_chain.state == UnitState.REVEALING  # the solo audit, drawn by the chain
    assert market.open_job(solo_id) is not None
    assigned = client.verifiers_of(chain_unit)
    for address in assigned[: len(assigned) // 2 + 1]:
        market.sign_verdict(solo_id, next(v for v in market.verifiers if v.address == address), [0])
    market.send_outbox()
    assert client.get_unit(chain_unit).state == UnitState.VERDICTED
    assert client.credits(solo.address) == 2 * price
    # the solo unit reserved one replica: what the other two would have cost stays with the buyer
    assert client.get_order(chain_order.order_id).balance == 2 * price + fee
    service.sync.sync_chain_events()
    assert service.orders.advance_orders() == 1
    assert service.orders.order_status(order_id).state == "completed"


def test_a_reduced_unit_the_chain_refuses_runs_again_with_the_chains_reputations(
    adaptive_market: ChainMarket,
) -> None:
    """The pool believes the providers are past the order's streak (a stale read: a fault since): the
    chain refuses each solo assign (ProviderNotTrusted), the unit fails off chain without blaming anyone,
    the pool re-reads that provider from the chain, and within one attempt per provider a unit of three
    replicas lands."""
    market, service = adaptive_market, adaptive_market.service
    market.post_order(rounds=1, adaptive_replication=True, trusted_streak=3)
    with market.store.transaction() as session:
        for provider in market.providers:
            agent = market.store.get_agent(session, provider.address)
            agent.rep_valid = agent.rep_consecutive_valid = 3
            session.add(agent)
    service.matching.refresh_pool(force=True)
    refused: list[str] = []
    unit_id, chosen = market.match_and_accept()
    while len(chosen) == 1:
        market.send_outbox()
        assert market.unit(unit_id).state == "failed" and market.unit(unit_id).chain_unit_id is None
        with market.store.transaction() as session:
            (assign,) = [
                r for r in market.store.outbox_in(session, ["reverted"], 1000) if r.unit_id == unit_id
            ]
            assert "ProviderNotTrusted" in (assign.last_error or "")
            assert market.store.get_agent(session, chosen[0].address).rep_consecutive_valid == 0
        assert chosen[0].address not in refused
        refused.append(chosen[0].address)
        service.orders.advance_orders()
        unit_id, chosen = market.match_and_accept()
    assert len(chosen) == 3 and len(refused) >= 1
    market.send_outbox()
    assert market.client.get_unit(market.chain_unit(unit_id)).replicas == 3


def test_a_unit_whose_commits_never_landed_is_expired_although_the_market_saw_it_revealed(
    market: ChainMarket,
) -> None:
    """Found by the 200-run chaos bench (seed 118: the worker killed, then Redis, then the worker deaf,
    for the whole 40 s commit window): the replicas' signed commits and reveals reached the market but
    never the chain, so the market moved the unit to finalizing and every finalize was refused
    (RevealsIncomplete); nothing expired the unit and the order's escrow and collateral stayed locked. Past
    the verdict deadline the market expires it on chain, the unit fails and its round runs again."""
    client, service = market.client, market.service
    market.post_order(rounds=1)
    unit_id, chosen = market.match_and_accept()
    market.send_outbox()  # the assign lands; then the worker is gone
    chain_unit = market.chain_unit(unit_id)
    honest = result("honest")
    for provider in chosen:
        market.commit(unit_id, provider, honest)
    client.advance_time(client.get_unit(chain_unit).commit_deadline - client.now() + 1)
    market.tick()  # back: the commits are refused (CommitWindowClosed), the commit phase is over
    for provider in chosen:
        service.assignments.reveal(market.reveal_submission(unit_id, provider, honest))
    market.tick()
    assert market.unit(unit_id).state == "finalizing"
    assert (
        client.get_unit(chain_unit).state == UnitState.COMMITTING
        and client.get_unit(chain_unit).committed_mask == 0
    )

    client.advance_time(client.get_unit(chain_unit).verdict_deadline - client.now() + 1)
    market.tick()
    market.tick()
    assert client.get_unit(chain_unit).state == UnitState.EXPIRED
    assert market.unit(unit_id).state == "failed"
    assert service.orders.advance_orders() == 1
    retry_id, _ = market.match_and_accept()
    assert retry_id != unit_id and market.unit(retry_id).round_index == market.unit(unit_id).round_index
