"""A folded DiLoCo order on the round path (`settlement: "rounds"`) through the whole marketplace: a hardhat
node, PostgreSQL, Redis, the market API, a Celery worker and the agents as separate processes (apps.demo).

The market draws the order's roster once; the provider agents sign its Accept, train each round's shard
units (round 1's fold round 0's outer step, as on the per-unit path), sign one RoundCommit a round over
their slots' commitments and the roster's works deadline and open their results to the market; the worker
relays `openRoster`, the steps and `closeRoster`; the order runs no aggregate unit after its last round:
the buyer runs that outer step itself over the last round's results the chain accepted (apps/buyer.py
`final_outer_step`). The
fresh providers are on probation, so every unit is set aside: each round is revealed by a step of its
own, its units judged by the verifier, and the next round starts from their verdicts (committed by a step
of its own).
Checked from the chain's events and an independent recomputation of the training: every round committed
and revealed by a step, the roster closed, each provider paid exactly what the contract owed it, and the
buyer's final weights bitwise the outer step recomputed here from the blobs the providers serve: what an
aggregate unit would have output (its result is `diloco.aggregate` of the same inputs, checked bitwise by
its verifiers; tests/e2e/test_diloco.py's folded test checks it on the per-unit path)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from earned import earned
from orders import close_and_check, folded_order_config, wait_until

from apps.demo import (
    Buyer,
    Marketplace,
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


def rostered(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The order's training units run on the roster (a unit a step set aside has its chain id)."""
    return [u for u in status["units"] if u["kind"] == "train"]


def recompute_final_state(market: Marketplace, status: dict[str, Any]) -> str:
    """The buyer's final state recomputed as an independent verifier: genesis, each round's outer step over
    the accepted shard results the providers serve (fetched by the digests the market reported; their
    content addresses make them the committed bytes), the last one what the buyer runs itself."""
    from veritrain.agentkit import BlobPlane, decode_state
    from veritrain.blobstore import BlobStore
    from veritrain.diloco import AggregateInputs, OuterConfig, aggregate, order_genesis
    from veritrain.recipes import get_recipe

    config = market.config
    folder = config.work_dir / "auditor"
    peers = [p.peer_addr for p in market.providers()]
    plane = BlobPlane(BlobStore(folder / "blobs"), market.parties["buyer"].account, free_port(), folder)
    plane.start()
    try:
        state = order_genesis(get_recipe(config.recipe), config.seed, config.shards)
        output = ""
        for round_index in range(config.rounds):
            shards = sorted(
                (u for u in rostered(status) if u["round_index"] == round_index),
                key=lambda u: int(u["shard"]),
            )
            results = tuple(
                decode_state(plane.fetch_any(peers, u["accepted_state_digest"].removeprefix("0x")))
                for u in shards
            )
            step = aggregate(AggregateInputs(round_index, state, results, OuterConfig()))
            state, output = step.output_state, "0x" + step.output_digest.hex()
    finally:
        plane.stop()
    return output


