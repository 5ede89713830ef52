"""HTTP client of the market API for agents, buyers and the demo (typed requests and replies).

It lives in the kernel because it speaks only the kernel's messages: the agents reach the market through
it without importing `market/`.

A refused request raises :class:`MarketRefused` carrying the HTTP status, the error type name and the
market's message, so an agent can tell "my nonce was replayed" (409) from "bad signature" (401).
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from veritrain.errors import MarketError
from veritrain.messages import (
    AcceptSubmission,
    Ack,
    AgentInfo,
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

ReplyT = TypeVar("ReplyT", bound=BaseModel)


class MarketRefused(MarketError):
    """The market answered with a 4xx/5xx; ``status``, ``error`` and ``detail`` say why."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        self.status = status
        self.error = error
        self.detail = detail
        super().__init__(f"market refused ({status} {error}): {detail}")


class MarketClient:
    """One HTTP connection pool to a market; pass ``http`` to reuse a client (or FastAPI's TestClient)."""

    def __init__(
        self, base_url: str = "", *, http: httpx.Client | None = None, timeout: float = 10.0
    ) -> None:
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> MarketClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, reply: type[ReplyT], body: BaseModel | None = None) -> ReplyT:
        return reply.model_validate(self._json(method, path, body))

    def _json(self, method: str, path: str, body: BaseModel | None = None) -> Any:
        payload: Any = body.model_dump(mode="json") if body is not None else None
        try:
            response = self.http.request(method, path, json=payload)
        except httpx.TransportError as err:
            raise MarketError(f"market at {self.http.base_url} unreachable: {err}") from err
        if response.status_code >= 400:
            try:
                data = response.json()
            except ValueError:
                data = {}
            error = data.get("error", "HTTPError") if isinstance(data, dict) else "HTTPError"
            detail = data.get("detail", response.text) if isinstance(data, dict) else response.text
            raise MarketRefused(response.status_code, str(error), str(detail))
        return response.json()

    def register(self, signed: Signed[Registration]) -> AgentInfo:
        return self._call("POST", "/agents/register", AgentInfo, signed)

    def enroll_plant(self, signed: Signed[PlantEnrollment]) -> Ack:
        return self._call("POST", "/agents/plants", Ack, signed)

    def heartbeat(self, signed: Signed[Heartbeat]) -> HeartbeatReply:
        return self._call("POST", "/agents/heartbeat", HeartbeatReply, signed)

    def offer(self, signed: Signed[Offer]) -> Ack:
        return self._call("POST", "/agents/offer", Ack, signed)

    def progress(self, signed: Signed[Progress]) -> Ack:
        return self._call("POST", "/agents/progress", Ack, signed)

    def custody(self, signed: Signed[CustodyReport]) -> Ack:
        return self._call("POST", "/agents/custody", Ack, signed)

    def accept(self, submission: AcceptSubmission) -> Ack:
        return self._call("POST", "/assignments/accept", Ack, submission)

    def commit(self, submission: CommitSubmission) -> Ack:
        return self._call("POST", "/assignments/commit", Ack, submission)

    def reveal(self, submission: RevealSubmission) -> Ack:
        return self._call("POST", "/assignments/reveal", Ack, submission)

    def roster_accept(self, submission: RosterAcceptSubmission) -> Ack:
        return self._call("POST", "/rosters/accept", Ack, submission)

    def roster_work(self, submission: RosterWorkSubmission) -> Ack:
        return self._call("POST", "/rosters/work", Ack, submission)

    def roster_opening(self, submission: RosterOpeningSubmission) -> Ack:
        return self._call("POST", "/rosters/opening", Ack, submission)

    def round_audits(self, signed: Signed[Heartbeat]) -> RoundAuditJobsReply:
        return self._call("POST", "/rosters/audits", RoundAuditJobsReply, signed)

    def round_audit(self, submission: RoundAuditSubmission) -> Ack:
        return self._call("POST", "/rosters/audit", Ack, submission)

    def round_audit_refusal(self, signed: Signed[RoundAuditRefusal]) -> Ack:
        return self._call("POST", "/rosters/audit/refusal", Ack, signed)

    def roster(self, order_id: int) -> RosterStatus:
        return self._call("GET", f"/orders/{order_id}/roster", RosterStatus)

    def verification_jobs(self, signed: Signed[Heartbeat]) -> VerificationJobsReply:
        return self._call("POST", "/verification/jobs", VerificationJobsReply, signed)

    def evidence(self, signed: Signed[EvidenceRequest]) -> VerificationJobView:
        return self._call("POST", "/verification/evidence", VerificationJobView, signed)

    def verdict(self, submission: VerdictSubmission) -> Ack:
        return self._call("POST", "/verification/verdict", Ack, submission)

    def post_order(self, request: OrderRequest) -> OrderStatus:
        return self._call("POST", "/orders", OrderStatus, request)

    def order_status(self, order_id: int) -> OrderStatus:
        return self._call("GET", f"/orders/{order_id}", OrderStatus)

    def order_peers(self, order_id: int) -> OrderPeers:
        return self._call("GET", f"/orders/{order_id}/peers", OrderPeers)

    def dashboard_data(self) -> dict[str, Any]:
        """The dashboard's public read model (latest orders with units, verdicts and loss curves)."""
        data = self._json("GET", "/dashboard/data")
        if not isinstance(data, dict):
            raise MarketError("the market's /dashboard/data is not a JSON object")
        return data
