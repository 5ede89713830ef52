"""DiLoCo orders (M = 2 shards) through the whole marketplace: PostgreSQL, Redis, a hardhat node, the
market API, a Celery worker and the agents as separate processes (apps.demo).

What the chain recorded is checked against an independent recomputation in the test: every round's
aggregate unit is recomputed here from the blobs the providers serve (round state and accepted shard
results), and its result digest must equal the one the chain finalized; the buyer's final weights must
be the last aggregate's output.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from orders import KillMidUnit, close_and_check, folded_order_config

from apps.demo import (
    HONEST_CPU_CONFIGURATIONS,
    Buyer,
    DemoConfig,
    Marketplace,
    UnitOutcome,
    collect_training,
    marketplace,
    progress_printer,
    start_stack,
)
from apps.procs import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.node_backend,
    pytest.mark.torch,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.timeout(600),
]


def anchored_digest(unit: UnitOutcome) -> str:
    """The result digest the chain settled a unit on: finalized (fast path), or revealed by the replica a
    verdict accepted (spot check)."""
    (accepted,) = {
        unit.result_digests[p] for p, o in zip(unit.providers, unit.outcomes, strict=True) if o == "accept"
    }
    assert unit.finalized_digest in (None, accepted)
    return accepted


def recompute_aggregates(
    market: Marketplace, status: dict[str, Any], units: list[UnitOutcome]
) -> list[tuple[str, str, str]]:
    """Per round, as an independent verifier: (recomputed result digest, the digest the chain finalized,
    recomputed output digest). Inputs are fetched over libp2p by the digests the market reported; their
    content addresses make them the committed bytes."""
    from veritrain.agentkit import BlobPlane, decode_state
    from veritrain.blobstore import BlobStore
    from veritrain.diloco import AggregateInputs, OuterConfig, aggregate, order_genesis
    from veritrain.recipes import get_recipe

    config = market.config
    folder = config.work_dir / "auditor"
    peers = [p.peer_addr for p in market.providers() if p.name not in market.killed]
    plane = BlobPlane(BlobStore(folder / "blobs"), market.parties["buyer"].account, free_port(), folder)
    plane.start()
    chain = {unit.chain_unit_id: unit for unit in units}
    found = []
    try:
        round_state = order_genesis(get_recipe(config.recipe), config.seed, config.shards)
        for round_index in range(config.rounds):
            accepted = [
                u for u in status["units"] if u["round_index"] == round_index and u["state"] == "accepted"
            ]
            shards = {u["shard"]: u["accepted_state_digest"] for u in accepted if u["kind"] == "train"}
            results = tuple(
                decode_state(plane.fetch_any(peers, shards[m].removeprefix("0x")))
                for m in range(config.shards)
            )
            recomputed = aggregate(AggregateInputs(round_index, round_state, results, OuterConfig()))
            (closing,) = [u for u in accepted if u["kind"] == "aggregate"]
            anchored = anchored_digest(chain[closing["chain_unit_id"]])
            found.append(
                ("0x" + recomputed.result_digest.hex(), anchored, "0x" + recomputed.output_digest.hex())
            )
            round_state = recomputed.output_state
    finally:
        plane.stop()
    return found


def test_m2_order_completes_with_a_shard_provider_killed_mid_unit(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    # k = 1 on three providers: the provider training a round-0 shard dies mid-unit, so that attempt
    # can be accepted for nobody; it must fail unpaid and the shard run again elsewhere, then the
    # aggregate units close both rounds. Short chain windows so the dead attempt settles in about a minute.
    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=0,
        verifiers=1,
        replicas=1,
        shards=2,
        outer_step="unit",  # an aggregate unit per round (the default for M = 2 is folded)
        rounds=2,
        unit_steps=60,
        commit_window_s=40,
        reveal_window_s=10,
        verdict_window_s=30,
        database_url=fresh_postgres_url,
        broker_url=redis_url,
        extra_env={"VERITRAIN_CELERY_QUEUE": private_queue, "VERITRAIN_HEARTBEAT_TIMEOUT_S": "5"},
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        crash = KillMidUnit(market, emit, round_index=0, kind="train")
        buyer.wait_completed(started + 480, on_tick=crash)
        assert crash.victim is not None, "no provider was caught mid-unit"
        status = buyer.status()
        closed = close_and_check(market, buyer, before, started, started + 500)
        checks, money, units = closed.checks, closed.money, closed.units
        audited = recompute_aggregates(market, status, units)
        training = collect_training(market, units, status, tmp_path)
        killed = market.parties[crash.victim[0]].address

    # Every round closed on its aggregate unit, whose digest on chain is the one recomputed here.
    assert len(audited) == config.rounds
    for recomputed, anchored, _ in audited:
        assert recomputed == anchored
    assert status["current_state_digest"] == audited[-1][2] == training.final_state_digest
    # The victim's attempt settled unpaid; its shard ran again, on another provider.
    (dead,) = [u for u in status["units"] if u["unit_id"] == crash.victim[1]]
    retry = [
        u
        for u in status["units"]
        if (u["round_index"], u["kind"], u["shard"], u["attempt"]) == (0, "train", dead["shard"], 1)
    ]
    assert dead["state"] == "failed" and len(retry) == 1 and retry[0]["state"] == "accepted"
    assert killed not in retry[0]["providers"]
    accepted = [u for u in units if "accept" in u.outcomes]
    assert len(accepted) == config.rounds * (config.shards + 1)
    assert money.payouts.get(killed, 0) == sum(1 for u in accepted if u.providers == [killed]) * (
        money.payouts_total // len(accepted)
    )
    assert money.deposit == money.payouts_total + money.verdict_fees + money.refund
    for name in ("escrow_balanced", "providers_paid_exactly", "parties_conserved", "supply_conserved"):
        assert checks.results[name], (name, checks.details.get(name))


def test_honest_providers_on_different_cpu_configurations_are_all_paid(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    # k = 2 on four providers in four CPU configurations: replicas of one unit may disagree in the last
    # bits (the verifier settles that within the calibrated tolerance), aggregate replicas never do.
    config = DemoConfig(
        out_dir=tmp_path,
        providers=len(HONEST_CPU_CONFIGURATIONS),
        dishonest=0,
        verifiers=1,
        replicas=2,
        shards=2,
        outer_step="unit",  # an aggregate unit per round (the default for M = 2 is folded)
        rounds=2,
        unit_steps=40,
        database_url=fresh_postgres_url,
        broker_url=redis_url,
        extra_env={"VERITRAIN_CELERY_QUEUE": private_queue},
        provider_env=HONEST_CPU_CONFIGURATIONS,
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(started + 480)
        status = buyer.status()
        closed = close_and_check(market, buyer, before, started, started + 500)
        report, checks, money, units = closed.report, closed.checks, closed.money, closed.units
        audited = recompute_aggregates(market, status, units)
        classes = {
            party.name: re.findall(r"class (\S+)", market.procs[party.name].log_path.read_text())[:1]
            for party in market.providers()
        }

    emit(f"test: hardware classes {classes}")
    assert len({tuple(c) for c in classes.values()}) == len(
        HONEST_CPU_CONFIGURATIONS
    )  # four distinct classes
    outcomes = [outcome for unit in units for outcome in unit.outcomes]
    assert outcomes.count("fault") == 0 and outcomes.count("fraud") == 0, report["units"]
    assert len(units) == config.rounds * (config.shards + 1)  # nothing failed, nothing re-assigned
    assert all(money.payouts.get(party.address, 0) > 0 for party in market.providers()), money.payouts
    assert not money.slashed
    for recomputed, anchored, _ in audited:
        assert recomputed == anchored
    for name in ("escrow_balanced", "providers_paid_exactly", "supply_conserved"):
        assert checks.results[name], (name, checks.details.get(name))


def audit_folded(
    market: Marketplace, status: dict[str, Any], units: list[UnitOutcome]
) -> tuple[list[tuple[Any, str]], str, str, str]:
    """A folded 2-round order, recomputed as an independent verifier from the blobs the providers serve:
    per round-1 shard unit (the fold its served manifest names, the digest the chain settled it on, which
    that manifest must open), the fold recomputed from round 0, and the last aggregate's recomputed result
    and output digests beside the one the chain settled."""
    from veritrain.agentkit import BlobPlane, UnitManifest, decode_state
    from veritrain.blobstore import BlobStore
    from veritrain.diloco import AggregateInputs, Fold, OuterConfig, aggregate, order_genesis
    from veritrain.errors import VeritrainError
    from veritrain.recipes import get_recipe

    config = market.config
    folder = config.work_dir / "auditor"
    peers = [p.peer_addr for p in market.providers()]
    plane = BlobPlane(BlobStore(folder / "blobs"), market.parties["buyer"].account, free_port(), folder)
    plane.start()
    chain = {unit.chain_unit_id: unit for unit in units}

    def accepted(round_index: int, kind: str) -> list[dict[str, Any]]:
        return sorted(
            (
                u
                for u in status["units"]
                if (u["round_index"], u["kind"], u["state"]) == (round_index, kind, "accepted")
            ),
            key=lambda u: int(u["shard"]),
        )

    def results(round_index: int) -> tuple[Any, ...]:
        return tuple(
            decode_state(plane.fetch_any(peers, u["accepted_state_digest"].removeprefix("0x")))
            for u in accepted(round_index, "train")
        )

    def manifest(result_digest: str) -> UnitManifest:
        for peer in peers:
            try:
                return UnitManifest.from_bytes(plane.fetch(peer, plane.lookup_manifest(peer, result_digest)))
            except VeritrainError:
                continue
        raise AssertionError(f"no provider serves the manifest of {result_digest}")

    try:
        genesis = order_genesis(get_recipe(config.recipe), config.seed, config.shards)
        first = aggregate(AggregateInputs(0, genesis, results(0), OuterConfig()))
        folds = []
        for unit in accepted(1, "train"):
            anchored = anchored_digest(chain[unit["chain_unit_id"]])
            served = manifest(anchored)
            assert served.opened_result_digest() == anchored
            folds.append((served.fold(), anchored))
        last = aggregate(AggregateInputs(1, first.output_state, results(1), OuterConfig()))
        (closing,) = accepted(1, "aggregate")
        anchored_last = anchored_digest(chain[closing["chain_unit_id"]])
    finally:
        plane.stop()
    expected = Fold(first.output_digest, first.inputs_commitment)
    return (
        [(fold == expected, digest) for fold, digest in folds],
        "0x" + last.result_digest.hex(),
        anchored_last,
        "0x" + last.output_digest.hex(),
    )


def test_a_folded_m2_order_runs_the_outer_step_in_the_next_rounds_shard_units(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    # k = 1 and every unit drawn for a spot check, so the verifier re-executes each round-1 shard unit,
    # recomputing the outer step it ran first, and the one aggregate unit after the last round. Settled per
    # unit (asked): by default the market puts a folded order on the round path, which has no aggregate unit
    # (the buyer runs the last outer step itself: tests/e2e/test_rounds.py); this is the path that keeps it.
    config = folded_order_config(
        tmp_path,
        fresh_postgres_url,
        redis_url,
        private_queue,
        settlement="units",
        solo_spot_check_ppm=1_000_000,
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(started + 480)
        status = buyer.status()
        closed = close_and_check(market, buyer, before, started, started + 500)
        checks, money, units = closed.checks, closed.money, closed.units
        folds, recomputed, anchored, output = audit_folded(market, status, units)
        training = collect_training(market, units, status, tmp_path)

    # No aggregate unit between the rounds: one after the last, R·M + 1 units in all, all verified.
    assert sorted((u["round_index"], u["kind"]) for u in status["units"]) == [
        (0, "train"),
        (0, "train"),
        (1, "aggregate"),
        (1, "train"),
        (1, "train"),
    ]
    assert len(units) == config.rounds * config.shards + 1
    assert all(unit.outcomes == ["accept"] and unit.settlement == "verdict" for unit in units), units
    # Each round-1 unit's result on chain binds the outer step recomputed here from round 0's results.
    assert len(folds) == config.shards and all(equal for equal, _ in folds), folds
    # The last aggregate, recomputed from round 1's state and results, is the one the chain settled, and
    # its output is the buyer's final weights.
    assert recomputed == anchored
    assert status["current_state_digest"] == output == training.final_state_digest
    assert not money.slashed
    assert money.deposit == money.payouts_total + money.verdict_fees + money.refund
    for name in ("escrow_balanced", "providers_paid_exactly", "parties_conserved", "supply_conserved"):
        assert checks.results[name], (name, checks.details.get(name))
