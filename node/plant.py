"""The operator's plant agent under keys that are spent one by one (issue 9 item 2, market/canary.py).

Why: a planted cheat is caught whenever its verifiers do their job, and a caught key is spent: its fraud
record would tell the verifiers of its next unit what it is, so the market routes planted units only to
plants never caught. With one key, planting stops at the first catch. Run with `--plant-keys DIR`, the
agent holds the market's canary account key (the authority the market accepts plant enrollments from;
an enrollment is a signed message to the market, never a transaction, so it leaves no trace on chain) and
works under the keys in DIR, in file-name order: the first one without fraud on record is enrolled with
the market (`POST /agents/plants`) and run as an ordinary `--plant` agent until it is caught and has
nothing left to do; then the next one takes over. The operator provisions and funds those keys (tokens
to stake, ether for the stake permit and appeals) on its own: funding them from one account, or from the
canary account, would link them on chain, and the first caught key would give the others away. With no
fresh key left the agent waits for one to appear in DIR. Each time it looks for a key it first gets out what
the slash left of the caught keys' stake (`recover_stakes`), each key by its own transactions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from veritrain.agentkit import (
    HTTP_TIMEOUT_S,
    AgentClock,
    chain_patiently,
    connect_chain,
    register_patiently,
    run_agent,
)

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from node.agent import AgentConfig, ProviderAgent
    from veritrain.api_client import MarketClient
    from veritrain.chain.client import ChainClient

logger = logging.getLogger("veritrain.node.plant")

NO_FRESH_KEY_WAIT_S = 60.0  # how often an agent without a fresh key looks into its key folder again


def plant_keys(folder: Path, password_env: str) -> Iterator[LocalAccount]:
    """The plant keys in `folder` (keystores or key files), in file-name order, each read when needed."""
    from veritrain.keys import load_signer

    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        yield load_signer(path, password_env=password_env, prompt=False)


def current_plant(chain: ChainClient, keys: Iterable[LocalAccount]) -> LocalAccount | None:
    """The first key with no fraud on record (the ones before it were caught), or None."""
    return next((key for key in keys if chain.reputation(key.address).fraud == 0), None)


def recover_stakes(chain: ChainClient, keys: Iterable[LocalAccount]) -> None:
    """Release the thawed unbonding stake of each caught key, then start unbonding its free stake.

    Why: a caught key works no more, but what the slash left stays bonded. Its collateral stays locked
    while its held fraud's appeal window runs, so there may be nothing free yet: a later pass takes it.
    Release goes first because a new unstake request restarts the thaw of all the key's unbonding stake.
    Each key pays its own gas (a transaction from elsewhere would link it); what fails is logged and
    tried again on the next pass, and the runner goes on.
    """
    from veritrain.chain.errors import ChainError
    from veritrain.errors import InvalidInput
    from veritrain.wallet import release, unstake, veri

    steps = (
        (release, "released %s into the wallet of caught plant key %s"),
        (unstake, "unbonding %s of caught plant key %s (released once thawed)"),
    )
    for key in keys:
        try:
            if chain.reputation(key.address).fraud == 0:
                continue
            for step, done in steps:
                try:
                    amount = step(chain, key)
                except InvalidInput as refusal:  # checked before sending: nothing to do for now
                    logger.debug("caught plant key: %s", refusal)
                else:
                    logger.info(done, veri(amount), key.address)
        except ChainError as err:
            logger.error("recovering the stake of caught plant key %s failed: %s", key.address, err)


def enroll_plant(market: MarketClient, authority: LocalAccount, plant: str, chain_id: int) -> None:
    """Ask the market to treat `plant` as the operator's, by the authority's signature."""
    from veritrain.messages import PlantEnrollment, sign_message

    clock = AgentClock()
    message = PlantEnrollment(
        agent=authority.address, nonce=clock.next_nonce(), timestamp=clock.now(), plant=plant
    )
    market.enroll_plant(sign_message(message, authority.key, chain_id))


def run_plants(config: AgentConfig, keys_folder: Path) -> int:
    """Run the first fresh plant key until it is caught and done, then the next, until SIGTERM/SIGINT."""
    from node.agent import ProviderAgent
    from veritrain.api_client import MarketClient
    from veritrain.keys import load_signer

    authority = load_signer(config.keystore, password_env=config.password_env)
    chain = chain_patiently(lambda: connect_chain(config.rpc_url, config.deployments))
    stop = threading.Event()
    with MarketClient(config.market_url, timeout=HTTP_TIMEOUT_S) as market:
        while not stop.is_set():
            recover_stakes(chain, plant_keys(keys_folder, config.password_env))
            plant = chain_patiently(partial(_fresh_key, chain, keys_folder, config.password_env))
            if plant is None:
                logger.error("every plant key in %s is caught: add fresh funded keys there", keys_folder)
                stop.wait(NO_FRESH_KEY_WAIT_S)
                continue
            register_patiently(partial(enroll_plant, market, authority, plant.address, chain.chain_id))
            logger.info("plant key %s enrolled by %s", plant.address, authority.address)
            started: list[ProviderAgent] = []
            keyed = replace(config, data_dir=config.data_dir / plant.address)
            code = run_agent(partial(_start_agent, ProviderAgent, keyed, plant, started), stop)
            if code != 0 or not (started and started[-1].caught):
                return code
    return 0


def _fresh_key(chain: ChainClient, folder: Path, password_env: str) -> LocalAccount | None:
    """The first key of `folder` never caught, read afresh (a retry after an outage starts over)."""
    return current_plant(chain, plant_keys(folder, password_env))


def _start_agent(
    agent_class: type[ProviderAgent], config: AgentConfig, plant: LocalAccount, started: list[ProviderAgent]
) -> ProviderAgent:
    started.append(agent_class(config, plant))
    return started[-1]
