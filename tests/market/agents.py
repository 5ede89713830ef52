"""Test agents and buyers for the market tests: signing keys with their own nonces, a settable clock,
order specs and the on-chain orders that escrow them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from chain_double import LedgerChain
from eth_account.signers.local import LocalAccount

from market.ports import ChainOrder, RegistryRecipeCatalog
from veritrain.chain.eip712 import market_domain, sign_typed
from veritrain.messages import (
    AcceptSubmission,
    AgentRole,
    Heartbeat,
    Offer,
    OrderSpec,
    Registration,
    Signed,
    sign_message,
)

CHAIN_ID = 31337
T0 = 1_900_000_000


@dataclass
class Clock:
    now: int = T0

    def __call__(self) -> int:
        return self.now


@dataclass
class AgentKey:
    """A test agent: its key and its own increasing nonce."""

    account: LocalAccount
    clock: Clock
    operator: str = ""
    nonces: itertools.count = field(default_factory=lambda: itertools.count(1))
    accept_nonces: itertools.count = field(default_factory=itertools.count)  # unordered on chain

    @property
    def address(self) -> str:
        return str(self.account.address)

    def registration(self, role: AgentRole = AgentRole.PROVIDER, **overrides: object) -> Signed[Registration]:
        fields: dict[str, object] = {
            "agent": self.address,
            "nonce": next(self.nonces),
            "timestamp": self.clock.now,
            "role": role,
            "operator": self.operator or self.address,
            "memory_mb": 8192,
            "gflops": 200,
            "hardware_class": "cpu-avx2",
            "recipes": ("digits-mlp", "charlm-tiny"),
            "p2p_addr": f"/ip4/127.0.0.1/tcp/4001/p2p/{self.address}",
        }
        fields.update(overrides)
        return sign_message(Registration.model_validate(fields), self.account.key, CHAIN_ID)

    def heartbeat(self, nonce: int | None = None, timestamp: int | None = None) -> Signed[Heartbeat]:
        message = Heartbeat(
            agent=self.address,
            nonce=next(self.nonces) if nonce is None else nonce,
            timestamp=self.clock.now if timestamp is None else timestamp,
        )
        return sign_message(message, self.account.key, CHAIN_ID)

    def offer(self, price_per_pflop: int) -> Signed[Offer]:
        message = Offer(
            agent=self.address,
            nonce=next(self.nonces),
            timestamp=self.clock.now,
            price_per_pflop=price_per_pflop,
            expires_at=self.clock.now + 3600,
        )
        return sign_message(message, self.account.key, CHAIN_ID)

    def sign(self, primary: str, message: dict[str, object]) -> str:
        domain = market_domain(CHAIN_ID, LedgerChain.job_market_address)
        return "0x" + sign_typed(self.account, domain, primary, message).hex()

    def accept(
        self, unit_id: int, chain_order_id: int, unit_key: str, nonce: int | None = None
    ) -> AcceptSubmission:
        nonce = next(self.accept_nonces) if nonce is None else nonce
        deadline = self.clock.now + 600
        message = {
            "orderId": chain_order_id,
            "unitKey": unit_key,
            "provider": self.address,
            "nonce": nonce,
            "deadline": deadline,
        }
        return AcceptSubmission(
            unit_id=unit_id,
            provider=self.address,
            nonce=nonce,
            deadline=deadline,
            signature=self.sign("Accept", message),
        )


def order_spec(buyer: str, clock: Clock, **overrides: object) -> OrderSpec:
    fields: dict[str, object] = {
        "buyer": buyer,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "ab" * 32,
        "total_steps": 40,
        "unit_steps": 20,
        "replicas": 3,
        "seed": 7,
        "max_price_per_pflop": 10**18,
        "verifier_fee_per_unit": 10**15,
        "deadline": clock.now + 86_400,
    }
    fields.update(overrides)
    return OrderSpec.model_validate(fields)


def chain_order_for(spec: OrderSpec, order_id: int, price_per_replica: int | None = None) -> ChainOrder:
    """The on-chain order a buyer would post for ``spec`` (escrow at the spec's max price by default)."""
    from market.domain.pricing import escrow_plan

    plan = escrow_plan(spec, RegistryRecipeCatalog().lookup(spec.recipe).flops_per_step)
    return ChainOrder(
        order_id=order_id,
        buyer=spec.buyer,
        spec_hash=spec.spec_hash(),
        units=plan.units,
        replicas=plan.replicas,
        price_per_replica=plan.price_per_replica if price_per_replica is None else price_per_replica,
        verifier_fee_per_unit=plan.verifier_fee_per_unit,
        deadline=spec.deadline,
        min_replicas=plan.min_replicas,
        trusted_streak=plan.trusted_streak,
    )
