"""The whole marketplace as separate processes: the demo flow on PostgreSQL + Redis, and a provider crash.

Each test starts a hardhat node, the market API, a Celery worker and the agents (apps.demo), and
checks the outcome from on-chain events and balances only — never from the market's own database.
"""

from __future__ import annotations

import re
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from orders import KillMidUnit, close_and_check, wait_until

from apps.buyer import UnitOutcome, order_money
from apps.demo import (
    VERIFIER_FEE_PER_UNIT,
    Buyer,
    DemoConfig,
    Marketplace,
    marketplace,
    progress_printer,
    run_demo,
    start_stack,
)
from apps.demo_report import Checks, OrderMoney
from veritrain.errors import RequestDenied
from veritrain.p2p import P2PNode

pytestmark = [pytest.mark.slow, pytest.mark.node_backend, pytest.mark.torch, pytest.mark.timeout(420)]


@pytest.mark.postgres
@pytest.mark.redis
def test_demo_flow_on_postgresql_and_redis(
    fresh_postgres_url: str, redis_url: str, private_queue: str, tmp_path: Path
) -> None:
    config = DemoConfig(
        out_dir=tmp_path,
        database_url=fresh_postgres_url,
        broker_url=redis_url,
        extra_env={"VERITRAIN_CELERY_QUEUE": private_queue},
        timeout_s=300,
    )
    report = run_demo(config, progress_printer())  # raises DemoCheckFailed if any acceptance check fails

    assert report["conservation_ok"] is True
    assert report["final_loss"] < report["initial_loss"]
    assert len(report["slashed"]) == 1
    dishonest = next(name for name in report["balances"]["before"] if name.endswith("DISHONEST"))
    assert report["balances"]["before"][dishonest]["address"] == report["slashed"][0]
    assert all(report["checks"].values()), report["check_details"]
    assert (tmp_path / "demo-report.json").is_file()
    assert (tmp_path / "loss-curve.png").stat().st_size > 0
    assert (tmp_path / "final-weights.safetensors").stat().st_size > 0


def two_providers_k1(tmp_path: Path) -> DemoConfig:
    """k = 1 on two providers, with short chain windows (the market schedules by them) so that a dead
    attempt settles within about a minute."""
    return DemoConfig(
        out_dir=tmp_path,
        providers=2,
        dishonest=0,
        replicas=1,
        rounds=2,
        unit_steps=80,
        commit_window_s=40,
        reveal_window_s=10,
        verdict_window_s=30,
        extra_env={"VERITRAIN_HEARTBEAT_TIMEOUT_S": "5"},
    )


def assert_paid_once_each(money: OrderMoney, completed: list[UnitOutcome], checks: Checks) -> None:
    """Nothing paid twice: one price per accepted replica, deposit = payouts + verifier fees + refund, and
    the report's money checks hold."""
    price = money.payouts_total // len(completed)
    for address, paid in money.payouts.items():
        assert paid == price * sum(1 for u in completed if u.providers == [address])
    assert money.deposit == money.payouts_total + money.verdict_fees + money.refund
    for name in ("escrow_balanced", "providers_paid_exactly", "parties_conserved", "supply_conserved"):
        assert checks.results[name], (name, checks.details.get(name))


