"""The dashboard's read model: one JSON document of public market state, polled by the page at `/`.

Public data only: what the chain or the agents' own signed announcements already make public (orders,
units, replicas and their revealed digests, verdict outcomes, settlement transactions, stake, reputation,
hardware class, price). Never signatures, salts before they are revealed on chain, agents' network
addresses or anything about the operator. Bounded: the latest orders only, and each loss curve thinned to
at most ``MAX_CURVE_POINTS`` points, so a long-running market's page stays small.

The shapes of orders, rounds and units here follow the market's tables (an order's `shards`, a unit's
`kind`: `train` or the round's DiLoCo `aggregate`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from sqlmodel import Session, col, func, select

from market.progress import REPORTING_STATES
from market.service import MarketService
from market.store import (
    AgentRow,
    LossPointRow,
    OfferRow,
    OrderRow,
    OutboxRow,
    ReplicaRow,
    RoundRow,
    UnitRow,
    VerdictSignatureRow,
    VerificationJobRow,
)
from veritrain.messages import LOSS_SCALE

DASHBOARD_HTML = files("market").joinpath("dashboard.html").read_text()
MAX_ORDERS = 20
MAX_CURVE_POINTS = 400
OUTCOME_NAMES = {0: "accept", 1: "fault", 2: "fraud"}


def dashboard_state(service: MarketService, max_orders: int = MAX_ORDERS) -> dict[str, Any]:
    """Orders (latest first) with rounds, units and loss curves; providers; verifiers."""
    store = service.store
    with store.transaction() as session:
        orders = session.exec(select(OrderRow).order_by(col(OrderRow.id).desc()).limit(max_orders)).all()
        order_ids = [order.id for order in orders if order.id is not None]
        units = session.exec(
            select(UnitRow).where(col(UnitRow.order_id).in_(order_ids)).order_by(col(UnitRow.id))
        ).all()
        unit_ids = [unit.id for unit in units if unit.id is not None]
        replicas = store.replicas_of_units(session, unit_ids)
        rounds = session.exec(select(RoundRow).where(col(RoundRow.order_id).in_(order_ids))).all()
        jobs = {
            job.unit_id: job
            for job in session.exec(
                select(VerificationJobRow).where(col(VerificationJobRow.unit_id).in_(unit_ids))
            ).all()
        }
        verdicts: dict[int, list[VerdictSignatureRow]] = defaultdict(list)
        job_ids = [job.id for job in jobs.values()]
        for row in session.exec(
            select(VerdictSignatureRow)
            .where(col(VerdictSignatureRow.job_id).in_(job_ids))
            .order_by(col(VerdictSignatureRow.id))
        ).all():
            verdicts[row.job_id].append(row)
        settlement: dict[int, list[OutboxRow]] = defaultdict(list)
        for entry in session.exec(
            select(OutboxRow).where(col(OutboxRow.unit_id).in_(unit_ids)).order_by(col(OutboxRow.id))
        ).all():
            settlement[entry.unit_id].append(entry)
        unit_views = {
            unit.id: _unit(unit, replicas.get(unit.id, []), jobs.get(unit.id), verdicts, settlement[unit.id])
            for unit in units
            if unit.id is not None
        }
        curves = _loss_curves(store.loss_points_of_units(session, unit_ids), units, replicas)
        return {
            "generated_at": service.clock(),
            "chain_id": service.config.chain_id,
            "orders": [_order(order, rounds, units, curves) for order in orders],
            "units": unit_views,
            "providers": _providers(session),
            "verifiers": _verifiers(session),
        }


def _order(
    order: OrderRow,
    rounds: Sequence[RoundRow],
    units: Sequence[UnitRow],
    curves: dict[int, list[list[float]]],
) -> dict[str, Any]:
    spec = json.loads(order.spec_json)
    own_rounds = sorted((r for r in rounds if r.order_id == order.id), key=lambda r: r.index)
    return {
        "id": order.id,
        "chain_order_id": str(order.chain_order_id),
        "buyer": order.buyer,
        "recipe": order.recipe,
        "state": order.state,
        "rounds_total": order.rounds_total,
        "rounds_accepted": order.rounds_accepted,
        "total_steps": spec.get("total_steps"),
        "unit_steps": spec.get("unit_steps"),
        "replicas": spec.get("replicas"),
        "shards": spec.get("shards", 1),
        "max_price_per_pflop": str(order.max_price_per_pflop),
        "deadline": order.deadline,
        "created_at": order.created_at,
        "rounds": [
            {
                "index": r.index,
                "state": r.state,
                "units": [u.id for u in units if u.round_id == r.id],
            }
            for r in own_rounds
        ],
        "loss": curves.get(order.id or 0, []),
    }


def _unit(
    unit: UnitRow,
    replicas: list[ReplicaRow],
    job: VerificationJobRow | None,
    verdicts: dict[int, list[VerdictSignatureRow]],
    settlement: list[OutboxRow],
) -> dict[str, Any]:
    verification = None
    if job is not None and job.id is not None:
        verification = {
            "job_id": job.id,
            "reason": job.reason,
            "state": job.state,
            "verdicts": [
                {
                    "verifier": v.verifier,
                    "outcomes": [OUTCOME_NAMES.get(o, str(o)) for o in json.loads(v.outcomes_json)],
                    # collateral slashed on chain: these outcomes contradicted the unit's verdict
                    "slashed": None if v.slashed is None else str(v.slashed),
                }
                for v in verdicts.get(job.id, [])
            ],
        }
    return {
        "id": unit.id,
        "order_id": unit.order_id,
        "round_index": unit.round_index,
        "shard": unit.shard,
        "kind": unit.kind,
        "attempt": unit.attempt,
        "state": unit.state,
        "chain_unit_id": None if unit.chain_unit_id is None else str(unit.chain_unit_id),
        "start_step": unit.start_step,
        "steps": unit.steps,
        "spot_checked": unit.spot_checked,
        "replicas": [
            {"provider": r.provider, "state": r.state, "result_digest": r.result_digest} for r in replicas
        ],
        "verification": verification,
        "settlement": [{"action": e.action, "state": e.state, "tx_hash": e.tx_hash} for e in settlement],
    }


def _loss_curves(
    points: Sequence[LossPointRow], units: Sequence[UnitRow], replicas: dict[int, list[ReplicaRow]]
) -> dict[int, list[list[float]]]:
    """Per order: [global step, mean reported loss] over the replicas still in good standing, thinned."""
    by_unit = {unit.id: unit for unit in units}
    shown = {
        (unit_id, r.provider)
        for unit_id, rows in replicas.items()
        for r in rows
        if r.state in REPORTING_STATES
    }
    sums: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for point in points:
        unit = by_unit.get(point.unit_id)
        if unit is None or (point.unit_id, point.provider) not in shown:
            continue
        cell = sums[unit.order_id][unit.start_step + point.step]
        cell[0] += point.loss_e6 / LOSS_SCALE
        cell[1] += 1
    curves = {}
    for order_id, steps in sums.items():
        curve = [[step, total / count] for step, (total, count) in sorted(steps.items())]
        stride = -(-len(curve) // MAX_CURVE_POINTS)
        curves[order_id] = curve[::stride] if stride > 1 else curve
    return curves


def _providers(session: Session) -> list[dict[str, Any]]:
    offers = {o.agent: o for o in session.exec(select(OfferRow)).all()}
    rows = session.exec(
        select(AgentRow).where(AgentRow.role == "provider").order_by(col(AgentRow.address))
    ).all()
    return [
        {
            "address": a.address,
            "online": a.online,
            "hardware_class": a.hardware_class,
            "gflops": a.gflops,
            "memory_mb": a.memory_mb,
            "free_stake": str(a.free_stake),
            "reputation": {"valid": a.rep_valid, "fault": a.rep_fault, "fraud": a.rep_fraud},
            "price_per_pflop": str(offers[a.address].price_per_pflop) if a.address in offers else None,
        }
        for a in rows
    ]


def _verifiers(session: Session) -> list[dict[str, Any]]:
    done = dict(
        session.exec(
            select(VerdictSignatureRow.verifier, func.count()).group_by(col(VerdictSignatureRow.verifier))
        ).all()
    )
    rows = session.exec(
        select(AgentRow).where(AgentRow.role == "verifier").order_by(col(AgentRow.address))
    ).all()
    return [
        {
            "address": a.address,
            "online": a.online,
            "free_stake": str(a.free_stake),
            "jobs_done": int(done.get(a.address, 0)),
        }
        for a in rows
    ]
