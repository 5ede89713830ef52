"""Rosters, the round path's lifecycle (docs/studies/round-settlement/PLAN.md step 5d): an order that opts in
(`OrderRequest.settlement == "rounds"`, folded, fixed k) is matched once, its providers accept the roster,
and each round settles in one `stepRound` instead of per unit.

- draw: the roster's providers per slot by the stake-weighted draw (market/domain/rosters.py), from the
  registered, online providers that serve the order's recipe, each within the slots its free stake can
  collateralize and whose stake last grew in or before the seed block; seeded by the hash of the order's
  `OrderPosted` block (market/seed_blocks.py) and the chain order id.
- accept: each provider signs `Accept(orderId, rosterKey)` once (whatever its slots); with every one in
  hand the roster outbox opens the roster (market/roster_outbox.py).
- works and openings: per round, each provider hands the commitments of all its slots of the round (each for
  `roundUnitId(order, round, unit)`) with one `RoundCommit(orderId, round, provider, commitmentsHash,
  deadline)` signature over them, signed up to the roster's works deadline (one deadline per step: the
  contract takes one for every signature of a step), then each slot's opening, which the market checks
  against its commitment and keeps off chain.
- plan: one step per round (reveal round r-1 and commit round r together) once the market holds both, then
  the close once the last round is revealed and no set-aside unit is open; each an idempotent outbox row.
- events (called by the chain sync, market/sync.py): the chain's counters replace the market's; a unit the
  step set aside (`UnitSetAside`) becomes an ordinary unit in VERIFYING with a verification job, and
  settles on the per-unit path (verdict, held fraud, expiry) like any other.

The roster key is an Accept's unit key (PLAN, Progress, step 1); a round's commitments are signed once per
provider by `RoundCommit` (one ecrecover per provider a step instead of one per slot).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from eth_utils import to_checksum_address
from sqlmodel import Session

from market.context import Lifecycle, MarketContext, require_signer, row_id
from market.domain.binding import is_bound
from market.domain.rosters import (
    CLOSE_ACTION,
    MAX_ROSTER_VERIFIERS,
    OPEN_ACTION,
    REVEAL_PREFIX,
    SETTLE_BY_ROUNDS,
    RosterProgress,
    RosterShape,
    SetAsideReason,
    StepPlan,
    draw_roster,
    next_roster_action,
    predict_set_aside,
)
from market.domain.rounds import plan_round
from market.domain.selection import ROLE_VERIFIERS, sample, selection_seed
from market.domain.states import OrderState, ReplicaState, UnitState, advance
from market.ports import ChainEvent, RosterChainState, RosterPort
from market.round_audits import REFUSED, RoundAudits, pending_records, posting_closes_at, verifiers_of
from market.seed_blocks import SeedBlocks, late_stake_block, staked_by
from market.store import (
    OrderRow,
    ReplicaRow,
    RosterAcceptRow,
    RosterRow,
    RosterWorkRow,
    RoundRow,
    UnitRow,
    VerificationJobRow,
)
from veritrain.chain.client import AuditRecord, Roster
from veritrain.chain.eip712 import commitment as commitment_of
from veritrain.chain.eip712 import market_domain, round_commit_message, round_unit_id
from veritrain.errors import IllegalTransition, InvalidInput, MarketError, NotFound
from veritrain.messages import (
    AgentRole,
    AssignmentPhase,
    OrderSpec,
    RosterOpeningSubmission,
    RosterStatus,
    UnitKind,
)

# Events of the round path the chain sync hands to :meth:`RosterBook.apply_event`.
ROSTER_EVENTS = frozenset(
    {"RosterOpened", "RoundCommitted", "RoundRevealed", "UnitSetAside", "OpeningPublished", "RosterClosed"}
)
# A round's draw reads the hash of the block that committed it; the EVM keeps 256. Past this many blocks the
# market predicts the hash unreadable (every unit drawn): the step revealing it may land later still.
SEED_HASH_MARGIN_BLOCKS = 200
# The way past the chain's pending audit records: `aside:<round>` takes the round's record and every one
# after it off the pending chain (setAsidePending), `post:<records>` posts a quorum over them (a post-only
# step).
ASIDE_PREFIX = "aside:"
POST_PREFIX = "post:"
# Roster states in which the market still has something to do.
LIVE_ROSTER_STATES = ("drawing", "accepting", "opening", "open")


def roster_port(chain: object) -> RosterPort:
    """The chain as a RosterPort, or MarketError when the market's chain cannot serve the round path."""
    if chain is None or not isinstance(chain, RosterPort):
        raise MarketError("the market's chain does not serve the round path (no RosterPort)")
    return chain


def roster_of(row: RosterRow) -> Roster:
    """The drawn roster of a row (MarketError before the draw)."""
    providers = tuple(json.loads(row.providers_json))
    if not providers:
        raise MarketError(f"roster {row.id} is not drawn yet")
    return Roster(
        providers,
        tuple(json.loads(row.slots_json)),
        row.replicas,
        row.units_per_round,
        row.rounds,
        tuple(verifiers_of(row)),
    )


def unheld_rounds(records: Sequence[AuditRecord], unheld: tuple[int, str] | None) -> frozenset[int]:
    """The rounds of the pending records from the first the market holds no quorum over (`unheld`) on: a
    way out takes them off together, so none of their units may be used before it."""
    if unheld is None:
        return frozenset()
    rounds = [round_index for round_index, _ in pending_records(records)]
    return frozenset(rounds[rounds.index(unheld[0]) :])


def excluded_of(row: RosterRow) -> list[str]:
    """The parties (providers, verifiers) a redraw of the roster leaves out."""
    return list(json.loads(row.excluded_json or "[]"))


def is_slot_unit(unit: UnitRow) -> bool:
    """Whether a unit of a rounds order is one of its roster's (a training unit's first attempt, run on the
    slots or set aside by a step), not a retry of one, which runs on the per-unit path."""
    return unit.kind == UnitKind.TRAIN.value and unit.attempt == 0


# What a roster's provider is handed (the Accept's unit key, its slots, the works deadline): the status.
RosterView = RosterStatus


