"""A file-backed stand-in for the JobMarket, implementing `market.ports.SettlementPort`.

Why a double: a Celery worker process cannot reach the in-process EVM, and most market tests drive the
service with a settable clock that no chain follows. The double models the contract's unit state
machine (collateral locks, commit → reveal → finalize / verdict / expiry, one settlement per unit,
single-use signed forms, a verdict's fraud held until the unit's truth is fixed) and records every effect
in a JSON file under a file lock, so a worker process and the test see the same chain.
`tests/market/test_settlement_port.py` runs the same conformance suite on it and on the real contracts;
what it does not model is listed there (each as a strict xfail): signature recovery, nonce order and block
time (deadlines). Its one clock (`advance_time`) only closes appeal windows (`set_appeal_window`, 0 by
default: a verdict is the unit's truth at once); appeals themselves are not modelled.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from eth_utils import keccak

from market.domain.replication import Reputation
from market.ports import (
    ChainEvent,
    ChainOrder,
    MarketTerms,
    RevealForm,
    SignedAccept,
    SignedCommit,
    SignedVerdict,
)
from veritrain.chain.eip712 import as_bytes32, outcomes_hash
from veritrain.chain.eip712 import commitment as commitment_of
from veritrain.chain.errors import ContractReverted, error_class
from veritrain.settings import Settings

JOB_MARKET = "0x" + "4a" * 20
OPERATOR = "0x" + "0b" * 20  # the double's sender of every transaction (the market's relayer)
DEFAULT_FREE_STAKE = 10**21
PPM = 1_000_000
TERMS = MarketTerms(600, 600, 1200, min_verifiers=1, provider_collateral=10**18, verifier_collateral=10**18)
OPEN_STATES = ("committing", "revealing")
SLASH_AMOUNT = TERMS.provider_collateral // 2  # the contracts in the conformance suite slash the same
OUTCOME_ACCEPT, OUTCOME_FAULT, OUTCOME_FRAUD = 0, 1, 2


def _revert(name: str, **arguments: Any) -> ContractReverted:
    return error_class(name)(name, arguments)


def _key(address: str) -> str:
    return address.lower()


class LedgerChain:
    chain_id = 31337
    job_market_address = JOB_MARKET

    spot_check_ppm = 0  # the contract's spot-check rate; the double draws every unit or none

    def __init__(self, path: Path, chain_id: int = 31337) -> None:
        self.path = Path(path)
        self.chain_id = chain_id
        if not self.path.exists():
            empty: dict[str, Any] = {
                "orders": {},
                "blocks": [],
                "units": {},
                "stake": {},
                "locked": {},
                "reputation": {},
                "used_accept_nonces": [],
            }
            self.path.write_text(json.dumps(empty))

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The whole ledger under an exclusive lock; written back only if the block did not raise (a revert
        leaves no trace, like a reverted transaction)."""
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text())
            yield state
            self.path.write_text(json.dumps(state))

    def _mine(self, state: dict[str, Any], name: str, args: dict[str, Any]) -> str:
        state["blocks"].append({"name": name, "args": args})
        tx_hash = "0x" + keccak(text=f"{len(state['blocks'])}:{name}").hex()
        state.setdefault("tx_blocks", {})[tx_hash] = len(state["blocks"])
        return tx_hash

    # --- test helpers ---

    def add_order(self, order: ChainOrder) -> None:
        """Post ``order`` as `postOrder` does: in a block of its own, which seeds its first draw."""
        with self._state() as state:
            self._mine(state, "OrderPosted", {"orderId": order.order_id, "buyer": order.buyer})
            posted = replace(order, posted_block=len(state["blocks"]))
            state["orders"][str(order.order_id)] = asdict(posted)

    def set_free_stake(self, account: str, amount: int) -> None:
        """Set the account's stake as of before the ledger's first block (no `Staked` event)."""
        with self._state() as state:
            state["stake"][_key(account)] = amount

    def stake(self, account: str, amount: int) -> None:
        """Add ``amount`` to the account's bonded stake in a block of its own, as `StakeManager.stake`."""
        with self._state() as state:
            bonded = int(state["stake"].get(_key(account), DEFAULT_FREE_STAKE))
            state["stake"][_key(account)] = bonded + amount
            self._mine(state, "Staked", {"account": account, "amount": amount})
            state.setdefault("staked_block", {})[_key(account)] = len(state["blocks"])

    def slash(self, account: str, amount: int) -> None:
        """Take ``amount`` of the account's bonded stake, as the StakeManager does for a fraud verdict."""
        with self._state() as state:
            bonded = int(state["stake"].get(_key(account), DEFAULT_FREE_STAKE))
            state["stake"][_key(account)] = bonded - amount
            self._mine(state, "StakeSlashed", {"account": account, "amount": amount, "recipient": JOB_MARKET})

    def advance_time(self, seconds: int) -> None:
        """Move the double's clock, which only closes appeal windows."""
        with self._state() as state:
            state["time"] = int(state.get("time", 0)) + seconds

    def set_appeal_window(self, seconds: int) -> None:
        """How long after a verdict its unit's truth stays open (VerdictAppeals' appeal window)."""
        with self._state() as state:
            state["appeal_window"] = seconds

    def draw(self, unit_id: int) -> None:
        """Draw an open unit for a spot check, as the operator's requestVerification does on chain."""
        self.request_verification(unit_id)

    def request_verification(self, unit_id: int) -> str:
        with self._state() as state:
            unit = self._open_unit(state, unit_id)
            if unit["drawn"]:
                return ""  # as the real port: a unit drawn already is left alone
            unit["drawn"] = True
            return self._mine(state, "VerificationRequested", {"unitId": unit_id})

    def effects(self, name: str) -> list[dict[str, Any]]:
        with self._state() as state:
            return [b["args"] for b in state["blocks"] if b["name"] == name]

    # --- contract rules ---

    def _use_accept_nonces(self, state: dict[str, Any], accepts: Sequence[SignedAccept]) -> None:
        """Accept nonces are unordered: any value once per provider (a reuse reverts as on the contract)."""
        used = set(state["used_accept_nonces"])
        for accept in accepts:
            if f"{_key(accept.provider)}:{accept.nonce}" in used:
                raise _revert("AcceptNonceUsed", provider=accept.provider, nonce=accept.nonce)
        state["used_accept_nonces"].extend(f"{_key(a.provider)}:{a.nonce}" for a in accepts)

    def _open_unit(self, state: dict[str, Any], unit_id: int) -> dict[str, Any]:
        unit: dict[str, Any] | None = state["units"].get(str(unit_id))
        if unit is None:
            raise _revert("InvalidUnitState", unitId=unit_id, state=0)
        if unit["state"] not in OPEN_STATES:
            raise _revert("UnitAlreadySettled", unitId=unit_id)
        return unit

    def _provider_index(self, unit: dict[str, Any], unit_id: int, provider: str) -> str:
        if _key(provider) not in [_key(p) for p in unit["providers"]]:
            raise _revert("NotAssignedProvider", unitId=unit_id, account=provider)
        return _key(provider)

    def _credit_outcome(self, state: dict[str, Any], provider: str, outcome: int, held: bool = False) -> None:
        """Reputation per outcome; fraud counts at the verdict (`held`) and not again when it settles."""
        valid, fault, fraud, consecutive = state["reputation"].get(_key(provider), [0, 0, 0, 0])
        if outcome == OUTCOME_ACCEPT:
            valid, consecutive = valid + 1, consecutive + 1
        elif outcome == OUTCOME_FAULT:
            fault, consecutive = fault + 1, 0
        else:
            fraud, consecutive = fraud + (1 if held else 0), 0
        state["reputation"][_key(provider)] = [valid, fault, fraud, consecutive]

    def _release(self, state: dict[str, Any], providers: Sequence[str]) -> None:
        for provider in providers:
            locked = state["locked"].get(_key(provider), 0)
            state["locked"][_key(provider)] = max(0, locked - TERMS.provider_collateral)

    def _close(
        self, state: dict[str, Any], unit: dict[str, Any], new_state: str, held: Sequence[str] = ()
    ) -> None:
        """Settle the unit: every provider's collateral is released but the `held` ones'."""
        unit["state"] = new_state
        self._release(state, [p for p in unit["providers"] if p not in held])

    def _require_truth(self, state: dict[str, Any], unit_id: int) -> dict[str, Any]:
        """The verdicted unit, once its appeal window passed (VerdictAppeals.truthOf without appeals)."""
        unit: dict[str, Any] | None = state["units"].get(str(unit_id))
        if unit is None or unit["state"] != "verdicted":
            raise _revert("NoVerdict", unitId=unit_id)
        if int(state.get("time", 0)) < unit["truth_at"]:
            raise _revert("TruthNotFixed", unitId=unit_id)
        return unit

    # --- SettlementPort ---

    def get_order(self, order_id: int) -> ChainOrder | None:
        with self._state() as state:
            raw = state["orders"].get(str(order_id))
        return None if raw is None else ChainOrder(**raw)

    def free_stake(self, account: str) -> int:
        with self._state() as state:
            bonded = int(state["stake"].get(_key(account), DEFAULT_FREE_STAKE))
            return bonded - int(state["locked"].get(_key(account), 0))

    def bonded_stake(self, account: str) -> int:
        with self._state() as state:
            return int(state["stake"].get(_key(account), DEFAULT_FREE_STAKE))

    def last_staked_block(self, account: str) -> int:
        with self._state() as state:
            return int(state.get("staked_block", {}).get(_key(account), 0))

    def reputation_of(self, account: str) -> Reputation:
        with self._state() as state:
            return Reputation(*state["reputation"].get(_key(account), [0, 0, 0, 0]))

    def terms(self) -> MarketTerms:
        return TERMS

    def assign(
        self,
        order_id: int,
        unit_key: str,
        providers: Sequence[str],
        verifiers: Sequence[str],
        accepts: Sequence[SignedAccept],
    ) -> int:
        as_bytes32(unit_key, "unit_key")  # malformed input fails before any transaction, as in the client
        with self._state() as state:
            if str(order_id) not in state["orders"]:
                raise _revert("UnknownOrder", orderId=order_id)
            self._use_accept_nonces(state, accepts)
            for provider in providers:
                bonded = int(state["stake"].get(_key(provider), DEFAULT_FREE_STAKE))
                locked = int(state["locked"].get(_key(provider), 0))
                if bonded - locked < TERMS.provider_collateral:
                    raise _revert(
                        "InsufficientFreeStake",
                        account=provider,
                        free=bonded - locked,
                        requested=TERMS.provider_collateral,
                    )
                state["locked"][_key(provider)] = locked + TERMS.provider_collateral
            unit_id = len(state["units"]) + 1
            state["units"][str(unit_id)] = {
                "order_id": order_id,
                "unit_key": unit_key,
                "state": "committing",
                "providers": list(providers),
                "verifiers": list(verifiers),
                "commitments": {},
                "reveals": {},
                "drawn": False,
            }
            self._mine(
                state,
                "UnitAssigned",
                {
                    "unitId": unit_id,
                    "orderId": order_id,
                    "unitKey": unit_key,
                    "providers": list(providers),
                    "verifiers": list(verifiers),
                },
            )
            return unit_id

    def commit_batch(self, unit_id: int, commits: Sequence[SignedCommit]) -> str:
        for commit in commits:
            as_bytes32(commit.commitment, "commitment")
        if not commits:
            raise _revert("EmptyBatch")
        with self._state() as state:  # one bad entry reverts the batch: nothing is written
            unit = self._open_unit(state, unit_id)
            tx_hash = ""
            for commit in commits:
                key = self._provider_index(unit, unit_id, commit.provider)
                if key in unit["commitments"]:
                    raise _revert("AlreadyCommitted", unitId=unit_id, provider=commit.provider)
                unit["commitments"][key] = commit.commitment.lower()
                args = {"unitId": unit_id, "provider": commit.provider, "commitment": commit.commitment}
                tx_hash = self._mine(state, "ReplicaCommitted", args)
            if len(unit["commitments"]) == len(unit["providers"]):
                unit["state"] = "revealing"
            return tx_hash

    def reveal_batch(self, unit_id: int, reveals: Sequence[RevealForm]) -> tuple[bool, str]:
        if not reveals:
            raise _revert("EmptyBatch")
        with self._state() as state:  # one bad entry reverts the batch: nothing is written
            unit = self._open_unit(state, unit_id)
            if unit["state"] == "committing":  # the double has no clock: its commit window never closes
                raise _revert("RevealWindowNotOpen", unitId=unit_id)
            full = len(unit["commitments"]) == len(unit["providers"])
            if full and not unit["reveals"] and not unit["drawn"] and self.spot_check_ppm >= PPM:
                # the contract's draw at the first reveal of a fully committed unit (rate 0 or 100 % here)
                unit["drawn"] = True
                self._mine(state, "VerificationRequested", {"unitId": unit_id})
            tx_hash = ""
            for reveal in reveals:
                preimage = (reveal.result_digest, reveal.salt, reveal.provider, unit_id)
                expected = "0x" + commitment_of(*preimage).hex()
                key = self._provider_index(unit, unit_id, reveal.provider)
                if key in unit["reveals"]:
                    raise _revert("AlreadyRevealed", unitId=unit_id, provider=reveal.provider)
                if unit["commitments"].get(key) != expected:
                    raise _revert("RevealMismatch", unitId=unit_id, provider=reveal.provider)
                unit["reveals"][key] = reveal.result_digest.lower()
                args = {"unitId": unit_id, "provider": reveal.provider, "resultDigest": reveal.result_digest}
                tx_hash = self._mine(state, "ReplicaRevealed", args)
            digests = set(unit["reveals"].values())
            if len(unit["reveals"]) < len(unit["providers"]) or len(digests) != 1 or unit["drawn"]:
                return False, tx_hash
            return True, self._settle_unanimous(state, unit, unit_id)

    def finalize(self, unit_id: int) -> str:
        with self._state() as state:
            unit = self._open_unit(state, unit_id)
            if unit["drawn"]:
                raise _revert("UnitUnderVerification", unitId=unit_id)
            if len(unit["reveals"]) != len(unit["providers"]):
                raise _revert("RevealsIncomplete", unitId=unit_id)
            if len(set(unit["reveals"].values())) != 1:
                raise _revert("NotUnanimous", unitId=unit_id)
            return self._settle_unanimous(state, unit, unit_id)

    def _settle_unanimous(self, state: dict[str, Any], unit: dict[str, Any], unit_id: int) -> str:
        self._close(state, unit, "finalized")
        for provider in unit["providers"]:
            self._credit_outcome(state, provider, OUTCOME_ACCEPT)
        digest = next(iter(unit["reveals"].values()))
        return self._mine(state, "UnitFinalized", {"unitId": unit_id, "resultDigest": digest})

    def submit_verdict(self, unit_id: int, outcomes: Sequence[int], verdicts: Sequence[SignedVerdict]) -> str:
        with self._state() as state:
            unit = self._open_unit(state, unit_id)
            if len(outcomes) != len(unit["providers"]):
                raise _revert("OutcomeCountMismatch", expected=len(unit["providers"]), given=len(outcomes))
            assigned = [_key(v) for v in unit["verifiers"]]
            for verdict in verdicts:
                if _key(verdict.verifier) not in assigned:
                    raise _revert("NotAssignedVerifier", unitId=unit_id, account=verdict.verifier)
            quorum = len(assigned) // 2 + 1  # a majority of the unit's verifiers; no nonce (single-use)
            if len(verdicts) < quorum:
                raise _revert("QuorumNotReached", unitId=unit_id, valid=len(verdicts), required=quorum)
            held = [p for p, o in zip(unit["providers"], outcomes, strict=True) if int(o) == OUTCOME_FRAUD]
            self._close(state, unit, "verdicted", held)
            unit["verdict"] = [int(o) for o in outcomes]
            unit["held"] = held
            unit["truth_at"] = int(state.get("time", 0)) + int(state.get("appeal_window", 0))
            unit["slashed_verifiers"] = []
            for provider, outcome in zip(unit["providers"], outcomes, strict=True):
                self._credit_outcome(state, provider, int(outcome), held=True)
            if held:
                mask = sum(1 << i for i, o in enumerate(outcomes) if int(o) == OUTCOME_FRAUD)
                self._mine(state, "FraudHeld", {"unitId": unit_id, "replicaMask": mask})
            return self._mine(
                state,
                "VerdictRecorded",
                {
                    "unitId": unit_id,
                    "outcomes": list(outcomes),
                    "outcomesHash": "0x" + outcomes_hash([int(o) for o in outcomes]).hex(),
                    "verifiers": [v.verifier for v in verdicts],
                },
            )

    def expire_unit(self, unit_id: int) -> str:
        with self._state() as state:
            unit = self._open_unit(state, unit_id)
            self._close(state, unit, "expired")
            for provider in unit["providers"]:
                if _key(provider) not in unit["reveals"]:
                    self._credit_outcome(state, provider, OUTCOME_FAULT)
            return self._mine(state, "UnitExpired", {"unitId": unit_id})

    def settle_verdict(self, unit_id: int, verdict: Sequence[int]) -> str:
        """VerdictAppeals.settleVerdict for a unit nobody appealed: `verdict` must be the unit's; once its
        appeal window passed, the held fraud replicas are released, slashed and counted as fraud (the
        bounty to the verdict's signers is not modelled). A no-op once nothing is held."""
        with self._state() as state:
            unit = state["units"].get(str(unit_id))
            if unit is None or [int(o) for o in verdict] != unit.get("verdict"):
                raise _revert("OutcomesMismatch", unitId=unit_id)
            self._require_truth(state, unit_id)
            if not unit["held"]:
                return "0x" + keccak(text=f"no-op {len(state['blocks'])}:{unit_id}").hex()
            held, unit["held"] = unit["held"], []
            self._release(state, held)
            for provider in held:
                bonded = int(state["stake"].get(_key(provider), DEFAULT_FREE_STAKE))
                state["stake"][_key(provider)] = bonded - SLASH_AMOUNT
                self._credit_outcome(state, provider, OUTCOME_FRAUD)
                args = {"unitId": unit_id, "provider": provider, "amount": SLASH_AMOUNT}
                self._mine(state, "ReplicaSlashed", args)
            return self._mine(state, "HeldSettled", {"unitId": unit_id, "truth": unit["verdict"]})

    def slash_contradicting_verifier(
        self, unit_id: int, outcomes: Sequence[int], evidence: SignedVerdict
    ) -> str:
        """VerdictAppeals' rule (signature recovery aside) for a unit nobody appealed: once its appeal
        window passed, an assigned verifier whose outcomes differ from the unit's verdict loses the verifier
        slash (here the collateral), once per unit; the sender gets the bounty."""
        with self._state() as state:
            unit = self._require_truth(state, unit_id)
            if _key(evidence.verifier) not in [_key(v) for v in unit["verifiers"]]:
                raise _revert("NotAssignedVerifier", unitId=unit_id, account=evidence.verifier)
            if [int(o) for o in outcomes] == unit["verdict"]:
                raise _revert("VerdictNotContradicted", unitId=unit_id, verifier=evidence.verifier)
            if _key(evidence.verifier) in unit["slashed_verifiers"]:
                raise _revert("VerifierAlreadySlashed", unitId=unit_id, verifier=evidence.verifier)
            unit["slashed_verifiers"].append(_key(evidence.verifier))
            bonded = int(state["stake"].get(_key(evidence.verifier), DEFAULT_FREE_STAKE))
            state["stake"][_key(evidence.verifier)] = bonded - TERMS.verifier_collateral
            return self._mine(
                state,
                "VerifierSlashed",
                {
                    "unitId": unit_id,
                    "verifier": evidence.verifier,
                    "amount": TERMS.verifier_collateral,
                    "reporter": OPERATOR,
                },
            )

    def unit_state(self, unit_id: int) -> str:
        with self._state() as state:
            unit = state["units"].get(str(unit_id))
            return "none" if unit is None else str(unit["state"])

    def block_number(self) -> int:
        with self._state() as state:
            return len(state["blocks"])

    def block_hash(self, block_number: int) -> str:
        return "0x" + keccak(text=f"block:{block_number}").hex()

    def tx_block(self, tx_hash: str) -> int:
        with self._state() as state:
            return int(state["tx_blocks"][tx_hash])

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
