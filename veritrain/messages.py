"""Typed API messages shared by the market, the agents and the demo, and EIP-712 signing of agent messages.

Every model is frozen and rejects unknown fields, so what was signed is exactly what is stored. Agent
messages (registration, heartbeat, offer) are signed under the domain ("Veritrain Market", "1",
chainId): a signature made for another chain recovers another address and is refused. Each carries a
per-agent ``nonce`` and ``timestamp`` that the market requires to increase strictly (replay defence).

Forms the contracts check themselves (Accept, Commit, Verdict under the JobMarket domain; built and
signed with :mod:`veritrain.chain.eip712`) travel here as relayed submissions; the market re-checks
their signatures so a bad one is refused before it costs gas.
"""

from __future__ import annotations

import json
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Literal, TypeVar

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from veritrain.errors import InvalidInput, InvalidSignature, ReplayedMessage

if TYPE_CHECKING:
    from veritrain.diloco import OuterConfig

MARKET_DOMAIN_NAME = "Veritrain Market"
DOMAIN_VERSION = "1"
MAX_REPLICAS = 5
UINT64_MAX = 2**64 - 1
UINT256_MAX = 2**256 - 1
CHECKPOINTS_PER_UNIT = 4  # PoL segments per unit when the order names no checkpoint interval
TRUSTED_STREAK = 20  # default consecutive valid units before an adaptive order gives a provider k = 1
PROBATION_STREAK = 5  # consecutive valid units before a provider's units may skip verification (JobMarket)
MAX_SHARDS = 1024  # shards per round an order may ask for


def _checksum(value: str) -> str:
    try:
        return to_checksum_address(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not an address: {value!r}") from exc


def _lower_hex(value: str) -> str:
    return value.lower()


Address = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$"), AfterValidator(_checksum)]
Bytes32Hex = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{64}$"), AfterValidator(_lower_hex)]
SignatureHex = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{130}$"), AfterValidator(_lower_hex)]
Uint64 = Annotated[int, Field(ge=0, le=UINT64_MAX)]
Uint256 = Annotated[int, Field(ge=0, le=UINT256_MAX)]
ShortText = Annotated[str, Field(min_length=1, max_length=128)]
RowId = Annotated[int, Field(ge=1, le=2**63 - 1)]  # a market database id (SQL BIGINT)


class Frozen(BaseModel):
    """Base of every API message: immutable, unknown fields refused (pydantic's lax mode for types, so
    JSON arrays become tuples and strings become enums)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentRole(StrEnum):
    PROVIDER = "provider"
    VERIFIER = "verifier"


class ReplicaOutcome(IntEnum):
    """Per-replica verdict, numbered as the JobMarket contract expects."""

    ACCEPT = 0
    FAULT = 1
    FRAUD = 2


# --- signed agent messages (market domain) ----------------------------------------------------------


class AgentMessage(Frozen):
    """A message an agent signs with its key; ``agent`` is the claimed signer."""

    PRIMARY_TYPE: ClassVar[str]
    # (EIP-712 field name, EIP-712 type, model attribute) after the common agent/nonce/timestamp fields.
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]]

    agent: Address
    nonce: Uint64
    timestamp: Uint64

    def typed_data(self, chain_id: int) -> dict[str, Any]:
        """Full EIP-712 typed data of this message under the market domain of ``chain_id``."""
        fields = [("agent", "address", "agent"), ("nonce", "uint64", "nonce")]
        fields += [("timestamp", "uint64", "timestamp"), *self.EXTRA_FIELDS]
        message = {name: _typed_value(getattr(self, attr)) for name, _, attr in fields}
        return {
            "types": {
                "EIP712Domain": [
                    {"name": "name", "type": "string"},
                    {"name": "version", "type": "string"},
                    {"name": "chainId", "type": "uint256"},
                ],
                self.PRIMARY_TYPE: [{"name": name, "type": typ} for name, typ, _ in fields],
            },
            "primaryType": self.PRIMARY_TYPE,
            "domain": {"name": MARKET_DOMAIN_NAME, "version": DOMAIN_VERSION, "chainId": chain_id},
            "message": message,
        }


def _typed_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, StrEnum):
        return value.value
    return value


class Registration(AgentMessage):
    """An agent announces itself: role, operator (for distinct-operator replicas), device, recipes."""

    PRIMARY_TYPE: ClassVar[str] = "Registration"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("role", "string", "role"),
        ("operator", "address", "operator"),
        ("memoryMb", "uint64", "memory_mb"),
        ("gflops", "uint64", "gflops"),
        ("hardwareClass", "string", "hardware_class"),
        ("recipes", "string[]", "recipes"),
        ("p2pAddr", "string", "p2p_addr"),
    )

    role: AgentRole
    operator: Address
    memory_mb: Uint64
    gflops: Annotated[int, Field(ge=1, le=UINT64_MAX)]
    hardware_class: ShortText
    recipes: tuple[ShortText, ...] = Field(default=(), max_length=64)
    p2p_addr: Annotated[str, Field(max_length=512)] = ""


class Heartbeat(AgentMessage):
    """Liveness and the agent's pull for work; the reply carries its assignments."""

    PRIMARY_TYPE: ClassVar[str] = "Heartbeat"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (("busy", "bool", "busy"),)

    busy: bool = False


class Offer(AgentMessage):
    """A provider's ask: token base units per PFLOP of training compute, valid until ``expires_at``."""

    PRIMARY_TYPE: ClassVar[str] = "Offer"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pricePerPflop", "uint256", "price_per_pflop"),
        ("expiresAt", "uint64", "expires_at"),
    )

    price_per_pflop: Uint256
    expires_at: Uint64


