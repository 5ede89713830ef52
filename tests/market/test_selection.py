"""Stake-weighted selection by chain randomness (issue 8 finding 3): the draw's distribution follows stake,
is deterministic from public data, never repeats a candidate, and leaves the hard constraints in force.

Frequencies are counted over a fixed set of seeds, so every run (on any CPU) sees the same counts; the
bounds are chi-square quantiles far in the tail (p ≈ 10⁻⁶), so they test the distribution, not luck.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import combinations
from typing import Any

import pytest
from agents import Clock
from chain_double import LedgerChain
from eth_hash.auto import keccak
from fastapi.testclient import TestClient
from market_flow import post_order, register_market, run_unit
from sqlmodel import col, select
from test_api import no_audit

from market.api import create_app
from market.context import row_id
from market.domain.matching import CandidatePool, DeclineReason, ProviderCandidate, UnitDemand, draw
from market.domain.selection import ROLE_REPLICAS, ROLE_VERIFIERS, sample, selection_seed
from market.service import MarketService
from market.store import MatchLogRow

TOKEN = 10**18
DRAWS = 20_000
CHI2_DF4_P1E6 = 33.4  # chi-square quantiles at p = 10⁻⁶
CHI2_DF5_P1E6 = 35.9


UNIT_KEY = "0x" + "ab" * 32
ONE_BLOCK = "0x" + "0b" * 32


def draws(n: int = DRAWS, one_block: bool = False) -> list[tuple[str, str]]:
    """(block hash, unit seed) of n draws: a fresh block each, or one block for n units (one pass)."""
    if one_block:
        return [(ONE_BLOCK, selection_seed(ONE_BLOCK, f"0x{i:064x}")) for i in range(n)]
    blocks = ["0x" + keccak(i.to_bytes(32, "big")).hex() for i in range(n)]
    return [(b, selection_seed(b, UNIT_KEY)) for b in blocks]


def chi_square(observed: Counter[Any], expected: dict[Any, float]) -> float:
    return sum((observed[key] - e) ** 2 / e for key, e in expected.items())


@pytest.mark.parametrize("one_block", [False, True], ids=["fresh-blocks", "one-pass"])
def test_the_first_pick_is_proportional_to_stake(one_block: bool) -> None:
    """Across blocks, and across the units of one pass (one block, many unit keys)."""
    stakes = {f"0x{i:040x}": s * TOKEN for i, s in enumerate((1, 2, 3, 4, 10), start=1)}
    total = sum(stakes.values())
    firsts = Counter(sample(b, s, ROLE_REPLICAS, stakes, 1)[0] for b, s in draws(one_block=one_block))
    expected = {a: DRAWS * w / total for a, w in stakes.items()}
    assert chi_square(firsts, expected) < CHI2_DF4_P1E6


@pytest.mark.parametrize("one_block", [False, True], ids=["fresh-blocks", "one-pass"])
def test_pairs_follow_weighted_sampling_without_replacement(one_block: bool) -> None:
    """k = 2 from four candidates: each unordered pair as often as successive sampling predicts."""
    stakes = {f"0x{i:040x}": s * TOKEN for i, s in enumerate((1, 2, 3, 6), start=1)}
    total = sum(stakes.values())

    def p_pair(a: str, b: str) -> float:
        wa, wb = stakes[a], stakes[b]
        return wa / total * wb / (total - wa) + wb / total * wa / (total - wb)

    pairs = Counter(frozenset(sample(b, s, ROLE_REPLICAS, stakes, 2)) for b, s in draws(one_block=one_block))
    expected = {frozenset(p): DRAWS * p_pair(*p) for p in combinations(stakes, 2)}
    assert abs(sum(expected.values()) - DRAWS) < 1e-6
    assert chi_square(pairs, expected) < CHI2_DF5_P1E6


def test_splitting_stake_across_sybil_keys_buys_nothing() -> None:
    """An adversary with 30 % of stake on 30 keys is picked first about 30 % of the time, as with one."""
    honest = {f"0x{i:040x}": 7 * TOKEN for i in range(1, 11)}  # 70 tokens
    sybils = {f"0x{1000 + i:040x}": TOKEN for i in range(30)}  # 30 tokens
    stakes = honest | sybils
    n = 5000
    adversarial = sum(1 for b, s in draws(n) if sample(b, s, ROLE_REPLICAS, stakes, 1)[0] in sybils)
    assert abs(adversarial - 0.3 * n) < 5 * (n * 0.3 * 0.7) ** 0.5  # binomial: 5 standard deviations


def test_draw_is_deterministic_without_duplicates_and_recomputable_from_its_inputs() -> None:
    stakes = {f"0x{i:040x}": (i % 7 + 1) * TOKEN for i in range(1, 60)}
    block = "0x" + "11" * 32
    seed = selection_seed(block, "0x" + "22" * 32)
    first = sample(block, seed, ROLE_REPLICAS, stakes, 10)
    assert first == sample(block, seed, ROLE_REPLICAS, dict(reversed(stakes.items())), 10)  # any order
    assert len(set(first)) == 10
    everyone = sample(block, seed, ROLE_REPLICAS, stakes, 100)
    assert len(everyone) == 59 and everyone[:10] == first
    # the seed is keccak(blockhash ‖ unit key), and each role draws with its own seed
    assert (
        selection_seed("0x" + "11" * 32, "0x" + "22" * 32) == "0x" + keccak(b"\x11" * 32 + b"\x22" * 32).hex()
    )
    assert sample(block, seed, ROLE_VERIFIERS, stakes, 10) != first
    assert sample("0x" + "12" * 32, seed, ROLE_REPLICAS, stakes, 10) != first


def test_leaving_the_draw_never_moves_anyone_else() -> None:
    """A key's place depends on the seed and its own stake only: an adversary that learns the seed and
    takes some of its keys offline cannot push an honest key out or pull its own others in."""
    stakes = {f"0x{i:040x}": (i % 5 + 1) * TOKEN for i in range(1, 40)}
    for b, s in draws(200):
        full = sample(b, s, ROLE_REPLICAS, stakes, len(stakes))
        gone = set(full[::3])
        rest = sample(b, s, ROLE_REPLICAS, {a: w for a, w in stakes.items() if a not in gone}, len(stakes))
        assert rest == tuple(a for a in full if a not in gone)


def test_zero_stake_is_drawn_after_every_staked_candidate() -> None:
    stakes = {"0x" + "01" * 20: 0, "0x" + "02" * 20: TOKEN, "0x" + "03" * 20: 0}
    for b, s in draws(50):
        assert sample(b, s, ROLE_REPLICAS, stakes, 3)[0] == "0x" + "02" * 20


def _candidate(i: int, **overrides: Any) -> ProviderCandidate:
    base = ProviderCandidate(
        address=f"0x{i:040x}",
        operator=f"op{i}",
        memory_mb=4096,
        gflops=100,
        hardware_class="cpu",
        recipes=frozenset({"digits-mlp"}),
        free_stake=10 * TOKEN,
        price_per_pflop=10**17,
        capacity=10**6,
        bonded_stake=10 * TOKEN,
    )
    return replace(base, **overrides)


def test_hard_constraints_still_hold_whatever_the_draw() -> None:
    """Memory, recipe, price ceiling, collateral and operator: an ineligible candidate is never chosen,
    however much stake it holds, and the eligible ones share the units by stake."""
    ineligible = [
        _candidate(1, memory_mb=512),
        _candidate(2, recipes=frozenset({"charlm-tiny"})),
        _candidate(3, price_per_pflop=10**19),
        _candidate(4, free_stake=TOKEN // 2),
        _candidate(5, gflops=1),
    ]
    ineligible = [replace(c, bonded_stake=1000 * TOKEN) for c in ineligible]
    eligible = [_candidate(10 + i, bonded_stake=(i + 1) * TOKEN) for i in range(5)]
    pool = CandidatePool(collateral=TOKEN, recipe_memory_mb={"digits-mlp": 1024})
    for c in [*ineligible, *eligible]:
        pool.upsert(c)
    counts: Counter[str] = Counter()
    for unit in range(4000):
        demand = UnitDemand(
            unit_id=unit,
            recipe="digits-mlp",
            min_memory_mb=1024,
            unit_flops=10**12,
            time_budget_s=600,
            max_price_per_pflop=10**18,
            collateral=TOKEN,
            needed=1,
        )
        match = pool.match(demand, ONE_BLOCK, selection_seed(ONE_BLOCK, f"0x{unit:064x}"))
        assert match.complete
        counts.update(match.selected)
        pool.release(match.selected[0])
    assert not set(counts) & {c.address for c in ineligible}
    expected = {c.address: 4000 * c.bonded_stake / (15 * TOKEN) for c in eligible}
    assert chi_square(counts, expected) < CHI2_DF4_P1E6


def test_the_pool_draw_is_the_published_one() -> None:
    """What the pool picks equals the draw anyone recomputes from the seed and the candidates' stakes."""
    candidates = [_candidate(i, bonded_stake=(i % 4 + 1) * TOKEN) for i in range(1, 30)]
    pool = CandidatePool()
    for c in candidates:
        pool.upsert(c)
    seed = selection_seed("0x" + "99" * 32, "0x" + "42" * 32)
    demand = UnitDemand(
        unit_id=1,
        recipe="digits-mlp",
        min_memory_mb=1024,
        unit_flops=10**12,
        time_budget_s=600,
        max_price_per_pflop=10**18,
        collateral=0,
        needed=3,
    )
    stakes = {c.address: c.bonded_stake for c in candidates}
    published = sample(ONE_BLOCK, seed, ROLE_REPLICAS, stakes, 3)
    assert pool.match(demand, ONE_BLOCK, seed).selected == published
    assert tuple(c.address for c in draw(ONE_BLOCK, seed, candidates))[:3] == published


