"""Planted cheats, the verifiers' canaries (issue 9 item 2): the domain rules, and the market routing a
planted replay to the operator's plant on the real contracts (in-process EVM), where a verifier that
accepted the unanimous forgery without re-executing it is slashed once the verdict stands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from agents import CHAIN_ID, T0, AgentKey
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from fastapi.testclient import TestClient

from apps.protocol_harness import ChainMarket, result
from market.api import create_app
from market.chain_adapter import ChainCanaryAccount
from market.domain.canary import Replay, canary_spec, replay_of
from market.domain.matching import DeclineReason, ProviderCandidate, match_plant
from market.domain.replication import Reputation
from market.runtime import plant_agents
from market.service import MarketService
from tests.market.test_canary import SPEC, canary_chain, verified_round_0
from tests.market.test_domain import demand as unit_demand
from veritrain.chain.client import UnitState
from veritrain.errors import ConfigError, InvalidInput
from veritrain.messages import AgentRole, PlantEnrollment, ReplicaOutcome, sign_message

ACCEPT, FRAUD = int(ReplicaOutcome.ACCEPT), int(ReplicaOutcome.FRAUD)

# --- domain rules -----------------------------------------------------------------------------------------


def test_one_roll_plants_below_the_plant_rate_then_draws_canaries_and_refuses_rates_out_of_range() -> None:
    assert replay_of(50_000, 10_000, 0) == Replay.PLANTED
    assert replay_of(50_000, 10_000, 9_999) == Replay.PLANTED
    assert replay_of(50_000, 10_000, 10_000) == Replay.CANARY
    assert replay_of(50_000, 10_000, 59_999) == Replay.CANARY
    assert replay_of(50_000, 10_000, 60_000) == Replay.NONE
    assert replay_of(0, 0, 0) == Replay.NONE and replay_of(1_000_000, 0, 999_999) == Replay.CANARY
    for bad in ((1_000_001, 0, 0), (0, -1, 0), (600_000, 500_000, 0), (50_000, 0, 1_000_000)):
        with pytest.raises(InvalidInput):
            replay_of(*bad)


def test_a_planted_replay_is_worked_alone_and_hashes_apart_from_the_canary_of_the_same_unit() -> None:
    canary = canary_spec(SPEC, "0x" + "22" * 20, 1_900_000_000)
    planted = canary_spec(SPEC, "0x" + "22" * 20, 1_900_000_000, planted=True)
    assert canary.replicas == 3 and canary.adaptive_replication
    assert planted.replicas == 1 and not planted.adaptive_replication
    assert (
        planted.model_copy(update={"replicas": 3, "adaptive_replication": True, "trusted_streak": 1})
        == canary
    )
    assert planted.spec_hash() != canary.spec_hash()


def _plant(address: str, **fields: object) -> ProviderCandidate:
    base = ProviderCandidate(
        address=address,
        operator="operator",
        memory_mb=8192,
        gflops=100,
        hardware_class="cpu",
        recipes=frozenset({"digits-mlp"}),
        free_stake=10**20,
        price_per_pflop=None,  # a plant needs no offer
        reputation=Reputation(valid=0, fault=2, fraud=0, consecutive_valid=0),  # never caught yet
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_a_planted_unit_takes_the_least_loaded_plant_never_caught_that_can_run_it() -> None:
    demand = unit_demand(unit_id=9, collateral=10**19, needed=1)
    plants = [
        _plant("0xB", active_units=1, capacity=2),
        _plant("0xA", online=False),
        _plant("0xC", free_stake=10**18),
        _plant("0xD", active_units=1, capacity=4),
        # caught once: its fraud record would tell its next unit's verifiers that it is a plant
        _plant("0xE", reputation=Reputation(valid=0, fault=0, fraud=1, consecutive_valid=0)),
    ]
    match = match_plant(demand, plants)
    assert match.complete and match.selected == ("0xB",)  # 0xB and 0xD tie on load: the lower address
    assert dict(match.declines) == {
        "0xA": DeclineReason.OFFLINE,
        "0xC": DeclineReason.INSUFFICIENT_FREE_STAKE,
        "0xE": DeclineReason.FRAUD_RECORD,
    }
    assert not match_plant(replace(demand, excluded=frozenset({"0xB", "0xD"})), plants).complete
    idle = _plant("0xF", active_units=0, capacity=4)
    assert match_plant(demand, [*plants, idle]).selected == ("0xF",)


def test_plant_agents_are_read_as_checksummed_addresses_and_a_bad_one_is_refused() -> None:
    lower = "0x" + "ab" * 20
    assert plant_agents(f" {lower}, ,") == {to_checksum_address(lower)}
    assert plant_agents("") == frozenset()
    with pytest.raises(ConfigError, match="not an address"):
        plant_agents(f"{lower},0x1234")


# --- the market on the contracts ----------------------------------------------------------------------------


@dataclass
class PlantedMarket:
    market: ChainMarket
    honest: list[LocalAccount]
    plant: LocalAccount
    lazy: LocalAccount
    careful: list[LocalAccount]
    fresh: LocalAccount  # staked, unregistered: the key a caught plant's agent moves to
    canary: LocalAccount


@pytest.fixture
def planted_market(tmp_path: Path) -> Iterator[PlantedMarket]:
    """3 honest providers, the operator's plant, 3 verifiers (one lazy), no draw by the chain (only the
    market's known answer sends the planted unit to verification) and every verified unit replayed as a
    planted cheat."""
    with canary_chain(tmp_path, 11) as (client, accounts, store):
        honest, plant, verifiers = accounts[2:5], accounts[5], accounts[6:9]
        market = ChainMarket(client, store, accounts[1], [*honest, plant], verifiers, verifiers_per_unit=3)
        market.service.config = replace(
            market.service.config, plant_agents=frozenset({plant.address}), plant_rate_ppm=1_000_000
        )
        market.service.matching.refresh_pool(force=True)
        market.service.canaries.account = ChainCanaryAccount(client, accounts[10])
        yield PlantedMarket(market, honest, plant, verifiers[0], verifiers[1:], accounts[9], accounts[10])


@pytest.mark.chain
def test_a_planted_cheat_goes_to_the_plant_alone_and_slashes_the_verifier_that_accepted_it(
    planted_market: PlantedMarket,
) -> None:
    market, plant = planted_market.market, planted_market.plant
    client = market.client
    assert market.service.matching.pool.get(plant.address) is None  # never drawn for a buyer's unit
    verified_round_0(market)  # three newcomers; the plant is not among them (the helper checks 3)
    with market.store.transaction() as session:
        (round_0,) = market.store.units_in(session, ["accepted"], 10)
        assert plant.address not in {r.provider for r in market.store.replicas_of(session, round_0.id or 0)}
    assert market.service.canaries.run() == 1
    unit_id, chosen = market.match_and_accept()
    assert chosen == [plant] and market.unit(unit_id).k == 1
    market.send_outbox()
    forged = result("forged")
    market.commit(unit_id, plant, forged)
    market.service.assignments.reveal(market.reveal_submission(unit_id, plant, forged))
    market.send_outbox()
    chain_unit = market.chain_unit(unit_id)
    assert client.get_unit(chain_unit).drawn
    with market.store.transaction() as session:  # shown as the spot check it looks like, not as a canary
        assert market.store.get_job(session, market.open_job(unit_id) or 0).reason == "spot_check"
    lazy_bonded = client.stake_of(planted_market.lazy.address).bonded
    plant_bonded = client.stake_of(plant.address).bonded
    careful_bonded = [client.stake_of(v.address).bonded for v in planted_market.careful]
    market.sign_verdict(unit_id, planted_market.lazy, [ACCEPT])  # unanimous: the lazy one signs at once
    for careful in planted_market.careful:
        market.sign_verdict(unit_id, careful, [FRAUD])
    market.send_outbox()
    assert client.get_unit(chain_unit).state == UnitState.VERDICTED
    closes = client.get_unit(chain_unit).verdict_deadline + client.deployment.appeal_params.appeal_window
    client.advance_time(closes - client.now() + 1)
    market.tick()  # sync queues the held fraud's settlement and the contradicting signature ...
    market.tick()  # ... and the outbox relays both
    assert client.stake_of(plant.address).bonded < plant_bonded  # the operator pays for its plant
    assert client.stake_of(planted_market.lazy.address).bonded < lazy_bonded
    assert [client.stake_of(v.address).bonded for v in planted_market.careful] == careful_bonded
    # the plant's order ends with its one unit (never worked again) and its account closes it on chain
    market.service.orders.advance_orders()
    order_id = market.unit(unit_id).order_id
    with market.store.transaction() as session:
        assert market.store.get_order(session, order_id).state == "cancelled"
        assert not market.store.units_in(session, ["pending"], 10)
    market.service.canaries.run()
    assert client.get_order(market.order_chain_id(market.unit(unit_id))).closed
    # a caught plant is a tell (its fraud record is on chain, and no buyer's unit goes to a provider with
    # one): the next unit drawn for a plant is not replayed while no plant without a record is registered
    with market.store.transaction() as session:
        assert market.store.get_agent(session, plant.address).rep_fraud == 1
    verified_round_0(market, adaptive=False)
    assert market.service.canaries.run() == 0
    with market.store.transaction() as session:
        assert [row.state for row in market.store.canaries_in(session, ["planned", "passed"])] == ["passed"]
    # the plant's agent moves to a fresh key (node/plant.py), which the canary account enrolls: planting
    # resumes on it, and the caught key gets nothing
    fresh, canary = planted_market.fresh, planted_market.canary
    market.service.config = replace(market.service.config, plant_authority=canary.address)
    enrollment = PlantEnrollment(agent=canary.address, nonce=1, timestamp=market.now(), plant=fresh.address)
    market.service.agents.enroll_plant(sign_message(enrollment, canary.key, client.chain_id))
    market.providers.append(fresh)
    market.register(fresh, AgentRole.PROVIDER)
    assert market.service.matching.pool.get(fresh.address) is None
    verified_round_0(market, adaptive=False)
    assert market.service.canaries.run() == 1
    unit_id, chosen = market.match_and_accept()
    assert chosen == [fresh]


@pytest.mark.chain
def test_a_drawn_unit_gets_no_second_verification_request(planted_market: PlantedMarket) -> None:
    """The operator's requestVerification on a unit the chain drew already would be a second
    VerificationRequested, which no unit of a provider on probation has: it is not sent."""
    market = planted_market.market
    market.post_order(rounds=1)
    unit_id, _ = market.match_and_accept()
    market.send_outbox()
    chain_unit = market.chain_unit(unit_id)
    port = market.service.chain
    assert port is not None
    assert port.request_verification(chain_unit).startswith("0x")
    assert port.request_verification(chain_unit) == ""
    requested = [e for e in market.client.events() if e.name == "VerificationRequested"]
    assert [int(e.args["unitId"]) for e in requested] == [chain_unit]


# --- plant keys enrolled at run time --------------------------------------------------------------------


def _enrollment(signer: LocalAccount, plant: str, nonce: int, chain_id: int = CHAIN_ID) -> dict[str, object]:
    message = PlantEnrollment(agent=signer.address, nonce=nonce, timestamp=T0, plant=plant)
    return sign_message(message, signer.key, chain_id).model_dump(mode="json")


def test_the_canary_account_enrolls_a_fresh_plant_key_and_nobody_else_can(
    service: MarketService, make_agent: Callable[..., AgentKey]
) -> None:
    """A plant agent moving to a fresh key (node/plant.py) is enrolled by the canary account's signature:
    from then on the key is out of the stake-weighted draw and planted units may go to it. A signature by
    anyone else, a replay, the wrong chain, a verifier's address or a market with no canary account is
    refused with a typed error and changes nothing."""
    authority, stranger = Account.create(), Account.create()
    client = TestClient(create_app(service))
    fresh, verifier = make_agent(), make_agent()
    assert (
        client.post("/agents/register", json=fresh.registration().model_dump(mode="json")).status_code == 200
    )
    registered = verifier.registration(AgentRole.VERIFIER).model_dump(mode="json")
    assert client.post("/agents/register", json=registered).status_code == 200
    assert service.matching.pool.get(fresh.address) is not None  # an ordinary provider so far

    def enrolled() -> list[str]:
        with service.store.transaction() as session:
            return [agent.address for agent in service.ctx.plant_agents(session)]

    refused = client.post("/agents/plants", json=_enrollment(authority, fresh.address, 1))
    assert refused.status_code == 403 and refused.json()["error"] == "NotAuthorized"  # no canary account
    service.config = replace(service.config, plant_authority=authority.address, plant_rate_ppm=10_000)
    for body, status, error in (
        (_enrollment(stranger, fresh.address, 1), 403, "NotAuthorized"),
        (_enrollment(authority, fresh.address, 1, chain_id=1), 401, "InvalidSignature"),
        (_enrollment(authority, verifier.address, 1), 400, "InvalidInput"),
    ):
        reply = client.post("/agents/plants", json=body)
        assert (reply.status_code, reply.json()["error"]) == (status, error), reply.json()
    assert enrolled() == [] and service.matching.pool.get(fresh.address) is not None

    enrollment = _enrollment(authority, fresh.address, 2)
    assert client.post("/agents/plants", json=enrollment).status_code == 200
    assert enrolled() == [fresh.address]
    assert service.matching.pool.get(fresh.address) is None  # out of the draw at once ...
    service.matching.refresh_pool(force=True)
    assert service.matching.pool.get(fresh.address) is None  # ... and on every rebuild of the pool
    assert (
        client.post("/agents/register", json=fresh.registration().model_dump(mode="json")).status_code == 200
    )
    assert service.matching.pool.get(fresh.address) is None  # a re-registration does not put it back
    replayed = client.post("/agents/plants", json=enrollment)
    assert replayed.status_code == 409 and replayed.json()["error"] == "ReplayedMessage"
    assert client.post("/agents/plants", json=_enrollment(authority, fresh.address, 3)).status_code == 200
    assert enrolled() == [fresh.address]  # enrolling again changes nothing
