"""`ChainClient`: one typed Python method per contract action of VeriToken, StakeManager, JobMarket and
VerdictAppeals.

Every role (market service, provider and verifier agents, tests, demo) talks to the contracts through
this class, on any backend (`veritrain.chain.backends`). Transactions are signed locally by the
`LocalAccount` passed in; relayed actions (`..._with_sig`) take a `Signed` message made by the party with
the matching `sign_...` method and are sent by a relayer (by default the client's `relayer`). Money is
int base units everywhere. A revert raises the contract's own error class from `veritrain.chain.errors`.

    with open_backend() as backend:  # a local hardhat node, started and stopped for you
        deployer, buyer, p1, p2, p3, v1, v2 = backend.dev_accounts(7)
        client = ChainClient.deploy(backend, deployer, save_to="deployments.json")
        order_id, _ = client.post_order(buyer, spec_hash, units=1, replicas=3, ...)
        accepts = [client.sign_accept(p, order_id, unit_key, deadline) for p in (p1, p2, p3)]
        unit_id, _ = client.assign(order_id, unit_key, [p1, p2, p3], [v1, v2], accepts)
        signed = client.sign_commit(p1, unit_id, client.commitment(digest, salt, p1, unit_id), deadline)
        client.commit_with_sig(unit_id, p1, commitment, signed)  # relayed: p1 pays no gas
        ...

Batched (the cheap path, one transaction per step for all replicas): each provider signs a nonce-free
`sign_unit_commit`, the relayer sends `commit_batch(unit_id, commits)`, then `reveal_batch(unit_id,
[Reveal(provider, digest, salt), ...])` reveals and, when unanimous, finalizes in the same transaction.
The operator can pipeline units with `multicall([...calldata builders...])`.

Another process attaches with `ChainClient.connect(RpcBackend(url), "deployments.json", relayer=key)`.
Nonces: `Accept` takes an unordered nonce (any unused value; `sign_accept` draws the next one from the
client's `AcceptNonces`, so acceptances signed before any is relayed never collide); `Verdict` and
`UnitCommit` have none (single-use by the unit's state machine). The other signed messages share one
sequential counter per account and contract: `sign_*` reads the next nonce from the chain unless
`nonce=` is given (give it when signing several messages before any is submitted).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from eth_abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from web3.contract import Contract

from veritrain.chain import eip712
from veritrain.chain.artifacts import ContractData, load_all
from veritrain.chain.backends import Backend
from veritrain.chain.deployment import AppealParams, Deployment, MarketParams
from veritrain.chain.errors import ChainError, DeploymentError, WrongChainId
from veritrain.chain.revert import abi_signature, canonical_type
from veritrain.chain.tx import Event, Receipt, Transactor
from veritrain.errors import InvalidInput

DEFAULT_UNBONDING_PERIOD = 7 * 24 * 3600

# Fixed gas limits per function, so a transaction needs no eth_estimateGas round trip. Each is about twice
# the worst case measured (`veritrain bench chain`: 3 replicas, 2 verifiers; cold storage), scaled for the
# caps of 5 replicas and 5 verifiers. A limit only bounds the fee, unused gas is not charged. Functions not
# listed (deployment, admin, multicall, whose cost depends on its calls) are estimated.
GAS_LIMITS: dict[str, int] = {
    "mint": 150_000,
    "approve": 100_000,
    "stake": 200_000,
    "stakeWithPermit": 250_000,
    "requestUnstake": 150_000,
    "requestUnstakeWithSig": 200_000,
    "withdraw": 150_000,
    "withdrawWithSig": 200_000,
    "postOrder": 400_000,
    "closeOrder": 150_000,
    "assign": 1_500_000,
    "requestVerification": 100_000,
    "commit": 200_000,
    "commitWithSig": 250_000,
    "commitBatch": 800_000,
    "reveal": 150_000,
    "revealBatch": 1_000_000,
    "finalize": 600_000,
    "submitVerdict": 1_500_000,
    # round path (measured k = 3, 9 units per round, 3 providers: openRoster ~180k, stepRound ~280k plus
    # ~200k per unit it sets aside for a verdict); the limits cover 51 replica slots, 32 providers and a
    # step that sets 9 units aside
    "openRoster": 1_500_000,
    "stepRound": 4_000_000,
    "closeRoster": 1_500_000,
    "publishOpening": 500_000,
    "challengeAudit": 1_000_000,
    # VerdictAppeals (measured: appeal 90k, drawPanel 209k with 3 seats / 283k with 5, vote 80-116k, resolve
    # 149-165k or 408k settling 5 held fraud replicas, slashContradiction 155k, joinPool 84-101k,
    # settleVerdict 161k for 1 held replica of 3 / 355k for 5 of 5 with 5 signers); drawPanel's limit
    # covers 7 seats and every rejected draw attempt; a fixed limit also skips an estimate run in the
    # appeal's own block.
    "joinPool": 250_000,
    "leavePool": 150_000,
    "appeal": 250_000,
    "drawPanel": 1_200_000,
    "vote": 400_000,
    "resolve": 900_000,
    "lapse": 150_000,
    "slashContradiction": 400_000,
    "slashRoundAudit": 600_000,
    "settleVerdict": 750_000,
    "expireUnit": 500_000,
    "withdrawCredit": 150_000,
    "withdrawCreditWithSig": 200_000,
}


class UnitState(IntEnum):
    """JobMarket's unit state machine."""

    NONE = 0
    COMMITTING = 1
    REVEALING = 2
    FINALIZED = 3
    VERDICTED = 4
    EXPIRED = 5


class Outcome(IntEnum):
    """Verdict per replica."""

    ACCEPT = 0
    FAULT = 1
    FRAUD = 2


@dataclass(frozen=True)
class Signed:
    """A party's EIP-712 signature with the nonce and deadline it covers (they travel with it)."""

    signer: str
    signature: bytes
    nonce: int
    deadline: int

    def as_args(self) -> tuple[int, int, bytes]:
        """The trailing `nonce, deadline, signature` arguments of every `...WithSig` function."""
        return self.nonce, self.deadline, self.signature


@dataclass(frozen=True)
class VerifierSignature:
    """A verifier's outcome-only EIP-712 `Verdict` (JobMarket `VerifierSignature`): no nonce, no reasons."""

    verifier: str
    deadline: int
    signature: bytes

    def as_tuple(self) -> tuple[str, int, bytes]:
        return (_address(self.verifier), self.deadline, self.signature)


@dataclass(frozen=True)
class RefereeSignature:
    """A referee's EIP-712 `RefereeVote` on an appeal (VerdictAppeals `RefereeSignature`): no nonce."""

    referee: str
    deadline: int
    signature: bytes

    def as_tuple(self) -> tuple[str, int, bytes]:
        return (_address(self.referee), self.deadline, self.signature)


class AppealState(IntEnum):
    """VerdictAppeals' appeal life cycle."""

    NONE = 0
    PENDING = 1
    CONFIRMED = 2
    OVERTURNED = 3
    LAPSED = 4


@dataclass(frozen=True)
class AppealInfo:
    """VerdictAppeals `AppealView`: the panel is empty until drawn; `votes[i]` is seat i's outcomes hash."""

    unit_id: int
    state: AppealState
    appellant: str
    vote_deadline: int
    seed_block: int
    pool_size: int
    decided: bytes
    panel: tuple[str, ...]
    votes: tuple[bytes, ...]


class AcceptNonces:
    """Unordered `Accept` nonces for one signer process: consecutive bits of one random 248-bit word.

    The contract keeps a bitmap per account, so any unused value works in any order. A random word
    keeps two processes with one key apart; consecutive bits share one storage word (cheap).
    """

    def __init__(self) -> None:
        self._word = secrets.randbits(248)
        self._bit = 0

    def next(self) -> int:
        if self._bit == 256:
            self._word, self._bit = secrets.randbits(248), 0
        nonce = (self._word << 8) | self._bit
        self._bit += 1
        return nonce


@dataclass(frozen=True)
class SignedCommit:
    """A provider's signed `UnitCommit` for `commit_batch` (JobMarket `SignedCommit`).

    No nonce: a provider commits once per unit, so the unit's state machine makes the message single-use;
    that is why several providers can sign for the same batch without coordinating nonces.
    """

    provider: str
    commitment: bytes
    deadline: int
    signature: bytes

    def as_tuple(self) -> tuple[str, bytes, int, bytes]:
        return (self.provider, self.commitment, self.deadline, self.signature)


@dataclass(frozen=True)
class Reveal:
    """One replica's reveal for `reveal_batch` (JobMarket `Reveal`): the preimage of its commitment."""

    provider: str
    result_digest: bytes
    salt: bytes

    def as_tuple(self) -> tuple[str, bytes, bytes]:
        return (
            _address(self.provider),
            eip712.as_bytes32(self.result_digest, "result_digest"),
            eip712.as_bytes32(self.salt, "salt"),
        )


