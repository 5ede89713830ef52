"""A market service on the real contracts and a real store, driven step by step like its agents, a buyer
and an attacker would: the harness of `veritrain bench protocol` and of the settlement-hardening tests
(issue 8). It lives here, not under tests/, because the bench ships with the app."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eth_account.signers.local import LocalAccount
from sqlmodel import select

from market.chain_adapter import ChainClientSettlement
from market.context import MarketConfig
from market.domain.pricing import escrow_plan
from market.domain.replication import ReplicationPolicy
from market.ports import RegistryRecipeCatalog, SettlementPort
from market.service import MarketService
from market.store import MarketStore, OutboxRow, UnitRow, VerificationJobRow
from veritrain.chain.client import ChainClient, Reveal, VerifierSignature
from veritrain.errors import MarketError
from veritrain.messages import (
    AcceptSubmission,
    AgentRole,
    CommitSubmission,
    Heartbeat,
    Offer,
    OrderRequest,
    OrderSpec,
    Registration,
    ReplicaOutcome,
    RevealSubmission,
    VerdictSubmission,
    sign_message,
)
from veritrain.pol import result_digest

STAKE = 200 * 10**18
SALT = "0x" + "a7" * 32
REASONS = "0x" + "00" * 32  # the verdict's off-chain reasons hash: a record only, never compared


class HarnessStepFailed(MarketError):
    """The scripted market did not reach the state a step needs (a bug in the scenario, not a finding)."""


@dataclass(frozen=True)
class Result:
    """A replica's result: the two digests it reports and the result digest that binds them."""

    state_digest: str
    transcript_root: str

    @property
    def digest(self) -> str:
        state, root = (bytes.fromhex(h[2:]) for h in (self.state_digest, self.transcript_root))
        return "0x" + result_digest(state, root).hex()


def word(hex_text: str) -> bytes:
    """A 0x-prefixed 32-byte hex string as the bytes the chain client takes."""
    return bytes.fromhex(hex_text[2:])


def result(label: str) -> Result:
    """A distinct, correctly bound result per label."""
    state = hashlib.sha256(f"state:{label}".encode()).hexdigest()
    root = hashlib.sha256(f"root:{label}".encode()).hexdigest()
    return Result("0x" + state, "0x" + root)