@pytest.fixture
def client(service: MarketService) -> TestClient:
    return TestClient(create_app(service))


def test_the_market_records_the_seed_and_draws_replicas_and_verifiers_from_it(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    providers, verifiers = register_market(client, make_agent, providers=8, verifiers=4)
    stakes = {k.address: (i + 1) * 10 * TOKEN for i, k in enumerate([*providers, *verifiers])}
    for address, stake in stakes.items():
        ledger.set_free_stake(address, stake)
    service.agents.refresh_chain_facts(set(stakes))
    service.matching.refresh_pool(force=True)
    order = post_order(client, ledger, make_agent(), clock)
    posted = ledger.block_number()  # the order's OrderPosted block
    for _ in range(3):  # the operator runs its pass blocks later: the seed does not move with it
        ledger.slash(verifiers[0].address, 0)
    (match,) = service.matching.match_pending()
    assert match.complete
    (unit,) = client.get(f"/orders/{order['order_id']}").json()["units"]
    # anyone recomputes the draw from the posting block, the unit key and the stakes
    assert unit["selection_block"] == posted
    with service.store.transaction() as session:
        unit_key = service.store.units_of_order(session, order["order_id"])[0].unit_key
    block_hash = ledger.block_hash(posted)
    seed = selection_seed(block_hash, unit_key)
    assert unit["selection_seed"] == seed
    provider_stakes = {k.address: stakes[k.address] for k in providers}
    drawn = sample(block_hash, seed, ROLE_REPLICAS, provider_stakes, 3)
    assert set(unit["providers"]) == set(drawn)
    verifier_stakes = {k.address: stakes[k.address] for k in verifiers}
    assert tuple(unit["verifiers"]) == sample(block_hash, seed, ROLE_VERIFIERS, verifier_stakes, 2)

    # a dropped replica sends the unit back for a refill: the same seed, the next provider in its draw
    ledger.slash(verifiers[0].address, 0)  # any transaction: the chain moves on by a block
    with service.store.transaction() as session:
        row = service.store.units_of_order(session, order["order_id"])[0]
        replica = service.store.replica(session, row_id(row), drawn[0])
        service.assignments.drop_replica(session, row, replica, clock())
    (refill,) = service.matching.match_pending()
    assert refill.selected == sample(block_hash, seed, ROLE_REPLICAS, provider_stakes, 4)[3:]
    (unit,) = client.get(f"/orders/{order['order_id']}").json()["units"]
    assert (unit["selection_block"], unit["selection_seed"]) == (posted, seed)
    with service.store.transaction() as session:
        logs = session.exec(select(MatchLogRow).order_by(col(MatchLogRow.id))).all()
        assert [(log.selection_block, log.selection_seed) for log in logs] == [(posted, seed)] * 2


def test_stake_grown_from_the_seed_block_on_waits_for_a_draw_seeded_later(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """A key staked, or a stake topped up, once the seed block's hash was public could have been ground or
    sized for that seed: it is declined for the draws that block seeds, and drawn as any other from a seed
    block after its stake."""
    providers, _ = register_market(client, make_agent, providers=6, verifiers=2)
    for key in providers:
        ledger.set_free_stake(key.address, 10 * TOKEN)
    service.agents.refresh_chain_facts({k.address for k in providers})
    first = post_order(client, ledger, make_agent(), clock, chain_order_id=1)
    # after the posting: a registered provider tops up (the market learns it from the chain's events) and a
    # new key stakes and registers, each with a stake that puts it first in nearly every draw
    topped_up, newcomer = providers[0], make_agent()
    ledger.stake(topped_up.address, 10**6 * TOKEN)
    ledger.stake(newcomer.address, 10**6 * TOKEN)
    service.sync.sync_chain_events()
    body = newcomer.registration().model_dump(mode="json")
    assert client.post("/agents/register", json=body).status_code == 200
    offer = newcomer.offer(price_per_pflop=10**17)
    assert client.post("/agents/offer", json=offer.model_dump(mode="json")).status_code == 200
    service.matching.refresh_pool(force=True)

    (match,) = service.matching.match_pending()
    assert match.complete and not {topped_up.address, newcomer.address} & set(match.selected)
    late = {address for address, reason in match.declines if reason == DeclineReason.STAKED_AFTER_SEED}
    assert late == {topped_up.address, newcomer.address}

    second = post_order(client, ledger, make_agent(), clock, chain_order_id=2)
    (match,) = service.matching.match_pending()
    assert {topped_up.address, newcomer.address} <= set(match.selected)
    first_block, second_block = (
        client.get(f"/orders/{o['order_id']}").json()["units"][0]["selection_block"] for o in (first, second)
    )
    assert first_block < second_block == ledger.block_number()


def test_the_next_round_is_seeded_by_the_block_that_settled_the_last_one(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """Round 1's draw uses the block of the transaction that finalized round 0's unit: fixed by the chain,
    its hash unknown when that transaction was sent, whenever the market then opens and matches the round."""
    no_audit(service)
    providers, _ = register_market(client, make_agent)
    keys = {k.address: k for k in providers}
    order = post_order(client, ledger, make_agent(), clock)
    service.matching.match_pending()
    run_unit(client, service, keys, {"default": "0x" + "a1" * 32})
    (finalized,) = [e for e in ledger.events(1, ledger.block_number()) if e.name == "UnitFinalized"]
    ledger.slash(providers[0].address, 0)  # the chain moves on before the round opens
    assert service.orders.advance_orders() == 1
    service.matching.match_pending()
    units = client.get(f"/orders/{order['order_id']}").json()["units"]
    assert [u["round_index"] for u in units] == [0, 1]
    assert units[1]["selection_block"] == finalized.block_number < ledger.block_number()
    with service.store.transaction() as session:
        unit_key = service.store.units_of_order(session, order["order_id"])[1].unit_key
    assert units[1]["selection_seed"] == selection_seed(ledger.block_hash(finalized.block_number), unit_key)


def test_a_draw_short_of_providers_is_seeded_again_by_the_stake_that_came_late(
    client: TestClient, service: MarketService, ledger: LedgerChain, make_agent: Any, clock: Clock
) -> None:
    """An order posted before enough providers staked: its unit comes up short at the posting block, then
    is seeded by the block of the latest stake that grew after it, and drawn from that block."""
    providers, _ = register_market(client, make_agent, providers=2, verifiers=2)
    order = post_order(client, ledger, make_agent(), clock)
    posted = ledger.block_number()
    latecomer = make_agent()
    ledger.stake(latecomer.address, 10 * TOKEN)
    staked = ledger.block_number()
    assert (
        client.post("/agents/register", json=latecomer.registration().model_dump(mode="json")).status_code
        == 200
    )
    offer = latecomer.offer(price_per_pflop=10**17)
    assert client.post("/agents/offer", json=offer.model_dump(mode="json")).status_code == 200
    service.matching.refresh_pool(force=True)

    (short,) = service.matching.match_pending()
    assert not short.complete
    assert (latecomer.address, DeclineReason.STAKED_AFTER_SEED) in short.declines
    (unit,) = client.get(f"/orders/{order['order_id']}").json()["units"]
    assert unit["selection_block"] == staked > posted
    ledger.slash(providers[0].address, 0)  # the chain moves on: the new seed is the stake's block still
    (match,) = service.matching.match_pending()
    assert match.complete and set(match.selected) == {*(p.address for p in providers), latecomer.address}
    (unit,) = client.get(f"/orders/{order['order_id']}").json()["units"]
    with service.store.transaction() as session:
        unit_key = service.store.units_of_order(session, order["order_id"])[0].unit_key
    assert (unit["selection_block"], unit["selection_seed"]) == (
        staked,
        selection_seed(ledger.block_hash(staked), unit_key),
    )