def test_killed_provider_unit_migrates_and_nobody_is_paid_twice(tmp_path: Path) -> None:
    # k = 1 on two providers: when the provider of round 1 dies mid-unit, no replica of that attempt can
    # be accepted, so the unit must fail unpaid and run again on the other provider. Short chain windows
    # (the market schedules by them) so the dead attempt is settled within about a minute. The victim is
    # taken in round 1, whose start state every provider regenerates, so the retry's start is never in
    # question here; a later round's start held only by a killed producer is the next test's case.
    config = two_providers_k1(tmp_path)
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        crash = KillMidUnit(market, emit, round_index=0)
        buyer.wait_completed(started + 360, on_tick=crash)
        assert crash.victim is not None, "no provider was caught mid-unit"
        closed = close_and_check(market, buyer, before, started, started + 380)
        report, checks, money, units = closed.report, closed.checks, closed.money, closed.units
        killed = market.parties[crash.victim[0]].address

    # The victim's attempt settled without paying anyone; the unit ran again, on the other provider.
    dead = [u for u in units if killed in u.providers and "accept" not in u.outcomes]
    assert len(dead) == 1 and dead[0].settlement in ("expired", "verdict"), report["units"]
    later = [u for u in units if u.chain_unit_id > dead[0].chain_unit_id]  # the retry, then round 2
    assert len(later) == config.rounds, report["units"]
    assert all(killed not in u.providers and u.outcomes == ["accept"] for u in later), report["units"]
    completed = [u for u in units if "accept" in u.outcomes]
    assert len(completed) == config.rounds
    assert_paid_once_each(money, completed, checks)


def test_an_accepted_result_outlives_its_only_producer(tmp_path: Path) -> None:
    # k = 1 on two providers: round 1's accepted result is produced by one provider alone. That provider is
    # SIGKILLed for good as soon as round 2 has opened (before 8f65b16 the killed-provider test drew this
    # case by chance in round 2 and stalled on 'no holder served blob'). Round 2 opens only once another
    # agent holds that result (market/custody.py), so round 2 and the order still complete from that copy,
    # and nobody is paid twice.
    config = two_providers_k1(tmp_path)
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        names = {party.address: party.name for party in market.providers()}
        victim: list[tuple[str, str]] = []  # (provider name, the round-1 state it alone produced)

        def kill_the_producer(status: dict[str, Any]) -> None:
            accepted = [u for u in status["units"] if u["round_index"] == 0 and u["state"] == "accepted"]
            if victim or not accepted or not any(u["round_index"] == 1 for u in status["units"]):
                return
            (producer,) = accepted[0]["providers"]
            market.kill(names[producer])
            victim.append((names[producer], accepted[0]["accepted_state_digest"]))
            emit(f"test: SIGKILLed {names[producer]}, the producer of round 1's result, as round 2 opened")

        buyer.wait_completed(started + 360, on_tick=kill_the_producer)
        assert victim, "round 2 never opened"
        closed = close_and_check(market, buyer, before, started, started + 380)
        report, checks, money, units = closed.report, closed.checks, closed.money, closed.units
        killed = market.parties[victim[0][0]].address
        digest = victim[0][1].removeprefix("0x")
        custodians = [
            party.name
            for party in market.agents()
            if party.name != victim[0][0]
            and f"holding state {digest} in custody" in market.procs[party.name].log_path.read_text()
        ]

    assert custodians, "no agent besides the producer reported holding round 1's result"
    # The victim was paid for round 1 only; round 2 was accepted from the other provider.
    completed = [u for u in units if "accept" in u.outcomes]
    assert len(completed) == config.rounds, report["units"]
    assert completed[0].providers == [killed] and completed[1].providers != [killed], report["units"]
    assert_paid_once_each(money, completed, checks)
    assert money.payouts.get(killed, 0) == money.payouts_total // len(completed)


