"""The market's :class:`market.ports.SettlementPort` over :class:`veritrain.chain.client.ChainClient`.

The market is the JobMarket operator: it proposes assignments and relays the parties' signed forms,
paying their gas with its own key: the keystore of the settings (``--keystore``), or
``VERITRAIN_OPERATOR_KEY``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import HexStr

from market.domain.pricing import EscrowPlan
from market.domain.replication import Reputation
from market.metrics import record_settlement
from market.ports import (
    ChainEvent,
    ChainOrder,
    MarketTerms,
    RevealForm,
    RosterChainState,
    SignedAccept,
    SignedAudit,
    SignedCommit,
    SignedRoundWork,
    SignedVerdict,
)
from veritrain.chain import client as chain
from veritrain.chain.client import (
    AuditRecord,
    AuditSignature,
    ChainClient,
    Roster,
    RoundSignature,
    RoundWork,
    Signed,
    VerifierSignature,
)
from veritrain.chain.eip712 import as_bytes32, audit_chains, compact_signature, outcomes_hash
from veritrain.chain.errors import VerdictNotContradicted
from veritrain.chain.tx import Receipt
from veritrain.errors import MarketError
from veritrain.keys import load_signer
from veritrain.settings import Settings

ZERO_ADDRESS = "0x" + "0" * 40


def _sig(hex_signature: str) -> bytes:
    return bytes.fromhex(hex_signature.removeprefix("0x"))


def _mined(action: str, receipt: Receipt) -> str:
    """Count a mined settlement transaction and its gas for this worker's /metrics; its hash."""
    record_settlement(action, receipt.gas_used)
    return receipt.tx_hash


def _hex(value: Any) -> Any:
    return "0x" + bytes(value).hex() if isinstance(value, bytes | bytearray) else value


