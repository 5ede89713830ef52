"""Issue 8 finding 11: somebody who copies an agent's stake permit out of the mempool and submits it to
the token first makes `stakeWithPermit` revert; the agent still stakes, through the allowance that the
front-run permit set. Real EVM (in-process). And a permit signed on a chain idle for an hour is not
already expired when it lands (hardhat node)."""

from __future__ import annotations

from typing import Any

import pytest

from veritrain.agentkit import stake_by_permit
from veritrain.chain import eip712
from veritrain.chain.backends import InProcessBackend, RpcBackend
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


def test_a_permit_signed_on_an_idle_chain_has_not_expired_when_it_lands(world: Any) -> None:
    """Regression: a chain that mines only on transactions keeps its last block's time while idle, so a
    deadline counted from that block (600 s) had passed an hour later, when the agent's own transaction
    made the next block: the permit reverted and the agent could not stake. Deadlines count from the
    pending block."""
    if not isinstance(world.backend, RpcBackend):
        pytest.skip("the in-process EVM's clock moves only with a mined block")
    client, agent = world.client, world.outsider
    client.approve(agent, client.deployment.stake_manager, 0)  # the permit alone can let it stake
    bonded = client.stake_of(agent).bonded
    world.backend._dev_call("evm_increaseTime", [3600])  # an idle hour: time, no block
    stake_by_permit(client, agent, 4 * 10**18)
    assert client.stake_of(agent).bonded == bonded + 4 * 10**18