MAX_PROGRESS_POINTS = 64
LOSS_SCALE = 10**6  # EIP-712 has no floats: a loss travels as round(loss × 10⁶)


class Progress(AgentMessage):
    """Training losses a provider reports while its replica of a unit runs (the dashboard's live curve).

    Reported, not verified: the market shows them as the provider's word until the unit is settled, and
    drops the points of a replica judged fault or fraud. ``steps`` are 1-based within the unit."""

    PRIMARY_TYPE: ClassVar[str] = "Progress"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("unitId", "uint64", "unit_id"),
        ("steps", "uint64[]", "steps"),
        ("lossesE6", "uint64[]", "losses_e6"),
    )

    unit_id: RowId
    steps: tuple[Annotated[int, Field(ge=1, le=10**9)], ...] = Field(
        min_length=1, max_length=MAX_PROGRESS_POINTS
    )
    losses_e6: tuple[Uint64, ...] = Field(min_length=1, max_length=MAX_PROGRESS_POINTS)

    @model_validator(mode="after")
    def _paired(self) -> Progress:
        if len(self.steps) != len(self.losses_e6):
            raise ValueError(f"{len(self.steps)} steps but {len(self.losses_e6)} losses")
        return self


class CustodyReport(AgentMessage):
    """An agent tells the market it now holds a state blob the market asked it to keep (see ``Custody``):
    from then on the market lists it as a holder of that state."""

    PRIMARY_TYPE: ClassVar[str] = "CustodyReport"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (("stateDigest", "bytes32", "state_digest"),)

    state_digest: Bytes32Hex


class PlantEnrollment(AgentMessage):
    """The market's canary account (``agent``, the signer) vouches for ``plant`` as one of the operator's
    planted cheats (market/canary.py): a fresh key its plant agent moved to after the last one was caught.
    The market keeps it out of the stake-weighted draw and routes planted units to it."""

    PRIMARY_TYPE: ClassVar[str] = "PlantEnrollment"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (("plant", "address", "plant"),)

    plant: Address


class EvidenceRequest(AgentMessage):
    """A verifier asks for the evidence of a unit whose verdict is in (a referee re-executes it when seated
    on the unit's appeal panel): the replicas' reported digests, their peers, the unit's work."""

    PRIMARY_TYPE: ClassVar[str] = "EvidenceRequest"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (("unitId", "uint256", "chain_unit_id"),)

    chain_unit_id: Uint256


class AgentInfo(Frozen):
    """The market's view of a registered agent (reply to a registration)."""

    address: Address
    role: AgentRole
    operator: Address
    online: bool


MessageT = TypeVar("MessageT", bound=AgentMessage)