@dataclass(frozen=True)
class Roster:
    """A round-path order's fixed assignment (JobMarket `openRoster`): replica slot
    `i = unit * replicas + replica` of every round is worked by `providers[slots[i]]`; `verifiers` (none, or
    minVerifiers..5) audit the units the chain draws (`sign_round_audit`)."""

    providers: tuple[str, ...]
    slots: tuple[int, ...]
    replicas: int
    units_per_round: int
    rounds: int
    verifiers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= len(self.providers) <= 32:
            raise InvalidInput(f"a roster has 1 to 32 providers, got {len(self.providers)}")
        if len(self.slots) != self.units_per_round * self.replicas or not 0 < len(self.slots) <= 51:
            raise InvalidInput(
                f"a roster has units_per_round x replicas slots (at most 51), got {len(self.slots)} for "
                f"{self.units_per_round} x {self.replicas}"
            )
        if any(not 0 <= index < len(self.providers) for index in self.slots):
            raise InvalidInput(f"slot indices must name one of the {len(self.providers)} providers")

    @property
    def layout(self) -> int:
        """The slots as the contract takes them: provider index of slot i in bits [5i, 5i + 5)."""
        return sum(index << (5 * slot) for slot, index in enumerate(self.slots))

    @property
    def key(self) -> bytes:
        """What each provider's `Accept` signs as its unitKey (JobMarket `rosterKey`)."""
        return eip712.roster_key(
            self.providers, self.layout, self.replicas, self.units_per_round, self.rounds, self.verifiers
        )

    def provider_of(self, unit: int, replica: int) -> str:
        return self.providers[self.slots[unit * self.replicas + replica]]


@dataclass(frozen=True)
class RoundSignature:
    """A roster provider's compact (EIP-2098) `RoundCommit` signature over its slots' commitments of one
    round (JobMarket `CompactSignature`)."""

    r: bytes
    vs: bytes

    def as_tuple(self) -> tuple[bytes, bytes]:
        return (self.r, self.vs)

    @classmethod
    def of(cls, signature: bytes) -> RoundSignature:
        """From a 65-byte signature."""
        return cls(*eip712.compact_signature(signature))


@dataclass(frozen=True)
class RoundWork:
    """A round's commitments (every replica slot's, in slot order) and each roster provider's
    `RoundCommit` signature over its own slots' commitments (in roster provider order): JobMarket
    `RoundWork`, one signature per provider per round."""

    commitments: tuple[bytes, ...]
    signatures: tuple[RoundSignature, ...]

    def as_tuple(self) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        return (list(self.commitments), [s.as_tuple() for s in self.signatures])


def provider_commitments(roster: Roster, provider_index: int, commitments: Sequence[bytes]) -> list[bytes]:
    """The commitments of roster provider `provider_index`'s slots, in slot order (what its `RoundCommit`
    covers), out of every slot's `commitments`."""
    if len(commitments) != len(roster.slots):
        raise InvalidInput(f"a round has {len(roster.slots)} slot commitments, got {len(commitments)}")
    return [c for c, index in zip(commitments, roster.slots, strict=True) if index == provider_index]


@dataclass(frozen=True)
class AuditSignature:
    """A roster verifier's compact `RoundAudit` signature (JobMarket `AuditSignature`): `verifier` is its
    index among the roster's verifiers."""

    verifier: int
    r: bytes
    vs: bytes

    def as_tuple(self) -> tuple[int, bytes, bytes]:
        return (self.verifier, self.r, self.vs)


@dataclass(frozen=True)
class AuditRecord:
    """One audit record (JobMarket `AuditRecord`), as `RoundRevealed` (its `audited` units) or `AuditPosted`
    gave it and each `AuditChallenged` since updated it. A round's (`posting` false): `info` bits 0..63 its
    drawn unanimous units, 112..175 those challenged, 176..207 the round; `digests_hash` the hash of the
    round's unit digests (`RoundRevealed`); it is pending until a posting's record follows it. A
    posting's: bit 255 set, 64..71 the signers, 72..111 the step's time; `digests_hash` the chain of the
    round records it covers. A roster's records, in order: every step gives the posted and pending
    chains, a challenge and the close are given them (`audit_records_after`)."""

    info: int
    digests_hash: bytes

    @property
    def round(self) -> int:
        return (self.info >> 176) & 0xFFFFFFFF

    @property
    def posting(self) -> bool:
        return bool(self.info & eip712.POSTING_FLAG)

    @property
    def units(self) -> int:
        """A round's record: its drawn unanimous units, as a bit mask (bits 0..63)."""
        return self.info & 0xFFFFFFFFFFFFFFFF

    @property
    def challenged(self) -> int:
        """A round's record: its units a challenge took back, as a bit mask (bits 112..175)."""
        return (self.info >> 112) & 0xFFFFFFFFFFFFFFFF

    @property
    def signers(self) -> int:
        """A posting's record: the roster verifiers that signed it, as a bit mask (bits 64..71)."""
        return (self.info >> 64) & 0xFF

    @classmethod
    def of_round(cls, round_index: int, units: int, digests: Sequence[bytes]) -> AuditRecord:
        """The record a step that reveals round `round_index` leaves pending for its drawn unanimous `units`
        (unanimous, no provider below the roster's streak), `digests` every unit's digest of the round in unit
        order (as `RoundRevealed` gives them)."""
        return cls(units | (round_index << 176), eip712.digests_hash(digests))

    def as_tuple(self) -> tuple[int, bytes]:
        return (self.info, self.digests_hash)


def audit_records_after(records: Sequence[AuditRecord], receipt: Receipt) -> list[AuditRecord]:
    """A roster's audit records once `receipt` was mined: a `RoundRevealed` with `audited` units adds its
    round's record, an `AuditPosted` a posting's, a `PendingSetAside` removes the last pending ones, an
    `AuditChallenged` updates its round's `info`."""
    return audit_records_of(receipt.events, records)


def audit_records_of(events: Sequence[Event], records: Sequence[AuditRecord] = ()) -> list[AuditRecord]:
    """`records` extended by one roster's `events` in chain order (see `audit_records_after`)."""
    updated = list(records)
    for event in events:
        if event.name == "RoundRevealed" and int(event.args["audited"]):
            digests = [bytes(d) for d in event.args["digests"]]
            updated.append(
                AuditRecord.of_round(int(event.args["round"]), int(event.args["audited"]), digests)
            )
        elif event.name == "AuditPosted":
            updated.append(AuditRecord(int(event.args["info"]), bytes(event.args["records"])))
        elif event.name == "PendingSetAside":  # the last pending records, taken off (setAsidePending)
            del updated[len(updated) - int(event.args["records"]) :]
        elif event.name == "AuditChallenged":
            index = next(
                i for i, r in enumerate(updated) if not r.posting and r.round == int(event.args["round"])
            )
            updated[index] = AuditRecord(int(event.args["info"]), updated[index].digests_hash)
    return updated


@dataclass(frozen=True)
class RosterInfo:
    """JobMarket `getRoster`: the recorded roster key, its shape and progress."""

    key: bytes
    units_per_round: int
    required_streak: int  # consecutive valid units a provider needs for its units to skip the verdict
    rounds: int
    committed: int  # rounds committed; all but a pending one are revealed
    pending_block: int  # block of the commit of the round awaiting its reveal (0: none)
    pending_since: int  # that commit's time: the round may be revealed for revealWindow after it
    replicas: int
    closed: bool
    set_aside_units: int  # units set aside for a verdict so far (they settle on the per-unit path)
    open_set_aside: int  # of which not settled yet: the roster cannot close while any is
    fault_marks: int  # 8 bits per provider: its fault + fraud count at open (mod 256)
    pending_round_hash: bytes
    audits_pending: bool = False  # round audit records no posting covers yet: the roster cannot close


@dataclass(frozen=True)
class StakePosition:
    bonded: int
    locked: int
    unbonding: int
    thaw_at: int

    @property
    def free(self) -> int:
        return self.bonded - self.locked


@dataclass(frozen=True)
class Reputation:
    valid: int
    fault: int
    fraud: int
    consecutive_valid: int


@dataclass(frozen=True)
class OrderInfo:
    """JobMarket `Order`: `balance` is escrow not yet committed to an open unit."""

    order_id: int
    buyer: str
    deadline: int
    units: int
    price_per_replica: int
    verifier_fee_per_unit: int
    balance: int
    delivered: int
    open_units: int
    replicas: int
    closed: bool
    min_replicas: int  # below `replicas` for an adaptive order only
    trusted_streak: int  # consecutive valid units a provider needs for a unit below `replicas`


