"""Chain fixtures: every client test runs on the in-process EVM and on a real `hardhat node`.

The hardhat node is one per session, started and stopped by its own PID. Each backend gets one deployed
"world" (contracts, funded and staked parties) per session; every test runs inside a snapshot of it
that is reverted afterwards, so tests are independent and cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from eth_account.signers.local import LocalAccount

from veritrain.chain.backends import Backend, HardhatNode, InProcessBackend
from veritrain.chain.client import ChainClient, Reveal, SignedCommit
from veritrain.chain.deployment import AppealParams, MarketParams

TOKEN = 10**18
TEST_PARAMS = MarketParams(
    commit_window=600,
    reveal_window=600,
    verdict_window=600,
    min_verifiers=2,
    provider_collateral=100 * TOKEN,
    slash_amount=60 * TOKEN,
    bounty_bps=5000,
    verifier_collateral=10 * TOKEN,
    spot_check_ppm=0,  # no random spot checks: a test that wants one draws it (requestVerification)
    solo_spot_check_ppm=0,
    probation_streak=0,  # fresh providers' units are not drawn either (probation: JobMarket.draw.test.js)
)
UNBONDING_PERIOD = 4000
# commit + reveal + verdict + appeal + vote windows must stay below the unbonding period (VerdictAppeals
# checks): 600 + 600 + 600 + 600 + 1200 = 3600.
TEST_APPEALS = AppealParams(appeal_window=600, vote_window=1200)
BUYER_FUNDS = 100_000 * TOKEN
PARTY_FUNDS = 1_000 * TOKEN
PROVIDER_STAKE = 300 * TOKEN
PRICE = 10 * TOKEN
FEE = 3 * TOKEN
VERIFIER_STAKE = 100 * TOKEN


@dataclass
class World:
    """A deployed Veritrain with named, funded parties: providers and verifiers already staked."""

    client: ChainClient
    backend: Backend
    deployer: LocalAccount
    buyer: LocalAccount
    providers: list[LocalAccount]
    verifiers: list[LocalAccount]
    outsider: LocalAccount

    # Small helpers for the common steps; each returns what later steps need.

    def post_order(self, *, units: int = 2, replicas: int = 3) -> int:
        order_id, _ = self.client.post_order(
            self.buyer, os.urandom(32), units, replicas, PRICE, FEE, self.client.now() + 86_400
        )
        return order_id

    def assign(self, order_id: int, providers: list[LocalAccount] | None = None) -> int:
        chosen = providers or self.providers[:3]
        key = os.urandom(32)
        deadline = self.client.now() + 3600
        accepts = [self.client.sign_accept(provider, order_id, key, deadline) for provider in chosen]
        unit_id, _ = self.client.assign(order_id, key, chosen, self.verifiers[:2], accepts)
        return unit_id

    def commit_all(self, unit_id: int, digests: list[bytes]) -> list[bytes]:
        """The first len(digests) providers each commit by their own transaction; returns the salts."""
        salts = []
        for provider, digest in zip(self.providers, digests, strict=False):
            salt = os.urandom(32)
            self.client.commit(provider, unit_id, self.client.commitment(digest, salt, provider, unit_id))
            salts.append(salt)
        return salts

    def reveal_all(self, unit_id: int, digests: list[bytes], salts: list[bytes]) -> None:
        for provider, digest, salt in zip(self.providers, digests, salts, strict=False):
            self.client.reveal(unit_id, provider, digest, salt)

    def signed_commits(
        self, unit_id: int, digests: list[bytes], providers: list[LocalAccount] | None = None
    ) -> tuple[list[SignedCommit], list[Reveal]]:
        """Each provider's signed UnitCommit of its digest (for commit_batch) and the matching reveals."""
        chosen = providers or self.providers[: len(digests)]
        deadline = self.client.now() + 3600
        commits, reveals = [], []
        for provider, digest in zip(chosen, digests, strict=True):
            salt = os.urandom(32)
            commitment = self.client.commitment(digest, salt, provider, unit_id)
            commits.append(self.client.sign_unit_commit(provider, unit_id, commitment, deadline))
            reveals.append(Reveal(provider.address, digest, salt))
        return commits, reveals


def build_world(backend: Backend, params: MarketParams = TEST_PARAMS) -> World:
    accounts = backend.dev_accounts(10)
    deployer, buyer = accounts[0], accounts[1]
    providers, verifiers, outsider = list(accounts[2:6]), list(accounts[6:9]), accounts[9]
    client = ChainClient.deploy(
        backend, deployer, params=params, appeal_params=TEST_APPEALS, unbonding_period=UNBONDING_PERIOD
    )
    client.mint(buyer, BUYER_FUNDS)
    client.approve(buyer, client.deployment.job_market, 2**256 - 1)
    for party in [*providers, *verifiers, outsider]:
        client.mint(party, PARTY_FUNDS)
        client.approve(party, client.deployment.stake_manager, 2**256 - 1)
    for provider in providers:
        client.stake(provider, PROVIDER_STAKE)
    for verifier in verifiers:
        client.stake(verifier, VERIFIER_STAKE)
    return World(client, backend, deployer, buyer, providers, verifiers, outsider)


@pytest.fixture(scope="session")
def hardhat_node() -> Iterator[HardhatNode]:
    with HardhatNode() as node:
        yield node


@pytest.fixture(scope="session")
def inprocess_world() -> Iterator[World]:
    with InProcessBackend() as backend:
        yield build_world(backend)


@pytest.fixture(scope="session")
def hardhat_world(hardhat_node: HardhatNode) -> Iterator[World]:
    with hardhat_node.backend() as backend:
        yield build_world(backend)


@pytest.fixture(params=["inprocess", pytest.param("hardhat", marks=pytest.mark.node_backend)])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """The session's world on one backend, inside a snapshot reverted after the test."""
    yield from reverted(request.getfixturevalue(f"{request.param}_world"))


def reverted(shared: World) -> Iterator[World]:
    """`shared` inside a snapshot reverted afterwards (transaction nonces forgotten with it)."""
    snapshot = shared.backend.snapshot()
    try:
        yield shared
    finally:
        shared.backend.revert(snapshot)
        shared.client.transactor.forget_nonces()
