"""Prometheus metrics of the market.

Why most families are read from the database at scrape time: the work is done by any number of Celery
workers on other hosts, and the database is the one place that knows all of it. So the API's `/metrics`
is the whole market's state — units by state, matches and declines by reason, verdicts by outcome,
settlement intents, outbox lag, chain-sync lag — the same whichever API replica is scraped, and a restart
loses nothing (counters are counts of rows that are never deleted).

What only the sending process knows — the gas each settlement transaction used — is counted in the worker
that sent it (`WORKER_REGISTRY`, served by `veritrain market worker --metrics-port`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlmodel import col, func, select

from market.domain.matching import DeclineReason
from market.domain.states import OrderState, ReplicaState, UnitState
from market.service import MarketService
from market.store import (
    AgentRow,
    ChainCursorRow,
    MatchLogRow,
    OrderRow,
    OutboxRow,
    ReplicaRow,
    UnitRow,
    VerdictSignatureRow,
    VerificationJobRow,
)

log = logging.getLogger(__name__)

# Outbox entries not yet on chain; their age is the settlement lag.
UNSENT_OUTBOX_STATES = ("pending", "sending")
SENT_OUTBOX_STATES = ("sent", "confirmed")
# Label values every scrape shows, at 0 until they happen (a family without samples would be absent).
DECLINE_REASONS = (*(reason.value for reason in DeclineReason), "not_enough_verifiers")
SETTLEMENT_ACTIONS = (
    "assign",
    "commit",
    "reveal",
    "finalize",
    "verdict",
    "expire",
    "slash_verifier",
)
MATCH_OUTCOMES = ("chosen", "none")
VERDICT_STATES = {
    ReplicaState.ACCEPTED.value: "accept",
    ReplicaState.FAULT.value: "fault",
    ReplicaState.FRAUD.value: "fraud",
}

# --- what a worker process counts itself --------------------------------------------------------------

WORKER_REGISTRY = CollectorRegistry()
SETTLEMENT_SENT = Counter(
    "veritrain_settlement_sent_transactions",
    "Settlement transactions this worker sent and saw mined, by action",
    ["action"],
    registry=WORKER_REGISTRY,
)
SETTLEMENT_GAS = Counter(
    "veritrain_settlement_gas",
    "Gas used by the settlement transactions this worker sent, by action",
    ["action"],
    registry=WORKER_REGISTRY,
)


def record_settlement(action: str, gas_used: int) -> None:
    """A settlement transaction this process sent was mined (called by the chain adapter)."""
    SETTLEMENT_SENT.labels(action).inc()
    SETTLEMENT_GAS.labels(action).inc(gas_used)


# --- the market's state, read from the database -------------------------------------------------------


class MarketCollector(Collector):
    """Families computed from the market's tables on every scrape."""

    def __init__(self, service: MarketService) -> None:
        self.service = service
        # match_log only grows: keep the decline tally and the last row read, so a scrape reads new rows only
        self._lock = threading.Lock()
        self._match_cursor = 0
        self._match_passes: Tally[str] = Tally()
        self._declines: Tally[str] = Tally()

    def collect(self) -> Iterator[Metric]:
        store = self.service.store
        now = self.service.clock()
        with store.transaction() as session:
            units = dict(session.exec(select(UnitRow.state, func.count()).group_by(col(UnitRow.state))).all())
            orders = dict(
                session.exec(select(OrderRow.state, func.count()).group_by(col(OrderRow.state))).all()
            )
            agents = session.exec(
                select(AgentRow.role, AgentRow.online, func.count()).group_by(
                    col(AgentRow.role), col(AgentRow.online)
                )
            ).all()
            replicas = dict(
                session.exec(select(ReplicaRow.state, func.count()).group_by(col(ReplicaRow.state))).all()
            )
            jobs = dict(
                session.exec(
                    select(VerificationJobRow.state, func.count()).group_by(col(VerificationJobRow.state))
                ).all()
            )
            signatures = session.exec(select(func.count()).select_from(VerdictSignatureRow)).one()
            outbox = session.exec(
                select(OutboxRow.action, OutboxRow.state, func.count()).group_by(
                    col(OutboxRow.action), col(OutboxRow.state)
                )
            ).all()
            oldest_unsent = session.exec(
                select(func.min(OutboxRow.created_at)).where(col(OutboxRow.state).in_(UNSENT_OUTBOX_STATES))
            ).one()
            cursor = session.get(ChainCursorRow, "job_market")
            new_logs = session.exec(
                select(MatchLogRow.id, MatchLogRow.selected_json, MatchLogRow.declines_json)
                .where(col(MatchLogRow.id) > self._match_cursor)
                .order_by(col(MatchLogRow.id))
            ).all()
        self._tally_matches(new_logs)

        yield _gauge(
            "veritrain_units", "Units by state", "state", {s.value: units.get(s.value, 0) for s in UnitState}
        )
        yield _gauge(
            "veritrain_orders",
            "Orders by state",
            "state",
            {s.value: orders.get(s.value, 0) for s in OrderState},
        )
        online = GaugeMetricFamily(
            "veritrain_agents", "Registered agents by role and liveness", labels=["role", "online"]
        )
        for role, is_online, count in agents:
            online.add_metric([role, "true" if is_online else "false"], count)
        yield online
        matches = CounterMetricFamily(
            "veritrain_matches",
            "Providers matched to units (replicas proposed), ever",
            value=sum(replicas.values()),
        )
        yield matches
        with self._lock:
            yield _counter(
                "veritrain_match_passes",
                "Matching decisions on a unit, by whether a provider was chosen",
                "outcome",
                {outcome: self._match_passes[outcome] for outcome in MATCH_OUTCOMES},
            )
            yield _counter(
                "veritrain_match_declines",
                "Candidates declined by matching, by reason",
                "reason",
                {reason: self._declines[reason] for reason in {*DECLINE_REASONS, *self._declines}},
            )
        yield _counter(
            "veritrain_verdicts",
            "Settled replicas by outcome (fast-path finalize counts as accept)",
            "outcome",
            {name: replicas.get(state, 0) for state, name in VERDICT_STATES.items()},
        )
        yield _gauge("veritrain_verification_jobs", "Verification jobs by state", "state", jobs)
        yield CounterMetricFamily(
            "veritrain_verdict_signatures", "Verifier verdict signatures received", value=signatures
        )
        intents = GaugeMetricFamily(
            "veritrain_settlement_intents",
            "Settlement outbox entries by action and state",
            labels=["action", "state"],
        )
        sent: Tally[str] = Tally()
        for action, state, count in outbox:
            kind = action.split(":", 1)[0]
            intents.add_metric([kind, state], count)
            if state in SENT_OUTBOX_STATES:
                sent[kind] += count
        yield intents
        yield _counter(
            "veritrain_settlement_transactions",
            "Settlement transactions sent or confirmed on chain, by action",
            "action",
            {action: sent[action] for action in {*SETTLEMENT_ACTIONS, *sent}},
        )
        yield GaugeMetricFamily(
            "veritrain_outbox_lag_seconds",
            "Age of the oldest settlement intent not yet sent (0: none)",
            value=max(0, now - oldest_unsent) if oldest_unsent is not None else 0,
        )
        lag = self._chain_sync_lag(cursor)
        if lag is not None:
            yield GaugeMetricFamily(
                "veritrain_chain_sync_lag_blocks", "Chain blocks not yet applied by the event sync", value=lag
            )

    def _tally_matches(self, rows: Sequence[tuple[int | None, str, str]]) -> None:
        with self._lock:
            for row_id, selected, declines in rows:
                if row_id is None or row_id <= self._match_cursor:
                    continue  # a concurrent scrape already counted it
                self._match_passes["chosen" if json.loads(selected) else "none"] += 1
                for _who, reason in json.loads(declines):
                    self._declines[reason] += 1
                self._match_cursor = row_id

    def _chain_sync_lag(self, cursor: ChainCursorRow | None) -> int | None:
        """Head minus the last block the sync applied; None without a chain or when the node is down."""
        chain = self.service.chain
        if chain is None:
            return None
        try:
            head = chain.block_number()
        except Exception as err:  # the node's trouble must not break the scrape of everything else
            log.warning("chain-sync lag unknown: %s", err)
            return None
        applied = (cursor.next_block if cursor is not None else 0) - 1
        return max(0, head - applied)


def _gauge(name: str, documentation: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _counter(name: str, documentation: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def market_registry(service: MarketService) -> CollectorRegistry:
    """The registry the API's /metrics renders: the market's state from its database."""
    registry = CollectorRegistry()
    registry.register(MarketCollector(service))
    return registry