class RoundAuditRefusal(AgentMessage):
    """A roster verifier refuses a round audit (a unit it re-ran does not hold, or what it was asked to sign
    is not what the chain says): the round's drawn units are then set aside for a per-unit verdict."""

    PRIMARY_TYPE: ClassVar[str] = "RoundAuditRefusal"
    EXTRA_FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("orderId", "uint256", "order_id"),
        ("round", "uint32", "round_index"),
        ("reason", "string", "reason"),
    )

    order_id: RowId
    round_index: Annotated[int, Field(ge=0, le=2**32 - 1)]
    reason: Annotated[str, Field(min_length=1, max_length=512)]


class Signed(Frozen, Generic[MessageT]):
    """A message with its 65-byte signature (hex)."""

    message: MessageT
    signature: SignatureHex


def sign_message(message: MessageT, private_key: str | bytes, chain_id: int) -> Signed[MessageT]:
    """Sign an agent message under the market domain of ``chain_id``."""
    signable = encode_typed_data(full_message=message.typed_data(chain_id))
    signature = Account.sign_message(signable, private_key=private_key).signature
    return Signed(message=message, signature="0x" + bytes(signature).hex())


def recover_typed_signer(typed_data: dict[str, Any], signature: str) -> str:
    """Checksummed signer of ``typed_data``; a malformed signature is an :class:`InvalidSignature`."""
    try:
        return str(Account.recover_message(encode_typed_data(full_message=typed_data), signature=signature))
    except Exception as exc:  # eth_keys raises several unrelated types for bad v/r/s values
        raise InvalidSignature(f"signature cannot be recovered: {exc}") from exc


def verify_signed(signed: Signed[MessageT], chain_id: int) -> MessageT:
    """The message if its signature recovers to ``message.agent``, else :class:`InvalidSignature`."""
    recovered = recover_typed_signer(signed.message.typed_data(chain_id), signed.signature)
    if recovered != signed.message.agent:
        raise InvalidSignature(
            f"{signed.message.PRIMARY_TYPE} claims agent {signed.message.agent} but was signed by {recovered}"
        )
    return signed.message


# --- orders ----------------------------------------------------------------------------------------


class UnitKind(StrEnum):
    TRAIN = "train"  # H optimizer steps on one shard
    AGGREGATE = "aggregate"  # the DiLoCo outer step over a round's accepted shard results (M > 1)