def test_a_folded_order_on_the_round_path_completes_through_real_processes(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    # k = 1 and no audit draw; the fresh providers are on probation (below the roster's required streak),
    # so each step sets every unit of the round it reveals aside and the verifier re-executes it
    config = folded_order_config(
        tmp_path, fresh_postgres_url, redis_url, private_queue, settlement="rounds", solo_spot_check_ppm=0
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        providers = [p.address for p in market.providers()]
        # what each provider holds of the market's money once staked: the close pays it (credit + tokens)
        earned_before = {p: earned(market.client, p) for p in providers}
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(started + 480)
        status = wait_until(
            market,
            lambda: (s := buyer.status())["roster"]["state"] == "closed" and s,
            started + 500,
            "the roster was not closed",
        )
        paid = {p: earned(market.client, p) - earned_before[p] for p in providers}
        closed = close_and_check(market, buyer, before, started, started + 520)
        events = [
            e for e in market.events(buyer.posted_block) if e.args.get("orderId") == buyer.chain_order_id
        ]
        final = recompute_final_state(market, status)
        training = collect_training(market, closed.units, status, tmp_path)
    elapsed = time.monotonic() - started
    emit(f"test: the rounds order completed and was checked in {elapsed:.0f} s")

    names = [e.name for e in events]
    roster = status["roster"]
    assert (roster["rounds"], roster["committed"], roster["revealed"]) == (config.rounds,) * 3
    # every round committed and revealed once (each held for its verdicts: revealed alone, PLAN 5e)
    assert names.count("RosterOpened") == 1 and names.count("RosterClosed") == 1
    assert sorted(int(e.args["round"]) for e in events if e.name == "RoundCommitted") == [0, 1]
    assert sorted(int(e.args["round"]) for e in events if e.name == "RoundRevealed") == [0, 1]
    # R·M training units on the roster, each set aside by the step that revealed it (probation) and
    # accepted by its verdict, before the next round started from it; no aggregate unit
    trains = rostered(status)
    assert len(trains) == config.rounds * config.shards and all(u["state"] == "accepted" for u in trains)
    set_aside = [e for e in events if e.name == "UnitSetAside"]
    assert len(set_aside) == config.rounds * config.shards
    on_chain = {int(u["chain_unit_id"]): u for u in status["units"] if u["chain_unit_id"] is not None}
    assert {int(e.args["unitId"]) for e in set_aside} == {int(u["chain_unit_id"]) for u in trains}
    assert sorted(u["kind"] for u in on_chain.values()) == ["train"] * len(set_aside)
    assert all(unit.outcomes == ["accept"] for unit in closed.units), closed.units
    # what each provider was paid (its verdicts' credits and the roster's close, which pays it its whole
    # credit): the buyer's view of the payouts (the set-aside units' verdicts and what the roster's close
    # paid, apps/buyer.py `roster_payouts`), to the unit, provider by provider
    (closing,) = [e for e in events if e.name == "RosterClosed"]
    assert int(closing.args["settledRounds"]) == config.rounds
    money = closed.money
    assert paid == {p: money.payouts.get(p, 0) for p in providers}, (paid, closing.args, money)
    assert sum(paid.values()) == money.payouts_total > 0
    assert closed.checks.results["escrow_balanced"], closed.checks.details.get("escrow_balanced")
    assert not money.slashed
    # the buyer's final weights: its own outer step over the last round, recomputed here bit for bit (the
    # market's current state is the last round's start, which that step began from)
    assert final == training.final_state_digest != status["current_state_digest"]
    assert_whole_curve(config, training.losses, training.round_boundaries)
    for name in ("parties_conserved", "supply_conserved", "providers_paid_exactly"):
        assert closed.checks.results[name], (name, closed.checks.details.get(name))


def assert_whole_curve(config: Any, losses: list[float], boundaries: list[int]) -> None:
    """The buyer's verified loss curve: every training unit the chain accepted, round by round and shard by
    shard (each unit's steps), a boundary where each round after the first starts."""
    per_round = config.shards * config.unit_steps
    assert len(losses) == config.rounds * per_round, (len(losses), boundaries)
    assert boundaries == [r * per_round for r in range(1, config.rounds)]


def operator_gas(market: Marketplace, from_block: int, roster_txs: set[str]) -> tuple[int, int]:
    """(all, roster) gas the market's operator paid from `from_block` on: every transaction it sent (sum
    of receipts), and those that carried the order's roster events."""
    w3 = market.client.w3
    operator = market.parties["operator"].account.address
    total = roster = 0
    for number in range(from_block, int(w3.eth.block_number) + 1):
        for tx in w3.eth.get_block(number, full_transactions=True)["transactions"]:
            if tx["from"] != operator:
                continue
            used = int(w3.eth.get_transaction_receipt(tx["hash"])["gasUsed"])
            total += used
            if bytes(tx["hash"]).hex().removeprefix("0x") in roster_txs:
                roster += used
    return total, roster


def test_a_rounds_order_with_round_audits_pays_its_verifier_and_sets_nothing_aside(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    """No probation and every unit drawn: each round's units are audited by the roster's verifier off chain
    (it re-executes them, recomputes the pending audit chain from the chain and signs), the next round
    starts from them, the step revealing a round leaves them pending and the last step posts the one
    audit; nothing is set aside, and the close pays the verifier its fee for every audited unit."""
    config = folded_order_config(
        tmp_path,
        fresh_postgres_url,
        redis_url,
        private_queue,
        settlement="rounds",
        solo_spot_check_ppm=1_000_000,
        probation_streak=0,
        verdict_window_s=90,  # the posting's challenge window before the close
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        verifiers = [p.address for p in market.verifiers()]
        earned_before = {v: earned(market.client, v) for v in verifiers}  # once staked
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(started + 480)
        status = wait_until(
            market,
            lambda: (s := buyer.status())["roster"]["state"] == "closed" and s,
            started + 500,
            "the roster was not closed",
        )
        paid = {v: earned(market.client, v) - earned_before[v] for v in verifiers}  # the close pays them
        closed = close_and_check(market, buyer, before, started, started + 520)
        events = [
            e for e in market.events(buyer.posted_block) if e.args.get("orderId") == buyer.chain_order_id
        ]
        roster_txs = {
            e.tx_hash.lower().removeprefix("0x")
            for e in events
            if e.name in ("RosterOpened", "RoundCommitted", "RoundRevealed", "AuditPosted", "RosterClosed")
        }
        total_gas, roster_gas = operator_gas(market, buyer.posted_block, roster_txs)
        fee = market.client.get_order(buyer.chain_order_id).verifier_fee_per_unit
        # the buyer's weights from the revealed digests alone (no unit set aside, none assigned per unit)
        final = recompute_final_state(market, status)
        training = collect_training(market, closed.units, status, tmp_path)
    emit(f"test: the audited rounds order completed and was checked in {time.monotonic() - started:.0f} s")

    names = [e.name for e in events]
    audited = {int(e.args["round"]): int(e.args["audited"]) for e in events if e.name == "RoundRevealed"}
    assert audited == {r: (1 << config.shards) - 1 for r in range(config.rounds)}, audited
    assert names.count("AuditPosted") == 1 and names.count("UnitSetAside") == 0, names
    assert names.count("RosterVerifiers") == 1
    trains = rostered(status)
    assert len(trains) == config.rounds * config.shards and all(u["state"] == "accepted" for u in trains)
    assert all(u["chain_unit_id"] is None for u in trains)  # none set aside
    (verifier,) = verifiers
    assert paid[verifier] == config.rounds * config.shards * fee  # every audited unit, nothing else
    assert not closed.money.slashed and not closed.units  # no unit on the per-unit path
    assert final == training.final_state_digest
    # no unit on the per-unit path: every unit of the curve is one its round's step paid
    assert_whole_curve(config, training.losses, training.round_boundaries)
    assert closed.money.audit_fees == paid[verifier]  # the buyer's view of the close's audit fees
    units = config.rounds * config.shards  # the roster's units: the order has no aggregate unit
    emit(
        f"test: the market's own transactions: {total_gas} gas for {units} settled units "
        f"({total_gas // units} a unit); its roster transactions {roster_gas} ({roster_gas // units} a unit)"
    )
    for name in ("escrow_balanced", "providers_paid_exactly", "parties_conserved", "supply_conserved"):
        assert closed.checks.results[name], (name, closed.checks.details.get(name))
