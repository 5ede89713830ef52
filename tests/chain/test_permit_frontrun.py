"""Issue 8 finding 11: somebody who copies an agent's stake permit out of the mempool and submits it to
the token first makes `stakeWithPermit` revert; the agent still stakes, through the allowance that the
front-run permit set. Real EVM (in-process)."""

from __future__ import annotations

from typing import Any

import pytest

from veritrain.agentkit import stake_by_permit
from veritrain.chain import eip712
from veritrain.chain.backends import InProcessBackend
from veritrain.chain.client import ChainClient, Signed

pytestmark = pytest.mark.chain


class FrontRun:
    """The agent's chain client, but the permit it relays is submitted to the token by an attacker first."""

    def __init__(self, client: ChainClient, attacker: Any) -> None:
        self.client = client
        self.attacker = attacker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def stake_with_permit(self, staker: str, amount: int, permit: Signed, *, relayer: Any = None) -> Any:
        v, r, s = eip712.split_signature(permit.signature)
        spender = self.client.deployment.stake_manager
        self.client._send(
            self.attacker, self.client.token, "permit", staker, spender, amount, permit.deadline, v, r, s
        )
        return self.client.stake_with_permit(staker, amount, permit, relayer=relayer)


def test_a_front_run_permit_does_not_block_staking() -> None:
    with InProcessBackend() as backend:
        deployer, agent, attacker = backend.dev_accounts(3)
        client = ChainClient.deploy(backend, deployer)
        client.mint(agent, 10 * 10**18)
        stake_by_permit(FrontRun(client, attacker), agent, 4 * 10**18)  # type: ignore[arg-type]
        assert client.stake_of(agent).bonded == 4 * 10**18
        assert client.allowance(agent, client.deployment.stake_manager) == 0
