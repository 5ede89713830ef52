"""What the end-to-end tests of one order share: waiting for what the processes do, a provider killed while
it trains, and the order closed and checked from the chain (its money from events, apps.demo's report
checks)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from apps.buyer import UnitOutcome, order_money
from apps.demo import Buyer, DemoConfig, Marketplace, build_report
from apps.demo_report import Checks, Holdings, OrderMoney

T = TypeVar("T")


def folded_order_config(
    out_dir: Path, database_url: str, broker_url: str, queue: str, **overrides: Any
) -> DemoConfig:
    """A small folded DiLoCo order (2 rounds x 2 shards x 40 steps, k = 1) on 2 providers and 1 verifier,
    the stack on the test's own database and Celery queue; `overrides` change the rest."""
    return replace(
        DemoConfig(
            out_dir=out_dir,
            providers=2,
            dishonest=0,
            verifiers=1,
            replicas=1,
            shards=2,
            rounds=2,
            unit_steps=40,
            outer_step="folded",
            database_url=database_url,
            broker_url=broker_url,
            extra_env={"VERITRAIN_CELERY_QUEUE": queue},
        ),
        **overrides,
    )


def wait_until(
    market: Marketplace, condition: Callable[[], T], deadline: float, failure: str | Callable[[], str]
) -> T:
    """Poll `condition` every 0.5 s until it returns something truthy, and return that; fail with `failure`
    once `deadline` (time.monotonic) has passed, and at once when a child of the marketplace has died."""
    while not (value := condition()):
        assert time.monotonic() < deadline, failure if isinstance(failure, str) else failure()
        market.check_children()
        time.sleep(0.5)
    return value


def unit_in_progress(
    market: Marketplace, status: dict[str, Any], round_index: int, kind: str | None = None
) -> tuple[str, int] | None:
    """(provider name, unit id) of a replica of a `round_index` unit (of `kind`, if given) that the order's
    `status` shows being committed and whose provider's log shows training steps."""
    names = {party.address: party.name for party in market.providers()}
    for unit in status["units"]:
        if unit["round_index"] != round_index or unit["state"] != "committing":
            continue
        if kind is not None and unit["kind"] != kind:
            continue
        for address in unit["providers"]:
            log = market.procs[names[address]].log_path.read_text(errors="replace")
            if re.search(rf"unit {unit['unit_id']}: step \d+/", log):
                return names[address], int(unit["unit_id"])
    return None


class KillMidUnit:
    """An `on_tick` for Buyer.wait_completed: SIGKILLs, once and for good, the first provider found
    training a unit of `round_index` (of `kind`, if given); `victim` is (its name, the unit id)."""

    def __init__(
        self, market: Marketplace, emit: Callable[[str], None], round_index: int = 0, kind: str | None = None
    ) -> None:
        self.market, self.emit = market, emit
        self.round_index, self.kind = round_index, kind
        self.victim: tuple[str, int] | None = None

    def __call__(self, status: dict[str, Any]) -> None:
        if self.victim is not None:
            return
        found = unit_in_progress(self.market, status, self.round_index, self.kind)
        if found is not None:
            self.market.kill(found[0])
            self.victim = found
            self.emit(f"test: SIGKILLed {found[0]} while it trained unit {found[1]}")


@dataclass(frozen=True)
class ClosedOrder:
    report: dict[str, Any]
    checks: Checks
    money: OrderMoney
    units: list[UnitOutcome]


def close_and_check(
    market: Marketplace, buyer: Buyer, before: Holdings, started: float, close_by: float
) -> ClosedOrder:
    """Close the order (the rest of its escrow back to the buyer), wait for the chain to settle the fraud
    its verdicts held, withdraw every credit, then read the order's money from the chain's events and run
    the demo report's checks on the holdings."""
    buyer.close(close_by)
    buyer.wait_truth_fixed(close_by)
    market.withdraw_all_credits()
    report, checks = build_report(market, buyer, before, market.holdings(), None, started)
    money, units = order_money(market.events(buyer.posted_block), buyer.chain_order_id)
    return ClosedOrder(report, checks, money, units)
