"""The market's state in SQL (SQLModel): SQLite by default, PostgreSQL by URL; one repository class.

Why uint256 columns are decimal strings: SQLite has no 256-bit integers and its NUMERIC loses precision
above 2⁵³, so money is stored as text and converted back to ``int`` at the boundary (never a float).
Uniqueness that makes retries harmless lives in the schema: one outbox row per (unit, action), one
replica per (unit, provider), one verdict signature per (job, verifier), one chain unit per market unit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import String, Table, TypeDecorator, UniqueConstraint, bindparam, event, func, inspect, text
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Field, Session, SQLModel, col, create_engine, select

from market.domain.states import OrderState, ReplicaState, RoundState, UnitState
from veritrain.errors import MarketError, NotFound


class Uint256Text(TypeDecorator[int]):
    """An unsigned 256-bit integer stored as its decimal string on every backend."""

    impl = String(78)
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**256:
            raise ValueError(f"not a uint256: {value!r}")
        return str(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> int | None:
        return None if value is None else int(value)


# --- tables -------------------------------------------------------------------------------------------


class AgentRow(SQLModel, table=True):
    """A registered provider or verifier (from its signed Registration) and cached chain facts."""

    __tablename__ = "agents"

    address: str = Field(primary_key=True, max_length=42)
    role: str = Field(index=True, max_length=16)
    operator: str = Field(index=True, max_length=42)
    memory_mb: int
    gflops: int
    hardware_class: str = Field(max_length=128)
    recipes_json: str = "[]"
    p2p_addr: str = Field(default="", max_length=512)
    registered_at: int
    online: bool = True
    capacity: int = 1  # concurrent units; the current load is counted from replicas, never stored
    free_stake: int = Field(default=0, sa_type=Uint256Text)
    bonded_stake: int = Field(default=0, sa_type=Uint256Text)  # the selection draw's weight
    # the block of its latest `Staked` event (None: unknown, read before the field existed): a draw seeded by
    # block B counts it only when this is below B (market.domain.selection)
    stake_block: int | None = None
    rep_valid: int = 0
    rep_fault: int = 0
    rep_fraud: int = 0
    rep_consecutive_valid: int = 0

    @property
    def recipes(self) -> tuple[str, ...]:
        return tuple(json.loads(self.recipes_json))


class PlantRow(SQLModel, table=True):
    """A key of the operator's plant agent, enrolled at run time by the canary account's signature
    (market/canary.py); plants named in the configuration (``VERITRAIN_PLANT_AGENTS``) have no row."""

    __tablename__ = "plants"

    address: str = Field(primary_key=True, max_length=42)
    enrolled_by: str = Field(max_length=42)
    enrolled_at: int


class HeartbeatRow(SQLModel, table=True):
    """Latest accepted signed message per agent: the replay guard and the liveness clock."""

    __tablename__ = "heartbeats"

    agent: str = Field(primary_key=True, max_length=42)
    last_nonce: int = Field(default=0, sa_type=Uint256Text)
    last_timestamp: int = 0
    received_at: int = Field(default=0, index=True)


class OfferRow(SQLModel, table=True):
    __tablename__ = "offers"

    agent: str = Field(primary_key=True, max_length=42)
    price_per_pflop: int = Field(sa_type=Uint256Text)
    expires_at: int
    signed_at: int


class OrderRow(SQLModel, table=True):
    __tablename__ = "orders"

    id: int | None = Field(default=None, primary_key=True)
    chain_order_id: int = Field(sa_type=Uint256Text, unique=True)
    buyer: str = Field(index=True, max_length=42)
    spec_json: str
    spec_hash: str = Field(max_length=66)
    recipe: str = Field(max_length=128)
    state: str = Field(default=OrderState.OPEN.value, index=True, max_length=16)
    rounds_total: int
    rounds_accepted: int = 0
    current_state_digest: str | None = Field(default=None, max_length=66)
    flops_per_step: int = Field(sa_type=Uint256Text)
    min_memory_mb: int
    price_per_replica: int = Field(sa_type=Uint256Text)
    max_price_per_pflop: int = Field(sa_type=Uint256Text)
    deadline: int
    created_at: int
    posted_block: int | None = None  # its OrderPosted event's block: the seed block of its first round


class RoundRow(SQLModel, table=True):
    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("order_id", "index"),)

    id: int | None = Field(default=None, primary_key=True)
    order_id: int = Field(foreign_key="orders.id", index=True)
    index: int
    state: str = Field(default=RoundState.OPEN.value, max_length=16)
    start_state_digest: str | None = Field(default=None, max_length=66)
    next_state_digest: str | None = Field(default=None, max_length=66)


class UnitRow(SQLModel, table=True):
    __tablename__ = "units"

    id: int | None = Field(default=None, primary_key=True)
    order_id: int = Field(foreign_key="orders.id", index=True)
    round_id: int = Field(foreign_key="rounds.id", index=True)
    round_index: int
    shard: int = 0
    kind: str = Field(default="train", max_length=16)  # veritrain.messages.UnitKind
    attempt: int = 0
    unit_key: str = Field(unique=True, max_length=66)
    state: str = Field(default=UnitState.PENDING.value, index=True, max_length=16)
    k: int
    start_step: int
    steps: int
    chain_unit_id: int | None = Field(default=None, sa_type=Uint256Text, unique=True)
    accept_deadline: int = 0
    commit_deadline: int = 0
    verifiers_json: str = "[]"
    randomness: str | None = Field(default=None, max_length=66)
    # the draw that chose its replicas and verifiers: seed = keccak(blockhash(selection_block) ‖ unit_key),
    # selection_block fixed by the chain when the unit was created (market.orders.OrderBook.seed_block);
    # None only for a unit created before that, drawn with the head of its matching pass
    selection_block: int | None = None
    selection_seed: str | None = Field(default=None, max_length=66)
    spot_checked: bool = False
    updated_at: int = 0
    settled_block: int | None = None  # the block of the chain event that settled it (seeds what follows it)


class ReplicaRow(SQLModel, table=True):
    __tablename__ = "replicas"
    __table_args__ = (UniqueConstraint("unit_id", "provider"),)

    id: int | None = Field(default=None, primary_key=True)
    unit_id: int = Field(foreign_key="units.id", index=True)
    index: int
    provider: str = Field(index=True, max_length=42)
    state: str = Field(default=ReplicaState.PROPOSED.value, max_length=16)
    accept_nonce: int | None = Field(default=None, sa_type=Uint256Text)
    accept_deadline: int | None = Field(default=None, sa_type=Uint256Text)
    accept_signature: str | None = Field(default=None, max_length=132)
    commitment: str | None = Field(default=None, max_length=66)
    commit_deadline: int | None = Field(default=None, sa_type=Uint256Text)
    commit_signature: str | None = Field(default=None, max_length=132)
    result_digest: str | None = Field(default=None, max_length=66)
    salt: str | None = Field(default=None, max_length=66)
    state_digest: str | None = Field(default=None, max_length=66)
    transcript_root: str | None = Field(default=None, max_length=66)
    # a folded shard unit's outer step (its output is the round's state), bound to its result digest
    round_state_digest: str | None = Field(default=None, max_length=66, index=True)
    inputs_commitment: str | None = Field(default=None, max_length=66)


class MatchLogRow(SQLModel, table=True):
    """Every matching decision with the reason each examined candidate was declined, and the seed it drew
    with (a refill draws with the unit's own seed again, past the candidates it already had)."""

    __tablename__ = "match_log"

    id: int | None = Field(default=None, primary_key=True)
    unit_id: int = Field(index=True)
    at: int
    selected_json: str
    declines_json: str
    selection_block: int | None = None
    selection_seed: str | None = Field(default=None, max_length=66)


class VerificationJobRow(SQLModel, table=True):
    __tablename__ = "verification_jobs"

    id: int | None = Field(default=None, primary_key=True)
    unit_id: int = Field(foreign_key="units.id", unique=True)
    reason: str = Field(max_length=64)
    randomness: str = Field(max_length=66)
    state: str = Field(default="open", index=True, max_length=16)  # open -> quorum -> relayed
    created_at: int


class VerdictSignatureRow(SQLModel, table=True):
    __tablename__ = "verdict_signatures"
    __table_args__ = (UniqueConstraint("job_id", "verifier"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="verification_jobs.id", index=True)
    verifier: str = Field(max_length=42)
    outcomes_json: str
    reasons_hash: str = Field(max_length=66)  # off-chain record only; the chain sees outcomes
    deadline: int = Field(sa_type=Uint256Text)
    signature: str = Field(max_length=132)
    # collateral the chain slashed because these outcomes contradict the unit's verdict (VerifierSlashed)
    slashed: int | None = Field(default=None, sa_type=Uint256Text)


class OutboxRow(SQLModel, table=True):
    """A settlement intent: written in the same transaction as the state change that needs it, sent by
    one task, confirmed from chain events. The (unit, action) key makes a duplicate intent impossible."""

    __tablename__ = "settlement_outbox"
    __table_args__ = (UniqueConstraint("unit_id", "action"),)

    id: int | None = Field(default=None, primary_key=True)
    unit_id: int = Field(foreign_key="units.id", index=True)
    action: str = Field(max_length=80)
    payload_json: str = "{}"  # written by _add_intent, as are the times
    # pending -> sending -> sent -> confirmed; reverted (the chain settled the unit otherwise);
    # back to pending (no answer) or retrying (refused while the unit is open), each after a backoff
    state: str = Field(default="pending", index=True, max_length=16)
    attempts: int = 0
    next_attempt_at: int = 0  # a failed send waits until then (exponential backoff)
    tx_hash: str | None = Field(default=None, max_length=66)
    last_error: str | None = None
    created_at: int = 0
    updated_at: int = 0


class RosterRow(SQLModel, table=True):
    """A round-path order's roster (market/rosters.py): who works each replica slot of every round, drawn
    once. ``state``: drawing -> accepting (drawn, collecting each provider's Accept of ``roster_key``) ->
    opening (open_roster in the roster outbox) -> open (on chain) -> closed; failed (its open can never
    land). The round counters are the chain's (RoundCommitted, RoundRevealed), never the market's guess."""

    __tablename__ = "rosters"

    id: int | None = Field(default=None, primary_key=True)
    order_id: int = Field(foreign_key="orders.id", unique=True)
    chain_order_id: int = Field(sa_type=Uint256Text, unique=True)
    state: str = Field(default="drawing", index=True, max_length=16)
    replicas: int
    units_per_round: int
    rounds: int
    providers_json: str = "[]"
    slots_json: str = "[]"
    roster_key: str | None = Field(default=None, max_length=66)
    selection_block: int | None = None
    works_deadline: int = Field(default=0, sa_type=Uint256Text)  # every round's UnitCommit deadline
    committed: int = 0  # rounds committed on chain
    revealed: int = 0  # rounds revealed on chain
    last_error: str | None = None
    created_at: int
    updated_at: int
    drawn_at: int | None = None  # when the providers were drawn: their Accepts are due accept_timeout_s later
    excluded_json: str | None = None  # parties a redraw leaves out (they failed an open of this roster)
    # the roster's verifiers (JSON list, inside roster_key): they audit its drawn units (RoundAuditRow);
    # None or "[]": none, every drawn unit is set aside for a verdict
    verifiers_json: str | None = None


class RosterAcceptRow(SQLModel, table=True):
    """A roster provider's Accept signature over the roster key (one per provider, whatever its slots)."""

    __tablename__ = "roster_accepts"
    __table_args__ = (UniqueConstraint("roster_id", "provider"),)

    id: int | None = Field(default=None, primary_key=True)
    roster_id: int = Field(foreign_key="rosters.id", index=True)
    provider: str = Field(max_length=42)
    nonce: int = Field(sa_type=Uint256Text)
    deadline: int = Field(sa_type=Uint256Text)
    signature: str = Field(max_length=132)


class RosterWorkRow(SQLModel, table=True):
    """One replica slot of one round: its provider's commitment (for the round unit id) with the provider's
    `RoundCommit` signature over all its slots' commitments of the round (the same on each of its slots),
    then its opening (the commitment's preimage), which the market keeps until the step that reveals it."""

    __tablename__ = "roster_works"
    __table_args__ = (UniqueConstraint("roster_id", "round_index", "slot"),)

    id: int | None = Field(default=None, primary_key=True)
    roster_id: int = Field(foreign_key="rosters.id", index=True)
    round_index: int
    slot: int
    provider: str = Field(max_length=42)
    commitment: str = Field(max_length=66)
    signature: str = Field(max_length=132)
    result_digest: str | None = Field(default=None, max_length=66)
    salt: str | None = Field(default=None, max_length=66)


class RoundAuditRow(SQLModel, table=True):
    """A round's audit by the roster's verifiers (market/rosters.py): the units the chain will draw from it
    (unanimous, no weak provider), the pending audit chain before it and through it (``records``: what a
    verifier signs). ``state``: collecting -> signed (a majority of the roster's verifiers signed
    ``records``: the units may be used, the round's step leaves them pending) | refused (a verifier
    rejected a unit, or no quorum by ``deadline``: the step sets them aside for a verdict)."""

    __tablename__ = "round_audits"
    __table_args__ = (UniqueConstraint("roster_id", "round_index"),)

    id: int | None = Field(default=None, primary_key=True)
    roster_id: int = Field(foreign_key="rosters.id", index=True)
    round_index: int
    units: int  # bit u: unit u is audited
    pending: str = Field(max_length=66)  # the pending audit chain before this round
    records: str = Field(max_length=66)  # the pending audit chain through this round
    seed_block: int  # the block that committed the round: its hash drew the units (the jobs' randomness)
    state: str = Field(default="collecting", max_length=16)
    deadline: int
    created_at: int
    updated_at: int


class RoundAuditVoteRow(SQLModel, table=True):
    """One roster verifier's answer to a round audit: its `RoundAudit` signature over the audit's
    ``records``, or (no signature) its refusal with a reason."""

    __tablename__ = "round_audit_votes"
    __table_args__ = (UniqueConstraint("audit_id", "verifier"),)

    id: int | None = Field(default=None, primary_key=True)
    audit_id: int = Field(foreign_key="round_audits.id", index=True)
    verifier: str = Field(max_length=42)
    signature: str | None = Field(default=None, max_length=132)
    reason: str = ""


class RosterActionRow(SQLModel, table=True):
    """The roster outbox (market/roster_outbox.py): ``open``, ``step:<r>`` (reveal round r-1, commit round
    r), ``close``; one row per (roster, action), states as the unit outbox's (OutboxRow)."""

    __tablename__ = "roster_actions"
    __table_args__ = (UniqueConstraint("roster_id", "action"),)

    id: int | None = Field(default=None, primary_key=True)
    roster_id: int = Field(foreign_key="rosters.id", index=True)
    action: str = Field(max_length=32)
    payload_json: str = "{}"  # written by _add_intent, as are the times
    state: str = Field(default="pending", index=True, max_length=16)
    attempts: int = 0
    next_attempt_at: int = 0
    tx_hash: str | None = Field(default=None, max_length=66)
    last_error: str | None = None
    created_at: int = 0
    updated_at: int = 0


class LossPointRow(SQLModel, table=True):
    """A training loss a provider reported for its replica (signed `Progress`; the dashboard's curve)."""

    __tablename__ = "loss_points"
    __table_args__ = (UniqueConstraint("unit_id", "provider", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    unit_id: int = Field(foreign_key="units.id", index=True)
    provider: str = Field(max_length=42)
    step: int  # 1-based within the unit
    loss_e6: int = Field(sa_type=Uint256Text)
    at: int


class CustodyRow(SQLModel, table=True):
    """An agent asked to keep a state an open order may still start a unit from (market/custody.py);
    ``held_at`` is set by its signed report. Rows live only while the state is live in an open order."""

    __tablename__ = "custody"
    __table_args__ = (UniqueConstraint("order_id", "state_digest", "agent"),)

    id: int | None = Field(default=None, primary_key=True)
    order_id: int = Field(foreign_key="orders.id", index=True)
    state_digest: str = Field(max_length=66, index=True)
    agent: str = Field(max_length=42, index=True)
    requested_at: int
    held_at: int | None = None


class CanaryRow(SQLModel, table=True):
    """A verified unit drawn for a canary (market/canary.py), one row per drawn unit, so a unit is drawn
    once; its canary replays its order's verified round-0 unit (``source_unit_id``); a ``planted`` one is
    worked by one of the operator's plant agents, which forges it (a known cheat, for the verifiers).
    ``state``: passed (not drawn) | planned -> posted -> registered -> closed (``claimed_until`` marks a
    post in flight).
    The spec (with its deadline) is fixed when planned, so a retried post looks for the very order it may
    have posted already (by the canary account and spec hash) before posting again."""

    __tablename__ = "canaries"

    id: int | None = Field(default=None, primary_key=True)
    drawn_unit_id: int = Field(foreign_key="units.id", unique=True)
    source_unit_id: int | None = Field(default=None, foreign_key="units.id")
    state: str = Field(index=True, max_length=16)
    known_result_digest: str = Field(max_length=66)
    planted: bool = False
    spec_json: str = ""
    spec_hash: str = Field(default="", max_length=66, index=True)
    chain_order_id: int | None = Field(default=None, sa_type=Uint256Text)
    order_id: int | None = Field(default=None, foreign_key="orders.id", unique=True)
    claimed_until: int = 0  # a post in flight: nobody else posts it before then
    last_error: str | None = None
    created_at: int
    updated_at: int


class ChainCursorRow(SQLModel, table=True):
    __tablename__ = "chain_cursor"

    name: str = Field(primary_key=True, max_length=64)
    next_block: int = 0


ACTIVE_REPLICA_STATES = (
    ReplicaState.PROPOSED.value,
    ReplicaState.SIGNED.value,
    ReplicaState.COMMITTED.value,
    ReplicaState.REVEALED.value,
)


def _table(model: type[SQLModel]) -> Table:
    return model.__table__  # type: ignore[attr-defined]


# --- repository ---------------------------------------------------------------------------------------


def make_engine(url: str) -> Engine:
    """Engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys (API and worker share it)."""
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:")
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=StaticPool if in_memory else None,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


class MarketStore:
    """One repository over all market tables. Methods that change state take an open session so the
    service can make several changes (and their outbox intents) in one transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)

    def create_schema(self) -> None:
        """Create the missing tables, then add to existing tables the columns a newer version declares: a
        market upgraded in place keeps its database (new columns are nullable, so old rows stay valid)."""
        SQLModel.metadata.create_all(self.engine)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        existing = inspect(self.engine)
        with self.engine.begin() as connection:
            for table in SQLModel.metadata.sorted_tables:
                present = {column["name"] for column in existing.get_columns(table.name)}
                for column in table.columns:
                    if column.name in present:
                        continue
                    if not column.nullable:
                        raise MarketError(
                            f"table {table.name} lacks column {column.name}, which is not nullable: this "
                            "database needs a migration the market does not make by itself"
                        )
                    kind = column.type.compile(dialect=self.engine.dialect)
                    connection.execute(text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}'))
                    for index in table.indexes:
                        if column.name in index.columns:
                            index.create(connection)

    def drop_schema(self) -> None:
        SQLModel.metadata.drop_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose changes commit together at the end, or roll back on any exception."""
        with Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    # --- agents ---

    def get_agent(self, session: Session, address: str) -> AgentRow:
        row = session.get(AgentRow, address)
        if row is None:
            raise NotFound(f"agent {address} is not registered")
        return row

    def find_agent(self, session: Session, address: str) -> AgentRow | None:
        return session.get(AgentRow, address)

    def agents(self, session: Session, role: str | None = None) -> Sequence[AgentRow]:
        query = select(AgentRow)
        if role is not None:
            query = query.where(AgentRow.role == role)
        return session.exec(query.order_by(col(AgentRow.address))).all()

    def heartbeat_of(
        self, session: Session, address: str, *, for_update: bool = False
    ) -> HeartbeatRow | None:
        query = select(HeartbeatRow).where(HeartbeatRow.agent == address)
        if for_update:
            query = query.with_for_update()
        return session.exec(query).first()

    def stale_agents(self, session: Session, received_before: int) -> Sequence[AgentRow]:
        """Online agents whose last accepted message is older than ``received_before``."""
        query = (
            select(AgentRow)
            .join(HeartbeatRow, col(HeartbeatRow.agent) == col(AgentRow.address))
            .where(col(AgentRow.online).is_(True), col(HeartbeatRow.received_at) < received_before)
        )
        return session.exec(query).all()

    def offer_of(self, session: Session, address: str) -> OfferRow | None:
        return session.get(OfferRow, address)

    def offers(self, session: Session) -> dict[str, OfferRow]:
        return {row.agent: row for row in session.exec(select(OfferRow)).all()}

    # --- orders, rounds, units ---

    def get_order(self, session: Session, order_id: int, *, for_update: bool = False) -> OrderRow:
        return _by_id(session, OrderRow, order_id, f"order {order_id}", for_update)

    def order_by_chain_id(self, session: Session, chain_order_id: int) -> OrderRow | None:
        return session.exec(select(OrderRow).where(OrderRow.chain_order_id == chain_order_id)).first()

    def orders_in(self, session: Session, states: Sequence[str]) -> Sequence[OrderRow]:
        return session.exec(
            select(OrderRow).where(col(OrderRow.state).in_(states)).order_by(col(OrderRow.id))
        ).all()

    def round_of(self, session: Session, order_id: int, index: int) -> RoundRow | None:
        query = select(RoundRow).where(RoundRow.order_id == order_id, RoundRow.index == index)
        return session.exec(query).first()

    def get_round(self, session: Session, round_id: int) -> RoundRow:
        row = session.get(RoundRow, round_id)
        if row is None:
            raise NotFound(f"round {round_id} does not exist")
        return row

    def get_unit(self, session: Session, unit_id: int, *, for_update: bool = False) -> UnitRow:
        return _by_id(session, UnitRow, unit_id, f"unit {unit_id}", for_update)

    def unit_by_chain_id(self, session: Session, chain_unit_id: int) -> UnitRow | None:
        return session.exec(select(UnitRow).where(UnitRow.chain_unit_id == chain_unit_id)).first()

    def unit_by_key(self, session: Session, unit_key: str) -> UnitRow | None:
        return session.exec(select(UnitRow).where(UnitRow.unit_key == unit_key)).first()

    def units_in(
        self, session: Session, states: Sequence[str], limit: int | None = None
    ) -> Sequence[UnitRow]:
        query = select(UnitRow).where(col(UnitRow.state).in_(states)).order_by(col(UnitRow.id))
        if limit is not None:
            query = query.limit(limit)
        return session.exec(query).all()

    def units_of_order(self, session: Session, order_id: int) -> Sequence[UnitRow]:
        return session.exec(
            select(UnitRow).where(UnitRow.order_id == order_id).order_by(col(UnitRow.id))
        ).all()

    def units_of_round(self, session: Session, round_id: int) -> Sequence[UnitRow]:
        return session.exec(
            select(UnitRow).where(UnitRow.round_id == round_id).order_by(col(UnitRow.id))
        ).all()

    def replicas_of(self, session: Session, unit_id: int) -> Sequence[ReplicaRow]:
        query = select(ReplicaRow).where(ReplicaRow.unit_id == unit_id).order_by(col(ReplicaRow.index))
        return session.exec(query).all()

    def active_load(self, session: Session, provider: str | None = None) -> dict[str, int]:
        """Units each provider is busy with: its unsettled replicas of units run one by one, plus its slots
        of a round in each roster still running (:meth:`roster_load`, which stands for the replicas of the
        roster's own units). Derived, so no counter can drift."""
        slot_unit = (
            (col(UnitRow.kind) == "train")
            & (col(UnitRow.attempt) == 0)
            & col(UnitRow.order_id).in_(select(RosterRow.order_id).where(col(RosterRow.state) != "failed"))
        )
        query = (
            select(ReplicaRow.provider, func.count())
            .join(UnitRow, col(UnitRow.id) == col(ReplicaRow.unit_id))
            .where(col(ReplicaRow.state).in_(ACTIVE_REPLICA_STATES), ~slot_unit)
            .group_by(col(ReplicaRow.provider))
        )
        if provider is not None:
            query = query.where(ReplicaRow.provider == provider)
        load = {address: int(count) for address, count in session.exec(query).all()}
        for address, slots in self.roster_load(session).items():
            if provider is None or address == provider:
                load[address] = load.get(address, 0) + slots
        return load

    def roster_load(self, session: Session) -> dict[str, int]:
        """Each provider's slots of a round in the drawn rosters that still have rounds to run, between
        rounds too (the slots are its for the whole order, as the collateral the chain locks): except while
        the roster's order waits for a per-unit retry of its own, which its providers may take."""
        rosters = session.exec(
            select(RosterRow)
            .join(OrderRow, col(OrderRow.id) == col(RosterRow.order_id))
            .where(
                col(RosterRow.state).in_(["accepting", "opening", "open"]),
                col(OrderRow.state).in_([OrderState.OPEN.value, OrderState.RUNNING.value]),
                col(RosterRow.committed) < col(RosterRow.rounds),
            )
        ).all()
        if not rosters:
            return {}
        waiting = set(
            session.exec(
                select(UnitRow.order_id).where(
                    col(UnitRow.order_id).in_([r.order_id for r in rosters]),
                    col(UnitRow.attempt) > 0,
                    col(UnitRow.state).not_in([UnitState.ACCEPTED.value, UnitState.FAILED.value]),
                )
            ).all()
        )
        load: dict[str, int] = {}
        for roster in rosters:
            if roster.order_id in waiting:
                continue
            providers = json.loads(roster.providers_json)
            for index in json.loads(roster.slots_json):
                load[providers[index]] = load.get(providers[index], 0) + 1
        return load

    def replicas_of_units(self, session: Session, unit_ids: Sequence[int]) -> dict[int, list[ReplicaRow]]:
        """Replicas of many units in one query, grouped by unit, in replica order."""
        grouped: dict[int, list[ReplicaRow]] = {}
        if not unit_ids:
            return grouped
        query = (
            select(ReplicaRow).where(col(ReplicaRow.unit_id).in_(unit_ids)).order_by(col(ReplicaRow.index))
        )
        for row in session.exec(query).all():
            grouped.setdefault(row.unit_id, []).append(row)
        return grouped

    def orders_by_ids(self, session: Session, order_ids: set[int]) -> Sequence[OrderRow]:
        return session.exec(select(OrderRow).where(col(OrderRow.id).in_(sorted(order_ids)))).all()

    def write_matches(
        self,
        session: Session,
        replicas: Sequence[dict[str, Any]],
        logs: Sequence[dict[str, Any]],
        units: Sequence[dict[str, Any]],
        orders_started: set[int],
    ) -> None:
        """Persist a matching pass with one executemany per table (ORM objects cost ~0.5 ms each here).

        ``units`` rows carry ``target`` (the unit id) and the new column values.
        """
        session.flush()  # earlier ORM changes first; the statements below bypass the unit of work
        if replicas:
            session.execute(_table(ReplicaRow).insert(), list(replicas))
        if logs:
            session.execute(_table(MatchLogRow).insert(), list(logs))
        if units:
            table = _table(UnitRow)
            columns: dict[str, Any] = {name: bindparam(name) for name in units[0] if name != "target"}
            session.execute(
                table.update().where(table.c.id == bindparam("target")).values(**columns), list(units)
            )
        if orders_started:
            table = _table(OrderRow)
            session.execute(
                table.update()
                .where(table.c.id.in_(sorted(orders_started)))
                .values(state=OrderState.RUNNING.value)
            )
        session.expire_all()  # loaded rows are stale now; nothing is pending after the flush above

    def replica(self, session: Session, unit_id: int, provider: str) -> ReplicaRow:
        query = select(ReplicaRow).where(ReplicaRow.unit_id == unit_id, ReplicaRow.provider == provider)
        row = session.exec(query).first()
        if row is None:
            raise NotFound(f"{provider} holds no replica of unit {unit_id}")
        return row

    def replicas_of_provider(
        self, session: Session, provider: str, states: Sequence[str]
    ) -> Sequence[ReplicaRow]:
        query = select(ReplicaRow).where(ReplicaRow.provider == provider, col(ReplicaRow.state).in_(states))
        return session.exec(query.order_by(col(ReplicaRow.id))).all()

    # --- verification ---

    def job_for_unit(self, session: Session, unit_id: int) -> VerificationJobRow | None:
        return session.exec(select(VerificationJobRow).where(VerificationJobRow.unit_id == unit_id)).first()

    def get_job(self, session: Session, job_id: int) -> VerificationJobRow:
        row = session.get(VerificationJobRow, job_id)
        if row is None:
            raise NotFound(f"verification job {job_id} does not exist")
        return row

    def open_jobs(self, session: Session, limit: int = 10) -> Sequence[VerificationJobRow]:
        query = select(VerificationJobRow).where(VerificationJobRow.state == "open")
        return session.exec(query.order_by(col(VerificationJobRow.id)).limit(limit)).all()

    def verdicts_of(self, session: Session, job_id: int) -> Sequence[VerdictSignatureRow]:
        query = select(VerdictSignatureRow).where(VerdictSignatureRow.job_id == job_id)
        return session.exec(query.order_by(col(VerdictSignatureRow.id))).all()

    # --- settlement outbox ---

    def enqueue(
        self, session: Session, unit_id: int, action: str, payload: dict[str, Any], now: int
    ) -> OutboxRow:
        """Add a settlement intent unless (unit, action) already has one; returns the existing or new row."""
        existing = self.outbox_entry(session, unit_id, action)
        return existing or _add_intent(session, OutboxRow(unit_id=unit_id, action=action), payload, now)

    def outbox_entry(self, session: Session, unit_id: int, action: str) -> OutboxRow | None:
        query = select(OutboxRow).where(OutboxRow.unit_id == unit_id, OutboxRow.action == action)
        return session.exec(query).first()

    def get_outbox(self, session: Session, entry_id: int, *, for_update: bool = False) -> OutboxRow:
        return _by_id(session, OutboxRow, entry_id, f"outbox entry {entry_id}", for_update)

    def outbox_before(
        self, session: Session, unit_id: int, before_id: int, states: Sequence[str]
    ) -> Sequence[OutboxRow]:
        """The unit's own intents older than ``before_id`` in ``states`` (however long the whole queue is)."""
        query = select(OutboxRow).where(
            OutboxRow.unit_id == unit_id, col(OutboxRow.id) < before_id, col(OutboxRow.state).in_(states)
        )
        return session.exec(query).all()

    def outbox_of_kind(
        self, session: Session, unit_id: int, kind: str, *, for_update: bool = False
    ) -> Sequence[OutboxRow]:
        """The unit's intents ``kind:<party>`` by id (locked in that order, so two runs never deadlock)."""
        query = select(OutboxRow).where(
            OutboxRow.unit_id == unit_id, col(OutboxRow.action).startswith(f"{kind}:", autoescape=True)
        )
        if for_update:
            query = query.with_for_update()
        return session.exec(query.order_by(col(OutboxRow.id))).all()

    def outbox_in(
        self, session: Session, states: Sequence[str], limit: int = 100, *, due_by: int | None = None
    ) -> Sequence[OutboxRow]:
        """Entries in ``states`` by id; with ``due_by``, only those whose backoff ended by then."""
        query = select(OutboxRow).where(col(OutboxRow.state).in_(states))
        if due_by is not None:
            query = query.where(col(OutboxRow.next_attempt_at) <= due_by)
        return session.exec(query.order_by(col(OutboxRow.id)).limit(limit)).all()

    # --- canaries ---

    def canary_candidates(self, session: Session, limit: int = 100) -> Sequence[UnitRow]:
        """Accepted training units of buyers' orders (not of canaries) with no canary row yet."""
        considered = select(CanaryRow.drawn_unit_id)
        canary_orders = select(CanaryRow.order_id).where(col(CanaryRow.order_id).is_not(None))
        query = select(UnitRow).where(
            UnitRow.state == UnitState.ACCEPTED.value,
            UnitRow.kind == "train",
            col(UnitRow.id).not_in(considered),
            col(UnitRow.order_id).not_in(canary_orders),
        )
        return session.exec(query.order_by(col(UnitRow.id)).limit(limit)).all()

    def canaries_in(self, session: Session, states: Sequence[str], limit: int = 100) -> Sequence[CanaryRow]:
        query = select(CanaryRow).where(col(CanaryRow.state).in_(states))
        return session.exec(query.order_by(col(CanaryRow.id)).limit(limit)).all()

    def get_canary(self, session: Session, canary_id: int, *, for_update: bool = False) -> CanaryRow:
        return _by_id(session, CanaryRow, canary_id, f"canary {canary_id}", for_update)

    def canaries_with_spec(self, session: Session, spec_hash: str) -> Sequence[CanaryRow]:
        return session.exec(select(CanaryRow).where(CanaryRow.spec_hash == spec_hash)).all()

    def is_canary_order(self, session: Session, order_id: int) -> bool:
        """Whether the market bought ``order_id`` as a canary (market/canary.py)."""
        return session.exec(select(CanaryRow.id).where(CanaryRow.order_id == order_id)).first() is not None

    def planted_orders(self, session: Session, order_ids: set[int]) -> set[int]:
        """Which of these orders are planted cheats (market/canary.py): only plant agents work their units."""
        query = select(CanaryRow.order_id).where(
            col(CanaryRow.planted).is_(True), col(CanaryRow.order_id).in_(sorted(order_ids))
        )
        return {int(order_id) for order_id in session.exec(query).all() if order_id is not None}

    def enroll_plant(self, session: Session, address: str, enrolled_by: str, now: int) -> None:
        """Record a plant key once; enrolling it again changes nothing."""
        if not self.is_enrolled_plant(session, address):
            session.add(PlantRow(address=address, enrolled_by=enrolled_by, enrolled_at=now))

    def enrolled_plants(self, session: Session) -> set[str]:
        return set(session.exec(select(PlantRow.address)).all())

    def is_enrolled_plant(self, session: Session, address: str) -> bool:
        return session.get(PlantRow, address) is not None

    # --- reported losses ---

    def add_loss_points(self, session: Session, rows: Sequence[dict[str, Any]]) -> None:
        """Insert reported points, skipping (unit, provider, step) already stored (a resent report)."""
        if not rows:
            return
        unit_id, provider = rows[0]["unit_id"], rows[0]["provider"]
        query = select(LossPointRow.step).where(
            LossPointRow.unit_id == unit_id, LossPointRow.provider == provider
        )
        seen = set(session.exec(query).all())
        fresh = [row for row in rows if row["step"] not in seen]
        if fresh:
            session.execute(_table(LossPointRow).insert(), fresh)

    def loss_points_of_units(self, session: Session, unit_ids: Sequence[int]) -> Sequence[LossPointRow]:
        if not unit_ids:
            return []
        query = select(LossPointRow).where(col(LossPointRow.unit_id).in_(unit_ids))
        return session.exec(query.order_by(col(LossPointRow.unit_id), col(LossPointRow.step))).all()

    # --- custody of live states ---

    def custody_rows(self, session: Session) -> Sequence[CustodyRow]:
        return session.exec(select(CustodyRow).order_by(col(CustodyRow.id))).all()

    def custody_of_order(self, session: Session, order_id: int) -> Sequence[CustodyRow]:
        query = select(CustodyRow).where(CustodyRow.order_id == order_id)
        return session.exec(query.order_by(col(CustodyRow.id))).all()

    def custody_of_agent(self, session: Session, agent: str) -> Sequence[CustodyRow]:
        query = select(CustodyRow).where(CustodyRow.agent == agent)
        return session.exec(query.order_by(col(CustodyRow.id))).all()

    def custody_of_state(self, session: Session, order_id: int, state_digest: str) -> Sequence[CustodyRow]:
        query = select(CustodyRow).where(
            CustodyRow.order_id == order_id, CustodyRow.state_digest == state_digest
        )
        return session.exec(query.order_by(col(CustodyRow.id))).all()

    # --- rosters (the round path) ---

    def roster_of_order(
        self, session: Session, order_id: int, *, for_update: bool = False
    ) -> RosterRow | None:
        query = select(RosterRow).where(RosterRow.order_id == order_id)
        if for_update:
            query = query.with_for_update()
        return session.exec(query).first()

    def roster_by_chain_order(self, session: Session, chain_order_id: int) -> RosterRow | None:
        return session.exec(select(RosterRow).where(RosterRow.chain_order_id == chain_order_id)).first()

    def get_roster(self, session: Session, roster_id: int, *, for_update: bool = False) -> RosterRow:
        return _by_id(session, RosterRow, roster_id, f"roster {roster_id}", for_update)

    def rosters_in(self, session: Session, states: Sequence[str]) -> Sequence[RosterRow]:
        query = select(RosterRow).where(col(RosterRow.state).in_(states))
        return session.exec(query.order_by(col(RosterRow.id))).all()

    def roster_accepts(self, session: Session, roster_id: int) -> Sequence[RosterAcceptRow]:
        query = select(RosterAcceptRow).where(RosterAcceptRow.roster_id == roster_id)
        return session.exec(query.order_by(col(RosterAcceptRow.id))).all()

    def roster_works(self, session: Session, roster_id: int, round_index: int) -> Sequence[RosterWorkRow]:
        """The round's slots the market holds, by slot."""
        query = select(RosterWorkRow).where(
            RosterWorkRow.roster_id == roster_id, RosterWorkRow.round_index == round_index
        )
        return session.exec(query.order_by(col(RosterWorkRow.slot))).all()

    def clear_roster_draw(self, session: Session, roster_id: int) -> None:
        """Forget what the roster's last draw collected (its Accepts, any works) and retire its open intent
        under another name (kept for the record, never sent again): a redraw starts from nothing."""
        for row in [
            *self.roster_accepts(session, roster_id),
            *session.exec(select(RosterWorkRow).where(RosterWorkRow.roster_id == roster_id)).all(),
        ]:
            session.delete(row)
        opened = self.roster_action(session, roster_id, "open")
        if opened is not None:
            opened.action = f"open:redrawn:{opened.id}"
            if opened.state in ("pending", "sending", "retrying"):
                opened.state = "reverted"
            session.add(opened)
        session.flush()

    def roster_action(self, session: Session, roster_id: int, action: str) -> RosterActionRow | None:
        query = select(RosterActionRow).where(
            RosterActionRow.roster_id == roster_id, RosterActionRow.action == action
        )
        return session.exec(query).first()

    def enqueue_roster_action(
        self, session: Session, roster_id: int, action: str, payload: dict[str, Any], now: int
    ) -> RosterActionRow:
        """Add a roster intent unless (roster, action) already has one; returns the existing or new row."""
        existing = self.roster_action(session, roster_id, action)
        return existing or _add_intent(
            session, RosterActionRow(roster_id=roster_id, action=action), payload, now
        )

    def roster_actions_of(self, session: Session, roster_id: int) -> Sequence[RosterActionRow]:
        query = select(RosterActionRow).where(RosterActionRow.roster_id == roster_id)
        return session.exec(query.order_by(col(RosterActionRow.id))).all()

    def get_roster_action(
        self, session: Session, action_id: int, *, for_update: bool = False
    ) -> RosterActionRow:
        return _by_id(session, RosterActionRow, action_id, f"roster action {action_id}", for_update)

    def roster_actions_due(self, session: Session, now: int, limit: int = 100) -> Sequence[RosterActionRow]:
        query = select(RosterActionRow).where(
            col(RosterActionRow.state).in_(["pending", "sending", "retrying"]),
            col(RosterActionRow.next_attempt_at) <= now,
        )
        return session.exec(query.order_by(col(RosterActionRow.id)).limit(limit)).all()

    def round_audit(
        self, session: Session, roster_id: int, round_index: int, *, for_update: bool = False
    ) -> RoundAuditRow | None:
        query = select(RoundAuditRow).where(
            RoundAuditRow.roster_id == roster_id, RoundAuditRow.round_index == round_index
        )
        if for_update:
            query = query.with_for_update()
        return session.exec(query).first()

    def round_audits(self, session: Session, roster_id: int) -> Sequence[RoundAuditRow]:
        query = select(RoundAuditRow).where(RoundAuditRow.roster_id == roster_id)
        return session.exec(query.order_by(col(RoundAuditRow.round_index))).all()

    def round_audits_in(self, session: Session, states: Sequence[str]) -> Sequence[RoundAuditRow]:
        query = select(RoundAuditRow).where(col(RoundAuditRow.state).in_(states))
        return session.exec(query.order_by(col(RoundAuditRow.id))).all()

    def round_audit_votes(self, session: Session, audit_id: int) -> Sequence[RoundAuditVoteRow]:
        query = select(RoundAuditVoteRow).where(RoundAuditVoteRow.audit_id == audit_id)
        return session.exec(query.order_by(col(RoundAuditVoteRow.id))).all()

    # --- chain cursor ---

    def cursor(self, session: Session, name: str = "job_market") -> ChainCursorRow:
        row = session.get(ChainCursorRow, name)
        if row is None:
            row = ChainCursorRow(name=name, next_block=0)
            session.add(row)
            session.flush()
        return row


Row = TypeVar("Row", OrderRow, UnitRow, OutboxRow, CanaryRow, RosterRow, RosterActionRow)
Intent = TypeVar("Intent", OutboxRow, RosterActionRow)


def _add_intent(session: Session, row: Intent, payload: dict[str, Any], now: int) -> Intent:
    """Write a new settlement intent (its owner and action set on `row`) and flush it for its id."""
    row.payload_json = json.dumps(payload, sort_keys=True)
    row.created_at = row.updated_at = now
    session.add(row)
    session.flush()
    return row


def _by_id(session: Session, model: type[Row], row_id: int, what: str, for_update: bool) -> Row:
    """The `model` row with primary key `row_id`, locked FOR UPDATE when asked; NotFound names `what`."""
    query = select(model).where(model.id == row_id)
    if for_update:
        query = query.with_for_update()
    row = session.exec(query).first()
    if row is None:
        raise NotFound(f"{what} does not exist")
    return row
