"""The market service settling on the real contracts (in-process EVM) through `market.chain_adapter`."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(params=[0])
def market(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChainMarket]:
    """A market on the contracts with the chain's spot-check rate `request.param` (ppm; 0: never drawn),
    4 staked providers and 2 staked verifiers."""
    rate = int(request.param)
    params = MarketParams(min_verifiers=1, spot_check_ppm=rate, solo_spot_check_ppm=rate)
    with InProcessBackend() as backend:
        accounts = list(backend.dev_accounts(8))
        client = ChainClient.deploy(backend, accounts[0], params=params)
        funded_accounts(client, accounts)
        store = MarketStore(f"sqlite:///{tmp_path / 'market.sqlite3'}")
        store.create_schema()
        yield ChainMarket(client, store, accounts[1], accounts[2:6], accounts[6:8])
        store.dispose()


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
