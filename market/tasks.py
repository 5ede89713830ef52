"""Celery tasks of the market: short, idempotent wrappers around the market's lifecycles
(:class:`market.service.MarketService`).

Import this module on both sides (the API to send, ``veritrain market worker`` to run); the app is
configured from :func:`veritrain.settings.load_settings` by :mod:`market.celery_config`.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import Celery

from market.celery_config import celery_settings
from market.context import Triggers
from market.runtime import build_service
from market.service import MarketService
from veritrain.settings import load_settings

log = logging.getLogger(__name__)

app = Celery("veritrain-market")
app.config_from_object(celery_settings(load_settings()))


@lru_cache(maxsize=1)
def service() -> MarketService:
    """One service per worker process (its candidate pool survives between tasks)."""
    return wire_triggers(build_service(load_settings()))


def wire_triggers(svc: MarketService) -> MarketService:
    """Let the service send matching / advancing as soon as there is something to do (API and worker)."""

    def send(task_name: str, **kwargs: object) -> None:
        try:
            app.send_task(task_name, kwargs=kwargs, ignore_result=True)
        except Exception:  # a trigger only saves latency: the periodic tick still runs the step
            log.warning("could not send %s; the next tick will run it", task_name, exc_info=True)

    def match(refresh_pool: bool) -> None:
        send("market.match_units", refresh_pool=refresh_pool)

    def advance() -> None:
        send("market.advance_orders")

    def settle() -> None:
        send("market.drain_outbox")

    svc.triggers = Triggers(match=match, advance=advance, settle=settle)
    return svc


@app.task(name="market.match_units")
def match_units(limit: int = 500, refresh_pool: bool = False) -> int:
    """Match pending units; returns how many got a complete set of replicas. ``refresh_pool``: reload the
    candidate pool first (an agent registered, changed its offer, came back or was lost)."""
    svc = service()
    if refresh_pool:
        svc.matching.refresh_pool(force=True)
    return sum(1 for match in svc.matching.match_pending(limit) if match.complete)


@app.task(name="market.advance_orders")
def advance_orders() -> int:
    return service().orders.advance_orders()


@app.task(name="market.sweep_heartbeats")
def sweep_heartbeats() -> dict[str, object]:
    result = service().agents.sweep()
    return {
        "lost_agents": result.lost_agents,
        "dropped_replicas": result.dropped_replicas,
        "expiring_units": result.expiring_units,
    }


@app.task(name="market.send_settlement")
def send_settlement(entry_id: int) -> dict[str, object]:
    """Send one outbox entry; a duplicate delivery finds it claimed or done and has no effect."""
    result = service().outbox.send_outbox_entry(entry_id)
    return {"entry_id": result.entry_id, "state": result.state, "sent": result.sent, "detail": result.detail}


@app.task(name="market.drain_outbox")
def drain_outbox(limit: int = 100) -> int:
    """Dispatch a send task per pending entry (each is idempotent: overlapping drains are harmless)."""
    entries = service().outbox.pending_outbox(limit)
    for entry_id in entries:
        send_settlement.apply_async((entry_id,), ignore_result=True)
    return len(entries)


@app.task(name="market.sync_chain_events")
def sync_chain_events() -> int:
    svc = service()
    return svc.sync.sync_chain_events() if svc.chain is not None else 0


@app.task(name="market.run_canaries")
def run_canaries() -> int:
    """Draw verified units for canaries and post the drawn ones (nothing without a canary account)."""
    return service().canaries.run()


@app.task(name="market.run_rosters")
def run_rosters() -> int:
    """The round path's pass: draw rosters, queue and send their actions (each send is idempotent)."""
    svc = service()
    return svc.roster_outbox.run() if svc.chain is not None else 0


@app.task(name="market.tick", ignore_result=True)
def tick() -> None:
    """Periodic heartbeat of the control plane (celery beat): each step is its own task; nobody reads
    their results, so none are stored."""
    steps = (
        sweep_heartbeats,
        sync_chain_events,
        match_units,
        advance_orders,
        drain_outbox,
        run_canaries,
        run_rosters,
    )
    for task in steps:
        task.apply_async(ignore_result=True)
