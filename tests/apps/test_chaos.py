"""`veritrain bench chaos` without its stack: the fault schedule is a function of the seed, the summary
adds the runs' counts up as the issue defines them, and the CLI writes them (the runs themselves are
stubbed here; tests/e2e/test_chaos.py runs real ones); the stack supervises its worker as a supervisor
would over the many runs it serves."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apps import chaos, demo
from apps.chaos import ChaosError, ChaosStack, Fault, FaultInjector, RunRecord, fault_schedule, summarize
from apps.cli import main
from apps.faultproxy import PASS, FaultProxy, LinkMode
from node.agent import UnitRecord
from veritrain.errors import ChildProcessExited


def test_schedule_is_reproducible_from_its_seed_and_stays_in_bounds() -> None:
    schedules = [fault_schedule(seed) for seed in range(200)]
    assert schedules == [fault_schedule(seed) for seed in range(200)]
    assert len({tuple(s) for s in schedules}) > 150  # seeds do give different schedules
    faults = [fault for schedule in schedules for fault in schedule]
    assert {f.action for f in faults} == {"kill", "stop", "crash", "partition", "slow"}
    crashes = [[f for f in s if f.action == "crash"] for s in schedules]
    assert all(len(c) <= 1 for c in crashes) and any(crashes)  # never two providers gone at once
    assert all(f.target == chaos.BUSY_PROVIDER and f.down_s == 0 for c in crashes for f in c)
    named = {"provider-0", "provider-1", "provider-2", "verifier-0", "market", "worker"}
    assert {f.target for f in faults} == named | {chaos.BUSY_PROVIDER, chaos.CHAIN}
    assert all(chaos.FAULT_WINDOW_S[0] <= f.at_s <= chaos.FAULT_WINDOW_S[1] for f in faults)
    assert all(1 <= len(s) <= 4 and s == sorted(s, key=lambda f: f.at_s) for s in schedules)
    # the EVM node is only frozen (a restart would lose its in-memory chain), at most once a run, briefly
    frozen = [[f for f in s if f.target == chaos.CHAIN] for s in schedules]
    assert all(len(c) <= 1 for c in frozen) and 30 <= sum(map(len, frozen)) <= 70
    assert all(f.action == "stop" and f.down_s <= chaos.MARKET_DOWN_S[1] for c in frozen for f in c)
    long = [f for f in faults if f.down_s >= chaos.LONG_DOWN_S[0]]  # long kills and partitions: agents only
    assert {f.action for f in long} == {"kill", "partition"}
    assert all(f.target not in ("market", "worker", chaos.CHAIN) for f in long)
    assert all(f.down_s <= chaos.MARKET_DOWN_S[1] for f in faults if f.target in ("market", "worker"))
    links = [f for f in faults if f.action in ("partition", "slow")]  # link faults: agents only
    assert {f.target for f in links} == named - {"market", "worker"} | {chaos.BUSY_PROVIDER}  # not the chain
    assert {f.action for f in faults if f.target == chaos.BUSY_PROVIDER} == {"crash", "partition"}
    slow = [f for f in links if f.action == "slow"]
    assert all(chaos.SLOW_DELAY_MS[0] <= f.delay_ms <= chaos.SLOW_DELAY_MS[1] for f in slow)
    assert all(chaos.SLOW_LOSS[0] <= f.loss <= chaos.SLOW_LOSS[1] for f in slow)
    assert all(f.delay_ms == 0 and f.loss == 0 for f in faults if f.action != "slow")


def test_the_reveal_window_outlasts_every_outage_the_schedule_draws(tmp_path: Path) -> None:
    """An honest provider cut off past the reveal deadline loses the withhold penalty by design; the bench
    sizes its window so that no drawn outage (with a long kill's restart and a relay) can cause that."""
    faults = [fault for seed in range(500) for fault in fault_schedule(seed, redis=True)]
    longest = max(fault.down_s for fault in faults)
    assert longest <= chaos.LONG_DOWN_S[1]
    config = chaos.chaos_config(tmp_path, None, "q")
    assert config.reveal_window_s >= longest + 10


def test_redis_is_faulted_only_when_the_run_has_its_own() -> None:
    with_redis = [f for seed in range(200) for f in fault_schedule(seed, redis=True)]
    assert {f.action for f in with_redis if f.target == "redis"} == {"kill", "stop"}
    assert all(f.down_s <= chaos.MARKET_DOWN_S[1] for f in with_redis if f.target == "redis")
    assert fault_schedule(11, redis=True) == fault_schedule(11, redis=True)


def test_summary_counts_every_kind_of_failure() -> None:
    clean = RunRecord(run=0, seed=5, schedule=[], injected=[{}, {}], outcome="completed", lost_units=2)
    broken = RunRecord(
        run=1,
        seed=6,
        schedule=[],
        injected=[{}],
        outcome="error",
        lost_units=2,
        double_payments=1,
        stuck_escrow=2,
        false_slashes=1,
        failed_checks=["escrow_balanced"],
    )
    refunded = RunRecord(run=2, seed=7, schedule=[], outcome="refunded")
    summary = summarize([clean, broken, refunded], seed=5, wall_s=12.34)
    assert {k: summary[k] for k in ("runs", "lost_orders", "double_payments", "stuck_escrow")} == {
        "runs": 3,
        "lost_orders": 1,
        "double_payments": 1,
        "stuck_escrow": 2,
    }
    # 2 units lost to 2 faults is 1 per fault; 2 lost to 1 fault is 2 (above the bound)
    assert summary["max_lost_units_per_fault"] == 2
    assert summary["false_slashes"] == 1 and summary["failed_money_checks"] == 1
    assert summary["incomplete_orders"] == 2 and summary["faults_injected"] == 3
    assert [r["seed"] for r in summary["records"]] == [5, 6, 7]


class FakeStack:
    """A marketplace that starts nothing (the runs are stubbed)."""

    def __enter__(self) -> object:
        return object()

    def __exit__(self, *exc: object) -> None:
        return None


def fake_marketplace(monkeypatch: pytest.MonkeyPatch, run_order: Any) -> None:
    """Runs go to ``run_order`` on a marketplace that starts nothing."""
    monkeypatch.setattr(chaos, "run_order", run_order)
    monkeypatch.setattr(chaos, "started_marketplace", lambda config, emit, port, seed: FakeStack())


def test_cli_writes_the_counts_and_fails_when_a_run_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_run_order(stack: Any, record: RunRecord, schedule: Any, emit: Any) -> None:
        record.outcome = "completed" if record.seed == 3 else "error"

    fake_marketplace(monkeypatch, fake_run_order)
    out = tmp_path / "chaos.json"
    assert main(["bench", "chaos", "--runs", "1", "--seed", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["records"][0]["schedule"] == [vars(f) for f in fault_schedule(3)]
    assert main(["bench", "chaos", "--runs", "2", "--seed", "3", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["lost_orders"] == 1
    with pytest.raises(ChaosError):
        chaos.run_chaos(0, 1, tmp_path, "filesystem", print)
    with pytest.raises(ChaosError):
        chaos.run_chaos(1, 1, tmp_path, "rabbitmq", print)


def test_an_interrupted_bench_resumes_from_its_json_and_refuses_another_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []

    def fake_run_order(stack: Any, record: RunRecord, schedule: Any, emit: Any) -> None:
        ran.append(record.seed)
        if record.seed == 12:
            raise KeyboardInterrupt  # the operator stops the bench in its third run
        record.outcome = "completed"

    fake_marketplace(monkeypatch, fake_run_order)
    out = tmp_path / "chaos.json"
    with pytest.raises(KeyboardInterrupt):
        main(["bench", "chaos", "--runs", "4", "--seed", "10", "--json", str(out)])
    saved = json.loads(out.read_text())  # rewritten after each finished run
    assert (saved["runs"], saved["runs_requested"], saved["broker"]) == (2, 4, "filesystem")
    with pytest.raises(ChaosError, match="seed 10"):
        chaos.run_chaos(4, 11, tmp_path, "filesystem", print, out, resume=True)
    with pytest.raises(ChaosError, match="broker"):
        chaos.run_chaos(4, 10, tmp_path, "redis", print, out, resume=True)
    assert json.loads(out.read_text()) == saved  # a refused resume leaves the file alone
    ran.clear()
    monkeypatch.setattr(chaos, "run_order", lambda stack, record, schedule, emit: ran.append(record.seed))
    assert main(["bench", "chaos", "--runs", "4", "--seed", "10", "--json", str(out), "--resume"]) == 1
    summary = json.loads(out.read_text())
    assert ran == [12, 13]  # only the runs the file did not hold
    assert [r["seed"] for r in summary["records"]] == [10, 11, 12, 13] and summary["runs"] == 4
    assert summary["records"][:2] == saved["records"] and summary["lost_orders"] == 2  # 12, 13: "error"
    assert summary["wall_time_s"] >= saved["wall_time_s"]
    out.write_text("{}")
    with pytest.raises(ChaosError, match="not a chaos bench result"):
        chaos.run_chaos(4, 10, tmp_path, "filesystem", print, out, resume=True)


class FakeMarket:
    """Three providers whose data folders live under `work_dir`; records kills and restarts."""

    def __init__(self, work_dir: Path) -> None:
        self.calls: list[str] = []
        self.config = SimpleNamespace(work_dir=work_dir)
        names = [f"provider-{i}" for i in range(3)]
        self.parties = {name: SimpleNamespace(address=f"0x{i}", name=name) for i, name in enumerate(names)}

    def providers(self) -> list[Any]:
        return list(self.parties.values())

    def kill(self, name: str) -> None:
        self.calls.append(f"kill {name}")

    def restart(self, name: str) -> None:
        self.calls.append(f"restart {name}")


def test_a_crash_waits_for_a_busy_provider_which_is_left_alone_until_the_order_ends(tmp_path: Path) -> None:
    market = FakeMarket(tmp_path)
    schedule = [Fault(0.0, "crash", chaos.BUSY_PROVIDER, 0.0), Fault(0.0, "kill", "provider-2", 0.0)]
    stack = ChaosStack(market, FaultProxy())  # type: ignore[arg-type]
    injector = FaultInjector(stack, schedule, lambda line: None)
    injector.tick({"units": [{"unit_id": 1, "state": "proposed", "providers": ["0x1"]}]})
    assert market.calls == []  # nobody trains yet: the crash and the faults behind it wait
    injector.tick({"units": [{"unit_id": 2, "state": "committing", "providers": ["0x2", "0x0"]}]})
    # provider-2 crashed; the kill scheduled for it is not applied (it is down until the order ends)
    assert market.calls == ["kill provider-2"]
    assert [(f["action"], f["target"]) for f in injector.injected] == [("crash", "provider-2")]
    injector.finish()
    assert market.calls == ["kill provider-2", "restart provider-2"] and injector.crashed == []


def test_a_provider_crashed_after_saving_its_commitment_reboots_to_reveal_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 132 (seed 232) of the 2026-11-24 bench: the crash hit provider-1 0.4 s after its commit, it
    stayed down and lost the withhold penalty. A provider whose unsent-or-sent commitment is on its disk
    reboots instead; one whose record has no salt yet (or that revealed) stays down."""
    monkeypatch.setattr(chaos, "REBOOT_S", 0.0)
    market = FakeMarket(tmp_path)
    UnitRecord(unit_id=7, salt="0x" + "11" * 32, committed=True).save(tmp_path / "provider-1" / "units" / "7")
    UnitRecord(unit_id=6, salt="0x" + "22" * 32, revealed=True).save(tmp_path / "provider-0" / "units" / "6")
    schedule = [Fault(0.0, "crash", chaos.BUSY_PROVIDER, 0.0)]
    injector = FaultInjector(ChaosStack(market, FaultProxy()), schedule, lambda line: None)  # type: ignore[arg-type]
    injector.tick({"units": [{"unit_id": 7, "state": "committing", "providers": ["0x1", "0x2"]}]})
    assert market.calls == ["kill provider-1", "restart provider-1"] and injector.crashed == []
    assert injector.injected[0]["rebooted_s"] == 0.0
    for unit_id, name in ((6, "provider-0"), (8, "provider-2")):  # revealed; nothing saved yet
        market.calls.clear()
        injector = FaultInjector(ChaosStack(market, FaultProxy()), list(schedule), lambda line: None)  # type: ignore[arg-type]
        unit = {"unit_id": unit_id, "state": "committing", "providers": [market.parties[name].address]}
        injector.tick({"units": [unit]})
        assert market.calls == [f"kill {name}"] and injector.crashed == [name]


def test_a_link_fault_switches_the_agents_link_for_its_duration_and_heals_it() -> None:
    modes: list[tuple[str, LinkMode]] = []

    class FakeLinks:
        def set_mode(self, link: str, mode: LinkMode) -> None:
            modes.append((link, mode))

    schedule = [
        Fault(0.0, "slow", "provider-1", 0.0, delay_ms=300, loss=0.02),
        Fault(0.0, "partition", "verifier-0", 0.0),
    ]
    stack = ChaosStack(object(), FakeLinks())  # type: ignore[arg-type]
    injector = FaultInjector(stack, schedule, lambda line: None)
    injector.tick({"units": []})
    assert modes == [
        ("provider-1", LinkMode("slow", delay_s=0.3, loss=0.02)),
        ("provider-1", PASS),
        ("verifier-0", LinkMode("partition")),
        ("verifier-0", PASS),
    ]
    assert [f["action"] for f in injector.injected] == ["slow", "partition"]


def test_a_buyer_run_dry_by_many_orders_is_topped_up_before_the_next_runs_snapshot() -> None:
    """Run 181 of the first 200-run bench failed to post its order: the buyer had paid 180 orders'
    providers out of its starting funds. Below a tenth of them it is minted its starting funds again."""
    minted: list[tuple[str, int]] = []
    balances = {"buyer": chaos.BUYER_FUNDS // 10 - 1}
    client = SimpleNamespace(
        token_balance=lambda account: balances[account],
        mint=lambda account, amount: minted.append((account, amount)),
    )
    market: Any = SimpleNamespace(client=client, parties={"buyer": SimpleNamespace(account="buyer")})
    chaos.top_up_buyer(market)
    assert minted == [("buyer", chaos.BUYER_FUNDS)]
    balances["buyer"] = chaos.BUYER_FUNDS // 10
    chaos.top_up_buyer(market)
    assert len(minted) == 1


def test_a_long_lived_stack_restarts_its_worker_as_often_as_a_supervisor_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the 200-run chaos bench (run 91, seed 191): one stack serves many runs, and its worker's
    deaf exit 75 after a Redis fault is normal there (DEPLOY.md: a supervisor restarts it); the stack
    restarted it three times in its whole life, so the fourth exit, 91 runs in, failed the run and lost its
    order. Now the limit is three restarts within a window: a crash loop still fails, a long life does not."""
    monkeypatch.setattr(demo, "WORKER_RESTART_WINDOW_S", 3.0)
    market = demo.Marketplace(demo.DemoConfig(out_dir=tmp_path), emit=lambda line: None)
    deaf = [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(75)"]  # up 0.3 s, then 75

    def start_worker(name: str) -> None:
        market.procs.start(name, deaf)

    def deaf_exit() -> None:
        assert market.procs["worker"].popen.wait() == 75

    monkeypatch.setattr(market, "start_market_process", start_worker)
    with market.procs:
        start_worker("worker")
        for _ in range(demo.MAX_WORKER_RESTARTS):
            deaf_exit()
            market.check_children()  # restarted
            assert market.procs["worker"].alive()
        deaf_exit()
        with pytest.raises(ChildProcessExited, match="exited with code 75"):
            market.check_children()  # a crash loop: a fourth exit within the window fails
        time.sleep(3.1)  # the window passes: the earlier restarts no longer count
        market.check_children()
        assert market.procs["worker"].alive()
