"""Composition root: build the store, chain port and service from :class:`veritrain.settings.Settings`.

The API process and every Celery worker call :func:`build_service` with the same settings, so both
sides agree on the database, the chain and the recipes.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from market.context import MarketConfig
from market.ports import CanaryAccount, RegistryRecipeCatalog, SettlementPort
from market.service import MarketService
from market.store import MarketStore
from veritrain.errors import ConfigError, MarketError
from veritrain.settings import Settings, load_settings

log = logging.getLogger(__name__)


def load_chain(settings: Settings) -> SettlementPort | None:
    """The chain port named by ``settings.chain_factory`` ("module:callable" taking the settings), or
    the :mod:`veritrain.chain` adapter when a deployments file is set.

    Neither means "not configured": the market still serves agents and matching, and refuses orders
    (it cannot check their escrow) with a clear error.
    """
    spec = settings.chain_factory
    if not spec and settings.deployments_file is not None:
        spec = "market.chain_adapter:connect_chain"
    if not spec:
        return None
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise MarketError(f"chain_factory must look like 'module:callable', got {spec!r}")
    module = importlib.import_module(module_name)
    factory = cast(Callable[[Settings], SettlementPort], getattr(module, attribute))
    return factory(settings)


def load_chain_key(settings: Settings) -> None:
    """Unlock the operator's keystore now (prompting if need be) when the market will settle on a chain
    through :mod:`market.chain_adapter`; the adapter later finds the key unlocked."""
    custom_chain = bool(settings.chain_factory) or settings.deployments_file is None
    if custom_chain or settings.operator_key.get_secret_value():
        return
    from market.chain_adapter import operator_account

    operator_account(settings, prompt=True)


def build_service(settings: Settings | None = None, *, create_schema: bool = True) -> MarketService:
    settings = settings or load_settings()
    settings.ensure_dirs()
    store = MarketStore(settings.database_url)
    if create_schema:
        store.create_schema()
    chain = load_chain(settings)
    if chain is None:
        log.warning("no chain configured (VERITRAIN_CHAIN_FACTORY); orders will be refused")
    canary = load_canary(settings, chain)
    config = MarketConfig(
        chain_id=chain.chain_id if chain else settings.chain_id,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        accept_timeout_s=settings.accept_timeout_s,
        max_skew_s=settings.message_max_skew_s,
        confirmations=settings.chain_confirmations,
        custody_wait_s=settings.custody_wait_s,
        canary_rate_ppm=settings.canary_rate_ppm,
        plant_agents=plant_agents(settings.plant_agents),
        plant_authority=canary.address if canary is not None else None,  # it enrolls fresh plant keys
        plant_rate_ppm=settings.plant_rate_ppm,
    )
    if chain is not None:  # schedule by the contract's own windows and quorum
        terms = chain.terms()
        config = replace(
            config,
            commit_window_s=terms.commit_window_s,
            reveal_window_s=terms.reveal_window_s,
            verdict_window_s=terms.verdict_window_s,
            min_verifiers=terms.min_verifiers,
            verifiers_per_unit=max(config.verifiers_per_unit, terms.min_verifiers),
        )
    return MarketService(store, RegistryRecipeCatalog(), chain, config, canary=canary)


def plant_agents(listed: str) -> frozenset[str]:
    """The operator's planted-cheat agents from ``VERITRAIN_PLANT_AGENTS`` (comma-separated addresses)."""
    from eth_utils import is_address, to_checksum_address

    addresses = [part.strip() for part in listed.split(",") if part.strip()]
    for address in addresses:
        if not is_address(address):
            raise ConfigError(f"VERITRAIN_PLANT_AGENTS: {address!r} is not an address")
    return frozenset(to_checksum_address(address) for address in addresses)


def load_canary(settings: Settings, chain: SettlementPort | None) -> CanaryAccount | None:
    """The canary account from ``VERITRAIN_CANARY_KEY`` on the :mod:`market.chain_adapter` chain; none
    (no canaries) without a key or on another chain port."""
    key = settings.canary_key.get_secret_value()
    from market.chain_adapter import ChainCanaryAccount, ChainClientSettlement

    if not key or not isinstance(chain, ChainClientSettlement):
        return None
    from eth_account import Account

    return ChainCanaryAccount(chain.client, Account.from_key(key))