def test_restarted_provider_resumes_its_unit_from_the_last_checkpoint(tmp_path: Path) -> None:
    # A crash followed by a restart within the heartbeat timeout costs only the steps since the last
    # checkpoint: the same provider finishes the same unit and is paid for it once.
    config = DemoConfig(
        out_dir=tmp_path, providers=1, dishonest=0, verifiers=1, replicas=1, rounds=1, unit_steps=200
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        before = start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        provider = market.providers()[0]
        restarted: list[int] = []

        def crash_and_restart(status: dict[str, Any]) -> None:
            log = market.procs[provider.name].log_path.read_text(errors="replace")
            if (
                not restarted
                and (done := re.findall(r"unit \d+: step (\d+)/200", log))
                and int(done[-1]) < 200
            ):
                market.kill(provider.name)
                market.restart(provider.name)
                restarted.append(int(done[-1]))
                emit(f"test: killed and restarted {provider.name} after step {done[-1]}")

        buyer.wait_completed(started + 300, on_tick=crash_and_restart)
        # The provider serves its blobs to parties only: an unstaked throwaway key is refused, the order's
        # buyer (granted when the unit was accepted, before the restart) is served.
        final = str(buyer.status()["current_state_digest"]).removeprefix("0x")
        with P2PNode(Account.create()) as stranger, P2PNode(market.parties["buyer"].account) as owner:
            with pytest.raises(RequestDenied):
                stranger.fetch(provider.peer_addr, final, timeout=30)
            assert sha256(owner.fetch(provider.peer_addr, final, timeout=30)).hexdigest() == final
        closed = close_and_check(market, buyer, before, started, started + 320)
        checks, money, units = closed.checks, closed.money, closed.units
        log = market.procs[provider.name].log_path.read_text(errors="replace")

    assert restarted, "the provider was never caught mid-unit"
    resumed = re.findall(r"resuming after a restart from ckpt-(\d+)\.safetensors", log)
    assert resumed and 0 <= restarted[0] - int(resumed[0]) <= 50  # lost at most one checkpoint interval
    assert len(units) == 1 and units[0].outcomes == ["accept"] and units[0].providers == [provider.address]
    assert list(money.payouts) == [provider.address] and money.escrow_balanced()
    assert checks.results["providers_paid_exactly"] and checks.results["supply_conserved"]


def test_an_auto_order_gives_newcomers_three_replicas_then_a_trusted_provider_an_audited_unit_alone(
    tmp_path: Path,
) -> None:
    """`replicas = auto` through every process: round 0 goes to three newcomers; once they have the order's
    streak (1 here) the first drawn provider works round 1 alone, the chain draws that unit for its solo
    audit (every such unit here), a verifier re-executes it and the verdict pays it; the buyer gets back
    what the two replicas it did not need would have cost."""
    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=0,
        verifiers=1,
        rounds=2,
        unit_steps=16,
        adaptive_replication=True,
        trusted_streak=1,
        solo_spot_check_ppm=1_000_000,
    )
    report = run_demo(config, progress_printer())

    first, second = report["units"]
    assert len(first["replicas"]) == 3 and {r["outcome"] for r in first["replicas"]} == {"accept"}
    assert len(second["replicas"]) == 1 and second["replicas"][0]["outcome"] == "accept"
    assert second["settlement"] == "verdict" and second["signing_verifiers"], second
    price = (report["deposit"] // 2 - VERIFIER_FEE_PER_UNIT) // 3
    assert sum(report["payouts"].values()) == 4 * price
    assert report["refund"] == report["deposit"] - 4 * price - report["verifier_fees"] >= 2 * price
    assert all(report["checks"].values()), report["check_details"]


def test_referee_agents_re_execute_an_appealed_verdict_and_confirm_it(tmp_path: Path) -> None:
    # Six verifier agents, all in VerdictAppeals' referee pool (`--referee`); each unit draws three of them
    # as its verifiers. A dishonest replica makes the unit disputed, so its verifiers settle it with a
    # verdict. An outsider then appeals that (correct) verdict: the chain seats the three verifiers that
    # are not the unit's on the panel; each finds its seat in the chain's events, fetches the unit's
    # evidence from the market, re-executes it, and votes. Their majority confirms the verdict, one of
    # them resolves the appeal, and the appellant's bond goes to the referees who voted.
    from veritrain.chain.client import AppealState

    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=1,
        verifiers=6,
        verifiers_per_unit=3,
        referees=True,
        rounds=1,
        unit_steps=16,
    )
    emit = progress_printer()
    started = time.monotonic()
    with marketplace(config, emit) as market:
        start_stack(market)
        client = market.client
        verifiers = [party.address for party in market.verifiers()]
        wait_until(
            market,
            lambda: all(client.in_referee_pool(address) for address in verifiers),
            started + 180,
            "the verifiers did not all join the referee pool",
        )
        buyer = Buyer(market)
        buyer.post_order()
        verdicts = wait_until(
            market,
            lambda: [e for e in market.events(buyer.posted_block) if e.name == "VerdictRecorded"],
            started + 300,
            "no unit was settled by a verdict",
        )
        unit_id, verdict = int(verdicts[0].args["unitId"]), [int(o) for o in verdicts[0].args["outcomes"]]
        assert 2 in verdict, verdict  # the dishonest replica was judged fraud

        appellant = market.parties["buyer"].account  # any staker may appeal; the buyer has tokens to stake
        bond = client.deployment.appeal_params.appeal_bond
        client.approve(appellant, client.deployment.stake_manager, bond)
        client.stake(appellant, bond)
        client.appeal(unit_id, appellant)
        client.draw_panel(unit_id, sender=appellant)
        replicas = client.get_unit(unit_id).replicas
        unit_parties = {client.replica(unit_id, i).provider for i in range(replicas)}
        unit_parties |= set(client.verifiers_of(unit_id))
        panel = client.get_appeal(unit_id).panel
        assert len(panel) == 3 and set(panel) <= set(verifiers) and not set(panel) & unit_parties
        emit(f"test: appealed unit {unit_id}'s verdict {verdict}; panel {panel}")
        tokens_before = {address: client.token_balance(address) for address in panel}
        wait_until(
            market,
            lambda: client.get_appeal(unit_id).state != AppealState.PENDING,
            started + 400,
            lambda: f"the panel did not end the appeal: {client.get_appeal(unit_id)}",
        )
        appeal = client.get_appeal(unit_id)
        decided = client.unit_events("AppealDecided", unit_id)
        logs = {party.address: market.procs[party.name].log_path.read_text() for party in market.verifiers()}
        gained = {a: client.token_balance(a) - tokens_before[a] for a in panel}
        appellant_stake = client.stake_of(appellant.address)
        buyer.wait_completed(started + 400)

    assert appeal.state == AppealState.CONFIRMED, appeal
    assert [int(o) for o in decided[0].args["outcomes"]] == verdict
    voters = [seat for seat, vote in zip(appeal.panel, appeal.votes, strict=True) if vote != bytes(32)]
    assert len(voters) >= 2, appeal  # a majority of the panel voted the verdict's outcomes
    assert gained == {a: bond // len(voters) if a in voters else 0 for a in panel}  # the bond, to the voters
    for voter in voters:  # each voted what its own re-execution of the unit's evidence found
        found = rf"\(unit {unit_id}, appeal\): \w+ path, outcomes {re.escape(str(tuple(verdict)))}"
        assert re.search(found, logs[voter]), logs[voter]
        assert f"unit {unit_id}: voted {verdict} as a seated referee" in logs[voter]
    assert appellant_stake.bonded == 0 and appellant_stake.locked == 0  # the bond was the stake: all lost


def _canary_unit(market: Marketplace, from_block: int) -> UnitOutcome | None:
    """The canary order's unit as the chain settled it, once it settled and the fraud its verdict held was
    settled too (the canary account's order), with every contract's events (VerifierSlashed is
    VerdictAppeals')."""
    canary = market.parties["canary"].address
    events = market.client.events(from_block)
    posted = [e for e in events if e.name == "OrderPosted" and str(e.args["buyer"]) == canary]
    if not posted:
        return None
    _, units = order_money(events, int(posted[0].args["orderId"]))
    return units[0] if units and units[0].settlement != "open" and not units[0].held else None


def _planted_unit(market: Marketplace, from_block: int, lazy: str) -> UnitOutcome | None:
    """The planted cheat's unit (the canary account's order) once it settled and its held fraud did, and
    the verifier that accepted it was slashed."""
    unit = _canary_unit(market, from_block)
    return unit if unit is not None and lazy in unit.slashed_verifiers else None


def test_a_planted_cheat_slashes_the_verifier_that_accepted_it_without_re_executing(tmp_path: Path) -> None:
    """Issue 9's verifier canary: the operator runs a plant agent (`node run --plant --plant-keys DIR`,
    working under the first key of DIR, which the canary account enrolls with the market); a verified unit
    is replayed as a planted cheat, which the market routes to the plant alone, which forges
    it. Its verifiers see an ordinary drawn unit (the plant is on probation). The lazy verifier accepts the
    unanimous forgery at once; the two that re-execute sign fraud and settle it; once the verdict stands the
    plant is slashed and the lazy verifier's own signature slashes it, read back from the chain. The buyer's
    order never had the plant among its providers. The caught key is spent, so the agent moves to the next
    key of DIR by itself: enrolled, staked, registered."""
    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=0,
        verifiers=3,
        lazy_verifiers=1,
        rounds=1,
        unit_steps=16,
        canary_rate_ppm=0,
        plant=True,
        plant_rate_ppm=1_000_000,
        # the truth that slashes is fixed once the appeal window after the verdict deadline has passed
        commit_window_s=40,
        reveal_window_s=10,
        verdict_window_s=30,
    )
    deadline = time.monotonic() + config.timeout_s
    with marketplace(config, progress_printer()) as market:
        start_stack(market)
        lazy = market.parties["verifier-0-LAZY"].address
        plant, successor = (key.address for key in market.plant_keys)
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(deadline)
        assert all(plant not in unit["providers"] for unit in buyer.status()["units"])
        planted = wait_until(
            market,
            lambda: _planted_unit(market, buyer.posted_block, lazy),
            deadline,
            "the planted unit did not settle, or its lazy verifier was not slashed, in time",
        )
        wait_until(
            market,
            lambda: market.client.stake_of(successor).bonded > 0,
            deadline,
            "the caught plant's agent did not move to a fresh key in time",
        )
    assert planted.providers == [plant] and planted.outcomes == ["fraud"], planted
    assert planted.slashed[plant] > 0
    assert set(planted.slashed_verifiers) == {lazy}  # the two that re-executed keep their stake
    assert lazy not in planted.signing_verifiers and len(planted.signing_verifiers) == 2