class ChainClientSettlement:
    def __init__(self, client: ChainClient) -> None:
        if client.relayer is None:
            raise MarketError("the market's chain client needs the operator key as its relayer")
        self.client = client
        self.chain_id = client.chain_id
        self.job_market_address = client.deployment.job_market

    def get_order(self, order_id: int) -> ChainOrder | None:
        info = self.client.get_order(order_id)
        if int(info.buyer, 16) == 0 or info.closed:
            return None
        posted = self.client.unit_events("OrderPosted", order_id)
        if not posted:
            return None
        return ChainOrder(
            order_id=order_id,
            buyer=info.buyer,
            spec_hash=_hex(posted[0].args["specHash"]),
            units=info.units,
            replicas=info.replicas,
            price_per_replica=info.price_per_replica,
            verifier_fee_per_unit=info.verifier_fee_per_unit,
            deadline=info.deadline,
            min_replicas=info.min_replicas,
            trusted_streak=info.trusted_streak,
            posted_block=posted[0].block_number,
        )

    def free_stake(self, account: str) -> int:
        return self.client.free_stake(account)

    def bonded_stake(self, account: str) -> int:
        return self.client.stake_of(account).bonded

    def last_staked_block(self, account: str) -> int:
        return self.client.last_staked_block(account)

    def reputation_of(self, account: str) -> Reputation:
        rep = self.client.reputation(account)
        return Reputation(rep.valid, rep.fault, rep.fraud, rep.consecutive_valid)

    def terms(self) -> MarketTerms:
        params = self.client.params
        return MarketTerms(
            commit_window_s=params.commit_window,
            reveal_window_s=params.reveal_window,
            verdict_window_s=params.verdict_window,
            min_verifiers=params.min_verifiers,
            provider_collateral=params.provider_collateral,
            verifier_collateral=params.verifier_collateral,
        )

    def assign(
        self,
        order_id: int,
        unit_key: str,
        providers: Sequence[str],
        verifiers: Sequence[str],
        accepts: Sequence[SignedAccept],
    ) -> int:
        signed = [Signed(a.provider, _sig(a.signature), a.nonce, a.deadline) for a in accepts]
        unit_id, receipt = self.client.assign(order_id, unit_key, list(providers), list(verifiers), signed)
        _mined("assign", receipt)
        return unit_id

    def commit_batch(self, unit_id: int, commits: Sequence[SignedCommit]) -> str:
        signed = [
            chain.SignedCommit(
                c.provider, as_bytes32(c.commitment, "commitment"), c.deadline, _sig(c.signature)
            )
            for c in commits
        ]
        return _mined("commit_batch", self.client.commit_batch(unit_id, signed))

    def reveal_batch(self, unit_id: int, reveals: Sequence[RevealForm]) -> tuple[bool, str]:
        batch = [
            chain.Reveal(r.provider, as_bytes32(r.result_digest, "result_digest"), as_bytes32(r.salt, "salt"))
            for r in reveals
        ]
        finalized, receipt = self.client.reveal_batch(unit_id, batch)
        return finalized, _mined("reveal_batch", receipt)

    def finalize(self, unit_id: int) -> str:
        return _mined("finalize", self.client.finalize(unit_id))

    def request_verification(self, unit_id: int) -> str:
        if self.client.get_unit(unit_id).drawn:
            return ""  # drawn already (a provider on probation): nothing to send
        return _mined("request_verification", self.client.request_verification(unit_id))

    def submit_verdict(self, unit_id: int, outcomes: Sequence[int], verdicts: Sequence[SignedVerdict]) -> str:
        signed = [VerifierSignature(v.verifier, v.deadline, _sig(v.signature)) for v in verdicts]
        return _mined("verdict", self.client.submit_verdict(unit_id, list(outcomes), signed))

    def expire_unit(self, unit_id: int) -> str:
        return _mined("expire", self.client.expire_unit(unit_id))

    def slash_contradicting_verifier(
        self, unit_id: int, outcomes: Sequence[int], evidence: SignedVerdict
    ) -> str:
        # A free read first: until the unit's truth is fixed (appeal window, pending appeal) the send would
        # only revert, and so would evidence that agrees with the truth (the minority after an overturn):
        # raise the contract's own error (TruthNotFixed, AppealLapsed, VerdictNotContradicted) without
        # paying for a transaction.
        if self.client.truth_of(unit_id, pending=True) == outcomes_hash(outcomes):
            raise VerdictNotContradicted(
                "VerdictNotContradicted", {"unitId": unit_id, "verifier": evidence.verifier}
            )
        signed = VerifierSignature(evidence.verifier, evidence.deadline, _sig(evidence.signature))
        return _mined(
            "slash_verifier", self.client.slash_contradicting_verifier(unit_id, list(outcomes), signed)
        )

    def settle_verdict(self, unit_id: int, verdict: Sequence[int]) -> str:
        # A free read first: until the unit's truth is fixed (appeal window, pending appeal) the send would
        # only revert, at every retry of a wait that lasts the appeal window. Both reads are at the pending
        # block: on a chain that mines only on transactions, the latest block's time stops when nothing is
        # sent, and a wait that sends nothing would never see its window pass (the demo's held fraud did).
        self.client.check_settle_verdict(unit_id, list(verdict))
        return _mined("settle_held", self.client.settle_verdict(unit_id, list(verdict)))

    # --- the round path (market.ports.RosterPort) ---

    def roster_state(self, order_id: int) -> RosterChainState:
        info = self.client.get_roster(order_id)
        return RosterChainState(
            key="0x" + info.key.hex(),
            committed=info.committed,
            pending_block=info.pending_block,
            closed=info.closed,
            open_set_aside=info.open_set_aside,
            required_streak=info.required_streak,
            pending_since=info.pending_since,
            set_aside_units=info.set_aside_units,
            audits_pending=info.audits_pending,
        )

    def open_roster(self, order_id: int, roster: Roster, accepts: Sequence[SignedAccept]) -> str:
        signed = [Signed(a.provider, _sig(a.signature), a.nonce, a.deadline) for a in accepts]
        return _mined("open_roster", self.client.open_roster(order_id, roster, signed))

    def step_round(
        self,
        order_id: int,
        roster: Roster,
        openings: Sequence[RevealForm],
        deadline: int,
        work: SignedRoundWork | None,
        verifiers: Sequence[str],
        withheld: int = 0,
        audits: Sequence[SignedAudit] = (),
    ) -> str:
        reveals = [
            chain.Reveal(o.provider, as_bytes32(o.result_digest, "result_digest"), as_bytes32(o.salt, "salt"))
            for o in openings
        ]
        compact = (
            None
            if work is None
            else RoundWork(
                tuple(as_bytes32(c, "commitment") for c in work.commitments),
                tuple(RoundSignature.of(_sig(s)) for s in work.signatures),
            )
        )
        signed = [AuditSignature(a.verifier, *compact_signature(_sig(a.signature))) for a in audits]
        receipt = self.client.step_round(
            order_id,
            roster,
            reveals,
            deadline,
            compact,
            withheld=withheld,
            verifiers=list(verifiers),
            audits=signed,
            audit_records=self.client.audit_records(order_id),
        )
        return _mined("step_round", receipt)

    def pending_audits(self, order_id: int) -> str:
        records = self.client.audit_records(order_id)
        return "0x" + audit_chains([r.as_tuple() for r in records])[1].hex()

    def audit_records(self, order_id: int) -> list[AuditRecord]:
        return self.client.audit_records(order_id)

    def set_aside_pending(self, order_id: int, roster: Roster, count: int, verifiers: Sequence[str]) -> str:
        # everything the contract checks comes from the chain: the records, each taken round's unit digests
        # (its `RoundRevealed`) and, when a round is committed and not revealed, its slots' commitments
        records = self.client.audit_records(order_id)
        digests: list[list[bytes]] = []
        if verifiers:
            for record in records[len(records) - count :]:
                (revealed,) = self.client.roster_events(
                    order_id, ("RoundRevealed",), round_index=record.round
                )
                digests.append([bytes(d) for d in revealed.args["digests"]])
        info = self.client.get_roster(order_id)
        commitments = (
            self.client.round_commitments(order_id, info.committed - 1) if info.pending_block else []
        )
        receipt = self.client.set_aside_pending(
            order_id,
            roster,
            records,
            count,
            digests=digests,
            verifiers=list(verifiers),
            commitments=commitments,
        )
        return _mined("set_aside_pending", receipt)

    def close_roster(self, order_id: int, roster: Roster) -> str:
        records = self.client.audit_records(order_id)
        return _mined("close_roster", self.client.close_roster(order_id, roster, records))

    def spot_check_ppm(self, replicas: int) -> int:
        params = self.client.params
        return params.solo_spot_check_ppm if replicas == 1 else params.spot_check_ppm

    def unit_state(self, unit_id: int) -> str:
        return self.client.get_unit(unit_id).state.name.lower()

    def block_number(self) -> int:
        return int(self.client.w3.eth.block_number)

    def block_hash(self, block_number: int) -> str:
        return "0x" + bytes(self.client.w3.eth.get_block(block_number)["hash"]).hex()

    def tx_block(self, tx_hash: str) -> int:
        return int(self.client.w3.eth.get_transaction_receipt(HexStr(tx_hash))["blockNumber"])

    def events(self, from_block: int, to_block: int) -> list[ChainEvent]:
        start = max(from_block, self.client.deployment.block)
        end = min(to_block, self.block_number())  # past the head: nothing yet (eth-tester would raise)
        if start > end:
            return []
        return [
            ChainEvent(e.block_number, e.log_index, e.name, {k: _hex(v) for k, v in e.args.items()})
            for e in self.client.events(start, end)
        ]