@dataclass(frozen=True)
class UnitInfo:
    """JobMarket `UnitView`; masks have bit i set for replica i."""

    unit_id: int
    order_id: int
    state: UnitState
    replicas: int
    verifier_count: int
    committed_mask: int
    revealed_mask: int
    drawn: bool
    commit_deadline: int
    reveal_deadline: int
    verdict_deadline: int


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica: its provider, commitment (before reveal) or result digest (after)."""

    provider: str
    commitment_or_digest: bytes
    committed: bool
    revealed: bool


@dataclass(frozen=True)
class AccountBalances:
    """Everything one account holds in the system, for demos and invariant checks."""

    tokens: int
    credits: int
    bonded: int
    locked: int
    unbonding: int


def _address(value: str | LocalAccount) -> str:
    if isinstance(value, LocalAccount):
        return str(value.address)
    try:
        return str(to_checksum_address(value))
    except (ValueError, TypeError) as err:
        raise InvalidInput(f"not an address: {value!r}") from err


class ChainClient:
    """Typed access to one Veritrain deployment on one backend."""

    def __init__(
        self,
        backend: Backend,
        deployment: Deployment,
        *,
        relayer: LocalAccount | None = None,
        contracts: dict[str, ContractData] | None = None,
        check_chain_id: bool = True,
    ) -> None:
        if check_chain_id and backend.chain_id != deployment.chain_id:
            raise WrongChainId(deployment.chain_id, backend.chain_id, "node vs deployments file")
        self.backend = backend
        self.w3 = backend.w3
        self.deployment = deployment
        self.contracts = contracts or load_all()
        self.transactor = Transactor(backend, [data.abi for data in self.contracts.values()])
        self.relayer = relayer
        self.accept_nonces = AcceptNonces()
        self.deploy_receipts: tuple[Receipt, ...] = ()  # set by deploy(): token, stakes, market, grantRole
        self.token: Contract = self._bind("VeriToken", deployment.token)
        self.stakes: Contract = self._bind("StakeManager", deployment.stake_manager)
        self.market: Contract = self._bind("JobMarket", deployment.job_market)
        self.appeals: Contract = self._bind("VerdictAppeals", deployment.verdict_appeals)
        self.appeals_domain = eip712.appeals_domain(deployment.chain_id, deployment.verdict_appeals)
        self.market_domain = eip712.market_domain(deployment.chain_id, deployment.job_market)
        self.stake_domain = eip712.stake_domain(deployment.chain_id, deployment.stake_manager)
        self.token_domain = eip712.token_domain(deployment.chain_id, deployment.token)

    def _bind(self, name: str, address: str) -> Contract:
        return self.w3.eth.contract(address=to_checksum_address(address), abi=list(self.contracts[name].abi))

    # ------------------------------------------------------------------ set-up

    @classmethod
    def deploy(
        cls,
        backend: Backend,
        deployer: LocalAccount,
        *,
        operator: str | LocalAccount | None = None,
        params: MarketParams | None = None,
        appeal_params: AppealParams | None = None,
        unbonding_period: int = DEFAULT_UNBONDING_PERIOD,
        save_to: Path | str | None = None,
        contracts: dict[str, ContractData] | None = None,
        admin_delay: int | None = None,
    ) -> ChainClient:
        """Deploy token, stake manager, job market (its two extensions first) and verdict appeals; grant the
        market and the appeals contract MARKET_ROLE; optionally write the file.

        `operator` (default: the deployer) is the market service's relayer key that proposes assignments.
        `admin_delay` (seconds): hand both contracts' admin role to an AdminTimelock with that delay, the
        deployer its only proposer and executor, so every later role grant is public for that long first
        (issue 8 finding 10); None keeps the deployer as admin (development chains, tests).
        """
        data = contracts or load_all()
        market_params = params or MarketParams()
        operator_address = _address(operator) if operator is not None else deployer.address
        transactor = Transactor(backend, [item.abi for item in data.values()])

        def create(name: str, *args: Any) -> Receipt:
            constructor = next((item for item in data[name].abi if item.get("type") == "constructor"), None)
            kinds = [canonical_type(arg) for arg in constructor["inputs"]] if constructor else []
            return transactor.send(deployer, None, data[name].bytecode + abi_encode(kinds, list(args)))

        token_receipt = create("VeriToken")
        token = _created(token_receipt, "VeriToken")
        stake_receipt = create("StakeManager", token, unbonding_period, deployer.address)
        stake_manager = _created(stake_receipt, "StakeManager")
        extension_receipt = create("JobMarketExtension", token, stake_manager, market_params.as_tuple())
        extension = _created(extension_receipt, "JobMarketExtension")
        rounds_receipt = create("JobMarketRoundsExtension", token, stake_manager, market_params.as_tuple())
        rounds_extension = _created(rounds_receipt, "JobMarketRoundsExtension")
        market_receipt = create(
            "JobMarket",
            token,
            stake_manager,
            operator_address,
            market_params.as_tuple(),
            extension,
            rounds_extension,
        )
        job_market = _created(market_receipt, "JobMarket")
        appeal = appeal_params or AppealParams()
        appeals_receipt = create("VerdictAppeals", job_market, appeal.as_tuple())
        deployment = Deployment(
            chain_id=backend.chain_id,
            token=token,
            stake_manager=stake_manager,
            job_market=job_market,
            block=token_receipt.block_number,
            deployer=deployer.address,
            operator=operator_address,
            unbonding_period=unbonding_period,
            params=market_params,
            verdict_appeals=_created(appeals_receipt, "VerdictAppeals"),
            appeal_params=appeal,
        )
        client = cls(backend, deployment, relayer=deployer, contracts=data)
        client.deploy_receipts = (
            token_receipt,
            stake_receipt,
            extension_receipt,
            rounds_receipt,
            market_receipt,
            appeals_receipt,
        )
        role = client.stakes.functions.MARKET_ROLE().call()
        for grantee in (job_market, deployment.verdict_appeals):
            grant = client.transactor.send(
                deployer, stake_manager, _calldata(client.stakes, "grantRole", role, grantee)
            )
            client.deploy_receipts += (grant,)
        # VerdictAppeals alone settles a verdict's held fraud by the unit's truth (JobMarket.settleHeld)
        appeals_role = client.market.functions.APPEALS_ROLE().call()
        grant = client.transactor.send(
            deployer,
            job_market,
            _calldata(client.market, "grantRole", appeals_role, deployment.verdict_appeals),
        )
        client.deploy_receipts += (grant,)
        if admin_delay is not None:
            client = client._hand_admin_to_timelock(deployer, admin_delay)
        if save_to is not None:
            client.deployment.save(save_to)
        return client

    def _hand_admin_to_timelock(self, deployer: LocalAccount, delay: int) -> ChainClient:
        """Deploy the AdminTimelock, grant it both admin roles and renounce the deployer's."""
        arguments = abi_encode(
            ["uint256", "address[]", "address[]"], [delay, [deployer.address], [deployer.address]]
        )
        receipt = self.transactor.send(deployer, None, self.contracts["AdminTimelock"].bytecode + arguments)
        timelock = _created(receipt, "AdminTimelock")
        receipts = [receipt]
        for contract in (self.stakes, self.market):
            admin = contract.functions.DEFAULT_ADMIN_ROLE().call()
            for function, account in (("grantRole", timelock), ("renounceRole", deployer.address)):
                data = _calldata(contract, function, admin, account)
                receipts.append(self.transactor.send(deployer, contract.address, data))
        client = type(self)(
            self.backend,
            replace(self.deployment, timelock=timelock),
            relayer=self.relayer,
            contracts=self.contracts,
        )
        client.deploy_receipts = self.deploy_receipts + tuple(receipts)
        return client

    @classmethod
    def connect(
        cls, backend: Backend, deployment: Deployment | Path | str, *, relayer: LocalAccount | None = None
    ) -> ChainClient:
        """Attach to a deployment; WrongChainId if the node is another chain, DeploymentError if no code."""
        loaded = deployment if isinstance(deployment, Deployment) else Deployment.load(deployment)
        client = cls(backend, loaded, relayer=relayer)
        for name, address in loaded.addresses.items():
            if not client.w3.eth.get_code(to_checksum_address(address)):
                raise DeploymentError(f"no {name} contract at {address} on chain {loaded.chain_id}")
        return client

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    @property
    def params(self) -> MarketParams:
        return self.deployment.params

    def now(self) -> int:
        """Latest block timestamp (deadlines are compared with block time, not the wall clock)."""
        return self.backend.latest_timestamp()

    def pending_time(self) -> int:
        """The pending block's timestamp: the time a transaction sent now executes at. What a party deciding
        whether to send one (a window closed, a deadline passed) must compare with: on a chain that mines
        only on transactions the latest block stops when nobody sends any."""
        return int(self.w3.eth.get_block("pending")["timestamp"])

    def deadline(self, ttl_s: int) -> int:
        """A signature deadline ``ttl_s`` after the pending block's time, not the latest block's: on a chain
        idle for longer than ``ttl_s`` a deadline counted from its last block has passed before it is sent."""
        return self.pending_time() + ttl_s

    def advance_time(self, seconds: int) -> int:
        """Dev chains only: move block time forward."""
        return self.backend.advance_time(seconds)

    def events(self, from_block: int | None = None, to_block: int | str = "latest") -> list[Event]:
        """Decoded events of the three contracts in a block range (default: since deployment), in chain order.

        For the market's chain sync: poll with from_block = last seen block + 1.
        """
        start = self.deployment.block if from_block is None else from_block
        query: Any = {
            "fromBlock": start,
            "toBlock": to_block,
            "address": [to_checksum_address(a) for a in self.deployment.addresses.values()],
        }
        logs = self.w3.eth.get_logs(query)
        decoded = (self.transactor.event_decoder.decode(log) for log in logs)
        return [event for event in decoded if event is not None]

    # ------------------------------------------------------------------ plumbing

    def unit_events(self, name: str, unit_id: int, from_block: int | None = None) -> list[Event]:
        """Decoded `name` events of one unit (indexed `unitId` first; also an order's `OrderPosted` or an
        account's `Staked`, whose first indexed argument is the order id or the address), from any of the
        contracts: one filtered log query (by event signature and that argument), not a scan of every event
        since deployment."""
        items = [
            item
            for data in self.contracts.values()
            for item in data.abi
            if item.get("type") == "event" and item.get("name") == name
        ]
        topics = sorted({event_topic(item) for item in items})
        query: Any = {
            "fromBlock": self.deployment.block if from_block is None else from_block,
            "toBlock": "latest",
            "address": [to_checksum_address(a) for a in self.deployment.addresses.values()],
            "topics": [topics, "0x" + unit_id.to_bytes(32, "big").hex()],
        }
        decoded = (self.transactor.event_decoder.decode(log) for log in self.w3.eth.get_logs(query))
        return [event for event in decoded if event is not None and event.name == name]

    def _send(self, sender: LocalAccount | None, contract: Contract, function: str, *args: Any) -> Receipt:
        return self._send_data(sender, contract, function, _calldata(contract, function, *args))

    def _send_data(
        self, sender: LocalAccount | None, contract: Contract, function: str, data: bytes
    ) -> Receipt:
        actor = sender or self.relayer
        if actor is None:
            raise ChainError(f"{function}: no sender given and the client has no relayer")
        return self.transactor.send(actor, contract.address, data, gas=GAS_LIMITS.get(function))

    def _view(
        self, contract: Contract, function: str, *args: Any, block: Literal["latest", "pending"] = "latest"
    ) -> Any:
        """An eth_call at `block`: "pending" reads the chain as a transaction sent now would (its time is
        now, where an idle automining dev chain's latest block can be minutes old)."""
        try:
            return contract.functions[function](*args).call(block_identifier=block)
        except Exception as err:
            raise self.transactor._typed(err) from err

    def _sign(
        self, signer: LocalAccount, domain: eip712.Domain, primary: str, message: dict[str, Any]
    ) -> Signed:
        signature = eip712.sign_typed(signer, domain, primary, message)
        return Signed(signer.address, signature, int(message["nonce"]), int(message["deadline"]))

    # ------------------------------------------------------------------ VeriToken

    def mint(self, to: str | LocalAccount, amount: int, *, owner: LocalAccount | None = None) -> Receipt:
        """Development faucet (token owner = deployer)."""
        return self._send(owner, self.token, "mint", _address(to), amount)

    def approve(self, owner: LocalAccount, spender: str, amount: int) -> Receipt:
        return self._send(owner, self.token, "approve", _address(spender), amount)

    def token_balance(self, account: str | LocalAccount) -> int:
        return int(self._view(self.token, "balanceOf", _address(account)))

    def allowance(self, owner: str | LocalAccount, spender: str) -> int:
        return int(self._view(self.token, "allowance", _address(owner), _address(spender)))

    def token_nonce(self, account: str | LocalAccount) -> int:
        """ERC-2612 permit nonce."""
        return int(self._view(self.token, "nonces", _address(account)))

    def sign_permit(
        self, owner: LocalAccount, spender: str, value: int, deadline: int, *, nonce: int | None = None
    ) -> Signed:
        """ERC-2612 permit for `spender` (e.g. the stake manager) to pull `value` of the owner's tokens."""
        message = {
            "owner": owner.address,
            "spender": _address(spender),
            "value": value,
            "nonce": self.token_nonce(owner) if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(owner, self.token_domain, "Permit", message)

    def relay_permit(
        self, owner: str | LocalAccount, spender: str, value: int, permit: Signed, *, relayer: LocalAccount
    ) -> Receipt:
        """Submit the owner's ERC-2612 permit (`sign_permit`): sets its allowance to `spender` to `value`."""
        v, r, s = eip712.split_signature(permit.signature)
        return self._send(
            relayer, self.token, "permit", _address(owner), _address(spender), value, permit.deadline, v, r, s
        )

    def send_ether(self, sender: LocalAccount, to: str | LocalAccount, amount: int) -> Receipt:
        """A plain value transfer (gas money for a new key on a development chain)."""
        return self.transactor.send(sender, _address(to), b"", value=amount)

    # ------------------------------------------------------------------ StakeManager

    def stake(self, staker: LocalAccount, amount: int) -> Receipt:
        """Bond `amount` (needs an allowance to the stake manager: see `approve`)."""
        return self._send(staker, self.stakes, "stake", amount)

    def stake_with_permit(
        self, staker: str | LocalAccount, amount: int, permit: Signed, *, relayer: LocalAccount | None = None
    ) -> Receipt:
        """Bond by the staker's ERC-2612 permit (`sign_permit(staker, stake_manager, ...)`): gasless."""
        v, r, s = eip712.split_signature(permit.signature)
        return self._send(
            relayer, self.stakes, "stakeWithPermit", _address(staker), amount, permit.deadline, v, r, s
        )

    def request_unstake(self, staker: LocalAccount, amount: int) -> Receipt:
        return self._send(staker, self.stakes, "requestUnstake", amount)

    def sign_request_unstake(
        self, staker: LocalAccount, amount: int, deadline: int, *, nonce: int | None = None
    ) -> Signed:
        message = {
            "staker": staker.address,
            "amount": amount,
            "nonce": self.stake_nonce(staker) if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(staker, self.stake_domain, "RequestUnstake", message)

    def request_unstake_with_sig(
        self, staker: str | LocalAccount, amount: int, signed: Signed, *, relayer: LocalAccount | None = None
    ) -> Receipt:
        return self._send(
            relayer,
            self.stakes,
            "requestUnstakeWithSig",
            _address(staker),
            amount,
            *signed.as_args(),
        )

    def withdraw_stake(self, staker: LocalAccount) -> Receipt:
        """Withdraw all thawed unbonding stake."""
        return self._send(staker, self.stakes, "withdraw")

    def sign_withdraw_stake(self, staker: LocalAccount, deadline: int, *, nonce: int | None = None) -> Signed:
        message = {
            "staker": staker.address,
            "nonce": self.stake_nonce(staker) if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(staker, self.stake_domain, "Withdraw", message)

    def withdraw_stake_with_sig(
        self, staker: str | LocalAccount, signed: Signed, *, relayer: LocalAccount | None = None
    ) -> Receipt:
        return self._send(
            relayer,
            self.stakes,
            "withdrawWithSig",
            _address(staker),
            *signed.as_args(),
        )

    def stake_of(self, account: str | LocalAccount) -> StakePosition:
        bonded, locked, unbonding, thaw_at = self._view(self.stakes, "stakeOf", _address(account))
        return StakePosition(int(bonded), int(locked), int(unbonding), int(thaw_at))

    def free_stake(self, account: str | LocalAccount) -> int:
        return int(self._view(self.stakes, "freeStake", _address(account)))

    def last_staked_block(self, account: str | LocalAccount) -> int:
        """The block of the account's latest `Staked` event (0: it never staked): the only way its bonded
        stake grows, so a draw seeded by block B may count it only when this is below B."""
        staked = self.unit_events("Staked", int(_address(account), 16))
        return max((event.block_number for event in staked), default=0)

    def total_staked(self) -> int:
        return int(self._view(self.stakes, "totalStaked"))

    def stake_nonce(self, account: str | LocalAccount) -> int:
        """Next nonce `account` must sign for the stake manager."""
        return int(self._view(self.stakes, "nonces", _address(account)))

    # ------------------------------------------------------------------ JobMarket: buyer

    def post_order(
        self,
        buyer: LocalAccount,
        spec_hash: bytes | str,
        units: int,
        replicas: int,
        price_per_replica: int,
        verifier_fee_per_unit: int,
        deadline: int,
        *,
        min_replicas: int | None = None,
        trusted_streak: int = 0,
    ) -> tuple[int, Receipt]:
        """Post an order, escrowing units × (replicas × price + fee) (needs an allowance to the market).

        With `min_replicas` below `replicas` the order is adaptive (postAdaptiveOrder): a unit may have as
        few as `min_replicas` providers when each has `trusted_streak` consecutive valid units.
        """
        spec = eip712.as_bytes32(spec_hash, "spec_hash")
        if min_replicas is None or (min_replicas == replicas and trusted_streak == 0):
            args: tuple[Any, ...] = ("postOrder", spec, units, replicas)
        else:
            args = ("postAdaptiveOrder", spec, units, min_replicas, replicas, trusted_streak)
        receipt = self._send(buyer, self.market, *args, price_per_replica, verifier_fee_per_unit, deadline)
        return int(receipt.event("OrderPosted").args["orderId"]), receipt

    def close_order(self, order_id: int, *, sender: LocalAccount | None = None) -> Receipt:
        """Credit the order's remaining balance to its buyer (buyer any time, anyone after the deadline)."""
        return self._send(sender, self.market, "closeOrder", order_id)

    # ------------------------------------------------------------------ JobMarket: operator

    def sign_accept(
        self,
        provider: LocalAccount,
        order_id: int,
        unit_key: bytes | str,
        deadline: int,
        *,
        nonce: int | None = None,
    ) -> Signed:
        """The provider's acceptance of one unit of `order_id` (EIP-712 Accept), with an unordered nonce."""
        message = {
            "orderId": order_id,
            "unitKey": eip712.as_bytes32(unit_key, "unit_key"),
            "provider": provider.address,
            "nonce": self.accept_nonces.next() if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(provider, self.market_domain, "Accept", message)

    def assign(
        self,
        order_id: int,
        unit_key: bytes | str,
        providers: Sequence[str | LocalAccount],
        verifiers: Sequence[str | LocalAccount],
        accepts: Sequence[Signed],
        *,
        operator: LocalAccount | None = None,
    ) -> tuple[int, Receipt]:
        """Assign one unit (operator only); `accepts[i]` is providers[i]'s `sign_accept`. Returns its id."""
        data = self.assign_calldata(order_id, unit_key, providers, verifiers, accepts)
        receipt = self._send_data(operator, self.market, "assign", data)
        return int(receipt.event("UnitAssigned").args["unitId"]), receipt

    def request_verification(self, unit_id: int, *, operator: LocalAccount | None = None) -> Receipt:
        """Draw the unit for a spot check (operator only): it can then settle only by verdict or expiry."""
        return self._send(operator, self.market, "requestVerification", unit_id)

    # ------------------------------------------------------------------ JobMarket: providers

    def commitment(
        self, result_digest: bytes | str, salt: bytes | str, provider: str | LocalAccount, unit_id: int
    ) -> bytes:
        """The commitment to submit for a result (computed locally; equals the contract's `commitmentOf`)."""
        return eip712.commitment(result_digest, salt, _address(provider), unit_id)

    def commit(self, provider: LocalAccount, unit_id: int, commitment: bytes | str) -> Receipt:
        """The provider commits itself (pays gas)."""
        return self._send(
            provider, self.market, "commit", unit_id, eip712.as_bytes32(commitment, "commitment")
        )

    def sign_commit(
        self,
        provider: LocalAccount,
        unit_id: int,
        commitment: bytes | str,
        deadline: int,
        *,
        nonce: int | None = None,
    ) -> Signed:
        message = {
            "unitId": unit_id,
            "provider": provider.address,
            "commitment": eip712.as_bytes32(commitment, "commitment"),
            "nonce": self.market_nonce(provider) if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(provider, self.market_domain, "Commit", message)

    def commit_with_sig(
        self,
        unit_id: int,
        provider: str | LocalAccount,
        commitment: bytes | str,
        signed: Signed,
        *,
        relayer: LocalAccount | None = None,
    ) -> Receipt:
        """Relay a provider's signed commitment (`sign_commit`)."""
        return self._send(
            relayer,
            self.market,
            "commitWithSig",
            unit_id,
            _address(provider),
            eip712.as_bytes32(commitment, "commitment"),
            *signed.as_args(),
        )

    def reveal(
        self,
        unit_id: int,
        provider: str | LocalAccount,
        result_digest: bytes | str,
        salt: bytes | str,
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Reveal a replica's result; permissionless (the salt is the authorization), relayer by default."""
        return self._send(
            sender,
            self.market,
            "reveal",
            unit_id,
            _address(provider),
            eip712.as_bytes32(result_digest, "result_digest"),
            eip712.as_bytes32(salt, "salt"),
        )

    # ------------------------------------------------------------------ JobMarket: batches

    def sign_unit_commit(
        self, provider: LocalAccount, unit_id: int, commitment: bytes | str, deadline: int
    ) -> SignedCommit:
        """The provider's EIP-712 `UnitCommit` for `commit_batch`; needs no nonce, so no chain read."""
        value = eip712.as_bytes32(commitment, "commitment")
        message = {"unitId": unit_id, "provider": provider.address, "commitment": value, "deadline": deadline}
        signature = eip712.sign_typed(provider, self.market_domain, "UnitCommit", message)
        return SignedCommit(provider.address, value, deadline, signature)

    def commit_batch_calldata(self, unit_id: int, commits: Sequence[SignedCommit]) -> bytes:
        """Call data of `commitBatch`, to send alone (`commit_batch`) or inside a `multicall`."""
        return _calldata(self.market, "commitBatch", unit_id, [commit.as_tuple() for commit in commits])

    def commit_batch(
        self, unit_id: int, commits: Sequence[SignedCommit], *, relayer: LocalAccount | None = None
    ) -> Receipt:
        """Relay several providers' `sign_unit_commit` messages for one unit in one transaction.

        Any subset of the unit's providers, in any order; one bad entry (InvalidSigner, SignatureExpired,
        NotAssignedProvider, AlreadyCommitted, ...) reverts the whole batch; no entries: EmptyBatch.
        """
        data = self.commit_batch_calldata(unit_id, commits)
        return self._send_data(relayer, self.market, "commitBatch", data)

    def reveal_batch_calldata(self, unit_id: int, reveals: Sequence[Reveal]) -> bytes:
        """Call data of `revealBatch`, to send alone (`reveal_batch`) or inside a `multicall`."""
        return _calldata(self.market, "revealBatch", unit_id, [reveal.as_tuple() for reveal in reveals])

    def reveal_batch(
        self, unit_id: int, reveals: Sequence[Reveal], *, sender: LocalAccount | None = None
    ) -> tuple[bool, Receipt]:
        """Reveal several replicas of one unit; permissionless, like `reveal`. Returns (finalized, receipt).

        When these reveals complete the unit with one unanimous digest and it was not drawn for
        verification, the same transaction finalizes it (no separate `finalize`). Differing digests do not
        revert: the unit stays REVEALING and waits for a verdict (finalized is False).
        """
        data = self.reveal_batch_calldata(unit_id, reveals)
        receipt = self._send_data(sender, self.market, "revealBatch", data)
        finalized = any(event.args["unitId"] == unit_id for event in receipt.events_named("UnitFinalized"))
        return finalized, receipt

    # ------------------------------------------------------------------ JobMarket: round path

    def sign_round_commit(
        self,
        provider: LocalAccount,
        order_id: int,
        round_index: int,
        commitments: Sequence[bytes | str],
        deadline: int,
    ) -> RoundSignature:
        """The provider's `RoundCommit` for one round: `commitments` its own slots' of the round, in slot
        order (`provider_commitments`), in compact form."""
        return RoundSignature.of(
            self.round_commit_signature(provider, order_id, round_index, commitments, deadline)
        )

    def round_commit_signature(
        self,
        provider: LocalAccount,
        order_id: int,
        round_index: int,
        commitments: Sequence[bytes | str],
        deadline: int,
    ) -> bytes:
        """The provider's 65-byte `RoundCommit` signature over its own slots' `commitments` of a round (slot
        order), as the market takes it (`/rosters/work`)."""
        message = eip712.round_commit_message(provider.address, order_id, round_index, commitments, deadline)
        return eip712.sign_typed(provider, self.market_domain, "RoundCommit", message)

    def sign_round_work(
        self,
        accounts: Sequence[LocalAccount],
        roster: Roster,
        order_id: int,
        round_index: int,
        commitments: Sequence[bytes | str],
        deadline: int,
    ) -> RoundWork:
        """A whole round's `RoundWork` signed by every roster provider (`accounts` in roster provider order),
        for simulations and tests: `commitments` every slot's, in slot order."""
        values = tuple(eip712.as_bytes32(c, "commitment") for c in commitments)
        signatures = tuple(
            self.sign_round_commit(
                account, order_id, round_index, provider_commitments(roster, p, values), deadline
            )
            for p, account in enumerate(accounts)
        )
        return RoundWork(values, signatures)

    def open_roster(
        self,
        order_id: int,
        roster: Roster,
        accepts: Sequence[Signed],
        *,
        operator: LocalAccount | None = None,
    ) -> Receipt:
        """Fix an order's roster (operator only); `accepts[i]` is providers[i]'s `sign_accept` of
        `roster.key`."""
        return self._send(
            operator,
            self.market,
            "openRoster",
            order_id,
            list(roster.providers),
            roster.layout,
            roster.replicas,
            roster.units_per_round,
            roster.rounds,
            list(roster.verifiers),
            [accept.as_args() for accept in accepts],
        )

    def sign_round_audit(
        self,
        verifier: LocalAccount,
        roster: Roster,
        order_id: int,
        records: Sequence[AuditRecord],
    ) -> AuditSignature:
        """A roster verifier's `RoundAudit` of the round records pending a posting: `records` the roster's
        audit records as the posting step leaves them before it posts (its own round's,
        `AuditRecord.of_round`, last); it signs the chain of those after the last posting (sign only after
        re-executing their units)."""
        if verifier.address not in roster.verifiers:
            raise InvalidInput(f"{verifier.address} is not one of the roster's verifiers")
        message = {
            "orderId": order_id,
            "records": eip712.audit_chains([r.as_tuple() for r in records])[1],
        }
        signature = eip712.sign_typed(verifier, self.market_domain, "RoundAudit", message)
        r, vs = eip712.compact_signature(signature)
        return AuditSignature(roster.verifiers.index(verifier.address), r, vs)

    def step_round(
        self,
        order_id: int,
        roster: Roster,
        openings: Sequence[Reveal],
        deadline: int,
        work: RoundWork | None,
        *,
        withheld: int = 0,
        verifiers: Sequence[str | LocalAccount] = (),
        audits: Sequence[AuditSignature] = (),
        audit_records: Sequence[AuditRecord] = (),
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Reveal the pending round (`openings` per slot in slot order; their `provider` is not sent: the
        roster fixes it) and commit the next (`work`: every slot's commitment and every provider's
        `RoundCommit`, signed up to `deadline`; None commits nothing); permissionless,
        but a unit that needs a verdict is set aside only by the operator with `verifiers` (the receipt's
        `UnitSetAside` events name the units it became). Bit i of `withheld` gives slot i as not opened
        (after the round's reveal window only): its opening's `result_digest` is then the slot's
        commitment, its salt is ignored. The revealed round's drawn unanimous units are left pending a
        posting (any step without `verifiers`, or a step that posts) or set aside. `audits`: a
        posting, a majority of the roster's verifiers' `sign_round_audit` of every pending record (this
        step's round's included): their units are paid at close. `audit_records`: the roster's audit records
        so far (`audit_records_after`), whose posted and pending chains the step checks."""
        posted, pending = eip712.audit_chains([r.as_tuple() for r in audit_records])
        return self._send(
            sender,
            self.market,
            "stepRound",
            order_id,
            list(roster.providers),
            roster.layout,
            [opening.as_tuple()[1:] for opening in openings],
            withheld,
            sequence_of_addresses(verifiers),
            deadline,
            (work or RoundWork((), ())).as_tuple(),
            (
                pending,
                list(roster.verifiers) if audits else [],
                posted,
                [audit.as_tuple() for audit in audits],
            ),
        )

    def publish_opening(
        self,
        order_id: int,
        roster: Roster,
        slot: int,
        opening: Reveal,
        commitments: Sequence[bytes],
        *,
        audit_records: Sequence[AuditRecord] = (),
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Publish one slot's opening of the pending round on chain (`commitments`: every slot's, as the
        round's commit step carried them; `audit_records` the roster's, for its pending chain), so that no
        step can give the slot as withheld; permissionless."""
        return self._send(
            sender,
            self.market,
            "publishOpening",
            order_id,
            list(roster.providers),
            roster.layout,
            slot,
            *opening.as_tuple()[1:],
            [eip712.as_bytes32(c, "commitment") for c in commitments],
            eip712.audit_chains([r.as_tuple() for r in audit_records])[1],
        )

    def close_roster(
        self,
        order_id: int,
        roster: Roster,
        audit_records: Sequence[AuditRecord] = (),
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Pay a roster's revealed rounds and release its collateral (anyone once every round is
        revealed, or after the order's deadline); `audit_records`: every audit record of the roster, in
        order (its verifiers' fees are counted from them)."""
        return self._send(
            sender,
            self.market,
            "closeRoster",
            order_id,
            list(roster.providers),
            roster.layout,
            list(roster.verifiers),
            [r.as_tuple() for r in audit_records],
        )

    def challenge_audit(
        self,
        order_id: int,
        roster: Roster,
        round_index: int,
        unit: int,
        audit_records: Sequence[AuditRecord],
        digests: Sequence[bytes],
        verifiers: Sequence[str | LocalAccount],
        *,
        operator: LocalAccount | None = None,
    ) -> Receipt:
        """Set aside a unit a posted round audit paid (operator only, within verdictWindow of the posting
        that covered it): `audit_records` every audit record of the roster as last emitted
        (`audit_records_after`; those from the first round record of the covering posting to the last posting
        are sent, the posted chain before them as a hash), `digests` the round's audited units' agreed digests
        in unit order, `verifiers` the unit's verdict verifiers (none of the posting's signers)."""
        index = next(
            (i for i, r in enumerate(audit_records) if not r.posting and r.round == round_index), None
        )
        if index is None:
            raise InvalidInput(f"no audit record of round {round_index}")
        start = index
        while start > 0 and not audit_records[start - 1].posting:
            start -= 1
        end = max((i + 1 for i, r in enumerate(audit_records) if r.posting), default=0)
        return self._send(
            operator,
            self.market,
            "challengeAudit",
            order_id,
            list(roster.providers),
            roster.layout,
            ((index - start) << 8) | unit,
            eip712.audit_chains([r.as_tuple() for r in audit_records[:start]])[0],
            [r.as_tuple() for r in audit_records[start:end]],
            [eip712.as_bytes32(d, "digest") for d in digests],
            list(roster.verifiers),
            sequence_of_addresses(verifiers),
        )

    def audit_records(self, order_id: int, from_block: int | None = None) -> list[AuditRecord]:
        """The roster's audit records as its events left them (`audit_records_of`): one filtered log query
        by event and order, for whoever steps, posts or closes the roster."""
        names = ("RoundRevealed", "AuditPosted", "AuditChallenged", "PendingSetAside")
        items = [
            item
            for item in self.contracts["JobMarket"].abi
            if item.get("type") == "event" and item.get("name") in names
        ]
        query: Any = {
            "fromBlock": self.deployment.block if from_block is None else from_block,
            "toBlock": "latest",
            "address": self.market.address,
            "topics": [
                sorted({event_topic(item) for item in items}),
                "0x" + order_id.to_bytes(32, "big").hex(),
            ],
        }
        decoded = (self.transactor.event_decoder.decode(log) for log in self.w3.eth.get_logs(query))
        return audit_records_of([event for event in decoded if event is not None and event.name in names])

    def roster_events(
        self, order_id: int, names: Sequence[str], *, round_index: int | None = None
    ) -> list[Event]:
        """The round path's `names` events of one order (and of one round, for events that index it), in
        chain order: one filtered log query, not a scan of every event since deployment."""
        items = [
            item
            for item in self.contracts["JobMarket"].abi
            if item.get("type") == "event" and item.get("name") in names
        ]
        topics: list[Any] = [
            sorted({event_topic(item) for item in items}),
            "0x" + order_id.to_bytes(32, "big").hex(),
        ]
        if round_index is not None:
            topics.append("0x" + round_index.to_bytes(32, "big").hex())
        query: Any = {
            "fromBlock": self.deployment.block,
            "toBlock": "latest",
            "address": self.market.address,
            "topics": topics,
        }
        decoded = (self.transactor.event_decoder.decode(log) for log in self.w3.eth.get_logs(query))
        return [event for event in decoded if event is not None and event.name in names]

    def opened_roster(self, order_id: int) -> Roster:
        """The roster of `order_id` as the chain opened it (`RosterOpened`, `RosterVerifiers`): what a
        provider publishes its opening with, read from the chain rather than from the market."""
        events = self.roster_events(order_id, ("RosterOpened", "RosterVerifiers"))
        opened = [e.args for e in events if e.name == "RosterOpened"]
        if not opened:
            raise ChainError(f"order {order_id} has no roster on chain")
        args = opened[0]
        replicas, units = int(args["replicas"]), int(args["unitsPerRound"])
        layout = int(args["layout"])
        return Roster(
            providers=tuple(to_checksum_address(p) for p in args["providers"]),
            slots=tuple((layout >> (5 * slot)) & 31 for slot in range(units * replicas)),
            replicas=replicas,
            units_per_round=units,
            rounds=int(args["rounds"]),
            verifiers=next((tuple(e.args["verifiers"]) for e in events if e.name == "RosterVerifiers"), ()),
        )

    def round_commitments(self, order_id: int, round_index: int) -> list[bytes]:
        """Every slot's commitment of round `round_index` in slot order, from the calldata of the step that
        committed it (the transaction of its `RoundCommitted`: `stepRound` sent to the JobMarket, alone or
        inside its `multicall`). Events do not carry them; check them against the roster's round hash
        (`round_audit.round_hash`) before use."""
        committed = self.roster_events(order_id, ("RoundCommitted",), round_index=round_index)
        if not committed:
            raise ChainError(f"round {round_index} of order {order_id} is not committed on chain")
        tx = self.w3.eth.get_transaction(committed[0].tx_hash)  # type: ignore[arg-type]
        if to_checksum_address(tx["to"]) != self.market.address:
            raise ChainError(f"the step committing round {round_index} did not call the JobMarket itself")
        for args in self._step_calls(bytes(tx["input"])):
            if int(args[0]) == order_id and args[7][0]:
                return [bytes(commitment) for commitment in args[7][0]]
        raise ChainError(f"no stepRound of order {order_id} with commitments in {committed[0].tx_hash}")

    def _step_calls(self, data: bytes) -> list[tuple[Any, ...]]:
        """The decoded arguments of each `stepRound` call in JobMarket calldata `data` (a `multicall`'s
        inner calls included)."""
        from eth_abi import decode as abi_decode
        from eth_utils import function_abi_to_4byte_selector, get_abi_input_types

        found: list[tuple[Any, ...]] = []
        for entry in self.contracts["JobMarket"].abi:
            if entry.get("type") != "function" or entry.get("name") not in ("stepRound", "multicall"):
                continue
            item: Any = entry
            if data[:4] != function_abi_to_4byte_selector(item):
                continue
            args = tuple(abi_decode(get_abi_input_types(item), data[4:]))
            if item["name"] == "stepRound":
                found.append(args)
            else:
                for call in args[0]:
                    found += self._step_calls(bytes(call))
        return found

    def set_aside_unit(self, order_id: int, round_index: int, unit: int) -> int | None:
        """The unit id unit `unit` of round `round_index` became when its step set it aside
        (`UnitSetAside`; None: not set aside)."""
        for event in self.roster_events(order_id, ("UnitSetAside",), round_index=round_index):
            if int(event.args["unit"]) == unit:
                return int(event.args["unitId"])
        return None

    def round_audit_signature(self, verifier: LocalAccount, order_id: int, records: bytes) -> bytes:
        """A roster verifier's 65-byte `RoundAudit(orderId, records)` signature over the pending chain
        `records` (`round_audit.records_through`); sign only what you recomputed and re-executed."""
        message = {"orderId": order_id, "records": eip712.as_bytes32(records, "records")}
        return eip712.sign_typed(verifier, self.market_domain, "RoundAudit", message)

    def set_aside_pending(
        self,
        order_id: int,
        roster: Roster,
        audit_records: Sequence[AuditRecord],
        count: int,
        *,
        digests: Sequence[Sequence[bytes]] = (),
        verifiers: Sequence[str | LocalAccount] = (),
        commitments: Sequence[bytes] = (),
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Take the last `count` of the roster's pending audit records (`audit_records_after`) off its pending
        chain, so that no posting pays them (the way out of pending audits): with `verifiers` (the operator
        only) their units are set aside for verdicts, `digests` each taken record's round's unit digests in
        unit order (`RoundRevealed`'s); without (anyone, after the order's deadline + verdictWindow) they are
        dropped unpaid. `commitments`: every slot's commitment of the round committed and not yet revealed,
        if one is (as its commit step carried them)."""
        taken = list(audit_records[len(audit_records) - count :])
        if count < 1 or len(taken) != count or any(r.posting for r in taken):
            raise InvalidInput(f"the last {count} audit records are not all pending round records")
        committed = b"\x00" * 32
        if commitments:
            round_index = self.get_roster(order_id).committed - 1
            committed = eip712.round_commitments_chain(order_id, round_index, commitments)
        return self._send(
            sender,
            self.market,
            "setAsidePending",
            order_id,
            list(roster.providers),
            roster.layout,
            eip712.audit_chains([r.as_tuple() for r in audit_records[: len(audit_records) - count]])[1],
            [r.as_tuple() for r in taken],
            [eip712.as_bytes32(d, "digest") for round_digests in digests for d in round_digests],
            committed,
            sequence_of_addresses(verifiers),
        )

    def get_roster(self, order_id: int) -> RosterInfo:
        raw, round_hash = self._view(self.market, "getRoster", order_id)
        return RosterInfo(
            key=bytes(raw[0]),
            units_per_round=int(raw[1]),
            required_streak=int(raw[2]),
            rounds=int(raw[3]),
            committed=int(raw[4]),
            pending_block=int(raw[5]),
            pending_since=int(raw[6]),
            replicas=int(raw[7]),
            closed=bool(raw[8]),
            set_aside_units=int(raw[9]),
            open_set_aside=int(raw[10]),
            fault_marks=int(raw[12]),
            pending_round_hash=bytes(round_hash),
            audits_pending=bool(raw[11]),
        )

    def assign_calldata(
        self,
        order_id: int,
        unit_key: bytes | str,
        providers: Sequence[str | LocalAccount],
        verifiers: Sequence[str | LocalAccount],
        accepts: Sequence[Signed],
    ) -> bytes:
        """Call data of `assign`, to send alone (`assign`) or inside the operator's `multicall`."""
        return _calldata(
            self.market,
            "assign",
            order_id,
            eip712.as_bytes32(unit_key, "unit_key"),
            sequence_of_addresses(providers),
            sequence_of_addresses(verifiers),
            [signed.as_args() for signed in accepts],
        )

    def market_calldata(self, function: str, *args: Any) -> bytes:
        """Call data of any JobMarket function (ABI-encoded by the contract's ABI), e.g. for `multicall`."""
        try:
            return _calldata(self.market, function, *args)
        except Exception as err:  # web3 raises several unrelated types for an unknown name or bad args
            raise InvalidInput(f"cannot encode JobMarket.{function}{tuple(args)!r}: {err}") from err

    def multicall(self, calls: Sequence[bytes], *, sender: LocalAccount | None = None) -> Receipt:
        """Run several JobMarket calls (from the `..._calldata` builders) in one transaction, as `sender`.

        Each call runs with the original sender, so operator-only calls (assign) need the operator as
        sender. Lets the operator pipeline units: one transaction per tick revealing unit k, committing
        unit k+1 and assigning unit k+2 costs less than the separate transactions (one 21,000 base, warm
        storage). A failing call reverts everything with that call's own typed error. Gas is estimated.
        """
        if not calls:
            raise InvalidInput("multicall needs at least one call")
        data = _calldata(self.market, "multicall", list(calls))
        return self._send_data(sender, self.market, "multicall", data)

    # ------------------------------------------------------------------ JobMarket: settlement

    def finalize(self, unit_id: int, *, sender: LocalAccount | None = None) -> Receipt:
        """Fast-path settlement of a unanimous, undrawn unit; permissionless."""
        return self._send(sender, self.market, "finalize", unit_id)

    def sign_verdict(
        self,
        verifier: LocalAccount,
        unit_id: int,
        outcomes: Sequence[int],
        deadline: int,
    ) -> VerifierSignature:
        """A verifier's signature over per-replica outcomes (`Outcome`) only: no nonce, no reasons."""
        message = {"unitId": unit_id, "outcomesHash": eip712.outcomes_hash(outcomes), "deadline": deadline}
        signature = eip712.sign_typed(verifier, self.market_domain, "Verdict", message)
        return VerifierSignature(verifier.address, deadline, signature)

    def submit_verdict(
        self,
        unit_id: int,
        outcomes: Sequence[int],
        verdicts: Sequence[VerifierSignature],
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Relay `sign_verdict` signatures of a majority of the unit's verifiers; settles it per outcome."""
        signatures = [signed.as_tuple() for signed in verdicts]
        return self._send(
            sender, self.market, "submitVerdict", unit_id, [int(outcome) for outcome in outcomes], signatures
        )

    def slash_contradicting_verifier(
        self,
        unit_id: int,
        outcomes: Sequence[int],
        evidence: VerifierSignature,
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Slash an assigned verifier whose own `sign_verdict` over `outcomes` contradicts the unit's truth
        (VerdictAppeals `slashContradiction`): the verdict once its appeal window passed unappealed, else
        the panel's decision. `TruthNotFixed` before that, `AppealLapsed` if the panel never decided. The
        sender earns the bounty in tokens. Permissionless."""
        return self._send(
            sender,
            self.appeals,
            "slashContradiction",
            unit_id,
            [int(outcome) for outcome in outcomes],
            evidence.as_tuple(),
        )

    def slash_round_audit(
        self, unit_id: int, truth: Sequence[int], *, sender: LocalAccount | None = None
    ) -> Receipt:
        """Slash every roster verifier that signed the round audit of a unit `challenge_audit` set aside,
        once the unit's `truth` (fixed as for `slash_contradicting_verifier`) calls a replica fraud
        (VerdictAppeals `slashRoundAudit`). The sender earns the bounty in tokens. Permissionless."""
        return self._send(
            sender, self.appeals, "slashRoundAudit", unit_id, [int(outcome) for outcome in truth]
        )

    def expire_unit(self, unit_id: int, *, sender: LocalAccount | None = None) -> Receipt:
        """Expire an unsettled unit after its verdict deadline; permissionless."""
        return self._send(sender, self.market, "expireUnit", unit_id)

    # ------------------------------------------------------------------ VerdictAppeals

    def join_referee_pool(self, referee: LocalAccount) -> Receipt:
        """Lock `referee_stake` of the referee's free stake and enter the pool panels are drawn from."""
        return self._send(referee, self.appeals, "joinPool")

    def leave_referee_pool(self, referee: LocalAccount) -> Receipt:
        """Leave the referee pool and release the referee stake (a panel already drawn keeps the seat)."""
        return self._send(referee, self.appeals, "leavePool")

    def appeal(self, unit_id: int, appellant: LocalAccount) -> Receipt:
        """Appeal the verdict that settled `unit_id`, locking `appeal_bond` of the appellant's free stake."""
        return self._send(appellant, self.appeals, "appeal", unit_id)

    def draw_panel(self, unit_id: int, *, sender: LocalAccount | None = None) -> Receipt:
        """Draw the appeal's referee panel (from the block after the appeal on); permissionless."""
        return self._send(sender, self.appeals, "drawPanel", unit_id)

    def sign_referee_vote(
        self, referee: LocalAccount, unit_id: int, outcomes: Sequence[int], deadline: int
    ) -> RefereeSignature:
        """A seated referee's vote: the outcomes of its own re-execution (no nonce: one vote per appeal)."""
        message = {"unitId": unit_id, "outcomesHash": eip712.outcomes_hash(outcomes), "deadline": deadline}
        signature = eip712.sign_typed(referee, self.appeals_domain, "RefereeVote", message)
        return RefereeSignature(referee.address, deadline, signature)

    def vote(
        self,
        unit_id: int,
        outcomes: Sequence[int],
        signed: RefereeSignature,
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Relay a referee's vote; the vote that makes a majority of the panel decides the appeal."""
        return self._send(
            sender, self.appeals, "vote", unit_id, [int(o) for o in outcomes], signed.as_tuple()
        )

    def resolve_appeal(
        self,
        unit_id: int,
        verdict: Sequence[int],
        decided: Sequence[int],
        *,
        sender: LocalAccount | None = None,
    ) -> Receipt:
        """Move a decided appeal's stakes: the replicas the verdict held as fraud settled by the decision
        (`HeldSettled`), then the bond to the referees (confirmed) or, overturned, the cheats the verdict
        missed slashed too (by JobMarket: `ReplicaSlashed` comes from the market, as for held fraud).
        `verdict` and `decided` are the settled and the panel's outcomes."""
        return self._send(
            sender,
            self.appeals,
            "resolve",
            unit_id,
            [int(o) for o in verdict],
            [int(o) for o in decided],
        )

    def settle_verdict(
        self, unit_id: int, verdict: Sequence[int], *, sender: LocalAccount | None = None
    ) -> Receipt:
        """Settle the replicas the verdict called fraud (JobMarket holds them: collateral locked, no slash
        yet) by the verdict itself, once it stands (VerdictAppeals `settleVerdict`): the cheats are slashed
        and the verdict's signers get the bounty (`ReplicaSlashed`, `HeldSettled`). `verdict` is the outcomes
        that settled the unit (`OutcomesMismatch`). `TruthNotFixed` while the appeal window is open or an
        appeal is pending; a no-op when nothing is held or a decided appeal's `resolve_appeal` settled them.
        Permissionless."""
        return self._send(sender, self.appeals, "settleVerdict", unit_id, [int(o) for o in verdict])

    def check_settle_verdict(self, unit_id: int, verdict: Sequence[int]) -> None:
        """`settle_verdict` as a free eth_call on the pending block: raises the typed error sending it now
        would revert with (`TruthNotFixed` until the unit's truth is fixed), so a relay that waits pays for
        no transaction."""
        self._view(self.appeals, "settleVerdict", unit_id, [int(o) for o in verdict], block="pending")

    def lapse_appeal(self, unit_id: int, *, sender: LocalAccount | None = None) -> Receipt:
        """Close an appeal no majority decided by its vote deadline: bond released, nobody slashed."""
        return self._send(sender, self.appeals, "lapse", unit_id)

    def get_appeal(self, unit_id: int) -> AppealInfo:
        raw = self._view(self.appeals, "getAppeal", unit_id)
        return AppealInfo(
            unit_id=unit_id,
            state=AppealState(int(raw[0])),
            appellant=to_checksum_address(raw[1]),
            vote_deadline=int(raw[2]),
            seed_block=int(raw[3]),
            pool_size=int(raw[4]),
            decided=bytes(raw[5]),
            panel=tuple(to_checksum_address(item) for item in raw[6]),
            votes=tuple(bytes(item) for item in raw[7]),
        )

    def verdict_hash(self, unit_id: int) -> bytes:
        """The outcomes hash of the verdict that settled `unit_id` (32 zero bytes unless verdicted)."""
        return bytes(self._view(self.market, "verdictHashOf", unit_id))

    def truth_of(self, unit_id: int, *, pending: bool = False) -> bytes:
        """The outcomes hash verifiers of `unit_id` are judged against (`TruthNotFixed`, `AppealLapsed`);
        `pending`: as a transaction sent now would find it (its window may have closed since the last
        block)."""
        return bytes(self._view(self.appeals, "truthOf", unit_id, block="pending" if pending else "latest"))

    def in_referee_pool(self, account: str | LocalAccount) -> bool:
        return bool(self._view(self.appeals, "inPool", _address(account)))

    # ------------------------------------------------------------------ JobMarket: credits

    def withdraw_credit(self, account: LocalAccount) -> Receipt:
        """Pull all of the account's credit as tokens."""
        return self._send(account, self.market, "withdrawCredit")

    def sign_withdraw_credit(
        self, account: LocalAccount, deadline: int, *, nonce: int | None = None
    ) -> Signed:
        message = {
            "account": account.address,
            "nonce": self.market_nonce(account) if nonce is None else nonce,
            "deadline": deadline,
        }
        return self._sign(account, self.market_domain, "WithdrawCredit", message)

    def withdraw_credit_with_sig(
        self, account: str | LocalAccount, signed: Signed, *, relayer: LocalAccount | None = None
    ) -> Receipt:
        """Relay a signed withdrawal; the tokens go to `account`, the relayer pays the gas."""
        return self._send(
            relayer,
            self.market,
            "withdrawCreditWithSig",
            _address(account),
            *signed.as_args(),
        )

    # ------------------------------------------------------------------ JobMarket: views

    def credits(self, account: str | LocalAccount) -> int:
        return int(self._view(self.market, "credits", _address(account)))

    def reputation(self, account: str | LocalAccount) -> Reputation:
        valid, fault, fraud, consecutive = self._view(self.market, "reputationOf", _address(account))
        return Reputation(int(valid), int(fault), int(fraud), int(consecutive))

    def get_order(self, order_id: int) -> OrderInfo:
        raw = self._view(self.market, "getOrder", order_id)
        return OrderInfo(
            order_id=order_id,
            buyer=to_checksum_address(raw[0]),
            deadline=int(raw[1]),
            units=int(raw[2]),
            price_per_replica=int(raw[3]),
            verifier_fee_per_unit=int(raw[4]),
            balance=int(raw[5]),
            delivered=int(raw[6]),
            open_units=int(raw[7]),
            replicas=int(raw[8]),
            closed=bool(raw[9]),
            min_replicas=int(raw[10]),
            trusted_streak=int(raw[11]),
        )

    def get_unit(self, unit_id: int) -> UnitInfo:
        raw = self._view(self.market, "getUnit", unit_id)
        return UnitInfo(
            unit_id=unit_id,
            order_id=int(raw[0]),
            state=UnitState(int(raw[1])),
            replicas=int(raw[2]),
            verifier_count=int(raw[3]),
            committed_mask=int(raw[4]),
            revealed_mask=int(raw[5]),
            drawn=bool(raw[6]),
            commit_deadline=int(raw[7]),
            reveal_deadline=int(raw[8]),
            verdict_deadline=int(raw[9]),
        )

    def replica(self, unit_id: int, index: int) -> ReplicaInfo:
        provider, digest, committed, revealed = self._view(self.market, "replicaOf", unit_id, index)
        return ReplicaInfo(to_checksum_address(provider), bytes(digest), bool(committed), bool(revealed))

    def verifiers_of(self, unit_id: int) -> list[str]:
        return [to_checksum_address(item) for item in self._view(self.market, "verifiersOf", unit_id)]

    def total_escrow(self) -> int:
        return int(self._view(self.market, "totalEscrow"))

    def total_credits(self) -> int:
        return int(self._view(self.market, "totalCredits"))

    def order_count(self) -> int:
        return int(self._view(self.market, "orderCount"))

    def unit_count(self) -> int:
        return int(self._view(self.market, "unitCount"))

    def market_nonce(self, account: str | LocalAccount) -> int:
        """Next sequential job-market nonce of `account` (one counter: Commit, WithdrawCredit)."""
        return int(self._view(self.market, "nonces", _address(account)))

    def balances(self, account: str | LocalAccount) -> AccountBalances:
        """Tokens in the wallet, credit in the market and stake in the stake manager of one account."""
        position = self.stake_of(account)
        return AccountBalances(
            tokens=self.token_balance(account),
            credits=self.credits(account),
            bonded=position.bonded,
            locked=position.locked,
            unbonding=position.unbonding,
        )


def event_topic(item: dict[str, Any]) -> str:
    """topic0 of an event ABI item: keccak of its canonical signature, hex."""
    return "0x" + keccak(text=abi_signature(item)).hex()


def _calldata(contract: Contract, function: str, *args: Any) -> bytes:
    return bytes.fromhex(contract.encode_abi(function, args=list(args))[2:])


def _created(receipt: Receipt, name: str) -> str:
    if receipt.contract_address is None:
        raise DeploymentError(f"deploying {name} created no contract (tx {receipt.tx_hash})")
    return receipt.contract_address


def sequence_of_addresses(values: Sequence[str | LocalAccount]) -> list[str]:
    return [_address(value) for value in values]