def test_a_canary_catches_a_trusted_provider_that_cheats_once_it_works_alone(tmp_path: Path) -> None:
    """Issue 9's "a canary catches a planted cheat": three providers train honestly until they are past the
    order's streak (1), then cheat. The chain draws no solo audit here, so only the canary can catch them:
    the market replays the verified round-0 unit as a canary order, a trusted provider works it alone and
    cheats, its reveal is not the known answer, the market asks the chain to verify it, the verifier's
    re-execution finds the forgery and the verdict slashes it, read back from the chain."""
    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=3,
        dishonest_after=1,
        verifiers=1,
        rounds=1,
        unit_steps=16,
        adaptive_replication=True,
        trusted_streak=1,
        solo_spot_check_ppm=0,
        probation_streak=1,  # past it after round 0: only the canary's known answer can catch the cheat
        canary_rate_ppm=1_000_000,
    )
    deadline = time.monotonic() + config.timeout_s
    with marketplace(config, progress_printer()) as market:
        start_stack(market)
        buyer = Buyer(market)
        buyer.post_order()
        buyer.wait_completed(deadline)
        (round_0,) = buyer.status()["units"]
        assert len(round_0["providers"]) == 3  # worked honestly by three newcomers
        canary_unit = wait_until(
            market,
            lambda: _canary_unit(market, buyer.posted_block),
            deadline,
            "the canary unit did not settle in time",
        )
    (cheater,) = canary_unit.providers
    assert canary_unit.settlement == "verdict" and canary_unit.outcomes == ["fraud"], canary_unit
    assert canary_unit.slashed[cheater] > 0 and canary_unit.signing_verifiers