class ChainCanaryAccount:
    """The canary account (:class:`market.ports.CanaryAccount`) over the chain client: it approves and
    posts its orders itself, paying its own gas, like any buyer."""

    def __init__(self, client: ChainClient, account: LocalAccount) -> None:
        self.client = client
        self.account = account
        self.address: str = account.address

    def posted_order(self, spec_hash: str) -> int | None:
        for event in self.client.events():
            args = event.args
            if (
                event.name == "OrderPosted"
                and str(args["buyer"]).lower() == self.address.lower()
                and str(_hex(args["specHash"])).lower() == spec_hash.lower()
            ):
                return int(args["orderId"])
        return None

    def post_order(self, spec_hash: str, plan: EscrowPlan, deadline: int) -> int:
        self.client.approve(self.account, self.client.deployment.job_market, plan.total)
        order_id, _ = self.client.post_order(
            self.account,
            spec_hash,
            plan.units,
            plan.replicas,
            plan.price_per_replica,
            plan.verifier_fee_per_unit,
            deadline,
            min_replicas=plan.min_replicas,
            trusted_streak=plan.trusted_streak,
        )
        return order_id

    def close_order(self, order_id: int) -> None:
        if not self.client.get_order(order_id).closed:  # closed before a crash: closing again reverts
            self.client.close_order(order_id, sender=self.account)


def operator_account(settings: Settings, *, prompt: bool = False) -> LocalAccount:
    """The operator's key: the settings' keystore (unlocked once per process, so `market serve` and
    `market worker` may prompt at start and their tasks reuse it), else ``VERITRAIN_OPERATOR_KEY``."""
    key = settings.operator_key.get_secret_value()
    if key:
        return Account.from_key(key)
    if settings.keystore is None:
        raise MarketError("the market needs the operator key: --keystore FILE (or VERITRAIN_OPERATOR_KEY)")
    return load_signer(settings.keystore, password_env=settings.keystore_password_env, prompt=prompt)


def connect_chain(settings: Settings) -> ChainClientSettlement:
    """Attach to the deployment in ``settings.deployments_file`` at ``settings.chain_rpc_url``."""
    from veritrain.chain.backends import RpcBackend

    if settings.deployments_file is None:
        raise MarketError("set VERITRAIN_DEPLOYMENTS_FILE to the deployments JSON the chain client wrote")
    backend = RpcBackend(settings.chain_rpc_url)
    client = ChainClient.connect(backend, settings.deployments_file, relayer=operator_account(settings))
    return ChainClientSettlement(client)
