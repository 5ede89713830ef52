"""A file-backed stand-in for the JobMarket, implementing `market.ports.SettlementPort`.

Why a double: the market's chain adapter needs the chain client's high-level API, which is being
written in parallel; these tests are about the market's own behaviour (outbox idempotency, Celery
delivery, state machines). The double keeps the contract rules the market relies on (a unit key is
assigned once; a unit settles once, a repeat reverts ``UnitAlreadySettled``) and records every effect
in a JSON file under a file lock, so a Celery worker process and the test see the same chain.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eth_utils import keccak

from market.domain.replication import Reputation
from market.ports import ChainEvent, ChainOrder, MarketTerms, SignedAccept, SignedVerdict
from veritrain.chain.errors import error_class
from veritrain.settings import Settings

JOB_MARKET = "0x" + "4a" * 20


class LedgerChain:
    chain_id = 31337
    job_market_address = JOB_MARKET

    def __init__(self, path: Path, chain_id: int = 31337) -> None:
        self.path = Path(path)
        self.chain_id = chain_id
        if not self.path.exists():
            self.path.write_text(json.dumps({"orders": {}, "blocks": [], "units": {}, "stake": {}}))

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text())
            yield state
            self.path.write_text(json.dumps(state))

    def _mine(self, state: dict[str, Any], name: str, args: dict[str, Any]) -> str:
        state["blocks"].append({"name": name, "args": args})
        return "0x" + keccak(text=f"{len(state['blocks'])}:{name}").hex()

    # --- test helpers ---

    def add_order(self, order: ChainOrder) -> None:
        with self._state() as state:
            state["orders"][str(order.order_id)] = asdict(order)

    def set_free_stake(self, account: str, amount: int) -> None:
        with self._state() as state:
            state["stake"][account] = amount

    def effects(self, name: str) -> list[dict[str, Any]]:
        with self._state() as state:
            return [b["args"] for b in state["blocks"] if b["name"] == name]

    # --- SettlementPort ---

    def get_order(self, order_id: int) -> ChainOrder | None:
        with self._state() as state:
            raw = state["orders"].get(str(order_id))
        return None if raw is None else ChainOrder(**raw)

    def free_stake(self, account: str) -> int:
        with self._state() as state:
            return int(state["stake"].get(account, 10**21))

    def reputation_of(self, account: str) -> Reputation:
        return Reputation()

    def terms(self) -> MarketTerms:
        return MarketTerms(600, 600, 1200, verifier_quorum=1, provider_collateral=10**18)

    def assign(
        self,
        order_id: int,
        unit_key: str,
        providers: Sequence[str],
        verifiers: Sequence[str],
        accepts: Sequence[SignedAccept],
    ) -> int:
        with self._state() as state:
            if any(u["unit_key"] == unit_key for u in state["units"].values()):
                raise error_class("UnitKeyUsed")("UnitKeyUsed", {"unitKey": unit_key})
            unit_id = len(state["units"]) + 1
            state["units"][str(unit_id)] = {
                "unit_key": unit_key,
                "settled": False,
                "providers": list(providers),
            }
            self._mine(state, "UnitAssigned", {"unitId": unit_id, "orderId": order_id, "unitKey": unit_key})
            return unit_id

    def commit_with_sig(
        self, unit_id: int, provider: str, commitment: str, nonce: int, deadline: int, signature: str
    ) -> str:
        with self._state() as state:
            return self._mine(state, "Committed", {"unitId": unit_id, "provider": provider})

    def reveal(self, unit_id: int, provider: str, result_digest: str, salt: str) -> str:
        with self._state() as state:
            return self._mine(state, "Revealed", {"unitId": unit_id, "provider": provider})

    def request_verification(self, unit_id: int) -> str:
        with self._state() as state:
            return self._mine(state, "VerificationRequested", {"unitId": unit_id})

    def _settle(self, name: str, unit_id: int, extra: dict[str, Any]) -> str:
        with self._state() as state:
            unit = state["units"][str(unit_id)]
            if unit["settled"]:
                raise error_class("UnitAlreadySettled")("UnitAlreadySettled", {"unitId": unit_id})
            unit["settled"] = True
            return self._mine(state, name, {"unitId": unit_id, **extra})

    def finalize(self, unit_id: int) -> str:
        return self._settle("UnitFinalized", unit_id, {})

    def submit_verdict(
        self, unit_id: int, outcomes: Sequence[int], reasons_hash: str, verdicts: Sequence[SignedVerdict]
    ) -> str:
        return self._settle("VerdictRecorded", unit_id, {"outcomes": list(outcomes)})

    def expire_unit(self, unit_id: int) -> str:
        return self._settle("UnitExpired", unit_id, {})

    def block_number(self) -> int:
        with self._state() as state:
            return len(state["blocks"])

    def block_hash(self, block_number: int) -> str:
        return "0x" + keccak(text=f"block:{block_number}").hex()

    def events(self, from_block: int, to_block: int) -> list[ChainEvent]:
        with self._state() as state:
            blocks = state["blocks"]
        # block n (1-based) holds the n-th transaction
        return [
            ChainEvent(n, 0, blocks[n - 1]["name"], blocks[n - 1]["args"])
            for n in range(max(from_block, 1), min(to_block, len(blocks)) + 1)
        ]


def make_ledger_chain(settings: Settings) -> LedgerChain:
    """Factory for ``VERITRAIN_CHAIN_FACTORY=chain_double:make_ledger_chain`` in worker processes."""
    return LedgerChain(settings.data_dir / "ledger.json", settings.chain_id)