class RosterBook(Lifecycle):
    def __init__(self, ctx: MarketContext) -> None:
        super().__init__(ctx)
        self.audits = RoundAudits(ctx)

    # --- registration (OrderBook.post_order) ---

    def register(self, session: Session, order: OrderRow, shape: RosterShape, now: int) -> RosterRow:
        """The roster row of a round-path order, to be drawn by :meth:`draw_pending`."""
        row = RosterRow(
            order_id=row_id(order),
            chain_order_id=order.chain_order_id,
            replicas=shape.replicas,
            units_per_round=shape.units_per_round,
            rounds=shape.rounds,
            works_deadline=order.deadline,
            selection_block=order.posted_block,  # the draw's seed block (a short draw moves it: draw_pending)
            created_at=now,
            updated_at=now,
        )
        session.add(row)
        session.flush()
        return row

    # --- draw ---

    def draw_pending(self) -> int:
        """Draw every roster still waiting for its providers; a roster that finds too few waits for more
        (its error kept in ``last_error``). Returns how many were drawn."""
        roster_port(self.chain)
        assert self.chain is not None
        with self.store.transaction() as session:
            if not self.store.rosters_in(session, ["drawing"]):
                return 0  # no chain read for nothing: this runs at every tick
        seeds = SeedBlocks(self.chain)
        terms = self.chain.terms()
        collateral = terms.provider_collateral
        drawn = 0
        now = self.clock()
        with self.store.transaction() as session:
            for row in self.store.rosters_in(session, ["drawing"]):
                order = self.store.get_order(session, row.order_id)
                # seeded by the order's posting block, which the chain fixed before anyone saw its hash (or by
                # a later stake's block, once a draw came up short while that stake waited)
                seed_block, block_hash = seeds.at(row.selection_block)
                stakes, capacity = self._provider_pool(session, order, collateral, seed_block)
                for provider in excluded_of(row):
                    stakes.pop(provider, None)
                try:
                    roster = draw_roster(
                        block_hash,
                        f"0x{row.chain_order_id:064x}",
                        stakes,
                        capacity,
                        row.replicas,
                        row.units_per_round,
                        row.rounds,
                    )
                    if self.config.round_audits:
                        verifiers = self._draw_verifiers(
                            session,
                            roster,
                            (seed_block, block_hash),
                            terms.verifier_collateral,
                            set(excluded_of(row)),
                        )
                        roster = replace(roster, verifiers=verifiers)
                except MarketError as exc:
                    if excluded_of(row):  # a redraw without those who failed it: the per-unit path instead
                        self.fall_back(session, row, f"redraw failed: {exc}", now)
                        continue
                    row.last_error = str(exc)
                    row.updated_at = now
                    late = late_stake_block(
                        (a.stake_block or 0 for a in self.store.agents(session) if a.online), seed_block
                    )
                    if late is not None:  # stake that came after the seed block: seeded again by its block
                        row.selection_block = late
                    session.add(row)
                    continue
                row.providers_json = json.dumps(list(roster.providers))
                row.verifiers_json = json.dumps(list(roster.verifiers))
                row.slots_json = json.dumps(list(roster.slots))
                row.roster_key = "0x" + roster.key.hex()
                row.selection_block = seed_block
                row.state = "accepting"
                row.drawn_at = now
                row.updated_at = now
                session.add(row)
                for unit in self.store.units_of_order(session, row.order_id):
                    if unit.state == UnitState.ROSTERED.value:  # a redraw: the new roster's slots run it
                        self.add_slots(session, order, unit)
                if order.state == OrderState.OPEN.value:
                    order.state = OrderState.RUNNING.value
                    session.add(order)
                drawn += 1
        if drawn:
            self.triggers.match(True)  # its providers' slots are load now (Matchmaker.refresh_pool)
        return drawn

    def redraw(self, session: Session, row: RosterRow, failed: set[str], reason: str, now: int) -> None:
        """Draw the roster again without `failed` (providers whose Accept never came, or that made its open
        revert for good: a spent nonce, a streak or stake that no longer holds): what the last draw
        collected is forgotten, the round-0 units lose their slots until :meth:`draw_pending` seats the new
        providers, who sign the new roster key. Only before the roster is open on chain."""
        if row.state not in ("accepting", "opening"):
            raise IllegalTransition(f"roster {row.id} is {row.state}: only an unopened roster is redrawn")
        self.store.clear_roster_draw(session, row_id(row))
        for unit in self.store.units_of_order(session, row.order_id):
            if unit.state == UnitState.ROSTERED.value:
                for replica in self.store.replicas_of(session, row_id(unit)):
                    session.delete(replica)
        row.excluded_json = json.dumps(sorted(set(excluded_of(row)) | failed))
        row.providers_json, row.slots_json, row.roster_key = "[]", "[]", None
        row.state, row.last_error, row.updated_at = "drawing", reason, now
        session.add(row)
        session.flush()

    def fall_back(self, session: Session, row: RosterRow, reason: str, now: int) -> None:
        """The roster can never open (nobody left to draw, or its open refused for a reason no redraw
        clears): it fails, and the order's training units run on the per-unit path (matched, assigned and
        settled one by one) from now on; nothing of the roster is on chain, so the order's whole budget is
        there for them."""
        row.state, row.last_error, row.updated_at = "failed", reason, now
        session.add(row)
        for unit in self.store.units_of_order(session, row.order_id):
            if unit.state == UnitState.ROSTERED.value:
                for replica in self.store.replicas_of(session, row_id(unit)):
                    session.delete(replica)
                unit.state = advance(UnitState.ROSTERED, UnitState.PENDING, what=f"unit {unit.id}").value
                unit.k, unit.updated_at = row.replicas, now
                session.add(unit)
        session.flush()
        self.triggers.match(False)

    def _provider_pool(
        self, session: Session, order: OrderRow, collateral: int, seed_block: int
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Draw weights (bonded stake) and slot capacity (free stake / collateral) of the online providers
        that serve the order's recipe with enough memory and whose stake last grew by ``seed_block``."""
        stakes: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for agent in self.store.agents(session, AgentRole.PROVIDER.value):
            if not agent.online or order.recipe not in agent.recipes or agent.memory_mb < order.min_memory_mb:
                continue
            if self.ctx.is_plant(agent.address):  # plants work planted canaries only
                continue
            if not staked_by(agent, seed_block):  # its stake grew once the seed's hash was public
                continue
            stakes[agent.address] = agent.bonded_stake
            capacity[agent.address] = agent.free_stake // collateral if collateral else 1 << 32
        return stakes, capacity

    def _draw_verifiers(
        self, session: Session, roster: Roster, block: tuple[int, str], collateral: int, excluded: set[str]
    ) -> tuple[str, ...]:
        """The roster's verifiers, who audit its drawn units (market/round_audits.py): online registered
        verifiers with free stake for the verifier collateral, none a provider of the roster or run by a
        provider's operator, by the stake-weighted draw seeded by the roster's block hash and key (a draw
        of its own, as a unit's verifiers are drawn apart from its replicas); as many as the config asks (at
        least the chain's minimum, at most 5), none that made an earlier open of it fail (`excluded`).
        MarketError when too few can take it: the roster waits."""
        providers = {p.lower() for p in roster.providers}
        operators = {
            agent.operator.lower()
            for agent in self.store.agents(session, AgentRole.PROVIDER.value)
            if agent.address.lower() in providers
        }
        pool = {
            agent.address: agent.bonded_stake
            for agent in self.store.agents(session, AgentRole.VERIFIER.value)
            if agent.online
            and agent.address.lower() not in providers
            and agent.address not in excluded
            and agent.operator.lower() not in operators
            and agent.free_stake >= collateral
            and staked_by(agent, block[0])
        }
        block_hash = block[1]
        wanted = min(max(self.config.verifiers_per_unit, self.config.min_verifiers, 1), MAX_ROSTER_VERIFIERS)
        seed = selection_seed(block_hash, "0x" + roster.key.hex())
        chosen = sample(block_hash, seed, ROLE_VERIFIERS, pool, wanted)
        if len(chosen) < max(self.config.min_verifiers, 1):
            raise MarketError(f"only {len(chosen)} verifiers with free stake can audit the roster")
        return tuple(chosen)

    def choose_verifiers(self, roster: Roster, block: tuple[int, str], seed_key: str) -> list[str]:
        """The verifiers a step sets its units aside with: registered online verifiers that are none of the
        roster's providers and whose stake last grew in or before the seed block, by the stake-weighted draw
        seeded by `block` (number and hash: the revealed round's commit block) and `seed_key`, as many as
        the config asks (at least the contract's minimum)."""
        count = max(self.config.verifiers_per_unit, self.config.min_verifiers)
        providers = {p.lower() for p in roster.providers}
        block_number, block_hash = block
        with self.store.transaction() as session:
            pool = {
                agent.address: agent.bonded_stake
                for agent in self.store.agents(session, AgentRole.VERIFIER.value)
                if agent.online and agent.address.lower() not in providers and staked_by(agent, block_number)
            }
        chosen = sample(block_hash, selection_seed(block_hash, seed_key), ROLE_VERIFIERS, pool, count)
        if len(chosen) < max(self.config.min_verifiers, 1):
            raise MarketError(f"only {len(chosen)} verifiers can take a set-aside unit of this roster")
        return list(chosen)

    # --- what providers see and sign ---

    def status(self, session: Session, order_id: int) -> RosterStatus | None:
        """The order's roster as its status shows it (None: no roster, or not drawn yet; a roster that failed
        in a redraw shows no providers)."""
        row = self.store.roster_of_order(session, order_id)
        if row is None or (row.providers_json == "[]" and row.state != "failed"):
            return None
        return RosterStatus(
            order_id=order_id,
            chain_order_id=row.chain_order_id,
            state=row.state,
            roster_key=row.roster_key or "",
            providers=tuple(json.loads(row.providers_json)),
            slots=tuple(json.loads(row.slots_json)),
            replicas=row.replicas,
            units_per_round=row.units_per_round,
            rounds=row.rounds,
            works_deadline=row.works_deadline,
            committed=row.committed,
            revealed=row.revealed,
        )

    def roster(self, order_id: int) -> Roster:
        """The order's drawn roster, verifiers included (NotFound: no roster; MarketError: not drawn yet)."""
        with self.store.transaction() as session:
            return roster_of(self._roster(session, order_id))

    def view(self, order_id: int) -> RosterView:
        """The order's drawn roster (NotFound: no roster; MarketError: not drawn yet)."""
        with self.store.transaction() as session:
            roster_of(self._roster(session, order_id))
            view = self.status(session, order_id)
            assert view is not None
            return view

    def accept(self, order_id: int, provider: str, nonce: int, deadline: int, signature: str) -> None:
        """A roster provider's Accept of the roster key (checked before anything is stored); a second one
        from the same provider is refused."""
        now = self.clock()
        with self.store.transaction() as session:
            row = self._roster(session, order_id, for_update=True)
            roster = roster_of(row)
            if row.state != "accepting":
                raise IllegalTransition(f"roster of order {order_id} is {row.state}; it takes no Accept")
            if provider not in roster.providers:
                raise InvalidInput(f"{provider} is not a provider of the roster of order {order_id}")
            if deadline <= now:
                raise InvalidInput(f"the Accept's deadline {deadline} has passed (market clock {now})")
            held = [a for a in self.store.roster_accepts(session, row_id(row)) if a.provider == provider]
            if held:
                if (held[0].nonce, held[0].deadline, held[0].signature) == (nonce, deadline, signature):
                    return  # the same Accept again (a retried request): nothing to change
                raise InvalidInput(f"{provider} already accepted the roster of order {order_id}")
            message = {
                "orderId": row.chain_order_id,
                "unitKey": bytes.fromhex(roster.key.hex()),
                "provider": provider,
                "nonce": nonce,
                "deadline": deadline,
            }
            accepted = RosterAcceptRow(
                roster_id=row_id(row), provider=provider, nonce=nonce, deadline=deadline, signature=signature
            )
            self._add_signed(session, accepted, "Accept", message)
            for unit in self.store.units_of_order(session, order_id):
                if unit.state == UnitState.ROSTERED.value:
                    self._move_slot(session, unit, provider, ReplicaState.PROPOSED, ReplicaState.SIGNED)
        self.triggers.settle()

    def submit_work(
        self, order_id: int, provider: str, round_index: int, commitments: Sequence[str], signature: str
    ) -> None:
        """A provider's signed commitments for a round: one per slot it holds in the round, in slot order,
        with its `RoundCommit(orderId, round, provider, keccak256(commitments), works_deadline)` signature
        (checked before anything is stored: InvalidSignature). A round takes one per provider; the same
        again is a no-op."""
        with self.store.transaction() as session:
            row = self._roster(session, order_id, for_update=True)
            slots = self._round_slots(row, provider, round_index)
            if row.state not in ("accepting", "opening", "open"):
                raise IllegalTransition(f"roster of order {order_id} is {row.state}; it takes no work")
            if round_index < row.committed:
                raise IllegalTransition(f"round {round_index} of order {order_id} is committed already")
            if len(commitments) != len(slots):
                raise InvalidInput(
                    f"{provider} holds {len(slots)} slots of round {round_index}, got {len(commitments)} "
                    "commitments"
                )
            values = [c.lower() for c in commitments]
            held = {w.slot: w for w in self.store.roster_works(session, row_id(row), round_index)}
            if any(slot in held for slot in slots):
                if all(
                    slot in held and (held[slot].commitment, held[slot].signature) == (value, signature)
                    for slot, value in zip(slots, values, strict=True)
                ):
                    return
                raise InvalidInput(
                    f"{provider}'s slots of round {round_index} have other commitments already"
                )
            message = round_commit_message(
                provider, row.chain_order_id, round_index, values, row.works_deadline
            )
            domain = market_domain(self.config.chain_id, self.ctx.job_market())
            require_signer(domain, "RoundCommit", message, signature, provider)
            for slot, value in zip(slots, values, strict=True):
                session.add(
                    RosterWorkRow(
                        roster_id=row_id(row),
                        round_index=round_index,
                        slot=slot,
                        provider=provider,
                        commitment=value,
                        signature=signature,
                    )
                )
                mirror = self._training_unit(session, order_id, round_index, slot // row.replicas)
                if mirror is not None:
                    replica = self._move_slot(
                        session, mirror, provider, ReplicaState.SIGNED, ReplicaState.COMMITTED
                    )
                    if replica is not None:
                        replica.commitment, replica.commit_signature = value, signature
                        session.add(replica)
        self.triggers.settle()

    def submit_opening(
        self, order_id: int, provider: str, round_index: int, unit: int, result_digest: str, salt: str
    ) -> None:
        """A slot's opening (its commitment's preimage): kept off chain until the step that reveals it."""
        self.open_slot(
            RosterOpeningSubmission(
                order_id=order_id,
                provider=provider,
                round_index=round_index,
                unit=unit,
                result_digest=result_digest,
                salt=salt,
                state_digest="0x" + "00" * 32,
                transcript_root="0x" + "00" * 32,
            ),
            training=False,
        )

    def open_slot(self, opening: RosterOpeningSubmission, *, training: bool = True) -> None:
        """A slot's opening (its commitment's preimage), kept off chain until the step that reveals it, with
        the state it reports (``training``: the round's training unit learns it, and is accepted once every
        slot of the unit opened the same result; the state must be bound to the result). The same opening
        again changes nothing; another one is refused."""
        order_id, provider, round_index, unit = (
            opening.order_id,
            opening.provider,
            opening.round_index,
            opening.unit,
        )
        result_digest, salt = opening.result_digest.lower(), opening.salt.lower()
        fold = (
            None
            if opening.round_state_digest is None or opening.inputs_commitment is None
            else (opening.round_state_digest.lower(), opening.inputs_commitment.lower())
        )
        if training and not is_bound(result_digest, opening.state_digest, opening.transcript_root, fold=fold):
            raise InvalidInput(
                f"the state reported for unit {unit} of round {round_index} is not bound to its result digest"
            )
        with self.store.transaction() as session:
            row = self._roster(session, order_id, for_update=True)
            slot = self._slot(row, provider, round_index, unit)
            held = {w.slot: w for w in self.store.roster_works(session, row_id(row), round_index)}
            work = held.get(slot)
            if work is None:
                raise IllegalTransition(f"slot {slot} of round {round_index} has no commitment to open")
            if work.salt is not None:
                if (work.result_digest, work.salt) == (result_digest, salt):
                    return  # the same opening again (a retried request)
                raise InvalidInput(f"slot {slot} of round {round_index} is opened already")
            unit_id = round_unit_id(row.chain_order_id, round_index, unit)
            expected = "0x" + commitment_of(result_digest, salt, provider, unit_id).hex()
            if expected != work.commitment:
                raise InvalidInput(
                    f"the opening of slot {slot} of round {round_index} is not its commitment's"
                )
            work.result_digest, work.salt = result_digest, salt
            session.add(work)
            mirror = self._training_unit(session, order_id, round_index, unit) if training else None
            if mirror is not None:
                replica = self._move_slot(
                    session, mirror, provider, ReplicaState.COMMITTED, ReplicaState.REVEALED
                )
                if replica is not None:
                    replica.result_digest, replica.salt = result_digest, salt
                    replica.state_digest, replica.transcript_root = (
                        opening.state_digest.lower(),
                        opening.transcript_root.lower(),
                    )
                    replica.round_state_digest, replica.inputs_commitment = fold or (None, None)
                    session.add(replica)
        self.triggers.settle()

    # --- the round's training units (market/orders.py runs them as it runs a folded order's units) ---

    def seats(self, session: Session, order: OrderRow) -> bool:
        """Whether the order's training units run on roster slots: it has a roster, and it did not fail
        (a failed roster's units run on the per-unit path)."""
        row = self.store.roster_of_order(session, row_id(order))
        return row is not None and row.state != "failed"

    def add_slots(self, session: Session, order: OrderRow, unit: UnitRow) -> None:
        """A round-path training unit is ROSTERED, with one replica per slot of its unit, held by the
        roster's providers: proposed until the provider accepted the roster, signed after."""
        row = self._roster(session, row_id(order))
        roster = roster_of(row)
        accepted = {a.provider for a in self.store.roster_accepts(session, row_id(row))}
        unit.state = UnitState.ROSTERED.value
        unit.k = row.replicas
        session.add(unit)
        for replica in range(row.replicas):
            provider = roster.provider_of(unit.shard, replica)
            state = ReplicaState.SIGNED if provider in accepted else ReplicaState.PROPOSED
            session.add(
                ReplicaRow(
                    unit_id=row_id(unit),
                    index=replica,
                    provider=to_checksum_address(provider),
                    state=state.value,
                )
            )

    def slot_assignment(
        self, session: Session, order: OrderRow, unit: UnitRow, replica: ReplicaRow
    ) -> dict[str, Any] | None:
        """What a roster slot's provider does next for a ROSTERED unit, as Assignment fields beside the
        unit's work (None: nothing until something changes): accept the roster while it collects Accepts,
        train and commit once it is open on chain, open its result once every slot of the unit committed
        (as the per-unit path reveals only once all committed: no replica sees another's result first)."""
        row = self._roster(session, row_id(order))
        if order.state not in (OrderState.OPEN.value, OrderState.RUNNING.value):
            return None  # expired or cancelled: nothing more to train or open
        state = ReplicaState(replica.state)
        if state == ReplicaState.PROPOSED and row.state == "accepting":
            phase = AssignmentPhase.ACCEPT
        elif state == ReplicaState.SIGNED and row.state == "open":
            phase = AssignmentPhase.RUN
        elif state == ReplicaState.COMMITTED and all(
            r.state in (ReplicaState.COMMITTED.value, ReplicaState.REVEALED.value)
            for r in self.ctx.live_replicas(session, unit)
        ):
            phase = AssignmentPhase.REVEAL
        else:
            return None
        return {
            "phase": phase,
            "unit_key": row.roster_key or "",
            "accept_deadline": row.works_deadline,
            "chain_unit_id": round_unit_id(row.chain_order_id, unit.round_index, unit.shard),
            "commit_deadline": row.works_deadline,
            "round_units": tuple(
                slot // row.replicas for slot in self._round_slots(row, replica.provider, unit.round_index)
            ),
            "settlement": SETTLE_BY_ROUNDS,
        }

    def _training_unit(self, session: Session, order_id: int, round_index: int, unit: int) -> UnitRow | None:
        """The round's ROSTERED training unit `unit` (None before the round's units exist, or once
        accepted)."""
        round_row = self.store.round_of(session, order_id, round_index)
        if round_row is None:
            return None
        for candidate in self.store.units_of_round(session, row_id(round_row)):
            if candidate.shard == unit and candidate.state == UnitState.ROSTERED.value:
                return candidate
        return None

    def _move_slot(
        self, session: Session, unit: UnitRow, provider: str, current: ReplicaState, target: ReplicaState
    ) -> ReplicaRow | None:
        """`provider`'s replica of `unit`, moved from `current` to `target` (None: not in `current`)."""
        for replica in self.store.replicas_of(session, row_id(unit)):
            if replica.provider.lower() == provider.lower() and replica.state == current.value:
                replica.state = advance(current, target, what="roster slot").value
                session.add(replica)
                return replica
        return None

    def _unanimous(self, session: Session, unit: UnitRow) -> list[ReplicaRow] | None:
        """The unit's replicas when every slot opened the same result (None otherwise)."""
        replicas = self.ctx.live_replicas(session, unit)
        if len(replicas) != unit.k or any(r.state != ReplicaState.REVEALED.value for r in replicas):
            return None
        if len({r.result_digest for r in replicas}) != 1:
            return None
        return list(replicas)

    def _accept(self, session: Session, unit: UnitRow, replicas: list[ReplicaRow]) -> None:
        """Accept a unanimous unit from its openings: its replicas' states start the next round's units
        (market/orders.py). Only for a unit the chain will not set aside (:meth:`decide`)."""
        for replica in replicas:
            replica.state = advance(ReplicaState.REVEALED, ReplicaState.ACCEPTED, what="roster slot").value
            session.add(replica)
        unit.state = advance(UnitState.ROSTERED, UnitState.ACCEPTED, what=f"unit {unit.id}").value
        unit.updated_at = self.clock()
        session.add(unit)

    def _roster(self, session: Session, order_id: int, *, for_update: bool = False) -> RosterRow:
        row = self.store.roster_of_order(session, order_id, for_update=for_update)
        if row is None:
            raise NotFound(f"order {order_id} has no roster (it settles per unit)")
        return row

    def _slot(self, row: RosterRow, provider: str, round_index: int, unit: int) -> int:
        roster = roster_of(row)
        if not 0 <= round_index < row.rounds or not 0 <= unit < row.units_per_round:
            raise InvalidInput(
                f"no unit {unit} of round {round_index} in a {row.rounds} x {row.units_per_round} roster"
            )
        for replica in range(row.replicas):
            if roster.provider_of(unit, replica) == provider:
                return unit * row.replicas + replica
        raise InvalidInput(f"{provider} holds no slot of unit {unit} of the roster of order {row.order_id}")

    def _round_slots(self, row: RosterRow, provider: str, round_index: int) -> list[int]:
        """The slots `provider` holds in each round, in slot order (a round's `RoundCommit` covers them)."""
        if not 0 <= round_index < row.rounds:
            raise InvalidInput(f"no round {round_index} in a roster of {row.rounds} rounds")
        roster = roster_of(row)
        if provider not in roster.providers:
            raise InvalidInput(f"{provider} holds no slot of the roster of order {row.order_id}")
        index = roster.providers.index(provider)
        return [slot for slot, holder in enumerate(roster.slots) if holder == index]

    def _add_signed(
        self, session: Session, row: RosterAcceptRow | RosterWorkRow, primary: str, message: dict[str, Any]
    ) -> None:
        """Store `row` once its signature is its provider's over `message` (`primary`)."""
        domain = market_domain(self.config.chain_id, self.ctx.job_market())
        require_signer(domain, primary, message, row.signature, row.provider)
        session.add(row)

    # --- planning: the roster outbox's intents ---

    def plan(self) -> int:
        """Decide each open roster's pending round (:meth:`decide`), then queue each live roster's next
        action (open, step, close); returns how many were queued. Safe to run any number of times: (roster,
        action) has one row."""
        now = self.clock()
        queued = 0
        with self.store.transaction() as session:
            for row in self.store.rosters_in(session, ["accepting", "open"]):
                if row.state == "accepting":
                    queued += self._plan_open(session, row, now) or self._redraw_when_late(session, row, now)
                    continue
                try:
                    chain = self._read(row)
                    records = self._pending_records(row, chain)
                except Exception as exc:  # RPC down: nothing decided or planned for this roster now
                    row.last_error = f"roster read failed: {type(exc).__name__}: {exc}"
                    session.add(row)
                    continue
                unheld = self.audits.first_unheld(session, row, records)
                if chain is not None:
                    self.decide(session, row, chain, unheld_rounds(records, unheld))
                step = next_roster_action(self._progress(session, row, chain, now))
                action = CLOSE_ACTION if self._closable_at_deadline(session, row, chain, now) else step
                if chain is not None and records:
                    action = self._past_pending(chain, records, unheld, action, step)
                if action == CLOSE_ACTION and not self._challenges_over(row, chain, now):
                    continue
                name = action.action if isinstance(action, StepPlan) else action
                if name is None or self.store.roster_action(session, row_id(row), name) is not None:
                    continue
                payload = self._step(session, row, action) if isinstance(action, StepPlan) else {}
                self.store.enqueue_roster_action(session, row_id(row), name, payload, now)
                queued += 1
        if queued:
            self.triggers.settle()
        return queued

    def _pending_records(self, row: RosterRow, chain: RosterChainState | None) -> list[AuditRecord]:
        """The roster's audit records while some are pending (none read otherwise: this runs every tick)."""
        if chain is None or not chain.audits_pending:
            return []
        return roster_port(self.chain).audit_records(row.chain_order_id)

    def _past_pending(
        self,
        chain: RosterChainState,
        records: Sequence[AuditRecord],
        unheld: tuple[int, str] | None,
        action: StepPlan | str | None,
        step: StepPlan | str | None,
    ) -> StepPlan | str | None:
        """What gets the roster past the chain's pending audit records (it cannot close while any is): a
        record the market holds no quorum over (`unheld`: anyone may reveal a round without verifiers) is
        taken off the pending chain with every record after it once its audit is refused or lapsed
        (`aside:<round>`: set aside for verdicts, or dropped after the deadline when no verifier can take
        them); while the audit collects the roster goes on without closing; with a quorum over every
        record, a roster due to close posts it first: `post:<records>` (a step that only posts), or, with a
        round still pending its reveal, the `step` revealing it (the last round's posts, its silent slots
        given as withheld)."""
        if unheld is not None:
            round_index, answer = unheld
            if answer == REFUSED:
                return f"{ASIDE_PREFIX}{round_index}"
            return None if action == CLOSE_ACTION else action
        if action == CLOSE_ACTION:
            return f"{POST_PREFIX}{len(records)}" if chain.pending_block == 0 else step
        return action

    def _challenges_over(self, row: RosterRow, chain: RosterChainState | None, now: int) -> bool:
        """Whether the last audit posting's challenge window (verdictWindow from the posting's time, on
        chain) has passed: the chain refuses a close before, so the close is planned for after it."""
        if not verifiers_of(row) or chain is None:
            return True
        records = roster_port(self.chain).audit_records(row.chain_order_id)
        assert self.chain is not None
        return now > posting_closes_at(records, self.chain.terms().verdict_window_s)

    def _redraw_when_late(self, session: Session, row: RosterRow, now: int) -> int:
        """Redraw a roster whose Accepts did not all come within ``accept_timeout_s`` of its draw, without
        the providers that did not send theirs (as a per-unit proposal is dropped after that long)."""
        if row.drawn_at is None or now <= row.drawn_at + self.config.accept_timeout_s:
            return 0
        accepted = {a.provider for a in self.store.roster_accepts(session, row_id(row))}
        silent = set(roster_of(row).providers) - accepted
        self.redraw(session, row, silent, f"no Accept from {sorted(silent)} in time", now)
        return 0

    def _closable_at_deadline(
        self, session: Session, row: RosterRow, chain: RosterChainState | None, now: int
    ) -> bool:
        """Whether the order's deadline passed: the roster is then closed whatever is left, so that the
        budget of the rounds not run returns to the order (its set-aside units settle or expire first: the
        outbox waits for them). A round pending its reveal is revealed first, by a step of its own
        (:func:`next_roster_action` past the deadline): the close pays nothing for a pending round, so its
        honest providers would lose their pay and its silent slots their penalty. Only if that step, once
        queued, has not landed within `verdictWindow` (no verifier to take a unit it sets aside, say) is the
        roster closed with the round pending, as the chain allows after the round's reveal window."""
        if now <= self.store.get_order(session, row.order_id).deadline:
            return False
        if chain is None or chain.pending_block == 0:
            return True
        assert self.chain is not None
        reveal = StepPlan(chain.committed, chain.committed - 1, None, held=chain.committed < row.rounds)
        queued = self.store.roster_action(session, row_id(row), reveal.action)
        return (
            queued is not None
            and now > queued.created_at + self.chain.terms().verdict_window_s
            and now > chain.pending_since + self.config.reveal_window_s
        )

    def _read(self, row: RosterRow) -> RosterChainState | None:
        """The roster as the chain holds it, once a round was committed (None before, or not on chain)."""
        if row.committed == 0:
            return None
        chain = roster_port(self.chain).roster_state(row.chain_order_id)
        return chain if chain.exists else None

    def decide(
        self, session: Session, row: RosterRow, chain: RosterChainState, unheld: frozenset[int] = frozenset()
    ) -> None:
        """Accept the training units the chain will not set aside, from their openings: a unit of the
        pending round whose slots all opened one result, that the revealing step will neither draw (the
        draw is fixed by the block that committed the round, readable now) nor set aside for a provider
        below the roster's streak. Every other unit of the round waits for its verdict (PLAN 5e: a drawn
        result is never used before it is verified, as on the per-unit path), and the round is held: the
        step revealing it commits nothing (:func:`next_roster_action`). Also accepts a unit of a revealed
        round that the chain paid after all (a provider's streak grew between prediction and step), once
        the market has seen every set-aside event of the roster, and unless its round is `unheld` (pending on
        chain without the market's quorum: someone else revealed it; its units wait for their way out)."""
        assert self.chain is not None
        self._accept_paid(session, row, chain, unheld)
        if chain.pending_block == 0:
            return
        round_index = chain.committed - 1
        candidates = [
            (unit, replicas)
            for unit in self._rostered(session, row, round_index)
            if (replicas := self._unanimous(session, unit)) is not None
        ]
        if not candidates:
            return
        roster = roster_of(row)
        values = self._slot_values(session, row, round_index)
        reasons = self.predict(
            roster, row.chain_order_id, round_index, chain, self.seed_hash(chain.pending_block), values
        )
        works = self.store.roster_works(session, row_id(row), round_index)
        opened = len(works) == len(values) and all(w.salt is not None for w in works)
        audited = self.audits.usable_units(
            session, row, round_index, reasons, values, opened, chain.pending_block
        )
        for unit, replicas in candidates:
            if unit.shard not in reasons or unit.shard in audited:
                self._accept(session, unit, replicas)

    def predict(
        self,
        roster: Roster,
        chain_order_id: int,
        round_index: int,
        chain: RosterChainState,
        block_hash: str,
        values: Sequence[str | None],
    ) -> dict[int, SetAsideReason]:
        """Which units of the pending round `round_index` the revealing step sets aside, and why
        (:func:`predict_set_aside` over the chain's inputs: `block_hash` from :meth:`seed_hash`, the rate,
        the providers' streaks read now against the roster's `required_streak`), `values` each slot's opened
        digest (None where none)."""
        assert self.chain is not None
        weak = frozenset(
            p
            for p in roster.providers
            if chain.required_streak and self.chain.reputation_of(p).consecutive_valid < chain.required_streak
        )
        rate = roster_port(self.chain).spot_check_ppm(roster.replicas)
        return predict_set_aside(roster, chain_order_id, round_index, block_hash, rate, values, weak)

    def seed_hash(self, block_number: int) -> str:
        """The hash the chain's draw of a round committed in `block_number` reads: zero once the step
        revealing it could land past the EVM's 256 readable block hashes (with a margin: every unit is then
        drawn, as the contract decides)."""
        assert self.chain is not None
        if self.chain.block_number() - block_number > SEED_HASH_MARGIN_BLOCKS:
            return "0x" + "00" * 32
        return self.chain.block_hash(block_number)

    def _accept_paid(
        self, session: Session, row: RosterRow, chain: RosterChainState, unheld: frozenset[int]
    ) -> None:
        revealed = chain.committed - (1 if chain.pending_block else 0)
        units = self.store.units_of_order(session, row.order_id)
        seen = sum(1 for u in units if is_slot_unit(u) and u.chain_unit_id is not None)
        if seen != chain.set_aside_units:
            return  # the sync has not applied every UnitSetAside yet: a unit left ROSTERED may be one
        for unit in units:
            if unit.state == UnitState.ROSTERED.value and unit.round_index < revealed:
                if unit.round_index in unheld:
                    continue
                replicas = self._unanimous(session, unit)
                if replicas is not None:
                    self._accept(session, unit, replicas)

    def _rostered(self, session: Session, row: RosterRow, round_index: int) -> list[UnitRow]:
        return [
            unit
            for unit in self.store.units_of_order(session, row.order_id)
            if unit.state == UnitState.ROSTERED.value and unit.round_index == round_index
        ]

    def _slot_values(self, session: Session, row: RosterRow, round_index: int) -> list[str | None]:
        """Each slot's opened (or published) digest of the round, None where the market has none."""
        values: list[str | None] = [None] * (row.units_per_round * row.replicas)
        for work in self.store.roster_works(session, row_id(row), round_index):
            values[work.slot] = work.result_digest
        return values

    def _plan_open(self, session: Session, row: RosterRow, now: int) -> int:
        roster = roster_of(row)
        accepts = {a.provider: a for a in self.store.roster_accepts(session, row_id(row))}
        if set(accepts) != set(roster.providers):
            return 0
        payload = {
            "accepts": [
                {
                    "provider": p,
                    "nonce": accepts[p].nonce,
                    "deadline": accepts[p].deadline,
                    "signature": accepts[p].signature,
                }
                for p in roster.providers
            ]
        }
        self.store.enqueue_roster_action(session, row_id(row), OPEN_ACTION, payload, now)
        row.state = "opening"
        row.updated_at = now
        session.add(row)
        return 1

    def _progress(
        self, session: Session, row: RosterRow, chain: RosterChainState | None, now: int
    ) -> RosterProgress:
        """What the next action depends on. The pending round's openings are ready once every slot opened,
        or once its reveal window passed on chain (the step then gives the silent slots as withheld); it is
        held while one of its units waits for a verdict, or a slot has no opening to give."""
        slots = row.units_per_round * row.replicas
        pending = row.committed - 1 if row.committed > row.revealed else None
        window_passed = (
            chain is not None
            and chain.pending_block != 0
            and chain.committed - 1 == pending
            and now > chain.pending_since + self.config.reveal_window_s
        )
        works: set[int] = set()
        openings: set[int] = set()
        held: set[int] = set()
        for index in range(max(row.committed - 1, 0), min(row.committed + 1, row.rounds)):
            rows = self.store.roster_works(session, row_id(row), index)
            if len(rows) == slots:
                works.add(index)
                if all(w.salt is not None for w in rows) or (index == pending and window_passed):
                    openings.add(index)
                if index == pending and any(w.salt is None for w in rows):
                    held.add(index)
        if pending is not None and self._rostered(session, row, pending):
            held.add(pending)
        auditing = (
            frozenset({pending})
            if pending is not None and self.audits.collecting(session, row, pending)
            else frozenset()
        )
        open_set_aside = sum(
            1
            for unit in self.store.units_of_order(session, row.order_id)
            if unit.chain_unit_id is not None
            and is_slot_unit(unit)
            and unit.state not in (UnitState.ACCEPTED.value, UnitState.FAILED.value)
        )
        return RosterProgress(
            rounds=row.rounds,
            committed=row.committed,
            pending=row.committed > row.revealed,
            closed=row.state == "closed",
            expired=now > self.store.get_order(session, row.order_id).deadline,
            works_ready=frozenset(works),
            openings_ready=frozenset(openings),
            open_set_aside=open_set_aside,
            held=frozenset(held),
            auditing=auditing,
        )

    def _step(self, session: Session, row: RosterRow, plan: StepPlan) -> dict[str, Any]:
        """The step's payload, fixed when queued: the revealed round's openings and the committed round's
        commitments, each in slot order, with its providers' `RoundCommit` signatures (roster order)."""
        payload: dict[str, Any] = {
            "reveal": plan.reveal,
            "commit": plan.commit,
            "deadline": row.works_deadline,
        }
        if plan.reveal is not None:
            # a slot without an opening (its window passed) is given as withheld: its commitment instead
            payload["openings"] = [
                {"provider": w.provider, "result_digest": w.result_digest, "salt": w.salt}
                if w.salt is not None
                else {"provider": w.provider, "result_digest": w.result_digest, "withheld": w.commitment}
                for w in self.store.roster_works(session, row_id(row), plan.reveal)
            ]
        if plan.commit is not None:
            # every slot's commitment; each provider's one RoundCommit signature (held on each of its slots)
            works = self.store.roster_works(session, row_id(row), plan.commit)
            signed = {w.provider: w.signature for w in works}
            payload["commitments"] = [w.commitment for w in works]
            payload["signatures"] = [signed[p] for p in roster_of(row).providers]
        return payload

    # --- the chain's facts ---

    def reconcile(self, session: Session, row: RosterRow, chain: RosterChainState, now: int) -> None:
        """Adopt the chain's counters (re-read after a send or a revert): the chain is the source of truth,
        and its counters only grow."""
        if not chain.exists:
            return
        if row.state in ("accepting", "opening"):
            row.state = "open"
        row.committed = max(row.committed, chain.committed)
        row.revealed = max(row.revealed, chain.committed - (1 if chain.pending_block else 0))
        if chain.closed:
            row.state = "closed"
        row.updated_at = now
        session.add(row)

    def apply_event(self, session: Session, event: ChainEvent, now: int) -> set[str]:
        """Apply one round-path event to its roster (none: not this market's order, ignored); returns the
        accounts whose stake it changed. Never raises for an event it does not expect: the sync goes on."""
        args = event.args
        if not isinstance(args.get("orderId"), int) or args["orderId"] < 0:
            return set()
        row = self.store.roster_by_chain_order(session, args["orderId"])
        if row is None or row.providers_json == "[]":
            return set()
        providers = set(json.loads(row.providers_json))
        if event.name == "RosterOpened":
            if row.state in ("accepting", "opening"):
                row.state = "open"
            self._confirm(session, row, OPEN_ACTION, now)
            touched = providers | set(verifiers_of(row))  # each locked its collateral
        elif event.name == "RoundCommitted":
            round_index = int(args["round"])
            row.committed = max(row.committed, round_index + 1)
            self._confirm(session, row, f"step:{round_index}", now)
            touched = set()
        elif event.name == "RoundRevealed":
            round_index = int(args["round"])
            row.revealed = max(row.revealed, round_index + 1)
            self._confirm(session, row, f"{REVEAL_PREFIX}{round_index}", now)
            if round_index + 1 == row.rounds:
                self._confirm(session, row, f"step:{row.rounds}", now)
            touched = set()
        elif event.name == "UnitSetAside":
            touched = self._set_aside(
                session, row, int(args["round"]), int(args["unit"]), int(args["unitId"]), event, now
            )
        elif event.name == "OpeningPublished":
            self._published(session, row, int(args["round"]), int(args["slot"]), str(args["resultDigest"]))
            touched = set()
        elif event.name == "RosterClosed":
            row.state = "closed"
            self._confirm(session, row, "close", now)
            touched = providers | set(verifiers_of(row))
        else:
            return set()
        row.updated_at = now
        session.add(row)
        return touched

    def _confirm(self, session: Session, row: RosterRow, action: str, now: int) -> None:
        entry = self.store.roster_action(session, row_id(row), action)
        if entry is not None and entry.state != "confirmed":
            entry.state = "confirmed"
            entry.updated_at = now
            session.add(entry)

    def _published(self, session: Session, row: RosterRow, round_index: int, slot: int, digest: str) -> None:
        """A provider published its opening on chain: the slot's result is known (its salt is not, and the
        step that reveals the round no longer needs it from the market)."""
        for work in self.store.roster_works(session, row_id(row), round_index):
            if work.slot == slot and work.result_digest is None:
                work.result_digest = digest.lower()
                session.add(work)

    def _set_aside(
        self,
        session: Session,
        row: RosterRow,
        round_index: int,
        unit: int,
        chain_unit_id: int,
        event: ChainEvent,
        now: int,
    ) -> set[str]:
        """The step set unit `unit` of `round_index` aside as chain unit `chain_unit_id`: the round's training
        unit itself (held by :meth:`decide`, so nothing started from it yet) goes to VERIFYING with the chain
        id, its replicas as the step revealed them and the step's verifiers, with a verification job: it
        settles on the per-unit path, and its verdict decides what the next round starts from. A unit with no
        ROSTERED training unit (accepted before the step: a provider's streak fell in between; or none, off
        the training plane) becomes an ordinary unit of its own. A repeated event changes nothing."""
        providers = {roster_of(row).provider_of(unit, r) for r in range(row.replicas)}
        if chain_unit_id == 0:  # dropped unpaid (setAsidePending without verifiers): nothing to verify
            dropped = self._training_unit(session, row.order_id, round_index, unit)
            if dropped is not None:
                dropped.state = advance(UnitState.ROSTERED, UnitState.FAILED, what=f"unit {dropped.id}").value
                dropped.updated_at = now
                session.add(dropped)
            return providers
        if self.store.unit_by_chain_id(session, chain_unit_id) is not None:
            return set()
        order = self.store.get_order(session, row.order_id)
        spec = OrderSpec.from_stored(order.spec_json)
        round_row = self.store.round_of(session, row_id(order), round_index)
        if round_row is None:
            round_row = RoundRow(order_id=row_id(order), index=round_index)
            session.add(round_row)
            session.flush()
        sent: dict[str, Any] = {}
        for step in self.store.roster_actions_of(session, row_id(row)):
            payload = json.loads(step.payload_json)
            revealing = step.action in (f"step:{round_index + 1}", f"{REVEAL_PREFIX}{round_index}")
            if "verifiers" in payload and (revealing or round_index in payload.get("rounds", ())):
                sent = payload
        verifiers_json = json.dumps(sent.get("verifiers", []))
        # the per-unit sweep expires it a verdict window after now, as the chain allows
        commit_deadline = now - self.config.reveal_window_s
        works = {w.slot: w for w in self.store.roster_works(session, row_id(row), round_index)}
        mirror = self._training_unit(session, row.order_id, round_index, unit)
        if mirror is not None:
            unit_row = mirror
            unit_row.state = advance(UnitState.ROSTERED, UnitState.VERIFYING, what=f"unit {mirror.id}").value
            unit_row.chain_unit_id = chain_unit_id
            unit_row.commit_deadline = commit_deadline
            unit_row.verifiers_json = verifiers_json
            unit_row.updated_at = now
            for slot_replica in self.ctx.live_replicas(session, unit_row):
                work = works.get(unit * row.replicas + slot_replica.index)
                if slot_replica.state == ReplicaState.COMMITTED.value and work and work.result_digest:
                    slot_replica.state = ReplicaState.REVEALED.value  # published on chain, not to the market
                    slot_replica.result_digest = work.result_digest
                    session.add(slot_replica)
            session.add(unit_row)
        else:
            plan = plan_round(spec, round_index)[unit]
            unit_row = UnitRow(
                order_id=row_id(order),
                round_id=row_id(round_row),
                round_index=round_index,
                shard=unit,
                kind=UnitKind.TRAIN.value,
                unit_key=f"0x{round_unit_id(row.chain_order_id, round_index, unit):064x}",
                state=UnitState.VERIFYING.value,
                k=row.replicas,
                start_step=plan.start_step,
                steps=plan.steps,
                chain_unit_id=chain_unit_id,
                commit_deadline=commit_deadline,
                verifiers_json=verifiers_json,
                updated_at=now,
            )
            session.add(unit_row)
            session.flush()
            for replica in range(row.replicas):
                work = works.get(unit * row.replicas + replica)
                opened = work is not None and work.result_digest is not None
                session.add(
                    ReplicaRow(
                        unit_id=row_id(unit_row),
                        index=replica,
                        provider=to_checksum_address(roster_of(row).provider_of(unit, replica)),
                        state=(ReplicaState.REVEALED if opened else ReplicaState.COMMITTED).value,
                        commitment=work.commitment if work else None,
                        commit_signature=work.signature if work else None,
                        result_digest=work.result_digest if work else None,
                        salt=work.salt if work else None,
                    )
                )
        randomness = self.ctx.chain.block_hash(event.block_number) if self.ctx.chain else "0x" + "00" * 32
        unit_row.randomness = randomness
        reason = sent.get("reasons", {}).get(str(unit), SetAsideReason.DRAWN.value)
        session.add(
            VerificationJobRow(
                unit_id=row_id(unit_row), reason=f"roster_{reason}", randomness=randomness, created_at=now
            )
        )
        return providers
