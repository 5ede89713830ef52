"""The dashboard in a real browser during a running order, and every /metrics endpoint scraped around it.

One short order on the whole stack as processes (hardhat node, market API, Celery worker, three providers
of which one cheats, one verifier): k = 2 over 2 rounds of charlm-tiny; every unit goes to the verifier
(new providers are on probation). The page must show the loss curve gaining points while the order runs,
and the verdicts of the cheat's unit when it is opened; a screenshot is kept as an artifact. The market,
the worker and each agent must answer /metrics with their families, and the counters must have moved by
the end.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from browser import chromium, save_artifact, unless_stale
from orders import wait_until
from prometheus_client.parser import text_string_to_metric_families

from apps.demo import Buyer, DemoConfig, marketplace, progress_printer, start_stack

pytestmark = [pytest.mark.slow, pytest.mark.node_backend, pytest.mark.torch, pytest.mark.timeout(420)]


def scrape(port: int) -> dict[str, float]:
    """{sample name with sorted labels: value} of the /metrics at 127.0.0.1:port."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: list[dict[str, float]], prefix: str) -> float:
    """Sum of every sample whose name (with labels) starts with `prefix`, over several scrapes."""
    return sum(v for s in samples for k, v in s.items() if k.startswith(prefix))


def test_dashboard_shows_a_running_order_and_every_endpoint_exports_metrics(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    config = DemoConfig(
        out_dir=tmp_path,
        providers=3,
        dishonest=1,
        verifiers=1,
        replicas=2,
        rounds=2,
        unit_steps=16,
        metrics=True,
        timeout_s=300,
    )
    with marketplace(config, progress_printer()) as market, chromium(tmp_path / "profile") as page:
        start_stack(market)
        providers = [p.metrics_port for p in market.providers()]
        verifiers = [p.metrics_port for p in market.verifiers()]
        before = [scrape(port) for port in providers]
        buyer = Buyer(market)
        buyer.post_order()

        page.get(market.market_url + "/")

        def points() -> int | None:
            """Points the page's loss curve shows (the curve's element is redrawn as they arrive)."""
            curve = lambda: page.find_element(By.ID, "loss-curve").get_attribute("data-points")  # noqa: E731
            return unless_stale(lambda: int(curve()))

        first = wait_until(market, points, time.monotonic() + 240, "the loss curve never showed a point")
        more = wait_until(
            market,
            lambda: (points() or 0) > first and points(),
            time.monotonic() + 240,
            "the loss curve gained no points",
        )
        assert more > first

        def disputed_unit() -> int | None:
            """A unit with a signed verdict that calls a replica fraud (every unit of these new providers
            is verified: probation; the cheat, with 20x the stake, is in almost every unit)."""
            data = httpx.get(market.market_url + "/dashboard/data", timeout=10).json()
            for unit in data["units"].values():
                verification = unit["verification"]
                if verification and any("fraud" in v["outcomes"] for v in verification["verdicts"]):
                    return int(unit["id"])
            return None

        unit_id = wait_until(market, disputed_unit, time.monotonic() + 240, "no verdict called fraud")

        def open_unit() -> bool | None:
            """Click the unit's button; None when the list was redrawn under the click (try again)."""

            def click() -> bool:
                page.find_element(By.CSS_SELECTOR, f'button.unit[data-unit-id="{unit_id}"]').click()
                return True

            return unless_stale(click)

        wait_until(market, open_unit, time.monotonic() + 10, "the unit's button could not be clicked")

        def shown() -> tuple[str, list[str]] | None:
            """(title, verdict lines) of the opened unit, once its verdicts are on the page."""
            return unless_stale(
                lambda: (
                    page.find_element(By.ID, "unit-title").text,
                    [e.text for e in page.find_elements(By.CSS_SELECTOR, "#unit-verdicts .verdict")],
                )
            )

        title, verdicts = wait_until(
            market,
            lambda: (view := shown()) and view[1] and view,
            time.monotonic() + 10,
            "the opened unit's verdicts never showed on the page",
        )
        assert any("fraud" in line for line in verdicts) and any("accept" in line for line in verdicts)
        assert title.startswith(str(unit_id))
        screenshot = tmp_path / "dashboard.png"
        page.save_screenshot(str(screenshot))
        save_artifact(screenshot)

        buyer.wait_completed(time.monotonic() + 240)
        after = [scrape(port) for port in providers]
        checked = [scrape(port) for port in verifiers]
        worker = scrape(market.worker_metrics_port)
        api = httpx.get(market.market_url + "/metrics", timeout=10).text

    assert screenshot.stat().st_size > 0
    assert total(after, "veritrain_agent_units_total[('outcome', 'trained')]") >= 3  # 2 rounds x k = 2, less
    assert total(after, "veritrain_agent_units_total") > total(before, "veritrain_agent_units_total")
    assert total(after, "veritrain_training_tokens_total") > 0
    assert total(after, "veritrain_unit_duration_seconds_count") >= 3
    assert max(s.get("veritrain_training_tokens_per_second[]", 0) for s in after) > 0
    assert total(after, "veritrain_agent_heartbeats_total[('result', 'ok')]") > 0
    assert total(after, "veritrain_blob_bytes_served_total") > total(
        before, "veritrain_blob_bytes_served_total"
    )
    assert total(checked, "veritrain_agent_units_total[('outcome', 'verified')]") >= 1
    assert total(checked, "veritrain_agent_verdicts_total[('outcome', 'fraud')]") >= 1
    assert worker["veritrain_settlement_gas_total[('action', 'assign')]"] > 0
    assert worker["veritrain_settlement_sent_transactions_total[('action', 'assign')]"] >= 2
    for family in (
        "veritrain_units",
        "veritrain_match_declines_total",
        "veritrain_verdicts_total",
        "veritrain_settlement_transactions_total",
        "veritrain_outbox_lag_seconds",
        "veritrain_chain_sync_lag_blocks",
    ):
        assert f"# TYPE {family} " in api, family