class OrderSpec(Frozen):
    """What the buyer wants trained; its hash is the ``specHash`` of the on-chain order."""

    buyer: Address
    recipe: ShortText
    dataset_digest: Bytes32Hex
    total_steps: Annotated[int, Field(ge=1, le=10**9)]
    unit_steps: Annotated[int, Field(ge=1, le=10**9)]
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
    # Adaptive replication (BOINC's): `replicas` is the most a unit gets; a provider with `trusted_streak`
    # consecutive valid units (the JobMarket's counter) works a unit alone, audited by the solo spot check.
    adaptive_replication: bool = False
    trusted_streak: Annotated[int, Field(ge=1, le=65_535)] = TRUSTED_STREAK
    seed: Uint64
    max_price_per_pflop: Uint256
    verifier_fee_per_unit: Uint256 = 0
    deadline: Uint64
    # PoL checkpoint interval in steps; None: CHECKPOINTS_PER_UNIT segments per unit. Part of the spec hash,
    # since replicas and verifiers must cut the transcript at the same steps.
    checkpoint_every: Annotated[int, Field(ge=1, le=10**9)] | None = None
    # DiLoCo (DESIGN.md §3): M shards per round, each trains `unit_steps` inner steps on its own slice of
    # the data; an aggregate unit applies the outer step. `total_steps` counts the steps of each shard.
    # shard_quorum None: the round waits for all M shards; q: it proceeds once q are accepted and the
    # others failed (never fewer than the aggregation rule can take). M = 1 is sequential training and
    # takes none of the outer fields.
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)] = 1
    shard_quorum: Annotated[int, Field(ge=1, le=MAX_SHARDS)] | None = None
    outer_aggregation: Literal["mean", "trimmed_mean", "median"] = "mean"
    outer_trim: Annotated[int, Field(ge=0, le=MAX_SHARDS)] = 0
    outer_lr: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 0.7
    outer_momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.9
    # "unit": the outer step of every round is an aggregate unit. "folded": each shard unit of round r >= 1
    # runs round r-1's outer step itself before training, so a round's units need only the previous round's
    # accepted results (all of a round's units can be committed together); one aggregate unit still runs
    # after the last round (none on the round path). Hashed into `specHash` only when "folded". A spec that
    # does not name it is "folded" for M >= 2 (`_folded_by_default`: it settles on the round path by
    # default) and "unit" for M = 1; a stored spec is read with `from_stored`.
    outer_step: Literal["unit", "folded"] = "unit"

    @model_validator(mode="before")
    @classmethod
    def _folded_by_default(cls, data: Any) -> Any:
        """M >= 2 and no `outer_step` named: "folded", so that a plain sharded order can settle on the round
        path (issue 9). A spec that names "unit" keeps it, and its hash."""
        if isinstance(data, dict) and "outer_step" not in data:
            shards = data.get("shards", 1)
            if isinstance(shards, int) and not isinstance(shards, bool) and shards >= 2:
                return {**data, "outer_step": "folded"}
        return data

    @classmethod
    def from_stored(cls, text: str | bytes) -> OrderSpec:
        """A spec the market stored (`model_dump_json`, which names every field, so it reads back as it was
        hashed). One stored without `outer_step` was written before the field existed, when every order's
        outer step was a unit: it reads as "unit", so its hash stays the one its chain order escrows
        (`model_validate_json` would read it as a new spec naming nothing: "folded", another hash)."""
        try:
            fields = json.loads(text)
        except ValueError as err:
            raise InvalidInput(f"a stored order spec is not JSON: {err}") from err
        if isinstance(fields, dict):
            fields.setdefault("outer_step", "unit")
        return cls.model_validate(fields)

    @model_validator(mode="after")
    def _replication_fields(self) -> OrderSpec:
        if self.adaptive_replication and self.replicas < 2:
            raise ValueError("adaptive_replication needs replicas >= 2 (the most replicas of a unit)")
        if not self.adaptive_replication and self.trusted_streak != TRUSTED_STREAK:
            raise ValueError("trusted_streak needs adaptive_replication")
        return self

    @model_validator(mode="after")
    def _diloco_fields(self) -> OrderSpec:
        if self.shards == 1:
            if self.outer_step == "folded":
                raise ValueError("outer_step 'folded' needs shards >= 2 (M = 1 has no outer step)")
            if any(getattr(self, name) != default for name, default in _DILOCO_DEFAULTS.items()):
                raise ValueError("shard_quorum and the outer_* fields need shards >= 2")
            return self
        try:
            config = self.outer_config()
        except InvalidInput as exc:
            raise ValueError(str(exc)) from exc
        if not config.min_shards <= self.quorum <= self.shards:
            raise ValueError(
                f"shard_quorum must be in {config.min_shards}..{self.shards} "
                f"({self.outer_aggregation} with trim {self.outer_trim}), got {self.shard_quorum}"
            )
        return self

    @property
    def rounds(self) -> int:
        """Rounds of the order; the last one may be shorter."""
        return -(-self.total_steps // self.unit_steps)

    @property
    def quorum(self) -> int:
        """Accepted shards a round needs before its aggregate unit runs (M when the order waits for all)."""
        return self.shards if self.shard_quorum is None else self.shard_quorum

    @property
    def unit_count(self) -> int:
        """Units the order escrows: one per round for M = 1; M training units plus one aggregate unit per
        round for M > 1, or after the last round only when the outer step is folded into the shard units."""
        if self.shards == 1:
            return self.rounds
        aggregates = 1 if self.outer_step == "folded" else self.rounds
        return self.rounds * self.shards + aggregates

    def outer_config(self) -> OuterConfig:
        """The order's outer optimizer as the DiLoCo kernel takes it."""
        from veritrain.diloco import OuterConfig

        return OuterConfig(self.outer_aggregation, self.outer_trim, self.outer_lr, self.outer_momentum)

    def spec_hash(self) -> str:
        """keccak256 of the canonical JSON (sorted keys, no spaces) of the spec. An M = 1 spec leaves the
        DiLoCo fields out, a fixed-replication spec `trusted_streak` and a spec with outer_step "unit" that
        field (all at their defaults), so its hash is what it was before they existed."""
        fields = self.model_dump(mode="json")
        if not self.adaptive_replication:
            fields.pop("trusted_streak")
        if self.shards == 1:
            for name in _DILOCO_DEFAULTS:
                fields.pop(name)
        elif self.outer_step == "unit":
            fields.pop("outer_step")
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "0x" + keccak(canonical.encode()).hex()

    def checkpoint_every_for(self, unit_steps: int) -> int:
        """The checkpoint interval of a unit of ``unit_steps`` steps (never longer than the unit)."""
        return min(unit_steps, self.checkpoint_every or default_checkpoint_every(unit_steps))


_DILOCO_DEFAULTS: dict[str, Any] = {
    "shards": 1,
    "shard_quorum": None,
    "outer_aggregation": "mean",
    "outer_trim": 0,
    "outer_lr": 0.7,
    "outer_momentum": 0.9,
    "outer_step": "unit",
}


def default_checkpoint_every(steps: int) -> int:
    """CHECKPOINTS_PER_UNIT segments per unit, the last one possibly shorter."""
    return max(1, -(-steps // CHECKPOINTS_PER_UNIT))


class OrderRequest(Frozen):
    """Buyer's request to the market: the spec and the id of the on-chain order that escrows it."""

    spec: OrderSpec
    chain_order_id: Uint256
    # "units": every unit settles on the per-unit path (assign, commit, reveal, finalize or verdict);
    # "rounds": the round path (a roster per order, one step per round; a folded, fixed-k order only);
    # None: the market's default, the round path for every spec that can have a roster, else per unit
    # (market.domain.rosters.settlement_of). Not part of the spec hash: it changes how the market settles,
    # not what is trained or escrowed.
    settlement: Literal["units", "rounds"] | None = None


class RosterStatus(Frozen):
    """A round-path order's roster (market/rosters.py): who holds which slot, the Accept's unit key, the
    deadline every RoundCommit of the roster must carry, and the chain's progress (rounds committed and
    revealed by ``stepRound``). ``state``: drawing, accepting, opening, open, closed. Slot ``s`` is unit
    ``s // replicas``'s replica ``s % replicas``, held by ``providers[slots[s]]``."""

    order_id: int
    chain_order_id: int
    state: str
    roster_key: str
    providers: tuple[str, ...]
    slots: tuple[int, ...]
    replicas: int
    units_per_round: int
    rounds: int
    works_deadline: int
    committed: int
    revealed: int

    def units_of(self, provider: str) -> list[tuple[int, int]]:
        """(unit, replica) of every slot `provider` holds, in slot order."""
        return [
            (slot // self.replicas, slot % self.replicas)
            for slot, index in enumerate(self.slots)
            if self.providers[index].lower() == provider.lower()
        ]


class OrderStatus(Frozen):
    order_id: int
    chain_order_id: int
    state: str
    rounds_total: int
    rounds_accepted: int
    current_state_digest: str | None
    units: tuple[UnitStatus, ...]
    roster: RosterStatus | None = None  # a round-path order's roster, once drawn
    # the registered spec: a round-path buyer runs the last outer step itself from it (checked against the
    # spec hash on chain, apps/buyer.py `final_outer_step`)
    spec: OrderSpec | None = None


class UnitStatus(Frozen):
    unit_id: int
    round_index: int
    attempt: int
    state: str
    chain_unit_id: int | None
    providers: tuple[str, ...]
    accepted_state_digest: str | None
    shard: int = 0
    kind: UnitKind = UnitKind.TRAIN
    verifiers: tuple[str, ...] = ()
    # the stake-weighted draw: seed = keccak(blockhash(selection_block) ‖ unit key), so anyone can redo it;
    # selection_block is fixed by the chain (the order's posting, or the settlement the unit follows)
    selection_block: int | None = None
    selection_seed: str | None = None


OrderStatus.model_rebuild()


class OrderPeers(Frozen):
    """Where the results of an order can be fetched: provider address → its libp2p multiaddr."""

    order_id: int
    chain_order_id: int
    peers: dict[str, str]


# --- assignments (heartbeat reply) and relayed settlement forms -------------------------------------


class AssignmentPhase(StrEnum):
    ACCEPT = "accept"  # sign Accept(orderId, unitKey, provider, nonce, deadline) and POST it
    RUN = "run"  # assigned on chain: execute and POST a signed commit before commit_deadline
    REVEAL = "reveal"  # all committed: POST the reveal
    DONE = "done"


class StateSource(Frozen):
    """Where the start state of a unit can be fetched (content address + the agents that hold it)."""

    state_digest: Bytes32Hex | None
    holders: tuple[str, ...] = ()


class OuterFields(Frozen):
    """The order's outer optimizer, as an aggregate unit is told it."""

    aggregation: Literal["mean", "trimmed_mean", "median"]
    trim: Annotated[int, Field(ge=0, le=MAX_SHARDS)]
    lr: float
    momentum: float

    def config(self) -> OuterConfig:
        from veritrain.diloco import OuterConfig

        return OuterConfig(self.aggregation, self.trim, self.lr, self.momentum)


class UnitWork(Frozen):
    """Everything needed to (re-)execute a unit: a provider trains it, a verifier replays its segments.

    M = 1: ``start_state`` is the unit's start (None: the recipe's portable genesis). M > 1: it is the
    round's state (θ_r, outer momentum; None: the genesis round state); a training unit starts from it
    plus ``previous``, its shard's last accepted result (None: fresh AdamW moments); an aggregate unit
    reads ``shard_results`` (per shard its accepted result this round, None for a shard left out under
    the quorum) and applies ``outer``. A training unit that carries ``outer`` (round r >= 1 of a folded
    order, see ``folds``) first runs round r-1's outer step: ``start_state`` is round r-1's state,
    ``shard_results`` round r-1's accepted results, and it trains from the output plus ``previous``.
    """

    unit_id: int
    order_id: int
    recipe: str
    dataset_digest: Bytes32Hex
    seed: int
    round_index: int
    shard: int
    start_step: int
    steps: int
    checkpoint_every: Annotated[int, Field(ge=1)]
    num_shards: Annotated[int, Field(ge=1, le=2**16)]  # units per round (M); the data is cut in M slices
    start_state: StateSource
    kind: UnitKind = UnitKind.TRAIN
    previous: StateSource | None = None
    shard_results: tuple[StateSource | None, ...] = Field(default=(), max_length=MAX_SHARDS)
    outer: OuterFields | None = None

    @property
    def folds(self) -> bool:
        """A training unit that runs the previous round's outer step before it trains (folded order)."""
        return self.kind == UnitKind.TRAIN and self.outer is not None


class Assignment(UnitWork):
    """One replica's next step. ``settlement == "rounds"``: a roster slot of a round-path order: the Accept
    (over ``unit_key``, the roster key; once per roster) goes to ``/rosters/accept``; the commitment for
    ``chain_unit_id`` (``roundUnitId``) waits for the provider's other slots of the round (``round_units``,
    the units whose slots it holds, in slot order): one ``RoundCommit`` over all of them, carrying
    ``commit_deadline`` (one deadline for every signature of a step), goes to ``/rosters/work``; each
    opening goes to ``/rosters/opening``."""

    replica_index: int
    phase: AssignmentPhase
    chain_order_id: int
    unit_key: Bytes32Hex
    accept_deadline: int
    chain_unit_id: int | None = None
    commit_deadline: int | None = None
    settlement: Literal["units", "rounds"] = "units"
    round_units: tuple[int, ...] = Field(default=(), max_length=MAX_SHARDS)


class Custody(Frozen):
    """A state the market asks this agent to keep and serve while an open order may still start a unit
    from it, so its producers are not its only holders; fetch it from ``state.holders`` (the content
    address checks the bytes) and report it with a ``CustodyReport``. A state no longer listed is released.
    ``held``: the market has the agent's report already."""

    state: StateSource
    held: bool = False


MAX_CUSTODY = 256  # states one agent is asked to keep at once


class HeartbeatReply(Frozen):
    agent: Address
    assignments: tuple[Assignment, ...]
    custody: tuple[Custody, ...] = Field(default=(), max_length=MAX_CUSTODY)


class AcceptSubmission(Frozen):
    """A provider's EIP-712 Accept signature for the contract's ``assign``; the market relays it."""

    unit_id: RowId
    provider: Address
    nonce: Uint256
    deadline: Uint256
    signature: SignatureHex


class CommitSubmission(Frozen):
    """A provider's EIP-712 ``UnitCommit`` signature; the market relays it with the unit's other replicas'
    in one ``commitBatch``. No nonce: a provider commits once per unit, so the form is single-use."""

    unit_id: RowId
    provider: Address
    commitment: Bytes32Hex
    deadline: Uint256
    signature: SignatureHex


class RevealSubmission(Frozen):
    """The commitment's preimage plus the off-chain parts of the result (for the next round and verifiers)."""

    unit_id: RowId
    provider: Address
    result_digest: Bytes32Hex
    salt: Bytes32Hex
    state_digest: Bytes32Hex
    transcript_root: Bytes32Hex
    # a folded training unit only: the outer step it ran first (its output's digest and inputs commitment),
    # which its result digest binds (``diloco.folded_result_digest``)
    round_state_digest: Bytes32Hex | None = None
    inputs_commitment: Bytes32Hex | None = None


class RosterAcceptSubmission(Frozen):
    """A roster provider's EIP-712 ``Accept(orderId, rosterKey, provider, nonce, deadline)``: one per roster,
    whatever its slots; the market relays them all in ``openRoster``."""

    order_id: RowId
    provider: Address
    nonce: Uint256
    deadline: Uint256
    signature: SignatureHex


class RosterWorkSubmission(Frozen):
    """A roster provider's work for one round: the commitment of every slot it holds in the round (slot
    order; each for its unit's ``roundUnitId(order, round, unit)``) and one EIP-712 ``RoundCommit(orderId,
    round, provider, commitmentsHash, deadline)`` signature over them (``commitmentsHash`` the keccak256 of
    the commitments, packed), the deadline the roster's ``works_deadline``."""

    order_id: RowId
    provider: Address
    round_index: Annotated[int, Field(ge=0, le=2**32 - 1)]
    commitments: tuple[Bytes32Hex, ...] = Field(min_length=1, max_length=MAX_SHARDS)
    signature: SignatureHex


class RosterOpeningSubmission(Frozen):
    """A roster slot's opening (its commitment's preimage), kept off chain by the market until the step
    that reveals the round, with the off-chain parts of the result as a ``RevealSubmission`` carries them
    (the next round's units start from the round's accepted results)."""

    order_id: RowId
    provider: Address
    round_index: Annotated[int, Field(ge=0, le=2**32 - 1)]
    unit: Annotated[int, Field(ge=0, le=MAX_SHARDS)]
    result_digest: Bytes32Hex
    salt: Bytes32Hex
    state_digest: Bytes32Hex
    transcript_root: Bytes32Hex
    round_state_digest: Bytes32Hex | None = None
    inputs_commitment: Bytes32Hex | None = None


class VerdictSubmission(Frozen):
    """One verifier's outcome-only EIP-712 Verdict signature (no nonce); relayed once a majority of the
    unit's verifiers signed the same outcomes. ``reasons_hash`` stays off chain: the market keeps it as a
    record, it never has to match between verifiers (their reasons carry their own measurements)."""

    job_id: RowId
    verifier: Address
    outcomes: tuple[ReplicaOutcome, ...] = Field(min_length=1, max_length=MAX_REPLICAS)
    reasons_hash: Bytes32Hex
    deadline: Uint256
    signature: SignatureHex


class ReplicaResult(Frozen):
    provider: Address
    result_digest: str | None
    state_digest: str | None
    transcript_root: str | None
    p2p_addr: str


# A verification job's `reason` when a canary unit's reveal is not its known answer (market/canary.py): the
# verifiers re-execute every segment, since the market knows the result is wrong on its hardware class.
CANARY_REASON = "canary"


class VerificationJobView(UnitWork):
    job_id: int
    chain_unit_id: int | None
    replicas: tuple[ReplicaResult, ...]
    randomness: Bytes32Hex
    reason: str


class VerificationJobsReply(Frozen):
    verifier: Address
    jobs: tuple[VerificationJobView, ...]
    custody: tuple[Custody, ...] = Field(default=(), max_length=MAX_CUSTODY)


class RoundOpening(Frozen):
    """One roster slot's opening of a round (the preimage of its commitment, which is on chain)."""

    result_digest: Bytes32Hex
    salt: Bytes32Hex


class RoundAuditJob(Frozen):
    """A round audit a roster verifier is asked for (market/rosters.py): re-execute the round's drawn
    unanimous units (``jobs``, one per audited unit, as a per-unit verification job shows it) and, if every
    one holds, sign ``RoundAudit(chain_order_id, records)``. Nothing here is taken on trust by an honest
    verifier: the openings and ``pending`` must hash to the roster's round hash on chain, ``units`` must be
    the chain's own draw, and ``records`` is recomputed from them (veritrain/chain/round_audit.py)."""

    order_id: RowId
    chain_order_id: Uint256
    round_index: Annotated[int, Field(ge=0, le=2**32 - 1)]
    providers: tuple[Address, ...] = Field(min_length=1, max_length=32)
    slots: tuple[int, ...] = Field(min_length=1, max_length=51)
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
    rounds: Annotated[int, Field(ge=1, le=2**32 - 1)]
    verifiers: tuple[Address, ...] = Field(min_length=1, max_length=5)
    openings: tuple[RoundOpening, ...] = Field(min_length=1, max_length=51)
    pending: Bytes32Hex  # the roster's pending audit chain before this round
    units: Uint256  # bit u: unit u is audited
    records: Bytes32Hex  # the pending audit chain through this round: what the market expects signed
    deadline: Uint64  # the market sets the units aside after this (market clock)
    jobs: tuple[VerificationJobView, ...] = Field(max_length=MAX_SHARDS)


class RoundAuditJobsReply(Frozen):
    verifier: Address
    audits: tuple[RoundAuditJob, ...]


class RoundAuditSubmission(Frozen):
    """A roster verifier's `RoundAudit(chainOrderId, records)` signature (EIP-712, market domain): it re-ran
    the round's audited units and vouches for them. Authorized by the signature itself; the same again is a
    no-op."""

    order_id: RowId
    round_index: Annotated[int, Field(ge=0, le=2**32 - 1)]
    verifier: Address
    records: Bytes32Hex
    signature: SignatureHex


class Ack(Frozen):
    ok: Literal[True] = True
    detail: str = ""


# --- replay defence -------------------------------------------------------------------------------


def require_fresh(
    last_nonce: int | None, last_timestamp: int | None, nonce: int, timestamp: int, now: int, max_skew_s: int
) -> None:
    """Replay defence: nonce and timestamp strictly/weakly increase per agent and the clock is near ours."""
    if abs(timestamp - now) > max_skew_s:
        raise ReplayedMessage(f"timestamp {timestamp} is more than {max_skew_s}s from the market clock {now}")
    if last_nonce is not None and nonce <= last_nonce:
        raise ReplayedMessage(f"nonce {nonce} is not above the last accepted nonce {last_nonce}")
    if last_timestamp is not None and timestamp < last_timestamp:
        raise ReplayedMessage(f"timestamp {timestamp} is older than the last accepted {last_timestamp}")


__all__ = [
    "MARKET_DOMAIN_NAME",
    "AcceptSubmission",
    "Ack",
    "AgentInfo",
    "AgentMessage",
    "AgentRole",
    "Assignment",
    "AssignmentPhase",
    "CommitSubmission",
    "Custody",
    "CustodyReport",
    "EvidenceRequest",
    "Heartbeat",
    "HeartbeatReply",
    "Offer",
    "OrderPeers",
    "OrderRequest",
    "OrderSpec",
    "OrderStatus",
    "OuterFields",
    "PlantEnrollment",
    "Progress",
    "Registration",
    "ReplicaOutcome",
    "ReplicaResult",
    "RevealSubmission",
    "RoundAuditJob",
    "RoundAuditJobsReply",
    "RoundAuditRefusal",
    "RoundAuditSubmission",
    "RoundOpening",
    "Signed",
    "StateSource",
    "UnitKind",
    "UnitStatus",
    "VerdictSubmission",
    "VerificationJobView",
    "VerificationJobsReply",
    "default_checkpoint_every",
    "recover_typed_signer",
    "require_fresh",
    "sign_message",
    "verify_signed",
]