@dataclass
class ChainMarket:
    client: ChainClient
    store: MarketStore
    buyer: LocalAccount
    providers: list[LocalAccount]
    verifiers: list[LocalAccount]
    wrap: Callable[[SettlementPort], SettlementPort] = lambda port: port
    service: MarketService = field(init=False)
    nonces: itertools.count = field(default_factory=lambda: itertools.count(1))
    offset: int = 0  # the market's clock runs this far ahead of the chain's
    verifiers_per_unit: int = 2
    round_audits: bool = True  # rosters with verifiers who audit the drawn units (market/round_audits.py)
    salt: str = SALT  # every replica's commitment salt (a bench varies it per trial)
    # staked accounts in VerdictAppeals' referee pool: the contract, not the market, seats them on a panel
    referees: list[LocalAccount] = field(default_factory=list)

    def __post_init__(self) -> None:
        params = self.client.params
        config = MarketConfig(
            chain_id=self.client.chain_id,
            commit_window_s=params.commit_window,
            reveal_window_s=params.reveal_window,
            verdict_window_s=params.verdict_window,
            min_verifiers=params.min_verifiers,
            verifiers_per_unit=self.verifiers_per_unit,
            round_audits=self.round_audits,
            policy=ReplicationPolicy(base_audit_ppm=0, trusted_audit_ppm=0),
        )
        port = self.wrap(ChainClientSettlement(self.client))
        self.service = MarketService(self.store, RegistryRecipeCatalog(), port, config, clock=self.now)
        for account in self.providers + self.verifiers:
            self.register(account, AgentRole.PROVIDER if account in self.providers else AgentRole.VERIFIER)

    def now(self) -> int:
        return self.client.now() + self.offset

    def register(self, account: LocalAccount, role: AgentRole) -> None:
        registration = Registration(
            agent=account.address,
            nonce=next(self.nonces),
            timestamp=self.now(),
            role=role,
            operator=account.address,
            memory_mb=8192,
            gflops=100,
            hardware_class="cpu",
            recipes=("digits-mlp",),
        )
        self.service.agents.register(sign_message(registration, account.key, self.client.chain_id))
        if role == AgentRole.PROVIDER:
            offer = Offer(
                agent=account.address,
                nonce=next(self.nonces),
                timestamp=self.now(),
                price_per_pflop=10**17,
                expires_at=self.now() + 86_400,
            )
            self.service.agents.post_offer(sign_message(offer, account.key, self.client.chain_id))

    def post_order(self, rounds: int = 2, settlement: str | None = None, **spec_fields: Any) -> int:
        """A buyer's order of ``rounds`` one-unit rounds with 3 replicas (``spec_fields`` override the
        spec's), settled as ``settlement`` asks ("units", "rounds"; None: the market's default); returns the
        market's order id."""
        spec = OrderSpec.model_validate({**self.order_spec(rounds).model_dump(), **spec_fields})
        plan = escrow_plan(spec, RegistryRecipeCatalog().lookup("digits-mlp").flops_per_step, settlement)
        self.client.approve(self.buyer, self.client.deployment.job_market, plan.total)
        chain_order, _ = self.client.post_order(
            self.buyer,
            spec.spec_hash(),
            plan.units,
            plan.replicas,
            plan.price_per_replica,
            plan.verifier_fee_per_unit,
            spec.deadline,
            min_replicas=plan.min_replicas,
            trusted_streak=plan.trusted_streak,
        )
        request = OrderRequest.model_validate(
            {"spec": spec, "chain_order_id": chain_order, "settlement": settlement}
        )
        order = self.service.orders.post_order(request)
        return order.id or 0

    def order_spec(self, rounds: int) -> OrderSpec:
        return OrderSpec(
            buyer=self.buyer.address,
            recipe="digits-mlp",
            dataset_digest="0x" + "cd" * 32,
            total_steps=10 * rounds,
            unit_steps=10,
            replicas=3,
            seed=3,
            max_price_per_pflop=10**18,
            verifier_fee_per_unit=10**15,
            deadline=self.client.now() + 30 * 86_400,
        )

    def unit(self, unit_id: int) -> UnitRow:
        with self.store.transaction() as session:
            return self.store.get_unit(session, unit_id)

    def replica_states(self, unit_id: int) -> list[str]:
        with self.store.transaction() as session:
            return [r.state for r in self.store.replicas_of(session, unit_id)]

    def match_and_accept(self) -> tuple[int, list[LocalAccount]]:
        """Match the pending unit and have its providers sign Accept; returns (unit id, providers)."""
        self.heartbeats()
        matches = self.service.matching.match_pending()
        if len(matches) != 1 or not matches[0].complete:
            raise HarnessStepFailed(f"expected one complete match, got {matches}")
        (match,) = matches
        by_address: dict[str, LocalAccount] = {a.address: a for a in self.providers}
        chosen = [by_address[a] for a in match.selected]
        unit = self.unit(match.unit_id)
        deadline = self.client.now() + 3600
        for provider in chosen:
            signed = self.client.sign_accept(provider, self.order_chain_id(unit), unit.unit_key, deadline)
            self.service.assignments.accept(
                AcceptSubmission(
                    unit_id=match.unit_id,
                    provider=provider.address,
                    nonce=signed.nonce,
                    deadline=deadline,
                    signature="0x" + signed.signature.hex(),
                )
            )
        return match.unit_id, chosen

    def chain_unit(self, unit_id: int) -> int:
        chain_unit = self.unit(unit_id).chain_unit_id
        if chain_unit is None:
            raise HarnessStepFailed(f"unit {unit_id} is not on chain yet")
        return chain_unit

    def order_chain_id(self, unit: UnitRow) -> int:
        with self.store.transaction() as session:
            return self.store.get_order(session, unit.order_id).chain_order_id

    def commit(self, unit_id: int, provider: LocalAccount, res: Result, ttl_s: int = 3600) -> None:
        """``provider`` signs its commit (valid ``ttl_s``) and hands it to the market."""
        chain_unit = self.chain_unit(unit_id)
        deadline = self.client.now() + ttl_s
        commitment = self.client.commitment(res.digest, self.salt, provider, chain_unit)
        signed = self.client.sign_unit_commit(provider, chain_unit, commitment, deadline)
        self.service.assignments.commit(
            CommitSubmission(
                unit_id=unit_id,
                provider=provider.address,
                commitment="0x" + commitment.hex(),
                deadline=deadline,
                signature="0x" + signed.signature.hex(),
            )
        )

    def reveal_submission(self, unit_id: int, provider: LocalAccount, res: Result) -> RevealSubmission:
        return RevealSubmission(
            unit_id=unit_id,
            provider=provider.address,
            result_digest=res.digest,
            salt=self.salt,
            state_digest=res.state_digest,
            transcript_root=res.transcript_root,
        )

    def reveal_on_chain(self, unit_id: int, reveals: dict[str, Result], sender: LocalAccount) -> bool:
        """Reveal straight on the JobMarket (not through the market); True if that finalized the unit."""
        batch = [Reveal(address, word(res.digest), word(self.salt)) for address, res in reveals.items()]
        chain_unit = self.chain_unit(unit_id)
        finalized, _ = self.client.reveal_batch(chain_unit, batch, sender=sender)
        return finalized

    def send_outbox(self, skip: Callable[[str], bool] = lambda action: False) -> list[str]:
        """Send every due outbox entry (in order, again while that lands some) except those ``skip`` names;
        the states of the entries that got past their wait."""
        states: list[str] = []
        for _ in range(10):
            results = [self.service.outbox.send_outbox_entry(e) for e in self.due_entries(skip)]
            done = [r.state for r in results if r.sent or r.state in ("confirmed", "reverted")]
            states += done
            if not done:
                return states
        raise HarnessStepFailed("outbox did not drain")

    def send_held(self) -> list[str]:
        """Let time pass until the market sends what it holds back for a unit's missing replicas (a batch
        waits for them until its phase's deadline less a margin), then send it: what a party that waits
        for the others' commits or reveals to land sees."""
        now = self.now()
        with self.store.transaction() as session:
            held = [e.next_attempt_at for e in self.store.outbox_in(session, ["pending"], 1000)]
        later = [at for at in held if at > now]
        if later:
            self.client.advance_time(min(later) - now)
        return self.send_outbox()

    def due_entries(self, skip: Callable[[str], bool] = lambda action: False) -> list[int]:
        due = self.service.outbox.pending_outbox()
        with self.store.transaction() as session:
            return [e for e in due if not skip(self.store.get_outbox(session, e).action)]

    def outbox_states(self, unit_id: int) -> dict[str, str]:
        with self.store.transaction() as session:
            rows = session.exec(select(OutboxRow).where(OutboxRow.unit_id == unit_id)).all()
            return {row.action: row.state for row in rows}

    def open_job(self, unit_id: int) -> int | None:
        """The unit's open verification job, if the market opened one."""
        with self.store.transaction() as session:
            rows = session.exec(
                select(VerificationJobRow).where(
                    VerificationJobRow.unit_id == unit_id, VerificationJobRow.state == "open"
                )
            ).all()
            return rows[0].id if rows else None

    def sign_verdict(
        self, unit_id: int, verifier: LocalAccount, outcomes: list[int], reasons_hash: str = REASONS
    ) -> VerifierSignature:
        """``verifier`` signs ``outcomes`` (EIP-712 Verdict) and hands them to the market's open job; the
        reasons hash stays off chain (each verifier's own measurements)."""
        job = self.open_job(unit_id)
        if job is None:
            raise HarnessStepFailed(f"unit {unit_id} has no open verification job")
        deadline = self.client.now() + 3600
        signed = self.client.sign_verdict(verifier, self.chain_unit(unit_id), outcomes, deadline)
        self.service.verification.submit_verdict(
            VerdictSubmission(
                job_id=job,
                verifier=verifier.address,
                outcomes=tuple(ReplicaOutcome(o) for o in outcomes),
                reasons_hash=reasons_hash,
                deadline=deadline,
                signature="0x" + signed.signature.hex(),
            )
        )
        return signed

    def heartbeats(self) -> None:
        """Every agent says it is alive, as the real ones do every few seconds: the chain's clock (which
        the market reads) moves with wall time and with each jump a test makes past a deadline."""
        for account in self.providers + self.verifiers:
            beat = Heartbeat(agent=account.address, nonce=next(self.nonces), timestamp=self.now())
            self.service.agents.heartbeat(sign_message(beat, account.key, self.client.chain_id))

    def tick(self) -> None:
        """One pass of the market's worker (the agents' heartbeats first): sweep deadlines, send what is
        due, apply chain events."""
        self.heartbeats()
        self.service.agents.sweep()
        self.send_outbox()
        self.service.sync.sync_chain_events()
        self.send_outbox()


def funded_accounts(client: ChainClient, accounts: list[LocalAccount]) -> None:
    """Mint to every account but the deployer; everyone but the buyer (accounts[1]) stakes."""
    for account in accounts[1:]:
        client.mint(account, 10_000 * 10**18)
    for account in accounts[2:]:
        client.approve(account, client.deployment.stake_manager, STAKE)
        client.stake(account, STAKE)
