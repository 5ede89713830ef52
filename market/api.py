"""HTTP API of the market (FastAPI; OpenAPI at /openapi.json, docs at /docs).

Every route is a thin call into one lifecycle of :class:`market.service.MarketService`; errors map to
4xx by type so a client learns exactly what was wrong, and since the lifecycles check everything before
writing, a 4xx never leaves a change behind.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request, status
from fastapi import Path as FastApiPath
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from market.dashboard import DASHBOARD_HTML, dashboard_state
from market.metrics import market_registry
from market.results import order_peers
from market.service import MarketService
from veritrain.errors import (
    IllegalTransition,
    InvalidInput,
    InvalidSignature,
    MarketError,
    NotAuthorized,
    NotFound,
    RateLimited,
    ReplayedMessage,
    UnderfundedOrder,
    VeritrainError,
)
from veritrain.messages import (
    AcceptSubmission,
    Ack,
    AgentInfo,
    AgentRole,
    CommitSubmission,
    CustodyReport,
    EvidenceRequest,
    Heartbeat,
    HeartbeatReply,
    Offer,
    OrderPeers,
    OrderRequest,
    OrderStatus,
    PlantEnrollment,
    Progress,
    Registration,
    RevealSubmission,
    RosterAcceptSubmission,
    RosterOpeningSubmission,
    RosterStatus,
    RosterWorkSubmission,
    RoundAuditJobsReply,
    RoundAuditRefusal,
    RoundAuditSubmission,
    Signed,
    VerdictSubmission,
    VerificationJobsReply,
    VerificationJobView,
)
from veritrain.ratelimit import TokenBuckets


class ErrorBody(BaseModel):
    error: str
    detail: str


# Most specific first: the first matching class decides the status.
ERROR_STATUS: tuple[tuple[type[VeritrainError], int], ...] = (
    (InvalidSignature, status.HTTP_401_UNAUTHORIZED),
    (NotAuthorized, status.HTTP_403_FORBIDDEN),
    (RateLimited, status.HTTP_429_TOO_MANY_REQUESTS),
    (ReplayedMessage, status.HTTP_409_CONFLICT),
    (UnderfundedOrder, status.HTTP_402_PAYMENT_REQUIRED),
    (InvalidInput, status.HTTP_400_BAD_REQUEST),
    (NotFound, status.HTTP_404_NOT_FOUND),
    (IllegalTransition, status.HTTP_409_CONFLICT),
    (MarketError, status.HTTP_503_SERVICE_UNAVAILABLE),
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 402, 403, 404, 409)
}
# A registration reads the agent's stake and reputation from the chain: rationed per client address.
REGISTER_RATE_PER_S = 2.0
REGISTER_BURST = 20


def status_for(exc: VeritrainError) -> int:
    for cls, code in ERROR_STATUS:
        if isinstance(exc, cls):
            return code
    return status.HTTP_500_INTERNAL_SERVER_ERROR


def create_app(service: MarketService) -> FastAPI:
    app = FastAPI(
        title="Veritrain market",
        version="1",
        description="Control plane: agents register and pull work by signed heartbeats; buyers post orders.",
    )
    app.state.service = service

    @app.exception_handler(VeritrainError)
    async def _veritrain_error(_request: Request, exc: VeritrainError) -> JSONResponse:
        body = ErrorBody(error=type(exc).__name__, detail=str(exc))
        return JSONResponse(status_code=status_for(exc), content=body.model_dump())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Framework-level refusals (unparsable body, unknown route) in the same documented shape."""
        body = ErrorBody(error="HTTPException", detail=str(exc.detail))
        return JSONResponse(status_code=exc.status_code, content=body.model_dump(), headers=exc.headers)

    @app.get("/health")
    def health() -> Ack:
        return Ack(detail="ok")

    metrics = market_registry(service)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        """The market's state in Prometheus text format (market/metrics.py)."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def dashboard_page() -> HTMLResponse:
        """The read-only dashboard: one self-contained page that polls /dashboard/data."""
        return HTMLResponse(DASHBOARD_HTML, headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/data")
    def dashboard_data() -> dict[str, Any]:
        """Public market state for the dashboard: latest orders, their units and loss curves, agents."""
        return dashboard_state(service)

    @app.post("/agents/progress", responses=_ERRORS)
    def progress(signed: Signed[Progress]) -> Ack:
        stored = service.progress.report(signed)
        return Ack(detail=f"{stored} loss points of unit {signed.message.unit_id}")

    register_buckets = TokenBuckets(REGISTER_RATE_PER_S, REGISTER_BURST)

    @app.post("/agents/register", responses={**_ERRORS, 429: {"model": ErrorBody}})
    def register(signed: Signed[Registration], request: Request) -> AgentInfo:
        client_host = request.client.host if request.client else ""
        if not register_buckets.take(client_host, service.ctx.clock()):
            raise RateLimited(f"too many registrations from {client_host}; at most {REGISTER_RATE_PER_S}/s")
        row = service.agents.register(signed)
        return AgentInfo(
            address=row.address, role=AgentRole(row.role), operator=row.operator, online=row.online
        )

    @app.post("/agents/plants", responses=_ERRORS)
    def enroll_plant(signed: Signed[PlantEnrollment]) -> Ack:
        """The canary account enrolls a fresh key of the operator's plant agent (market/canary.py)."""
        plant = service.agents.enroll_plant(signed)
        return Ack(detail=f"{plant} is enrolled as a plant")

    @app.post("/agents/heartbeat", responses=_ERRORS)
    def heartbeat(signed: Signed[Heartbeat]) -> HeartbeatReply:
        return service.agents.heartbeat(signed)

    @app.post("/agents/offer", responses=_ERRORS)
    def offer(signed: Signed[Offer]) -> Ack:
        row = service.agents.post_offer(signed)
        return Ack(detail=f"offer of {row.agent} at {row.price_per_pflop}/PFLOP until {row.expires_at}")

    @app.post("/agents/custody", responses=_ERRORS)
    def custody(signed: Signed[CustodyReport]) -> Ack:
        """An agent holds a state the market asked it to keep; from now on it is listed as a holder."""
        kept = service.custody.report(signed)
        return Ack(detail=f"{signed.message.agent} holds {signed.message.state_digest} for {kept} order(s)")

    @app.post("/assignments/accept", responses=_ERRORS)
    def accept(submission: AcceptSubmission) -> Ack:
        unit = service.assignments.accept(submission)
        return Ack(detail=f"unit {unit.id} is {unit.state}")

    @app.post("/assignments/commit", responses=_ERRORS)
    def commit(submission: CommitSubmission) -> Ack:
        unit = service.assignments.commit(submission)
        return Ack(detail=f"unit {unit.id} is {unit.state}")

    @app.post("/assignments/reveal", responses=_ERRORS)
    def reveal(submission: RevealSubmission) -> Ack:
        unit = service.assignments.reveal(submission)
        return Ack(detail=f"unit {unit.id} is {unit.state}")

    # The round path (market/rosters.py): like the per-unit forms above, each submission is authorized by
    # what it carries (an Accept or RoundCommit signature of the slot's provider; an opening is its
    # commitment's preimage), and checked whole before anything is stored.
    @app.post("/rosters/accept", responses=_ERRORS)
    def roster_accept(submission: RosterAcceptSubmission) -> Ack:
        service.rosters.accept(
            submission.order_id,
            submission.provider,
            submission.nonce,
            submission.deadline,
            submission.signature,
        )
        return Ack(detail=f"{submission.provider} accepted the roster of order {submission.order_id}")

    @app.post("/rosters/work", responses=_ERRORS)
    def roster_work(submission: RosterWorkSubmission) -> Ack:
        service.rosters.submit_work(
            submission.order_id,
            submission.provider,
            submission.round_index,
            submission.commitments,
            submission.signature,
        )
        return Ack(detail=f"{submission.provider}'s work of round {submission.round_index} is held")

    @app.post("/rosters/opening", responses=_ERRORS)
    def roster_opening(submission: RosterOpeningSubmission) -> Ack:
        service.rosters.open_slot(submission)
        return Ack(detail=f"opening of unit {submission.unit} of round {submission.round_index} is held")

    # Round audits (market/round_audits.py): a roster verifier pulls the audits it owes (a signed pull, as
    # /verification/jobs), then hands in its RoundAudit signature (authorized by itself: the same again is a
    # no-op) or a signed refusal (replay-guarded by its nonce).
    @app.post("/rosters/audits", responses=_ERRORS)
    def round_audits(signed: Signed[Heartbeat]) -> RoundAuditJobsReply:
        return service.rosters.audits.jobs(signed, service.orders.unit_work)

    @app.post("/rosters/audit", responses=_ERRORS)
    def round_audit(submission: RoundAuditSubmission) -> Ack:
        state = service.rosters.audits.submit(submission)
        return Ack(detail=f"the audit of round {submission.round_index} is {state}")

    @app.post("/rosters/audit/refusal", responses=_ERRORS)
    def round_audit_refusal(signed: Signed[RoundAuditRefusal]) -> Ack:
        state = service.rosters.audits.refuse(signed)
        return Ack(detail=f"the audit of round {signed.message.round_index} is {state}")

    @app.get("/orders/{order_id}/roster", responses=_ERRORS)
    def roster_of_order(order_id: Annotated[int, FastApiPath(ge=1, le=2**63 - 1)]) -> RosterStatus:
        """A round-path order's roster: its providers and slots, the Accept's unit key, the works deadline,
        and the rounds the chain committed and revealed (404: no roster, or not drawn yet)."""
        with service.store.transaction() as session:
            roster = service.rosters.status(session, order_id)
        if roster is None:
            raise NotFound(f"order {order_id} has no drawn roster")
        return roster

    @app.post("/verification/jobs", responses=_ERRORS)
    def verification_jobs(signed: Signed[Heartbeat]) -> VerificationJobsReply:
        return service.verification.pull_jobs(signed)

    @app.post("/verification/evidence", responses=_ERRORS)
    def evidence(signed: Signed[EvidenceRequest]) -> VerificationJobView:
        return service.verification.evidence(signed)

    @app.post("/verification/verdict", responses=_ERRORS)
    def verdict(submission: VerdictSubmission) -> Ack:
        job = service.verification.submit_verdict(submission)
        return Ack(detail=f"verification job {job.id} is {job.state}")

    @app.post("/orders", status_code=status.HTTP_201_CREATED, responses=_ERRORS)
    def post_order(request: OrderRequest) -> OrderStatus:
        order = service.orders.post_order(request)
        assert order.id is not None
        return service.orders.order_status(order.id)

    @app.get("/orders/{order_id}", responses=_ERRORS)
    def order_status(order_id: Annotated[int, FastApiPath(ge=1, le=2**63 - 1)]) -> OrderStatus:
        return service.orders.order_status(order_id)

    @app.get("/orders/{order_id}/peers", responses=_ERRORS)
    def peers_of_order(order_id: Annotated[int, FastApiPath(ge=1, le=2**63 - 1)]) -> OrderPeers:
        """Where the order's results can be fetched (the buyer checks what it fetches against the chain)."""
        return order_peers(service, order_id)

    return app
