"""The matching benchmark behind `veritrain bench market` (the command is :mod:`apps.bench_market`).

Setup: ``--providers`` (10,000) registered providers with offers and ``--orders`` (1,000) open orders,
each with its first unit pending, in a real database (a SQLite file by default, any URL with
``--database-url``). Measured: one production matching pass
(:meth:`market.matchmaker.Matchmaker.match_pending`), i.e. the decision *and* its writes (replicas, match
log with every decline reason, unit and order states, provider load) committed in one transaction.

- ``matches_per_s``: matched units / wall time of the whole pass including the commit.
- ``match_p99_ms``: 99th percentile of the per-unit decision time (wall clock; ``match_p99_cpu_ms`` is
  the same in thread CPU time, which a busy shared machine does not inflate).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

FLOPS_PER_STEP = 10_030_848  # digits-mlp (computed by the recipe registry; fixed here to keep torch out)
RECIPE = "digits-mlp"
HARDWARE_CLASSES = ("cpu-avx2", "cpu-avx512", "cuda-sm80", "cuda-sm89")
VERIFIERS = 20


def seed_database(url: str, providers: int, orders: int, replicas: int, seed: int) -> dict[str, float]:
    """Bulk-insert providers (agents, heartbeats, offers) and orders with one pending unit each."""
    from market.orders import unit_key_for
    from market.store import AgentRow, HeartbeatRow, MarketStore, OfferRow, OrderRow, RoundRow, UnitRow
    from veritrain.messages import OrderSpec

    rng = random.Random(seed)
    store = MarketStore(url)
    store.drop_schema()
    store.create_schema()
    now = int(time.time())
    started = time.perf_counter()
    with store.transaction() as session:
        for i in range(providers):
            address = f"0x{rng.getrandbits(160):040x}"
            operator = f"0x{(i // 2):040x}"  # every operator runs two machines: distinct-operator rule bites
            session.add(
                AgentRow(
                    address=address,
                    role="provider",
                    operator=operator,
                    memory_mb=rng.choice((128, *[2048, 8192, 24576] * 6)),  # ~5 % too small for the recipe
                    gflops=rng.randint(1, 2000),
                    hardware_class=rng.choice(HARDWARE_CLASSES),
                    recipes_json=json.dumps([RECIPE] if rng.random() < 0.9 else ["charlm-tiny"]),
                    registered_at=now,
                    online=rng.random() < 0.97,
                    free_stake=(
                        stake := rng.choice((0, 10**17, *[10**19, 10**20] * 9))
                    ),  # ~10 % under collateral
                    bonded_stake=stake,
                )
            )
            session.add(HeartbeatRow(agent=address, last_nonce=1, last_timestamp=now, received_at=now))
            if rng.random() < 0.95:
                price = rng.randint(10**16, 12 * 10**17)  # ~17 % above the buyers' max
                session.add(
                    OfferRow(agent=address, price_per_pflop=price, expires_at=now + 86_400, signed_at=now)
                )
        for _ in range(VERIFIERS):  # assign needs a quorum of independent verifiers per unit
            address = f"0x{rng.getrandbits(160):040x}"
            session.add(
                AgentRow(
                    address=address,
                    role="verifier",
                    operator=address,
                    memory_mb=8192,
                    gflops=500,
                    hardware_class="cpu-avx2",
                    registered_at=now,
                    free_stake=10**20,
                    bonded_stake=10**20,
                )
            )
        session.flush()
        for j in range(orders):
            spec = OrderSpec(
                buyer=f"0x{rng.getrandbits(160):040x}",
                recipe=RECIPE,
                dataset_digest="0x" + "ab" * 32,
                total_steps=100,
                unit_steps=100,
                replicas=replicas,
                seed=j,
                max_price_per_pflop=10**18,
                deadline=now + 86_400,
            )
            order = OrderRow(
                chain_order_id=j + 1,
                buyer=spec.buyer,
                spec_json=spec.model_dump_json(),
                spec_hash=spec.spec_hash(),
                recipe=RECIPE,
                rounds_total=1,
                flops_per_step=FLOPS_PER_STEP,
                min_memory_mb=257,
                price_per_replica=10**18,
                max_price_per_pflop=spec.max_price_per_pflop,
                deadline=spec.deadline,
                created_at=now,
            )
            session.add(order)
            session.flush()
            assert order.id is not None
            round_row = RoundRow(order_id=order.id, index=0)
            session.add(round_row)
            session.flush()
            assert round_row.id is not None
            session.add(
                UnitRow(
                    order_id=order.id,
                    round_id=round_row.id,
                    round_index=0,
                    unit_key=unit_key_for(j + 1, 0, 0, 0),
                    k=replicas,
                    start_step=0,
                    steps=100,
                    updated_at=now,
                )
            )
    seeded = time.perf_counter() - started
    store.dispose()
    return {"db_seed_s": round(seeded, 3)}


def run_benchmark(url: str, providers: int, orders: int, replicas: int, seed: int) -> dict[str, Any]:
    from market.context import MarketConfig
    from market.ports import RecipeInfo
    from market.service import MarketService
    from market.store import MarketStore

    facts: dict[str, Any] = seed_database(url, providers, orders, replicas, seed)

    class StaticRecipes:
        def lookup(self, name: str) -> RecipeInfo:
            return RecipeInfo(name=name, flops_per_step=FLOPS_PER_STEP, min_memory_mb=257)

    store = MarketStore(url)
    config = MarketConfig(provider_collateral=10**18, min_verifiers=2, verifiers_per_unit=2)
    service = MarketService(store, StaticRecipes(), None, config)
    started = time.perf_counter()
    service.matching.refresh_pool(force=True)
    facts["pool_build_s"] = round(time.perf_counter() - started, 3)

    latencies: list[tuple[float, float]] = []
    started = time.perf_counter()
    matches = service.matching.match_pending(limit=orders, latencies=latencies)
    wall = time.perf_counter() - started
    matched = sum(1 for m in matches if m.complete)
    declines = sum(len(m.declines) for m in matches)
    wall_ms = [w * 1000 for w, _ in latencies]
    cpu_ms = [c * 1000 for _, c in latencies]
    store.dispose()
    return {
        **facts,
        "matches_per_s": round(matched / wall, 1),
        "match_p99_ms": _p99(wall_ms),
        "match_p50_ms": round(statistics.median(wall_ms), 3),
        "match_p99_cpu_ms": _p99(cpu_ms),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
        "matched_units": matched,
        "unmatched_units": len(matches) - matched,
        "declines_recorded": declines,
        "match_pass_wall_s": round(wall, 3),
    }


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return round(values[0], 3) if values else 0.0
    return round(statistics.quantiles(values, n=100)[98], 3)
