"""Hypothesis state machine: random market histories on the real bytecode, checked after every step.

Each rule performs one party action on a hardhat node (EDR) and the same action on the reference model
(`invariants_model.Model`); a revert the model predicts must come back as that exact typed error with
those arguments. After every step the invariants below are checked from chain observations (contract
storage read straight from the node in one batch, token balances, the events of the step) and ghost
variables, and every account, order and unit is compared field by field with the model. Every example
ends by driving the market past all deadlines and closing every position: all funds must exit
(liveness); there the storage reader is also cross-checked against the contracts' public views, and
nonces are compared.
The round path (JobMarketRounds) runs beside the per-unit path on the same orders' ledger: rosters opened
on orders (fixed or adaptive, fewer replicas for providers with the streak), rounds committed and revealed
in one step each (a replica sometimes deviant, a slot sometimes withheld past the reveal window, its
opening sometimes published on chain first), units set aside by the operator's step (split, withheld, or
drawn) settling on the per-unit path (verdicts, held fraud, appeals, expiry), and closeRoster; plus
refused calls (forged works, tampered openings, early withheld slots, another roster's layout, early
closes, steps by a provider or with too few verifiers). Rosters, their per-provider set-aside slots and
roster locks are compared with the model after every step.
Actors: operator, 2 buyers, 3 providers, 2 verifiers and a referee, the only member of VerdictAppeals'
referee pool (a panel of one, never a unit's party, so the draw does not hang on block hashes; on a chain
deployed with PANEL_OF_THREE, three referees, the whole pool, so only their seats hang on it); the
deployer also holds MARKET_ROLE on the StakeManager, acting as a second market that slashes directly
(SECURITY.md A7).

Truth before money: a verdict holds the replicas it calls fraud (collateral locked, price in escrow,
nobody slashed, no bounty) until VerdictAppeals fixes the unit's truth. The machine appeals verdicts (the
framed provider or a verifier), draws the panel, votes (mostly the honest outcomes, which overturn a
framing verdict; sometimes the verdict), resolves, lets appeals lapse, and settles unappealed or lapsed
verdicts after the appeal window (settleVerdict); the model settles the held replicas the same way.

Named invariants (a failure raises `InvariantViolation` carrying the names; the mutation test asserts
the seeded bug trips the one it targets):
- solvency: token balance of StakeManager == totalStaked == Σ stakers' bonded+unbonding; token balance
  of JobMarket == totalEscrow + totalCredits, with totalCredits == Σ actors' credits (≥ would suffice
  against donations; this handler never donates, so equality must hold); VerdictAppeals holds nothing.
- no_double_settlement: a unit settles (finalize / verdict / expire) at most once and its held replicas
  at most once; per order, the escrow that left as credits never exceeds what the buyer escrowed, and
  once the order is closed equals it less the prices of its still-held replicas; on the round path, no
  provider is paid for more of a roster's slots (by closeRoster and its set-aside units' settlements
  together, measured as credit gained / price) than it holds in the rounds revealed so far.
- truth_before_money: a verdict slashes nobody it calls fraud, credits its signers only the fee and
  the withhold penalties' bounty, and leaves the held replicas' collateral locked.
- framed_made_whole: when the truth accepts a replica its verdict called fraud (an overturn), the
  provider lost no stake to that unit, gets its price and its collateral back.
- unit_state_machine: every stored unit state change is a legal edge (None → Committing → Revealing →
  Finalized | Verdicted | Expired; Committing → Verdicted | Expired; a round-path unit set aside for a
  verdict is born Revealing, checked by the step that sets it aside) and equals the model's state.
- slash_reaches_unbonding: a slash takes min(amount, bonded + unbonding) — unbonding stake stays slashable
  — and exactly that many tokens leave the StakeManager.
- slashed_never_withdrawable: per staker, bonded + unbonding == deposited − withdrawn − slashed, so a
  slashed token can never come back out through withdraw.
- funds_exit: after all deadlines, expiring units, closing orders, withdrawing credits and unstaking
  leave both contracts holding no tokens and every actor holding what the model says.
- collateral_locked: a staker never slashed has exactly locked the collateral of its open units, of its
  held replicas, of its slots in open rosters (one `providerCollateral` per slot of a round; a set-aside
  unit's providers lock nothing more, the roster's lock is theirs), its pending appeal bonds and its
  referee stake.
- drawn_never_finalized: a unit drawn for a spot check is never finalized; on the round path, every unit
  of a revealed round that the draw takes (a provider below the roster's required streak, read from
  storage before the step, or the committing block's hash gone) is set aside by that step
  (`UnitSetAside`), never paid by count.
- pending_audits: a roster's round hash holds exactly the model's pending audit chain (with the committed
  round's commitments) and its audit key the model's verifiers and posted chain, every posting the chain
  accepts (its AuditPosted event) is signed by a majority of the roster's verifiers, and no roster closes with
  a record pending: a drawn unit is paid only once a quorum's posting covers it, and a record taken off the
  pending chain (setAsidePending: set aside for verdicts, or dropped unpaid after the deadline +
  verdictWindow) can never be posted or paid again.
- audit_challenges: the round audits' dispute path (challengeAudit, slashRoundAudit, releaseAuditSigners):
  each signer of a challenged audit is slashed at most once per unit, only if it signed the posting that
  paid the unit, and only when the unit's truth holds fraud, and the slash that succeeds first takes every
  one of that posting's signers (as the step gave them, not as the chain recorded them); each roster
  verifier's collateral is released exactly once (early, before a slash of its audit, or at the close;
  never both); and the close pays each roster verifier no more fees than its share of the audited units it
  signed that no challenge took back (a challenged unit's slots: no_double_settlement).
- panel_majority: read from VerdictAppeals' own record of an appeal (getAppeal's panel, votes, decided)
  after every appeal action: the decision is the outcome vector more than half of the panel's seats voted,
  and there is none while no vector has that many (a dissent cast before, between or after the majority's
  votes never decides, nor delays the majority's decision).
- model_agreement: everything else the model predicts (success vs typed revert and its arguments,
  balances, stakes, credits, reputation, nonces, order and unit fields).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from eth_abi import encode as abi_encode
from eth_utils import keccak
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.chain.invariants_harness import Actor, AppealParams, Chain, MarketParams, TxOutcome
from tests.chain.invariants_model import (
    ACCEPT,
    FAULT,
    FRAUD,
    LEGAL_TRANSITIONS,
    SETTLED_STATES,
    AppealState,
    Expected,
    Model,
    RosterState,
    Unit,
    UnitState,
    bits,
)
from tests.chain.invariants_storage import StorageReader
from veritrain.chain import eip712
from veritrain.chain.errors import ContractReverted

BUYERS = ("buyer0", "buyer1")
PROVIDERS = ("provider0", "provider1", "provider2")
# stepRound's RoundWork as the ABI takes it: every slot's commitment, each roster provider's (r, vs)
RoundWorkArg = tuple[list[bytes], list[tuple[bytes, bytes]]]
VERIFIERS = ("verifier0", "verifier1")
REFEREE = "referee0"
# A panel of three (AppealParams.panel_size 3, PANEL_OF_THREE) draws from a pool of exactly three referees, so
# the panel is the same three whatever the block hash (only their seats differ): referee1 and referee2 join
# the pool only on such a chain (they are funded on every chain, their stake rules never pick them).
EXTRA_REFEREES = ("referee1", "referee2")
REFEREES = (REFEREE, *EXTRA_REFEREES)
# Round audits: a roster may have a third verifier (quorum 2 of 3: a posting signed by a bare majority), and
# a challenge needs two verifiers none of whom signed the posting: the spares, staked on demand.
SPARE_VERIFIERS = ("verifier2", "verifier3")
AUDITORS_OF_THREE = (*VERIFIERS, SPARE_VERIFIERS[0])
ALL_VERIFIERS = (*VERIFIERS, *SPARE_VERIFIERS)
ACTOR_LABELS = ("operator", *BUYERS, *PROVIDERS, *VERIFIERS, REFEREE, *SPARE_VERIFIERS, *EXTRA_REFEREES)
STAKERS = (*PROVIDERS, *VERIFIERS)  # the stake rules' accounts; the referee's stake sits in the pool
ALL_STAKERS = (*STAKERS, REFEREE, *SPARE_VERIFIERS, *EXTRA_REFEREES)
# withdraw_credit's accounts when it picks any: not the extra referees, so a panel of one draws as before
CREDIT_HOLDERS = (*BUYERS, *PROVIDERS, *VERIFIERS, REFEREE, *SPARE_VERIFIERS)
FUNDED = (*CREDIT_HOLDERS, *EXTRA_REFEREES)
INITIAL_TOKENS = 1_000_000
REFEREE_DEPOSIT = 1_000  # staked and joined to the referee pool at deployment (the pool locks part of it)
SIG_LIFETIME = 10**6
MAX_UINT = 2**256 - 1

INVARIANTS = (
    "solvency",
    "no_double_settlement",
    "unit_state_machine",
    "slash_reaches_unbonding",
    "slashed_never_withdrawable",
    "funds_exit",
    "model_agreement",
    "drawn_never_finalized",
    "collateral_locked",
    "truth_before_money",
    "framed_made_whole",
    "pending_audits",
    "audit_challenges",
    "panel_majority",
)
SETTLEMENT_EVENTS = {
    keccak(text="UnitFinalized(uint256,bytes32)"),
    keccak(text="VerdictRecorded(uint256,uint8[],bytes32,address[])"),
    keccak(text="UnitExpired(uint256)"),
}
STAKE_SLASHED = keccak(text="StakeSlashed(address,uint256,address)")
HELD_SETTLED = keccak(text="HeldSettled(uint256,uint8[])")
UNIT_SET_ASIDE = keccak(text="UnitSetAside(uint256,uint32,uint256,uint256)")
ROUND_REVEALED = keccak(text="RoundRevealed(uint256,uint32,bytes32[],uint256)")
AUDIT_POSTED = keccak(text="AuditPosted(uint256,uint256,bytes32)")
VERIFIER_SLASHED = keccak(text="VerifierSlashed(uint256,address,uint256,address)")


class InvariantViolation(AssertionError):
    """One step broke named invariants; `names` lists them, the message says how."""

    def __init__(self, failures: Sequence[tuple[str, str]]) -> None:
        self.names = frozenset(name for name, _ in failures)
        super().__init__("\n".join(f"[{name}] {detail}" for name, detail in failures))


def build_chain(
    artifacts: dict[str, dict[str, Any]],
    storage_layouts: dict[str, Any],
    params: MarketParams | None = None,
    appeal_params: AppealParams | None = None,
) -> Chain:
    """Deploy, fund every actor, approve both contracts, put `panel_size` referees in the pool, and
    snapshot: the start of every example.

    `storage_layouts` (solc's, per contract) must describe the deployed bytecode; each example's
    final cross-check against the views enforces that.
    """
    appeal_params = appeal_params or AppealParams()
    if appeal_params.panel_size > len(REFEREES):
        raise AssertionError(f"a panel of {appeal_params.panel_size}: only {len(REFEREES)} referees")
    chain = Chain(artifacts, params or MarketParams(), ACTOR_LABELS, appeal_params)
    chain.storage_layouts = storage_layouts
    for label in FUNDED:
        actor = chain.actors[label]
        minted = chain.transact(chain.deployer, chain.token, "mint", [actor.address, INITIAL_TOKENS])
        approved_sm = chain.transact(actor, chain.token, "approve", [chain.stakes.address, MAX_UINT])
        approved_jm = chain.transact(actor, chain.token, "approve", [chain.market.address, MAX_UINT])
        for outcome in (minted, approved_sm, approved_jm):
            if outcome.error is not None:
                raise AssertionError(f"setting up {label} failed: {outcome.error}")
    for label in REFEREES[: appeal_params.panel_size]:
        referee = chain.actors[label]
        for outcome in (
            chain.transact(referee, chain.stakes, "stake", [REFEREE_DEPOSIT]),
            chain.transact(referee, chain.appeals, "joinPool", []),
        ):
            if outcome.error is not None:
                raise AssertionError(f"setting up {label} failed: {outcome.error}")
    chain.mark_initial_state()
    return chain


def _mostly(data: st.DataObject, odds: int, label: str) -> bool:
    """True with probability odds/(odds+1): the usual choice, leaving room for the unusual one."""
    return data.draw(st.integers(0, odds), label=label) > 0


def _usually(data: st.DataObject, odds: int, label: str) -> bool:
    """True with probability odds/(odds+1) (odds >= 2) as `_mostly`, but True at both ends of the draw's
    range, which Hypothesis favours (`_mostly` is False at 0): for a path a run should take often whatever
    the data's bias. False only at the middle value."""
    return data.draw(st.integers(0, odds), label=label) != odds // 2


def _raw(value: str) -> bytes:
    """Receipt fields arrive as 0x-hex strings (raw JSON-RPC)."""
    return bytes.fromhex(value[2:])


def _slash_events(receipt: Any) -> dict[str, int]:
    """Stake taken per account (lowercase address) by the StakeSlashed events of one transaction."""
    taken: dict[str, int] = {}
    for log in receipt["logs"]:
        topics = [_raw(t) for t in log["topics"]]
        if topics[0] == STAKE_SLASHED:
            account = "0x" + topics[1][-20:].hex()
            taken[account] = taken.get(account, 0) + int.from_bytes(_raw(log["data"])[:32], "big")
    return taken


def _norm(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("0x"):
        return value.lower()
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value


@dataclass
class Ghosts:
    """What the chain did, as measured by the handler (independent of the model's arithmetic)."""

    settlements: dict[int, int] = field(default_factory=dict)
    escrow_out: dict[int, int] = field(default_factory=dict)
    deposited: dict[str, int] = field(default_factory=dict)
    withdrawn: dict[str, int] = field(default_factory=dict)
    slashed: dict[str, int] = field(default_factory=dict)
    unit_states: dict[int, UnitState] = field(default_factory=dict)
    held_settlements: dict[int, int] = field(default_factory=dict)  # HeldSettled events per unit
    unit_slashes: dict[tuple[int, str], int] = field(default_factory=dict)  # (unit, lowercase account)
    # Round path: per (order, provider), the roster slots paid (by the roster's close, or by the settlement
    # of a unit it set aside), measured as credit gained / the order's price.
    slot_pay: dict[tuple[int, str], int] = field(default_factory=dict)
    # Round audits: per (unit, lowercase signer), slashRoundAudit's VerifierSlashed events; per (order,
    # verifier), releases of its roster collateral seen (locked stake freed by a slashRoundAudit or the
    # close, in verifierCollateral), and those that could not be told (a slash clamped the lock); per (order,
    # verifier), the audit fees the close paid it (credit and tokens gained).
    audit_slashes: dict[tuple[int, str], int] = field(default_factory=dict)
    audit_releases: dict[tuple[int, str], int] = field(default_factory=dict)
    audit_unclear: set[tuple[int, str]] = field(default_factory=set)
    audit_pay: dict[tuple[int, str], int] = field(default_factory=dict)


@dataclass
class UnitSecrets:
    """The result digest and salt each replica committed to (only the provider would know them)."""

    digests: dict[int, bytes] = field(default_factory=dict)
    salts: dict[int, bytes] = field(default_factory=dict)


class MarketMachine(RuleBasedStateMachine):
    """The handler. `chain` is set by `machine_for()` (one deployment per contract variant)."""

    chain: ClassVar[Chain]
    # function name -> [succeeded, reverted], over all examples of the run (vacuous-pass guard).
    call_stats: ClassVar[dict[str, list[int]]]
    error_stats: ClassVar[dict[str, int]]

    def __init__(self) -> None:
        super().__init__()
        self.chain.reset()
        chain = self.chain
        self.actors = chain.actors
        self.address_of = {label: actor.address for label, actor in self.actors.items()}
        self.address_of["deployer"] = chain.deployer.address  # receives direct slashes
        self.address_of["appeals"] = chain.appeals.address  # must hold nothing and stake nothing
        self.label_of = {address: label for label, address in self.address_of.items()}
        self.model = Model(
            chain.params,
            chain.stakes.address,
            chain.market.address,
            token_holder_va=chain.appeals.address,
            appeal_params=chain.appeal_params,
        )
        self.model.pending_block = chain.pending_block
        self.model.block_hash = chain.block_hash
        for label in FUNDED:
            self.model.tokens[self.address_of[label]] = INITIAL_TOKENS
        self.ghosts = Ghosts()
        # build_chain's referees, one per seat of the panel: staked, and in the pool
        self.referees = REFEREES[: chain.appeal_params.panel_size]
        for label in self.referees:
            referee = self.address_of[label]
            self.model.stake(referee, REFEREE_DEPOSIT, 0)
            self.model.join_pool(referee)
            self.ghosts.deposited[referee] = REFEREE_DEPOSIT
        self.vote_order: dict[int, list[bytes]] = {}  # per appealed unit: the outcome hashes voted, in order
        self.dissenter: dict[int, int | None] = {}  # per appeal on a larger panel: whose vote dissents
        self.draining = False  # drain_everything runs (call stats tell its calls from the rules')
        self.secrets: dict[int, UnitSecrets] = {}
        self.failures: list[tuple[str, str]] = []
        self.storage = StorageReader(chain, chain.storage_layouts)
        self.staker_addresses = [self.address_of[label] for label in ALL_STAKERS]
        self.steps = 0
        self.broken = False
        self.accept_draws: dict[str, int] = {}  # per provider: unordered Accept nonces drawn so far
        # Round path: each committed round's (digest, salt) per slot, and each set-aside unit's honest digest
        self.round_secrets: dict[tuple[int, int], list[tuple[bytes, bytes]]] = {}
        self.honest: dict[int, bytes] = {}

    # ------------------------------------------------------------------------------------------
    # Running one action on both sides
    # ------------------------------------------------------------------------------------------

    def _run(
        self,
        what: str,
        sender: Actor,
        contract_name: str,
        fn: str,
        args: Sequence[Any],
        model_action: Callable[[], Expected | None],
    ) -> TxOutcome:
        """Apply `model_action` to the model, send the transaction, and record any disagreement."""
        expected = model_action()
        contract = getattr(self.chain, contract_name)
        outcome = self.chain.transact(sender, contract, fn, args, expect_revert=expected is not None)
        self.call_stats.setdefault(fn, [0, 0])[outcome.error is not None] += 1
        if outcome.error is not None:
            self.error_stats[f"{fn}: {outcome.error.name}"] = (
                self.error_stats.get(f"{fn}: {outcome.error.name}", 0) + 1
            )
        if expected is None and outcome.error is not None:
            self._fail(
                "model_agreement", f"{what}: model expected success, contract reverted {outcome.error}"
            )
        elif expected is not None and outcome.error is None:
            self._fail("model_agreement", f"{what}: model expected revert {expected}, contract succeeded")
        elif expected is not None and outcome.error is not None:
            self._check_error(what, expected, outcome.error)
        return outcome

    def _check_error(self, what: str, expected: Expected, error: ContractReverted) -> None:
        got_args = tuple(_norm(v) for v in error.arguments.values())
        want_args = tuple(_norm(v) for v in expected.args)
        if error.name != expected.name or (want_args and got_args != want_args):
            self._fail(
                "model_agreement",
                f"{what}: expected {expected.name}{want_args}, got {error.name}{got_args}",
            )

    def _fail(self, name: str, detail: str) -> None:
        self.failures.append((name, detail))

    def _now(self) -> int:
        return self.chain.now()

    def _sig_deadline(self) -> int:
        return self._now() + SIG_LIFETIME

    # ------------------------------------------------------------------------------------------
    # Rules: stake
    # ------------------------------------------------------------------------------------------

    @initialize(
        amounts=st.lists(
            st.sampled_from([0, 1_000, 2_500, 5_000]), min_size=len(STAKERS), max_size=len(STAKERS)
        )
    )
    def initial_stakes(self, amounts: list[int]) -> None:
        """Start most examples with staked parties, so the market gets past assignment quickly."""
        for staker, amount in zip(STAKERS, amounts, strict=True):
            if amount:
                self.do_stake(staker, amount)

    @initialize(buyer=st.sampled_from(BUYERS), units=st.integers(1, 3), replicas=st.integers(1, 3))
    def initial_order(self, buyer: str, units: int, replicas: int) -> None:
        self.do_post_order(buyer, units, replicas, 100, 50, 3_000)

    @rule(staker=st.sampled_from(STAKERS), amount=st.sampled_from([0, 1, 250, 500, 1_000, 1_500, 2_500]))
    def stake(self, staker: str, amount: int) -> None:
        self.do_stake(staker, amount)

    def do_stake(self, staker: str, amount: int) -> None:
        actor = self.actors[staker]
        before = self._sm_balance()
        outcome = self._run(
            f"stake({staker}, {amount})",
            actor,
            "stakes",
            "stake",
            [amount],
            lambda: self.model.stake(actor.address, amount, self._now()),
        )
        if outcome.error is None:
            self._add(self.ghosts.deposited, actor.address, self._sm_balance() - before)

    @rule(
        staker=st.sampled_from(STAKERS),
        amount=st.sampled_from([0, 1, 100, 500, 1_000, -1]),
        signed=st.booleans(),
    )
    def request_unstake(self, staker: str, amount: int, signed: bool) -> None:
        """amount -1 means all free stake (the usual client call)."""
        acc = self.model.stake_of(self.address_of[staker])
        self.do_request_unstake(staker, acc.bonded - acc.locked if amount < 0 else amount, signed)

    def do_request_unstake(self, staker: str, amount: int, signed: bool = False) -> None:
        actor = self.actors[staker]
        now = self._now()
        if not signed:
            self._run(
                f"requestUnstake({staker}, {amount})",
                actor,
                "stakes",
                "requestUnstake",
                [amount],
                lambda: self.model.request_unstake(actor.address, amount, now),
            )
            return
        nonce = self.model.sm_nonces.get(actor.address, 0)
        deadline = now + SIG_LIFETIME
        message = {"staker": actor.address, "amount": amount, "nonce": nonce, "deadline": deadline}
        signature = self.chain.sign_stake(actor, "RequestUnstake", message)

        def model_action() -> Expected | None:
            expected = self.model.request_unstake(actor.address, amount, now)
            if expected is None:
                self.model.sm_nonces[actor.address] = nonce + 1
            return expected

        self._run(
            f"requestUnstakeWithSig({staker}, {amount})",
            self.actors["operator"],
            "stakes",
            "requestUnstakeWithSig",
            [actor.address, amount, nonce, deadline, signature],
            model_action,
        )

    @rule(data=st.data(), signed=st.booleans())
    def withdraw_stake(self, data: st.DataObject, signed: bool) -> None:
        """Mostly a staker whose unbonding stake has thawed, sometimes any (early or empty withdrawals)."""
        now = self._now()
        thawed = [
            label
            for label in STAKERS
            if self.model.stake_of(self.address_of[label]).unbonding
            and self.model.stake_of(self.address_of[label]).thaw_at <= now
        ]
        pool = thawed if thawed and _mostly(data, 2, "prefer thawed") else STAKERS
        self.do_withdraw_stake(data.draw(st.sampled_from(pool), label="staker"), signed)

    def do_withdraw_stake(self, staker: str, signed: bool = False) -> None:
        actor = self.actors[staker]
        now = self._now()
        before = self._sm_balance()
        if signed:
            nonce = self.model.sm_nonces.get(actor.address, 0)
            deadline = now + SIG_LIFETIME
            message = {"staker": actor.address, "nonce": nonce, "deadline": deadline}
            signature = self.chain.sign_stake(actor, "Withdraw", message)

            def model_action() -> Expected | None:
                expected = self.model.withdraw_stake(actor.address, now)
                if expected is None:
                    self.model.sm_nonces[actor.address] = nonce + 1
                return expected

            outcome = self._run(
                f"withdrawWithSig({staker})",
                self.actors["operator"],
                "stakes",
                "withdrawWithSig",
                [actor.address, nonce, deadline, signature],
                model_action,
            )
        else:
            outcome = self._run(
                f"withdraw({staker})",
                actor,
                "stakes",
                "withdraw",
                [],
                lambda: self.model.withdraw_stake(actor.address, now),
            )
        if outcome.error is None:
            self._add(self.ghosts.withdrawn, actor.address, before - self._sm_balance())

    @precondition(lambda self: any(s.unbonding or s.locked for s in self.model.stakes.values()))
    @rule(staker=st.sampled_from(STAKERS), amount=st.sampled_from([1, 300, 700, 1_200, 5_000]))
    def slash_directly(self, staker: str, amount: int) -> None:
        """A second market (the deployer holds MARKET_ROLE) slashes: it must reach unbonding stake too."""
        self.do_slash_directly(staker, amount)

    def do_slash_directly(self, staker: str, amount: int) -> None:
        account = self.address_of[staker]
        pre = {account: self.storage.stake_of(account)}
        before = self._sm_balance()
        outcome = self._run(
            f"slash({staker}, {amount})",
            self.chain.deployer,
            "stakes",
            "slash",
            [account, amount, self.chain.deployer.address],
            lambda: self._model_slash(account, amount),
        )
        if outcome.receipt is not None:
            self._check_slashes(outcome.receipt, pre, {account: amount}, before)

    def _model_slash(self, account: str, amount: int) -> None:
        self.model.slash(account, amount, self.chain.deployer.address)

    # ------------------------------------------------------------------------------------------
    # Rules: orders and assignment
    # ------------------------------------------------------------------------------------------

    @rule(
        buyer=st.sampled_from(BUYERS),
        units=st.sampled_from([0, 1, 2, 3, 3]),
        replicas=st.integers(1, 3),
        price=st.sampled_from([1, 7, 100, 333]),
        fee=st.sampled_from([0, 1, 50, 101]),
        deadline_in=st.sampled_from([0, 300, 1_000, 3_000, 3_000]),
    )
    def post_order(
        self, buyer: str, units: int, replicas: int, price: int, fee: int, deadline_in: int
    ) -> None:
        self.do_post_order(buyer, units, replicas, price, fee, deadline_in)

    def do_post_order(
        self, buyer: str, units: int, replicas: int, price: int, fee: int, deadline_in: int
    ) -> None:
        actor = self.actors[buyer]
        now = self._now()
        deadline = now + deadline_in
        self._run(
            f"postOrder({buyer}, units={units}, replicas={replicas}, price={price}, fee={fee})",
            actor,
            "market",
            "postOrder",
            [b"\x11" * 32, units, replicas, price, fee, deadline],
            lambda: self.model.post_order(actor.address, units, replicas, price, fee, deadline, now),
        )

    @rule(
        buyer=st.sampled_from(BUYERS),
        units=st.sampled_from([1, 2, 3]),
        bounds=st.sampled_from([(1, 3), (1, 3), (1, 2), (2, 3), (0, 2), (3, 2)]),
        streak=st.sampled_from([0, 1, 1, 2, 3]),
        price=st.sampled_from([1, 7, 100]),
        fee=st.sampled_from([0, 1, 50]),
    )
    def post_adaptive_order(
        self, buyer: str, units: int, bounds: tuple[int, int], streak: int, price: int, fee: int
    ) -> None:
        """An adaptive order (minReplicas..replicas a unit, fewer than the most only for providers with the
        streak); assign's draw of fewer providers then exercises reduced units and ProviderNotTrusted."""
        self.do_post_adaptive_order(buyer, units, bounds, streak, price, fee)

    def do_post_adaptive_order(
        self, buyer: str, units: int, bounds: tuple[int, int], streak: int, price: int, fee: int
    ) -> None:
        actor = self.actors[buyer]
        now = self._now()
        low, high = bounds
        self._run(
            f"postAdaptiveOrder({buyer}, units={units}, {low}..{high}, streak={streak}, price={price})",
            actor,
            "market",
            "postAdaptiveOrder",
            [b"\x12" * 32, units, low, high, streak, price, fee, now + 3_000],
            lambda: self.model.post_adaptive_order(
                actor.address, units, low, high, streak, price, fee, now + 3_000, now
            ),
        )

    @precondition(lambda self: bool(self.model.orders))
    @rule(data=st.data())
    def assign(self, data: st.DataObject) -> None:
        """Mostly a valid proposal (open order, providers with free collateral first), sometimes not."""
        open_orders = [o for o, order in self.model.orders.items() if not order.closed]
        pool = open_orders if open_orders and _mostly(data, 4, "prefer open") else self.model.orders
        order_id = data.draw(st.sampled_from(sorted(pool)), label="order")
        order = self.model.orders[order_id]
        reduced = list(range(order.min_replicas, order.replicas)) * 3  # an adaptive order's smaller units
        count = data.draw(st.sampled_from([order.replicas] * 6 + reduced + [1, 2]), label="replicas")
        shuffled = data.draw(st.permutations(PROVIDERS), label="providers")
        if _mostly(data, 4, "prefer eligible"):
            shuffled = sorted(shuffled, key=lambda label: -self._free_stake(label))
        providers = shuffled[:count]
        verifiers = data.draw(st.sampled_from([VERIFIERS] * 6 + [VERIFIERS[:1]]), label="verifiers")
        stale_nonce = data.draw(st.sampled_from([False] * 9 + [True]), label="stale nonce")
        self.do_assign(order_id, list(providers), list(verifiers), stale_nonce)

    def _sign_accepts(
        self, order_id: int, unit_key: bytes, labels: Sequence[str], deadline: int, stale_nonce: bool
    ) -> tuple[list[tuple[int, int, bytes]], list[int]]:
        """Each labelled provider's `Accept` of `unit_key` (a unit's key or a roster's) and its nonce:
        unordered nonces spread over several bitmap words (37 apart); a stale one reuses the last."""
        accepts, nonces = [], []
        for label in labels:
            address = self.address_of[label]
            drawn = self.accept_draws.get(address, 0)
            if stale_nonce and drawn:
                nonce = (drawn - 1) * 37
            else:
                nonce = drawn * 37
                self.accept_draws[address] = drawn + 1
            message = {
                "orderId": order_id,
                "unitKey": unit_key,
                "provider": address,
                "nonce": nonce,
                "deadline": deadline,
            }
            accepts.append((nonce, deadline, self.chain.sign_market(self.actors[label], "Accept", message)))
            nonces.append(nonce)
        return accepts, nonces

    def do_assign(
        self, order_id: int, providers: list[str], verifiers: list[str], stale_nonce: bool = False
    ) -> None:
        now = self._now()
        deadline = now + SIG_LIFETIME
        unit_key = keccak(text=f"unit-{len(self.model.units)}-{now}")
        provider_addresses = [self.address_of[p] for p in providers]
        verifier_addresses = [self.address_of[v] for v in verifiers]
        accepts, nonces = self._sign_accepts(order_id, unit_key, providers, deadline, stale_nonce)
        units_before = len(self.model.units)
        outcome = self._run(
            f"assign(order {order_id}, {providers}, {verifiers}, stale={stale_nonce})",
            self.actors["operator"],
            "market",
            "assign",
            [order_id, unit_key, provider_addresses, verifier_addresses, accepts],
            lambda: self.model.assign(order_id, provider_addresses, verifier_addresses, nonces, now),
        )
        if outcome.error is None and len(self.model.units) > units_before:
            unit_id = len(self.model.units)
            self.secrets[unit_id] = UnitSecrets()
            if len(providers) < self.model.orders[order_id].replicas:  # an adaptive order's smaller unit
                self.call_stats.setdefault("assign (reduced unit)", [0, 0])[0] += 1

    @precondition(lambda self: bool(self.model.orders))
    @rule(data=st.data(), by_buyer=st.sampled_from([False, False, False, True]))
    def close_order(self, data: st.DataObject, by_buyer: bool) -> None:
        """Mostly an open order with no open unit, sometimes any (open units, closed, not yet closable)."""
        idle = [o for o, order in self.model.orders.items() if not order.closed and not order.open_units]
        pool = idle if idle and _mostly(data, 2, "prefer idle") else sorted(self.model.orders)
        self.do_close_order(data.draw(st.sampled_from(pool), label="order"), by_buyer)

    def do_close_order(self, order_id: int, by_buyer: bool = True) -> None:
        order = self.model.orders[order_id]
        caller = self.actors[self.label_of[order.buyer]] if by_buyer else self.actors["operator"]
        now = self._now()
        before = self._escrow()
        outcome = self._run(
            f"closeOrder({order_id}, by_buyer={by_buyer})",
            caller,
            "market",
            "closeOrder",
            [order_id],
            lambda: self.model.close_order(order_id, caller.address, now),
        )
        if outcome.error is None:
            self._add(self.ghosts.escrow_out, order_id, before - self._escrow())

    # ------------------------------------------------------------------------------------------
    # Rules: commit and reveal
    # ------------------------------------------------------------------------------------------

    def _open_units(self) -> list[int]:
        return [u for u, unit in self.model.units.items() if unit.state not in SETTLED_STATES]

    def _draw_unit(self, data: st.DataObject, ready: Callable[[Unit], bool] | None = None) -> int:
        """Mostly an open unit where the action can succeed (`ready`), sometimes any unit (to hit the
        early, late and already-settled errors)."""
        candidates = [
            unit_id for unit_id in self._open_units() if ready is None or ready(self.model.units[unit_id])
        ]
        pool = candidates if candidates and _mostly(data, 4, "prefer ready") else sorted(self.model.units)
        return data.draw(st.sampled_from(pool), label="unit")

    def _honest(self, unit_id: int) -> bytes:
        """The digest an honest replica of the unit reveals (a set-aside round unit's: its round's)."""
        return self.honest.get(unit_id) or keccak(text=f"honest-{unit_id}")

    def _verdict_deadline(self, unit: Unit) -> int:
        return unit.reveal_deadline + self.chain.params.verdict_window

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data(), deviant=st.sampled_from([False, False, False, True]), signed=st.booleans())
    def commit(self, data: st.DataObject, deviant: bool, signed: bool) -> None:
        """Mostly a replica that still has to commit, sometimes any (provider, unit) pair."""
        pending = [
            (unit_id, self.label_of[r.provider])
            for unit_id, unit in self.model.units.items()
            if unit.state == UnitState.COMMITTING
            for r in unit.replicas
            if r.commitment is None
        ]
        if pending and _mostly(data, 5, "prefer pending"):
            unit_id, provider = data.draw(st.sampled_from(pending), label="replica")
        else:
            unit_id = data.draw(st.sampled_from(sorted(self.model.units)), label="unit")
            provider = data.draw(st.sampled_from(PROVIDERS), label="provider")
        self.do_commit(unit_id, provider, deviant, signed)

    def do_commit(self, unit_id: int, provider: str, deviant: bool = False, signed: bool = False) -> None:
        actor = self.actors[provider]
        unit = self.model.units[unit_id]
        index = unit.index_of(actor.address)
        tag = f"{unit_id}-{index}"
        digest = keccak(text=f"deviant-{tag}" if deviant else f"honest-{unit_id}")
        salt = keccak(text=f"salt-{tag}")
        commitment = eip712.commitment(digest, salt, actor.address, unit_id)
        now = self._now()
        if signed:
            nonce = self.model.jm_nonces.get(actor.address, 0)
            deadline = now + SIG_LIFETIME
            message = {
                "unitId": unit_id,
                "provider": actor.address,
                "commitment": commitment,
                "nonce": nonce,
                "deadline": deadline,
            }
            signature = self.chain.sign_market(actor, "Commit", message)
            outcome = self._run(
                f"commitWithSig(unit {unit_id}, {provider})",
                self.actors["operator"],
                "market",
                "commitWithSig",
                [unit_id, actor.address, commitment, nonce, deadline, signature],
                lambda: self.model.commit(unit_id, actor.address, commitment, nonce, now),
            )
        else:
            outcome = self._run(
                f"commit(unit {unit_id}, {provider})",
                actor,
                "market",
                "commit",
                [unit_id, commitment],
                lambda: self.model.commit(unit_id, actor.address, commitment, None, now),
            )
        if outcome.error is None and index is not None:
            self.secrets[unit_id].digests[index] = digest
            self.secrets[unit_id].salts[index] = salt

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data(), wrong_salt=st.sampled_from([False] * 7 + [True]))
    def reveal(self, data: st.DataObject, wrong_salt: bool) -> None:
        """Mostly a committed replica that has not revealed yet, sometimes any replica."""
        pending = [
            (unit_id, index)
            for unit_id, unit in self.model.units.items()
            if unit.state not in SETTLED_STATES
            for index, r in enumerate(unit.replicas)
            if r.commitment is not None and r.digest is None
        ]
        if pending and _mostly(data, 5, "prefer pending"):
            unit_id, index = data.draw(st.sampled_from(pending), label="replica")
        else:
            unit_id = data.draw(st.sampled_from(sorted(self.model.units)), label="unit")
            index = data.draw(st.integers(0, len(self.model.units[unit_id].replicas) - 1), label="replica")
        self.do_reveal(unit_id, index, wrong_salt)

    def do_reveal(self, unit_id: int, index: int, wrong_salt: bool = False) -> None:
        unit = self.model.units[unit_id]
        provider = unit.replicas[index].provider
        secrets = self.secrets[unit_id]
        digest = secrets.digests.get(index, self._honest(unit_id))
        salt = secrets.salts.get(index, b"\x00" * 32)
        if wrong_salt:
            salt = keccak(salt)
        stored = unit.replicas[index].commitment
        matches = stored is not None and eip712.commitment(digest, salt, provider, unit_id) == stored
        now = self._now()
        self._run(
            f"reveal(unit {unit_id}, replica {index}, wrong_salt={wrong_salt})",
            self.actors["operator"],
            "market",
            "reveal",
            [unit_id, provider, digest, salt],
            lambda: self.model.reveal(unit_id, provider, digest, matches, now),
        )

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data())
    def request_verification(self, data: st.DataObject) -> None:
        """Mostly on a settled unit (must revert): the progress rule already draws open units for spot
        checks, and drawing most open units here would starve the finalize fast path."""
        settled = [u for u, unit in self.model.units.items() if unit.state in SETTLED_STATES]
        pool = settled if settled and _mostly(data, 3, "prefer settled") else sorted(self.model.units)
        self.do_request_verification(data.draw(st.sampled_from(pool), label="unit"))

    def do_request_verification(self, unit_id: int) -> None:
        self._run(
            f"requestVerification(unit {unit_id})",
            self.actors["operator"],
            "market",
            "requestVerification",
            [unit_id],
            lambda: self.model.request_verification(unit_id),
        )

    # ------------------------------------------------------------------------------------------
    # Rules: settlement
    # ------------------------------------------------------------------------------------------

    def _settle(
        self,
        what: str,
        unit_id: int,
        sender: Actor,
        fn: str,
        args: Sequence[Any],
        model_action: Callable[[], Expected | None],
        slashes: dict[str, int] | None = None,
        contract: str = "market",
    ) -> TxOutcome:
        """Run a settlement (of a unit, or of its held replicas through VerdictAppeals) and record what it
        did to escrow, settlement counts and stake (ghosts)."""
        unit = self.model.units.get(unit_id)
        order_id = unit.order_id if unit is not None else 0
        escrow_before = self._escrow()
        sm_before = self._sm_balance()
        pre = {account: self.storage.stake_of(account) for account in slashes or {}}
        rostered = [r.provider for r in unit.replicas] if unit is not None and unit.rostered else []
        if fn == "slashRoundAudit":  # pays no slot: its bounty goes to the caller, maybe a roster provider
            rostered = [p for p in rostered if p != sender.address]
        credits = {provider: self._earned(provider) for provider in rostered}
        outcome = self._run(what, sender, contract, fn, args, model_action)
        if outcome.receipt is not None:
            self._count_slot_pay(order_id, credits)
            topics = [_raw(log["topics"][0]) for log in outcome.receipt["logs"]]
            self._add(self.ghosts.settlements, unit_id, sum(1 for t in topics if t in SETTLEMENT_EVENTS))
            self._add(self.ghosts.held_settlements, unit_id, topics.count(HELD_SETTLED))
            self._add(self.ghosts.escrow_out, order_id, escrow_before - self._escrow())
            self._check_slashes(outcome.receipt, pre, slashes or {}, sm_before)
            for account, amount in _slash_events(outcome.receipt).items():
                self._add(self.ghosts.unit_slashes, (unit_id, account), amount)
        return outcome

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data())
    def finalize(self, data: st.DataObject) -> None:
        """Mostly by the operator (the fast path); else by one of the unit's providers, which the chain
        refuses until the verdict deadline."""
        unit_id = self._draw_unit(data, lambda unit: unit.finalizable)
        self.do_finalize(unit_id, by_operator=_mostly(data, 3, "finalize by the operator"))

    def do_finalize(self, unit_id: int, by_operator: bool = True) -> None:
        unit = self.model.units.get(unit_id)
        by_provider = not by_operator and unit is not None
        sender = self.actors[self.label_of[unit.replicas[0].provider] if by_provider else "operator"]
        now = self._now()
        self._settle(
            f"finalize(unit {unit_id}, by {'a provider' if by_provider else 'the operator'})",
            unit_id,
            sender,
            "finalize",
            [unit_id],
            lambda: self.model.finalize(unit_id, not by_provider, now),
        )

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data())
    def submit_verdict(self, data: st.DataObject) -> None:
        unit_id = self._draw_unit(
            data,
            lambda unit: (
                (unit.all_revealed or self._now() > unit.reveal_deadline)
                and self._now() <= self._verdict_deadline(unit)
            ),
        )
        unit = self.model.units[unit_id]
        outcomes = []
        for replica in unit.replicas:
            choices = [0, 1, 2] if replica.digest is not None else [1, 1, 1, 1, 0]
            outcomes.append(data.draw(st.sampled_from(choices), label="outcome"))
        signer_sets = [list(VERIFIERS), list(VERIFIERS), list(VERIFIERS[:1]), [VERIFIERS[1], VERIFIERS[1]]]
        signers = data.draw(st.sampled_from(signer_sets), label="signers")
        self.do_submit_verdict(unit_id, outcomes, signers)

    def _sign_verdict(self, label: str, unit_id: int, outcomes: list[int]) -> tuple[str, int, bytes]:
        """An outcome-only, nonce-free `Verdict` signature as the contract's `VerifierSignature`."""
        deadline = self._now() + SIG_LIFETIME
        message = {"unitId": unit_id, "outcomesHash": eip712.outcomes_hash(outcomes), "deadline": deadline}
        return (
            self.address_of[label],
            deadline,
            self.chain.sign_market(self.actors[label], "Verdict", message),
        )

    def do_submit_verdict(self, unit_id: int, outcomes: list[int], signers: list[str]) -> None:
        unit = self.model.units[unit_id]
        now = self._now()
        signatures = [self._sign_verdict(label, unit_id, outcomes) for label in signers]
        withholders = self._withholders(unit)
        accused = [r.provider for r, o in zip(unit.replicas, outcomes, strict=False) if o == FRAUD]
        signer_addresses = [self.address_of[label] for label in signers]
        watched = [*accused, *signer_addresses]
        before = {a: (self.storage.stake_of(a)[1], self.storage.account(a)[0]) for a in watched}
        outcome = self._settle(
            f"submitVerdict(unit {unit_id}, {outcomes}, {signers})",
            unit_id,
            self.actors["operator"],
            "submitVerdict",
            [unit_id, outcomes, signatures],
            lambda: self.model.submit_verdict(unit_id, outcomes, signer_addresses, now),
            slashes=withholders,
        )
        if outcome.receipt is not None:
            self._check_truth_before_money(unit, outcome.receipt, accused, signer_addresses, before)

    def _check_truth_before_money(
        self,
        unit: Unit,
        receipt: Any,
        accused: list[str],
        signers: list[str],
        before: dict[str, tuple[int, int]],
    ) -> None:
        """truth_before_money, at a verdict: the replicas it calls fraud lose no stake and keep their
        collateral locked, and its signers are credited only the fee and the withhold penalties' bounty."""
        taken = _slash_events(receipt)
        for provider in accused:
            label = self.label_of.get(provider, provider)
            if taken.get(provider.lower(), 0):
                self._fail(
                    "truth_before_money",
                    f"unit {unit.unit_id}: {label} slashed {taken[provider.lower()]} at the verdict that "
                    "calls it fraud, before the unit's truth is fixed",
                )
            locked = self.storage.stake_of(provider)[1]
            if locked != before[provider][0]:
                self._fail(
                    "truth_before_money",
                    f"unit {unit.unit_id}: {label}'s locked stake went {before[provider][0]} -> {locked} at "
                    "the verdict that holds its collateral",
                )
        penalties = sum(taken.get(p.lower(), 0) for p in self._withholders(unit))
        order = self.model.orders[unit.order_id]
        share = (order.fee + penalties * self.chain.params.bounty_bps // 10_000) // len(signers)
        for signer in signers:
            gained = self.storage.account(signer)[0] - before[signer][1]
            if gained != share:
                self._fail(
                    "truth_before_money",
                    f"unit {unit.unit_id}: signer {self.label_of.get(signer, signer)} credited {gained} at "
                    f"the verdict; the fee and withhold bounty share is {share}",
                )

    @precondition(lambda self: bool(self.model.units))
    @rule(data=st.data())
    def expire_unit(self, data: st.DataObject) -> None:
        self.do_expire(self._draw_unit(data, lambda unit: self._now() > self._verdict_deadline(unit)))

    def do_expire(self, unit_id: int) -> None:
        now = self._now()
        self._settle(
            f"expireUnit(unit {unit_id})",
            unit_id,
            self.actors["operator"],
            "expireUnit",
            [unit_id],
            lambda: self.model.expire(unit_id, now),
            slashes=self._withholders(self.model.units.get(unit_id)),
        )

    def _withholders(self, unit: Unit | None) -> dict[str, int]:
        """The withhold penalty each replica that committed but never revealed loses when `unit` settles."""
        if unit is None:
            return {}
        penalty = self.chain.params.withhold_penalty
        return {r.provider: penalty for r in unit.replicas if r.commitment is not None and r.digest is None}

    # ------------------------------------------------------------------------------------------
    # Rules: appeals and held fraud (VerdictAppeals)
    # ------------------------------------------------------------------------------------------

    def _verdicted(self) -> list[int]:
        return [u for u, unit in self.model.units.items() if unit.state == UnitState.VERDICTED]

    def _pending_appeals(self) -> list[int]:
        return [u for u, a in self.model.appeals.items() if a.state == AppealState.PENDING]

    def _truth(self, unit: Unit) -> list[int]:
        """What re-executing the unit shows: honest replicas accept, deviant ones fraud, silent ones fault."""
        honest = self._honest(unit.unit_id)
        return [FAULT if r.digest is None else ACCEPT if r.digest == honest else FRAUD for r in unit.replicas]

    def _other_outcomes(self, data: st.DataObject, unit: Unit) -> list[int]:
        """Any outcome vector the contracts accept for `unit` (sometimes one they refuse)."""
        return [
            data.draw(st.sampled_from([0, 1, 2] if r.digest is not None else [1, 1, 1, 0]), label="outcome")
            for r in unit.replicas
        ]

    @precondition(lambda self: bool(self._verdicted()))
    @rule(data=st.data())
    def appeals(self, data: st.DataObject) -> None:
        """One VerdictAppeals action, mostly where it can succeed (one rule for all six, so they do not
        crowd out the other rules; the progress rules drive the usual appeal life cycle)."""
        actions = ["appeal", "settle_verdict"]
        if self.model.appeals:
            actions += ["draw_panel", "vote", "resolve", "lapse"]
        getattr(self, f"_any_{data.draw(st.sampled_from(actions), label='action')}")(data)

    def _any_appeal(self, data: st.DataObject) -> None:
        """Mostly a verdict still in its appeal window, by one of the unit's parties; sometimes any."""
        now = self._now()
        open_ = [
            u
            for u in self._verdicted()
            if u not in self.model.appeals and now <= self.model.appeal_closes(self.model.units[u])
        ]
        pool = open_ if open_ and _mostly(data, 4, "prefer appealable") else sorted(self.model.units)
        unit_id = data.draw(st.sampled_from(pool), label="unit")
        unit = self.model.units[unit_id]
        parties = [self.label_of[r.provider] for r in unit.replicas] + [
            self.label_of[v] for v in unit.verifiers
        ]
        appellant = data.draw(st.sampled_from(parties if _mostly(data, 4, "a party") else STAKERS))
        self.do_appeal(unit_id, appellant)

    def do_appeal(self, unit_id: int, appellant: str) -> None:
        actor = self.actors[appellant]
        now = self._now()
        self._run(
            f"appeal(unit {unit_id}, by {appellant})",
            actor,
            "appeals",
            "appeal",
            [unit_id],
            lambda: self.model.appeal(unit_id, actor.address, now),
        )
        self._compare_appeal(unit_id)

    def _any_draw_panel(self, data: st.DataObject) -> None:
        pending = [u for u in self._pending_appeals() if not self.model.appeals[u].panel]
        pool = pending if pending and _mostly(data, 4, "prefer undrawn") else sorted(self.model.appeals)
        self.do_draw_panel(data.draw(st.sampled_from(pool), label="unit"))

    def do_draw_panel(self, unit_id: int) -> None:
        now = self._now()
        self._run(
            f"drawPanel(unit {unit_id})",
            self.actors["operator"],
            "appeals",
            "drawPanel",
            [unit_id],
            lambda: self.model.draw_panel(unit_id, now),
        )
        self._compare_appeal(unit_id)

    def _any_vote(self, data: st.DataObject) -> None:
        """Mostly the referee's honest vote on a drawn panel; sometimes the verdict, any vector, or an
        outsider's vote."""
        drawn = [u for u in self._pending_appeals() if self.model.appeals[u].panel]
        pool = drawn if drawn and _mostly(data, 4, "prefer drawn") else sorted(self.model.appeals)
        unit_id = data.draw(st.sampled_from(pool), label="unit")
        unit = self.model.units[unit_id]
        choice = data.draw(st.sampled_from(["truth"] * 4 + ["verdict", "any"]), label="vote")
        if choice == "truth":
            outcomes = self._truth(unit)
        elif choice == "verdict" and unit.verdict is not None:
            outcomes = list(unit.verdict)
        else:
            outcomes = self._other_outcomes(data, unit)
        if not _mostly(data, 6, "the referee"):
            referee = data.draw(st.sampled_from(STAKERS))
        elif len(self.referees) > 1:
            referee = data.draw(st.sampled_from(self.referees), label="referee")
        else:
            referee = REFEREE
        self.do_vote(unit_id, outcomes, referee)

    def _dissent(self, unit: Unit, truth: list[int], verdict: list[int]) -> list[int]:
        """What a referee of a larger panel votes when not the truth: the verdict when it is wrong, else the
        truth with its first revealed replica's outcome flipped (accept <-> fraud)."""
        if verdict and verdict != truth:
            return verdict
        flipped = list(truth)
        revealed = next((i for i, r in enumerate(unit.replicas) if r.digest is not None), None)
        if revealed is not None:
            flipped[revealed] = FRAUD if truth[revealed] == ACCEPT else ACCEPT
        return flipped

    def _cast_votes(self, unit_id: int, data: st.DataObject, odds: int, until_decided: bool) -> None:
        """The votes of the panel's referees that have not voted, in label order (the block hash orders their
        seats): on a panel of one the truth at `odds` to 1, else the verdict; on a larger one the truth but
        from the appeal's dissenter (drawn once: referee0, referee1 or none), whose vote is a dissent; one
        vote, or votes until the appeal is decided. So on a panel of three a dissent comes first, between
        the majority's two votes, or not at all."""
        unit, appeal = self.model.units[unit_id], self.model.appeals[unit_id]
        verdict, truth = list(unit.verdict or ()), self._truth(unit)
        dissent = verdict if len(self.referees) == 1 else self._dissent(unit, truth, verdict)
        for label in self.referees:
            address = self.address_of[label]
            if appeal.decided is not None or appeal.state != AppealState.PENDING:
                return
            if address in appeal.panel and appeal.votes[appeal.panel.index(address)] is not None:
                continue
            if len(self.referees) == 1:
                honest = _mostly(data, odds, "honest vote")
            else:
                if unit_id not in self.dissenter:  # drawn once per appeal; the ends favoured: dissents
                    self.dissenter[unit_id] = data.draw(st.sampled_from([0, None, 1]), label="dissenter")
                honest = self.referees.index(label) != self.dissenter[unit_id]
            self.do_vote(unit_id, truth if honest else dissent, label)
            if not until_decided:
                return

    def do_vote(self, unit_id: int, outcomes: list[int], referee: str) -> None:
        actor = self.actors[referee]
        now = self._now()
        deadline = now + SIG_LIFETIME
        message = {"unitId": unit_id, "outcomesHash": eip712.outcomes_hash(outcomes), "deadline": deadline}
        signature = self.chain.sign_appeals(actor, "RefereeVote", message)
        appeal = self.model.appeals.get(unit_id)
        undecided = appeal is not None and appeal.decided is None
        outcome = self._run(
            f"vote(unit {unit_id}, {outcomes}, {referee})",
            self.actors["operator"],
            "appeals",
            "vote",
            [unit_id, outcomes, (actor.address, deadline, signature)],
            lambda: self.model.vote(unit_id, outcomes, actor.address, now),
        )
        if outcome.receipt is not None:
            order = self.vote_order.setdefault(unit_id, [])
            order.append(eip712.outcomes_hash(outcomes))
            if undecided and appeal is not None and appeal.decided is not None:  # this vote decided it
                dissents = [i for i, voted in enumerate(order) if voted != order[-1]]
                if dissents:
                    where = "first" if dissents[0] == 0 else "between the majority's votes"
                    self.call_stats.setdefault(f"vote (decided over a dissent cast {where})", [0, 0])[0] += 1
        self._compare_appeal(unit_id)

    def _any_resolve(self, data: st.DataObject) -> None:
        """Mostly a decided appeal with the right vectors; sometimes undecided, settled or wrong vectors."""
        decided = [u for u in self._pending_appeals() if self.model.appeals[u].decided is not None]
        pool = decided if decided and _mostly(data, 4, "prefer decided") else sorted(self.model.appeals)
        unit_id = data.draw(st.sampled_from(pool), label="unit")
        unit, appeal = self.model.units[unit_id], self.model.appeals[unit_id]
        verdict = list(unit.verdict or ())
        decision = list(appeal.decided) if appeal.decided is not None else self._truth(unit)
        if not _mostly(data, 9, "right vectors"):
            verdict, decision = decision, verdict  # a mismatch unless the panel confirmed
        self.do_resolve(unit_id, verdict, decision)

    def do_resolve(self, unit_id: int, verdict: list[int], decided: list[int]) -> None:
        unit, appeal = self.model.units[unit_id], self.model.appeals[unit_id]
        slashes: dict[str, int] = {}
        if appeal.state == AppealState.PENDING and appeal.decided == tuple(decided):
            slash = self.chain.params.slash_amount
            for index, replica in enumerate(unit.replicas):
                held = unit.held >> index & 1
                if decided[index] == FRAUD and (held or verdict[index] != FRAUD):
                    self._add(slashes, replica.provider, slash)
            if tuple(decided) == unit.verdict:
                self._add(slashes, appeal.appellant, self.chain.appeal_params.appeal_bond)
        self._settle_held_by(
            f"resolve(unit {unit_id}, verdict {verdict}, decided {decided})",
            unit_id,
            "resolve",
            [unit_id, verdict, decided],
            lambda: self.model.resolve(unit_id, verdict, decided),
            decided,
            slashes,
            appeal.appellant,
        )

    def _any_lapse(self, data: st.DataObject) -> None:
        now = self._now()
        lapsable = [
            u
            for u in self._pending_appeals()
            if self.model.appeals[u].decided is None and now > self.model.appeals[u].vote_deadline
        ]
        pool = lapsable if lapsable and _mostly(data, 3, "prefer lapsable") else sorted(self.model.appeals)
        self.do_lapse(data.draw(st.sampled_from(pool), label="unit"))

    def do_lapse(self, unit_id: int) -> None:
        now = self._now()
        self._run(
            f"lapse(unit {unit_id})",
            self.actors["operator"],
            "appeals",
            "lapse",
            [unit_id],
            lambda: self.model.lapse(unit_id, now),
        )
        self._compare_appeal(unit_id)

    def _any_settle_verdict(self, data: st.DataObject) -> None:
        """Mostly a verdict with held fraud; sometimes any unit (early, appealed, settled, wrong vector)."""
        held = [u for u in self._verdicted() if self.model.units[u].held]
        pool = held if held and _mostly(data, 4, "prefer held") else sorted(self.model.units)
        unit_id = data.draw(st.sampled_from(pool), label="unit")
        unit = self.model.units[unit_id]
        verdict = (
            list(unit.verdict) if unit.verdict and _mostly(data, 9, "the verdict") else self._truth(unit)
        )
        self.do_settle_verdict(unit_id, verdict)

    def do_settle_verdict(self, unit_id: int, verdict: list[int]) -> None:
        unit = self.model.units[unit_id]
        slash = self.chain.params.slash_amount
        slashes = {unit.replicas[i].provider: slash for i in bits(unit.held)}
        now = self._now()
        self._settle_held_by(
            f"settleVerdict(unit {unit_id}, {verdict})",
            unit_id,
            "settleVerdict",
            [unit_id, verdict],
            lambda: self.model.settle_verdict(unit_id, verdict, now),
            verdict,
            slashes,
            None,
        )

    def _settle_held_by(
        self,
        what: str,
        unit_id: int,
        fn: str,
        args: Sequence[Any],
        model_action: Callable[[], Expected | None],
        truth: list[int],
        slashes: dict[str, int],
        appellant: str | None,
    ) -> None:
        """A VerdictAppeals call that may settle the unit's held replicas by `truth`; checks
        framed_made_whole for each one the truth accepts."""
        unit = self.model.units.get(unit_id)
        held = self.storage.held(unit_id) & 0xFF if unit is not None else 0
        providers = [unit.replicas[i].provider for i in bits(held)] if unit is not None else []
        before = {p: (self.storage.stake_of(p)[1], *self.storage.account(p)) for p in providers}
        outcome = self._settle(
            what, unit_id, self.actors["operator"], fn, args, model_action, slashes, contract="appeals"
        )
        if outcome.receipt is not None and unit is not None:
            self._compare_appeal(unit_id)
            settled = self.storage.held(unit_id) == 0 and held != 0
            if settled:
                stands = "stands" if tuple(truth) == unit.verdict else "overturned"
                self.call_stats.setdefault(f"settleHeld ({stands})", [0, 0])[0] += 1
            for index in bits(held):
                if settled and index < len(truth) and truth[index] == ACCEPT:
                    provider = unit.replicas[index].provider
                    bond = self.chain.appeal_params.appeal_bond if appellant == provider else 0
                    self._check_framed_made_whole(unit, provider, before[provider], bond)

    def _check_framed_made_whole(self, unit: Unit, provider: str, before: tuple[int, ...], bond: int) -> None:
        """framed_made_whole: the truth accepted a replica the verdict called fraud: the provider lost no
        stake to this unit (at the verdict or now), is paid the price, the fraud counted at the accusation
        is taken back, and its collateral (and the bond of its own appeal) came back. `before`: its locked
        stake, then its JobMarket account (credit, valid, fault, fraud, streak), just before."""
        self.call_stats.setdefault("settleHeld (framed paid)", [0, 0])[0] += 1
        label = self.label_of.get(provider, provider)
        lost = self.ghosts.unit_slashes.get((unit.unit_id, provider.lower()), 0)
        if lost:
            self._fail(
                "framed_made_whole", f"unit {unit.unit_id}: {label}, accepted by the truth, lost {lost}"
            )
        price = self.model.orders[unit.order_id].price
        credit, valid, _, fraud, _ = self.storage.account(provider)
        paid = credit - before[1]
        if (valid, fraud) != (before[2] + 1, before[4] - 1):
            self._fail(
                "framed_made_whole",
                f"unit {unit.unit_id}: {label}, accepted by the truth, has valid/fraud {(valid, fraud)}, "
                f"had {(before[2], before[4])}: the accusation must be taken back and the unit counted valid",
            )
        if paid != price:
            self._fail(
                "framed_made_whole",
                f"unit {unit.unit_id}: {label}, accepted by the truth, was credited {paid}, "
                f"not its price {price}",
            )
        locked = self.storage.stake_of(provider)[1]
        released = 0 if unit.rostered else self.chain.params.provider_collateral  # else the roster's
        want = max(0, before[0] - released - bond)
        if locked != want:
            self._fail(
                "framed_made_whole",
                f"unit {unit.unit_id}: {label}, accepted by the truth, has {locked} locked, "
                f"should have {want}",
            )

    def _compare_appeal(self, unit_id: int) -> None:
        """The appeal's state, appellant, panel and decision on VerdictAppeals against the model."""
        model = self.model.appeals.get(unit_id)
        got = self.chain.view_struct(self.chain.appeals, "getAppeal", unit_id)
        if model is None:
            want: tuple[Any, ...] = (AppealState.NONE, "0x" + "00" * 20, [], b"\x00" * 32)
        else:
            decided = b"\x00" * 32 if model.decided is None else eip712.outcomes_hash(model.decided)
            want = (model.state, model.appellant.lower(), [p.lower() for p in model.panel], decided)
        have = (
            got["state"],
            got["appellant"].lower(),
            [p.lower() for p in got["panel"]],
            bytes(got["decided"]),
        )
        if have != want:
            self._fail("model_agreement", f"appeal of unit {unit_id}: {have}, model {want}")
        self._check_panel_majority(unit_id, got)

    def _check_panel_majority(self, unit_id: int, got: dict[str, Any]) -> None:
        """panel_majority: from the chain's own record of the appeal, its decision is the outcome vector a
        majority of the panel's seats voted, and none while no vector has a majority."""
        seats = len(got["panel"])
        if not seats:
            return
        cast = [bytes(v) for v in got["votes"] if bytes(v) != b"\x00" * 32]
        majority = next((v for v in cast if cast.count(v) > seats // 2), b"\x00" * 32)
        decided = bytes(got["decided"])
        if decided != majority:
            tally = {v.hex()[:8]: cast.count(v) for v in cast}
            self._fail(
                "panel_majority",
                f"appeal of unit {unit_id}: a panel of {seats} voted {tally}, decided "
                f"{decided.hex()[:8] if any(decided) else 'nothing'}, its majority "
                f"{majority.hex()[:8] if any(majority) else 'none'}",
            )

    # ------------------------------------------------------------------------------------------
    # Rules: credits and time
    # ------------------------------------------------------------------------------------------

    @rule(data=st.data(), signed=st.booleans())
    def withdraw_credit(self, data: st.DataObject, signed: bool) -> None:
        """Mostly an account that has credit, sometimes any (a second withdrawal must revert)."""
        with_credit = [label for label in FUNDED if self.model.credits.get(self.address_of[label], 0)]
        pool = with_credit if with_credit and _mostly(data, 3, "prefer credit") else CREDIT_HOLDERS
        self.do_withdraw_credit(data.draw(st.sampled_from(pool), label="account"), signed)

    def do_withdraw_credit(self, account: str, signed: bool = False) -> None:
        actor = self.actors[account]
        if not signed:
            self._run(
                f"withdrawCredit({account})",
                actor,
                "market",
                "withdrawCredit",
                [],
                lambda: self.model.withdraw_credit(actor.address),
            )
            return
        nonce = self.model.jm_nonces.get(actor.address, 0)
        deadline = self._sig_deadline()
        message = {"account": actor.address, "nonce": nonce, "deadline": deadline}
        signature = self.chain.sign_market(actor, "WithdrawCredit", message)

        def model_action() -> Expected | None:
            expected = self.model.withdraw_credit(actor.address)
            if expected is None:
                self.model.jm_nonces[actor.address] = nonce + 1
            return expected

        self._run(
            f"withdrawCreditWithSig({account})",
            self.actors["operator"],
            "market",
            "withdrawCreditWithSig",
            [actor.address, nonce, deadline, signature],
            model_action,
        )

    @rule(seconds=st.sampled_from([1, 30, 99, 100, 101, 250, 501, 1_000]))
    def advance_time(self, seconds: int) -> None:
        self.chain.advance(seconds)

    # ------------------------------------------------------------------------------------------
    # Progress: drive one unit through its next phase (weighted by five identical rules)
    # ------------------------------------------------------------------------------------------

    def _progress(self, data: st.DataObject) -> None:
        """The natural next phase of an open unit, or a new assignment.

        Random single actions rarely line up into a whole unit life cycle, so this rule moves one unit
        a whole phase per step: all pending commits, then all reveals, then finalize, a verdict or
        expiry, then for a verdict that holds fraud its appeal or its settlement, waiting out deadlines
        when nothing else can happen. The per-action rules still explore the wrong orders and bad inputs.
        """
        open_units = self._open_units()
        unsettled = [  # a held unit (to appeal, or to settle once its hold ended), a pending appeal
            u
            for u in self._verdicted()
            if self.model.units[u].held or self.model.appeal_state(u) == AppealState.PENDING
        ]
        if not (open_units or unsettled) or not _mostly(data, 3, "continue a unit"):
            self._progress_assign(data)
            return
        unit_id = data.draw(st.sampled_from(open_units + unsettled), label="unit")
        if unit_id in unsettled:
            self._progress_truth(unit_id, data)
            return
        self._progress_unit(unit_id, data)

    def _progress_unit(self, unit_id: int, data: st.DataObject) -> None:
        """An open unit's next phase: its commits, its reveals, or its settlement (expiry when late)."""
        unit = self.model.units[unit_id]
        now = self._now()
        verdict_deadline = unit.reveal_deadline + self.chain.params.verdict_window
        if now > verdict_deadline:
            self.do_expire(unit_id)
        elif unit.state == UnitState.COMMITTING and now <= unit.commit_deadline:
            for index, replica in enumerate(unit.replicas):
                if replica.commitment is None and _mostly(data, 9, f"commit {index}"):
                    deviant = not _mostly(data, 7, "honest")
                    self.do_commit(
                        unit_id, self.label_of[replica.provider], deviant, data.draw(st.booleans())
                    )
            if unit.state == UnitState.COMMITTING:
                self.chain.advance(unit.commit_deadline - self._now() + 1)
        elif not unit.all_revealed and now <= unit.reveal_deadline:
            for index, replica in enumerate(unit.replicas):
                if replica.commitment is not None and replica.digest is None and _mostly(data, 9, "reveal"):
                    self.do_reveal(unit_id, index, wrong_salt=not _mostly(data, 19, "salt"))
            if not unit.all_revealed:
                self.chain.advance(unit.reveal_deadline - self._now() + 1)
        else:
            self._progress_settle(unit_id, data)

    def _progress_truth(self, unit_id: int, data: st.DataObject) -> None:
        """A verdicted unit's next step towards its truth: within its hold, maybe an appeal; a pending
        appeal's draw, vote (mostly the truth), resolve, or its lapse once nobody decided in time; a hold
        nobody appealed, or whose appeal lapsed, settled by the verdict once it ended. (Never waits: a jump
        in time would expire the other open units.)"""
        unit = self.model.units[unit_id]
        appeal = self.model.appeals.get(unit_id)
        verdict = list(unit.verdict or ())
        if appeal is None and self._now() <= self.model.hold_ends(unit):
            self._progress_appeal(unit_id, data)
        elif appeal is None or appeal.state == AppealState.LAPSED:
            self.do_settle_verdict(unit_id, verdict)
        elif appeal.decided is not None:
            self.do_resolve(unit_id, verdict, list(appeal.decided))
        elif self._now() > appeal.vote_deadline:
            self.do_lapse(unit_id)
        elif not appeal.panel:
            self.do_draw_panel(unit_id)
        else:
            self._cast_votes(unit_id, data, 4, until_decided=False)
            if appeal.decided is not None and _mostly(data, 3, "resolve at once"):
                self.do_resolve(unit_id, verdict, list(appeal.decided))

    def _progress_appeal(self, unit_id: int, data: st.DataObject) -> None:
        """Maybe appeal the unit's fresh verdict (mostly when it is wrong: the framed provider or the
        honest minority pays the bond; rarely when it is right), and mostly carry the appeal through at
        once: draw, vote (mostly the truth), resolve; sometimes it is left for later steps, or to lapse
        (always for a unit whose id is 7 mod 8)."""
        unit = self.model.units[unit_id]
        verdict, truth = list(unit.verdict or ()), self._truth(unit)
        wrong = [
            self.label_of[r.provider] for r, v, t in zip(unit.replicas, verdict, truth, strict=True) if v != t
        ]
        framed = [  # called fraud, honest: its provider's stake and price are held until the truth
            self.label_of[r.provider]
            for r, v, t in zip(unit.replicas, verdict, truth, strict=True)
            if v == FRAUD and t == ACCEPT
        ]
        odds = 9 if framed else 1 if wrong else 0  # of appealing against 1 (0: one chance in ten)
        if not (_mostly(data, odds, "appeal") if odds else not _mostly(data, 9, "let it stand")):
            return
        appellants = [
            label
            for label in wrong + [self.label_of[v] for v in unit.verifiers]
            if self._free_stake(label) >= self.chain.appeal_params.appeal_bond
        ]
        if not appellants:
            return
        self.do_appeal(unit_id, data.draw(st.sampled_from(appellants), label="appellant"))
        filed = self.model.appeals.get(unit_id)
        path = data.draw(st.sampled_from(["decide"] * 7 + ["later", "lapse", "lapse"]), label="appeal path")
        if unit_id % 8 == 7:  # whatever the draw: a run's data often repeats one choice throughout
            path = "lapse"
        if filed is None or path == "later":
            return  # left for later steps (or to lapse)
        if path == "lapse":  # nobody draws or votes in time
            self.chain.advance(filed.vote_deadline - self._now() + 1)
            self.do_lapse(unit_id)
            return
        self.do_draw_panel(unit_id)
        if filed.panel and _mostly(data, 9, "vote at once"):
            self._cast_votes(unit_id, data, 9, until_decided=True)
            if filed.decided is not None and _mostly(data, 9, "resolve at once"):
                self.do_resolve(unit_id, verdict, list(filed.decided))

    def _progress_settle(self, unit_id: int, data: st.DataObject) -> None:
        unit = self.model.units[unit_id]
        if not unit.drawn and not _mostly(data, 6, "spot check"):
            self.do_request_verification(unit_id)
        if unit.finalizable and _mostly(data, 4, "fast path"):
            self.do_finalize(unit_id)
            return
        honest = self._honest(unit_id)
        outcomes = []
        for replica in unit.replicas:
            if replica.digest is None:
                outcomes.append(FAULT)
            elif replica.digest == honest:  # sometimes framed: a colluding majority calls it fraud
                outcomes.append(data.draw(st.sampled_from([0, 0, 0, 0, 1, 2, 2]), label="outcome"))
            else:
                outcomes.append(data.draw(st.sampled_from([2, 2, 1]), label="outcome"))
        self.do_submit_verdict(unit_id, outcomes, [self.label_of[v] for v in unit.verifiers])
        if unit.state == UnitState.VERDICTED:
            self._progress_appeal(unit_id, data)  # an appeal moves held money only within the hold

    def _progress_assign(self, data: st.DataObject) -> None:
        open_orders = [
            o
            for o, order in self.model.orders.items()
            if not order.closed
            and order.deadline >= self._now()
            and order.delivered + order.open_units < order.units
            and order.cost_of(order.replicas) <= order.balance
        ]
        if not open_orders:
            buyer = data.draw(st.sampled_from(BUYERS), label="buyer")
            units = data.draw(st.integers(1, 3))
            if _mostly(data, 1, "fixed order"):
                self.do_post_order(buyer, units, data.draw(st.integers(1, 3)), 100, 50, 3_000)
            else:  # adaptive: smaller units for providers with the streak
                self.do_post_adaptive_order(buyer, units, (1, 3), data.draw(st.sampled_from([0, 1])), 100, 50)
            return
        order_id = data.draw(st.sampled_from(open_orders), label="order")
        order = self.model.orders[order_id]
        eligible = [p for p in PROVIDERS if self._free_stake(p) >= self.chain.params.provider_collateral]
        verifiers_ok = all(self._free_stake(v) >= self.chain.params.verifier_collateral for v in VERIFIERS)
        if len(eligible) < order.replicas or not verifiers_ok:
            for label in (*PROVIDERS, *VERIFIERS):
                if self._free_stake(label) < self.chain.params.provider_collateral:
                    self.do_stake(label, 2_500)
            return
        count = order.replicas
        trusted = [
            p for p in eligible if self.model.rep(self.address_of[p]).consecutive >= order.trusted_streak
        ]
        if (
            0 < order.min_replicas <= len(trusted)
            and order.min_replicas < order.replicas
            and _mostly(data, 1, "reduced unit")
        ):
            count = data.draw(st.integers(order.min_replicas, min(order.replicas - 1, len(trusted))))
            eligible = trusted  # an adaptive order's smaller unit, for providers with its streak
        providers = data.draw(st.permutations(eligible), label="providers")[:count]
        self.do_assign(order_id, list(providers), list(VERIFIERS))

    @rule(data=st.data())
    def progress_1(self, data: st.DataObject) -> None:
        self._progress(data)

    @rule(data=st.data())
    def progress_2(self, data: st.DataObject) -> None:
        self._progress(data)

    @rule(data=st.data())
    def progress_3(self, data: st.DataObject) -> None:
        self._progress(data)

    @rule(data=st.data())
    def progress_4(self, data: st.DataObject) -> None:
        self._progress(data)

    @rule(data=st.data())
    def progress_5(self, data: st.DataObject) -> None:
        """A fifth: the appeal life cycle added phases to drive."""
        self._progress(data)

    # ------------------------------------------------------------------------------------------
    # Rules: the round path (JobMarketRounds)
    # ------------------------------------------------------------------------------------------

    def _roster_args(self, order_id: int, wrong_key: bool = False) -> tuple[list[str], int]:
        """The roster's providers and layout as its calls carry them (`wrong_key`: another layout, which
        the contract refuses as RosterMismatch). An order without a roster gets a one-slot shape."""
        roster = self.model.rosters.get(order_id)
        providers, slots = (
            (roster.providers, roster.slots) if roster else ([self.address_of["provider0"]], [0])
        )
        if wrong_key:
            others = [a for a in (self.address_of[p] for p in PROVIDERS) if a not in providers]
            providers = providers[::-1] if len(providers) > 1 else others[:1]
        return list(providers), sum(index << (5 * slot) for slot, index in enumerate(slots))

    def do_open_roster(
        self,
        order_id: int,
        slots: list[list[str]],
        rounds: int,
        stale_nonce: bool = False,
        verifiers: Sequence[str] = (),
    ) -> None:
        """Open `order_id`'s roster: `slots[u]` are unit u's providers (replica order), every round alike;
        each provider signs one `Accept` of the roster's key (with `verifiers`: the roster's, who audit the
        units the chain draws by `RoundAudit` postings)."""
        labels = list(dict.fromkeys(label for unit in slots for label in unit))
        providers = [self.address_of[label] for label in labels]
        auditors = [self.address_of[label] for label in verifiers]
        layout_slots = [labels.index(label) for unit in slots for label in unit]
        replicas, per_round = len(slots[0]), len(slots)
        layout = sum(index << (5 * slot) for slot, index in enumerate(layout_slots))
        key = eip712.roster_key(providers, layout, replicas, per_round, rounds, auditors)
        deadline = self._sig_deadline()
        accepts, nonces = self._sign_accepts(order_id, key, labels, deadline, stale_nonce)
        now = self._now()
        self._run(
            f"openRoster(order {order_id}, {slots} x {rounds} rounds, verifiers {list(verifiers)}, "
            f"stale={stale_nonce})",
            self.actors["operator"],
            "market",
            "openRoster",
            [order_id, providers, layout, replicas, per_round, rounds, auditors, accepts],
            lambda: self.model.open_roster(
                order_id, providers, layout_slots, replicas, per_round, rounds, nonces, now, auditors
            ),
        )

    def _round_work(
        self,
        roster: RosterState,
        round_: int,
        deviant: set[int],
        forged: int | None,
        colluding: frozenset[int] = frozenset(),
    ) -> tuple[RoundWorkArg, list[tuple[bytes, str]], list[tuple[bytes, bytes]], int]:
        """Round `round_`'s signed work (honest digests but the `deviant` slots' and the `colluding` units':
        every replica of those the same forgery, a unanimous fraud only a verifier's re-execution sees; the
        `RoundCommit` of slot `forged`'s provider signed by another provider): (the contract's RoundWork
        tuple, the model's per slot (commitment, signer of its provider's RoundCommit), each slot's (digest,
        salt), the signatures' deadline)."""
        order_id, k = roster.order_id, roster.replicas
        deadline = self._sig_deadline()
        commitments, secrets = [], []
        for slot in range(roster.units_per_round * k):
            unit_id = eip712.round_unit_id(order_id, round_, slot // k)
            provider = roster.provider_of(slot)
            tag = f"r{order_id}-{round_}-{slot // k}"
            digest = keccak(text=f"deviant-{tag}-{slot}" if slot in deviant else f"honest-{tag}")
            if slot // k in colluding and slot not in deviant:
                digest = keccak(text=f"forged-{tag}")
            salt = keccak(text=f"salt-{tag}-{slot}")
            commitments.append(eip712.commitment(digest, salt, provider, unit_id))
            secrets.append((digest, salt))
        forger = roster.slots[forged] if forged is not None else None
        signatures, signers = [], []
        for p, provider in enumerate(roster.providers):
            signer = provider
            if p == forger:
                signer = next(a for a in (self.address_of[q] for q in PROVIDERS) if a != provider)
            own = [c for c, holder in zip(commitments, roster.slots, strict=True) if holder == p]
            message = eip712.round_commit_message(provider, order_id, round_, own, deadline)
            signature = self.chain.sign_market(self.actors[self.label_of[signer]], "RoundCommit", message)
            signatures.append(eip712.compact_signature(signature))
            signers.append(signer)
        model_works = [(c, signers[holder]) for c, holder in zip(commitments, roster.slots, strict=True)]
        return (commitments, signatures), model_works, secrets, deadline

    def do_step_round(
        self,
        order_id: int,
        *,
        commit: bool = True,
        reveal: bool = True,
        withheld: int = 0,
        deviant: frozenset[int] = frozenset(),
        forged: int | None = None,
        tampered: int | None = None,
        sender: str = "operator",
        verifiers: Sequence[str] = VERIFIERS,
        wrong_key: bool = False,
        post: bool = False,
        signers: int | None = None,
        colluding: frozenset[int] = frozenset(),
    ) -> None:
        """One stepRound: the pending round's openings (when `reveal`; `withheld` slots given by their
        commitment, slot `tampered` with a wrong salt) and the next round's works (when `commit`; the
        `colluding` units' replicas all the same forgery), with the roster's posted and pending audit
        chains; `post`: the roster verifiers of the mask `signers` (None: every one) sign `RoundAudit` over
        the pending chain as the step leaves it, and the step posts it."""
        roster = self.model.rosters.get(order_id)
        providers, layout = self._roster_args(order_id, wrong_key)
        openings: list[tuple[bytes, bytes]] = []
        if roster is not None and roster.pending_block and reveal:
            secrets = self.round_secrets.get((order_id, roster.committed - 1), [])
            for slot, (digest, salt) in enumerate(secrets):
                if withheld >> slot & 1:
                    digest, salt = roster.commitments[slot], bytes(32)
                elif slot == tampered:
                    salt = keccak(salt)
                openings.append((digest, salt))
        works: RoundWorkArg = ([], [])
        model_works: list[tuple[bytes, str]] = []
        new_secrets: list[tuple[bytes, bytes]] = []
        deadline = self._sig_deadline()
        if roster is not None and commit:
            round_ = roster.committed
            works, model_works, new_secrets, deadline = self._round_work(
                roster, round_, set(deviant), forged, colluding
            )
        verifier_addresses = [self.address_of[v] for v in verifiers]
        now = self._now()
        set_aside: list[int] = []
        must_set_aside = self._units_to_set_aside(order_id)

        audit = self._round_audit(
            order_id,
            post,
            openings,
            withheld,
            verifier_addresses,
            sender,
            model_works,
            deadline,
            now,
            signers,
        )
        post = post and bool(audit[3])  # no signature (a roster without verifiers): no posting

        def model_action() -> Expected | None:
            expected, units = self.model.step_round(
                order_id,
                not wrong_key,
                openings,
                withheld,
                verifier_addresses,
                sender == "operator",
                model_works,
                deadline,
                now,
                post,
                signers,
            )
            set_aside.extend(units)
            return expected

        units_before = len(self.model.units)
        committed_round = roster.committed if roster is not None else 0
        records_before = list(roster.audit_records) if roster is not None else []
        outcome = self._run(
            f"stepRound(order {order_id}, reveal={bool(openings)}, works={len(works[0])}, "
            f"withheld={withheld:#x}, deviant={sorted(deviant)}, forged={forged}, tampered={tampered}, "
            f"by {sender}, wrong_key={wrong_key})",
            self.actors[sender],
            "market",
            "stepRound",
            [
                order_id,
                providers,
                layout,
                openings,
                withheld,
                verifier_addresses,
                deadline,
                works,
                audit,
            ],
            model_action,
        )
        if outcome.receipt is None or roster is None:
            return
        if works[0]:
            self.round_secrets[(order_id, committed_round)] = new_secrets
        revealed_round = committed_round - 1
        for offset, unit in enumerate(set_aside):  # the model numbered them as the chain does
            unit_id = units_before + 1 + offset
            self.secrets[unit_id] = UnitSecrets()
            self.honest[unit_id] = keccak(text=f"honest-r{order_id}-{revealed_round}-{unit}")
            # a set-aside unit is born revealing (None -> Revealing), seen here: a phase of the same rule
            # may settle it before the step's invariant check
            state = UnitState(self.storage.unit(unit_id)["state"])
            if state != UnitState.REVEALING:
                self._fail("unit_state_machine", f"unit {unit_id} set aside as {state.name}, not REVEALING")
            self.ghosts.unit_states[unit_id] = state
        if set_aside:
            self.call_stats.setdefault("stepRound (set aside)", [0, 0])[0] += 1
        if roster.audit_records[-1:] != records_before[-1:]:
            self.call_stats.setdefault("stepRound (pending or posted)", [0, 0])[0] += 1
        if withheld:
            self.call_stats.setdefault("stepRound (withheld)", [0, 0])[0] += 1
        if post and signers is not None and len(bits(signers)) < len(roster.verifiers):
            self.call_stats.setdefault("stepRound (posted by a bare quorum)", [0, 0])[0] += 1
        events = [
            int.from_bytes(_raw(log["data"])[:32], "big")
            for log in outcome.receipt["logs"]
            if _raw(log["topics"][0]) == UNIT_SET_ASIDE
        ]
        audited = [  # RoundRevealed's `audited`: the drawn units left pending a posting
            int.from_bytes(_raw(log["data"])[32:64], "big")
            for log in outcome.receipt["logs"]
            if _raw(log["topics"][0]) == ROUND_REVEALED
        ]
        pending = set(bits(audited[0])) - set(must_set_aside[1]) if audited else set()
        missed = sorted(set(must_set_aside[0]) - set(events) - pending)
        if openings and missed:
            self._fail(
                "drawn_never_finalized",
                f"order {order_id} round {revealed_round}: units {missed} were drawn (a provider below the "
                f"roster's streak, or the seed's hash gone), yet the step neither set them aside nor left "
                f"them pending a posting (a unit of a provider below the streak only set aside): the roster "
                f"pays them by count, unchecked",
            )
        quorum = len(roster.verifiers) // 2 + 1
        for log in outcome.receipt["logs"]:  # AuditPosted's info: bits 64..71 the signers' mask
            if _raw(log["topics"][0]) == AUDIT_POSTED:
                signed = len(bits(int.from_bytes(_raw(log["data"])[:32], "big") >> 64 & 0xFF))
                if signed < quorum:
                    self._fail(
                        "pending_audits",
                        f"order {order_id}: a posting signed by {signed} of the roster's "
                        f"{len(roster.verifiers)} verifiers was accepted (a majority is {quorum}): its "
                        f"records are paid on less than a quorum's word",
                    )

    def _audit_chains(self, order_id: int) -> tuple[bytes, bytes]:
        """The roster's posted and pending audit chains, from the model's records."""
        roster = self.model.rosters.get(order_id)
        return eip712.audit_chains(roster.audit_records if roster is not None else [])

    def _round_audit(
        self,
        order_id: int,
        post: bool,
        openings: Sequence[tuple[bytes, bytes]],
        withheld: int,
        verifiers: Sequence[str],
        sender: str,
        works: Sequence[tuple[bytes, str]],
        deadline: int,
        now: int,
        signers: int | None = None,
    ) -> tuple[bytes, list[str], bytes, list[tuple[int, bytes, bytes]]]:
        """A step's RoundAudit: the roster's pending chain, and when `post` the roster's verifiers, its posted
        chain and the signature of each verifier of the mask `signers` (None: all) over the pending chain the
        step leaves (found by running the step on a copy of the model: its posting's record covers exactly
        that chain)."""
        posted, pending = self._audit_chains(order_id)
        roster = self.model.rosters.get(order_id)
        if not post or roster is None:
            return pending, [], posted, []
        clock = (self.model.pending_block, self.model.block_hash)  # the chain's: shared, not copied
        probe = copy.deepcopy(self.model, {id(f): f for f in clock})
        probe.step_round(
            order_id, True, openings, withheld, verifiers, sender == "operator", works, deadline, now, True
        )
        records = probe.rosters[order_id].audit_records
        signed = records[-1][1] if records and records[-1][0] >> 255 else pending
        signatures = []
        for index, verifier in enumerate(roster.verifiers):
            if signers is not None and not signers >> index & 1:
                continue
            message = {"orderId": order_id, "records": signed}
            signature = self.chain.sign_market(self.actors[self.label_of[verifier]], "RoundAudit", message)
            r, vs = eip712.compact_signature(signature)
            signatures.append((index, r, vs))
        return pending, list(roster.verifiers), posted, signatures

    def do_set_aside_pending(
        self, order_id: int, count: int, verifiers: Sequence[str] = VERIFIERS, sender: str = "operator"
    ) -> None:
        """setAsidePending of the roster's last `count` pending records: set aside with `verifiers`, or (none)
        dropped unpaid."""
        roster = self.model.rosters[order_id]
        providers, layout = self._roster_args(order_id)
        pending = roster.pending_records
        taken = pending[len(pending) - count :] if 0 < count <= len(pending) else pending
        kept = eip712.audit_chain(pending[: len(pending) - len(taken)])
        digests = [d for info, _ in taken for d in roster.revealed[info >> 176 & 0xFFFFFFFF][1]]
        committed = bytes(32)
        if roster.pending_block:
            committed = eip712.round_commitments_chain(order_id, roster.committed - 1, roster.commitments)
        verifier_addresses = [self.address_of[v] for v in verifiers]
        caller = self.address_of[sender]
        now = self._now()
        units_before = len(self.model.units)
        set_aside: list[tuple[int, int]] = []

        def model_action() -> Expected | None:
            expected, units = self.model.set_aside_pending(
                order_id, count, verifier_addresses, caller, sender == "operator", now
            )
            set_aside.extend(units)
            return expected

        outcome = self._run(
            f"setAsidePending(order {order_id}, last {count} of {len(pending)}, verifiers {list(verifiers)}, "
            f"by {sender})",
            self.actors[sender],
            "market",
            "setAsidePending",
            [order_id, providers, layout, kept, list(taken), digests, committed, verifier_addresses],
            model_action,
        )
        if outcome.receipt is None:
            return
        for offset, (round_, unit) in enumerate(set_aside):
            unit_id = units_before + 1 + offset
            self.secrets[unit_id] = UnitSecrets()
            self.honest[unit_id] = keccak(text=f"honest-r{order_id}-{round_}-{unit}")
            self.ghosts.unit_states[unit_id] = UnitState(self.storage.unit(unit_id)["state"])

    def _challengeable(self, order_id: int) -> list[tuple[int, int]]:
        """(record index, unit) of every audited unit a posting paid on the roster that no challenge took
        back yet (its posting's challenge window may have closed)."""
        roster = self.model.rosters[order_id]
        last = max((i for i, (info, _) in enumerate(roster.audit_records) if info >> 255), default=0)
        return [
            (index, unit)
            for index, (info, _) in enumerate(roster.audit_records[:last])
            if not info >> 255
            for unit in bits(info & (2**64 - 1) & ~(info >> 112))
        ]

    def do_challenge_audit(
        self,
        order_id: int,
        index: int,
        unit: int,
        verifiers: Sequence[str],
        sender: str = "operator",
        from_posting: bool = False,
    ) -> None:
        """challengeAudit of unit `unit` of the roster's record `index`, set aside with `verifiers`; the call
        carries the roster's records through its last posting (`from_posting`: only those after the posting
        before the record's, with the posted chain before them as the prefix)."""
        roster = self.model.rosters[order_id]
        providers, layout = self._roster_args(order_id)
        records = list(roster.audit_records)
        end = max((i + 1 for i, (info, _) in enumerate(records) if info >> 255), default=0)
        start = 0
        if from_posting:
            start = max(
                (i + 1 for i, (info, _) in enumerate(records[: min(index, end)]) if info >> 255), default=0
            )
        prefix = eip712.audit_chains(records[:start])[0]
        info = records[index][0] if index < len(records) else 0
        round_ = info >> 176 & 0xFFFFFFFF
        digests = roster.revealed[round_][1] if round_ in roster.revealed else []
        verifier_addresses = [self.address_of[v] for v in verifiers]
        caller = self.address_of[sender]
        now = self._now()
        units_before = len(self.model.units)
        challenged: list[int] = []

        def model_action() -> Expected | None:
            expected, unit_id = self.model.challenge_audit(
                order_id, index, end, unit, verifier_addresses, caller, sender == "operator", now
            )
            if unit_id is not None:
                challenged.append(unit_id)
            return expected

        outcome = self._run(
            f"challengeAudit(order {order_id}, record {index} unit {unit}, verifiers {list(verifiers)}, "
            f"by {sender}, records {start}..{end})",
            self.actors[sender],
            "market",
            "challengeAudit",
            [
                order_id,
                providers,
                layout,
                (index - start) << 8 | unit,
                prefix,
                records[start:end],
                digests,
                list(roster.verifiers),
                verifier_addresses,
            ],
            model_action,
        )
        if outcome.receipt is None:
            return
        unit_id = units_before + 1
        self.secrets[unit_id] = UnitSecrets()
        self.honest[unit_id] = keccak(text=f"honest-r{order_id}-{round_}-{unit}")
        state = UnitState(self.storage.unit(unit_id)["state"])
        if state != UnitState.REVEALING:
            self._fail("unit_state_machine", f"unit {unit_id} challenged as {state.name}, not REVEALING")
        self.ghosts.unit_states[unit_id] = state

    def _fixed_truth(self, unit: Unit) -> list[int]:
        """The truth VerdictAppeals judges `unit` by once fixed: a decided appeal's, else the verdict."""
        appeal = self.model.appeals.get(unit.unit_id)
        if appeal is not None and appeal.decided is not None:
            return list(appeal.decided)
        return list(unit.verdict or self._truth(unit))

    def do_slash_round_audit(self, unit_id: int, truth: list[int], sender: str = "operator") -> None:
        """slashRoundAudit of a challenged unit by `truth` (anyone's: `sender` gets the bounty); checks
        audit_challenges on the signers it slashed and on the roster collateral it released."""
        unit = self.model.units[unit_id]
        roster = self.model.rosters.get(unit.order_id)
        slash = self.chain.appeal_params.verifier_slash
        first = not unit.audit_slashed  # a success now must slash every signer
        slashes = {} if unit.audit_slashed else dict.fromkeys(unit.audit_signers, slash)
        auditors = list(roster.verifiers) if roster is not None else []
        pre = {v: self.storage.stake_of(v) for v in auditors}
        now = self._now()
        caller = self.address_of[sender]
        outcome = self._settle(
            f"slashRoundAudit(unit {unit_id}, {truth}, by {sender})",
            unit_id,
            self.actors[sender],
            "slashRoundAudit",
            [unit_id, truth],
            lambda: self.model.slash_round_audit(unit_id, truth, caller, now),
            slashes,
            contract="appeals",
        )
        if outcome.receipt is None:
            return
        where = "at the drain" if self.draining else "by a rule"
        self.call_stats.setdefault(f"slashRoundAudit (signers slashed {where})", [0, 0])[0] += 1
        slashed = [
            "0x" + _raw(log["topics"][2])[-20:].hex()
            for log in outcome.receipt["logs"]
            if _raw(log["topics"][0]) == VERIFIER_SLASHED
        ]
        signers = {a.lower() for a in unit.audit_signers}  # the posting's signers, as the step gave them
        truth_now = self._fixed_truth(unit)
        for account in slashed:
            self._add(self.ghosts.audit_slashes, (unit_id, account), 1)
            if account not in signers:
                self._fail(
                    "audit_challenges",
                    f"slashRoundAudit(unit {unit_id}) slashed {account}, which did not sign the posting that "
                    f"paid it (signers {sorted(signers)})",
                )
        missed = signers - set(slashed)
        if first and missed:
            labels = {a.lower(): label for a, label in self.label_of.items()}
            self._fail(
                "audit_challenges",
                f"slashRoundAudit(unit {unit_id}) slashed {sorted(labels.get(a, a) for a in set(slashed))} "
                f"but not {sorted(labels.get(a, a) for a in missed)}, which signed the posting that paid it",
            )
        if slashed and FRAUD not in truth_now:
            self._fail(
                "audit_challenges",
                f"slashRoundAudit(unit {unit_id}) slashed {slashed}; its truth {truth_now} holds no fraud",
            )
        self._count_audit_releases(unit.order_id, auditors, pre)

    def _count_audit_releases(
        self, order_id: int, auditors: Sequence[str], pre: dict[str, tuple[int, int, int, int]]
    ) -> None:
        """Roster collateral a transaction released per roster verifier: the locked stake it freed, unless a
        slash clamped the lock to the stake left (then it cannot be told)."""
        collateral = self.chain.params.verifier_collateral
        for verifier in auditors:
            bonded, locked, _, _ = self.storage.stake_of(verifier)
            before = pre[verifier][1]
            freed = before - locked
            clamped = locked >= bonded and before > bonded
            if clamped or freed < 0 or freed % collateral or (not freed and before < collateral):
                self.ghosts.audit_unclear.add((order_id, verifier))
            elif freed:
                self._add(self.ghosts.audit_releases, (order_id, verifier), freed // collateral)

    def _units_to_set_aside(self, order_id: int) -> tuple[list[int], list[int]]:
        """The pending round's units the draw takes, from the chain's state before the step: those worked
        by a provider below the roster's required streak, or all when the committing block's hash is gone
        (the spot-check rates are 0 here); and the first kind alone (never left pending)."""
        roster = self.model.rosters.get(order_id)
        if roster is None:
            return [], []
        stored = self.storage.roster(order_id)
        if not stored["pendingBlock"]:
            return [], []
        units = range(roster.units_per_round)
        required = stored["requiredStreak"]
        weak = {p for p, a in enumerate(roster.providers) if self.storage.account(a)[4] < required}
        k = roster.replicas
        by_weak = [u for u in units if any(roster.slots[u * k + r] in weak for r in range(k))]
        if self.chain.pending_block() - stored["pendingBlock"] > 256:
            return list(units), by_weak
        return by_weak, by_weak

    def do_publish_opening(
        self, order_id: int, slot: int, wrong_salt: bool = False, wrong_commitments: bool = False
    ) -> None:
        roster = self.model.rosters.get(order_id)
        providers, layout = self._roster_args(order_id)
        commitments: list[bytes] = list(roster.commitments) if roster is not None else []
        if wrong_commitments:
            commitments = commitments[::-1] if len(commitments) > 1 else [bytes(32)]
        secrets = self.round_secrets.get((order_id, roster.committed - 1), []) if roster is not None else []
        digest, salt = secrets[slot] if slot < len(secrets) else (bytes(32), bytes(32))
        if wrong_salt:
            salt = keccak(salt)
        self._run(
            f"publishOpening(order {order_id}, slot {slot}, wrong_salt={wrong_salt}, "
            f"wrong_commitments={wrong_commitments})",
            self.actors["operator"],
            "market",
            "publishOpening",
            [order_id, providers, layout, slot, digest, salt, commitments, self._audit_chains(order_id)[1]],
            lambda: self.model.publish_opening(order_id, True, slot, digest, salt, commitments),
        )

    def do_close_roster(self, order_id: int, sender: str = "operator", wrong_key: bool = False) -> None:
        roster = self.model.rosters.get(order_id)
        providers, layout = self._roster_args(order_id, wrong_key)
        credits = {a: self._earned(a) for a in (roster.providers if roster else [])}
        auditors = list(roster.verifiers) if roster else []
        pre = {v: self.storage.stake_of(v) for v in auditors}
        earned = {v: self._earned(v) for v in auditors}
        escrow_before = self._escrow()
        now = self._now()
        outcome = self._run(
            f"closeRoster(order {order_id}, by {sender}, wrong_key={wrong_key})",
            self.actors[sender],
            "market",
            "closeRoster",
            [
                order_id,
                providers,
                layout,
                list(roster.verifiers) if roster else [],
                list(roster.audit_records) if roster else [],
            ],
            lambda: self.model.close_roster(order_id, not wrong_key, now),
        )
        if outcome.receipt is not None:
            self._add(self.ghosts.escrow_out, order_id, escrow_before - self._escrow())
            self._count_slot_pay(order_id, credits)
            self._count_audit_releases(order_id, auditors, pre)
            for verifier in auditors:
                self._add(
                    self.ghosts.audit_pay, (order_id, verifier), self._earned(verifier) - earned[verifier]
                )

    def _count_slot_pay(self, order_id: int, earned_before: dict[str, int]) -> None:
        """Roster slots paid to each provider by one transaction: what it earned (credit and tokens: a close
        pays its whole credit out) / the order's price."""
        price = self.model.orders[order_id].price if order_id in self.model.orders else 0
        for provider, before in earned_before.items():
            gained = self._earned(provider) - before
            if gained and price:
                self._add(self.ghosts.slot_pay, (order_id, provider), gained // price)

    def _ensure_stake(self, label: str, amount: int) -> None:
        """Top up `label`'s free stake to `amount` (a roster's collateral, a set-aside unit's verifiers')."""
        short = amount - self._free_stake(label)
        if short > 0:
            self.do_stake(label, short)

    def _progress_roster(self, data: st.DataObject, audited: bool = False) -> None:
        """The natural next phase of a roster order, or a new one: open it (its order posted if none
        fits), commit a round (a replica sometimes deviant), reveal it (a slot sometimes withheld past the
        reveal window, its opening sometimes published first) with the next round's commit, push one of
        its set-aside units towards its settlement, or close it."""
        open_rosters = [
            o for o, r in self.model.rosters.items() if not r.closed and (r.verifiers or not audited)
        ]
        if not open_rosters or not _mostly(data, 4, "continue a roster"):
            self._progress_open_roster(data, audited)
            return
        order_id = data.draw(st.sampled_from(open_rosters), label="roster")
        for _ in range(4):  # a few phases at once: a roster's life takes a step per round
            self._roster_phase(order_id, data, audited)
            if self.model.rosters[order_id].closed or not _mostly(data, 2, "another phase"):
                return

    def _roster_phase(self, order_id: int, data: st.DataObject, audited: bool = False) -> None:
        """One phase of an open roster (see `_progress_roster`)."""
        roster, order = self.model.rosters[order_id], self.model.orders[order_id]
        set_aside = [
            u
            for u, unit in self.model.units.items()
            if unit.rostered and unit.order_id == order_id and unit.state not in SETTLED_STATES
        ]
        unsettled = [
            u for u in self._verdicted() if self.model.units[u].rostered and self.model.units[u].held
        ]
        if (set_aside or unsettled) and _mostly(data, 2, "a set-aside unit"):
            unit_id = data.draw(st.sampled_from(set_aside + unsettled), label="set-aside unit")
            if unit_id in unsettled:
                self._progress_truth(unit_id, data)
            else:
                self._progress_unit(unit_id, data)
            return
        if roster.verifiers and self._audit_dispute_phase(order_id, data):
            return
        now = self._now()
        can_commit = roster.committed < roster.rounds and now <= order.deadline
        if roster.pending_records and _mostly(
            data, (1 if audited else 2) if can_commit or roster.pending_block else 0, "keep pending"
        ):
            pass
        elif roster.pending_records:
            self._audit_phase(order_id, data)
            return
        if not roster.pending_block and not can_commit:
            closer = data.draw(st.sampled_from(["operator", self.label_of[order.buyer]]), label="closer")
            self.do_close_roster(order_id, closer)
            return
        slots = roster.units_per_round * roster.replicas
        deviant = frozenset(s for s in range(slots) if not _mostly(data, 9, f"honest slot {s}"))
        colluding: frozenset[int] = frozenset()
        if roster.verifiers:  # a unanimous forgery: only a challenge of the audit that paid it catches it
            colluding = frozenset(
                u
                for u in range(roster.units_per_round)
                if (_usually(data, 2, "collusion") if audited else not _mostly(data, 4, "no collusion"))
            )
        if not roster.pending_block:
            self.do_step_round(order_id, reveal=False, deviant=deviant, colluding=colluding)
            if not roster.pending_block or not _mostly(data, 1, "reveal at once"):
                return
            deviant = frozenset(s for s in range(slots) if not _mostly(data, 9, f"honest slot {s}"))
        withheld = 0
        if not _mostly(data, 3, "every slot opens"):
            slot = data.draw(st.integers(0, slots - 1), label="withheld slot")
            if _mostly(data, 1, "unpublished"):
                withheld = 1 << slot
            else:  # published on chain first: the step then takes its opening from there
                self.do_publish_opening(order_id, slot)
                withheld = 1 << slot if _mostly(data, 2, "relayer leaves it out") else 0
            if withheld:
                self.chain.advance(
                    max(0, roster.pending_since + self.chain.params.reveal_window - self._now() + 1)
                )
        for verifier in VERIFIERS:  # a set-aside unit locks each verifier's collateral
            self._ensure_stake(verifier, self.chain.params.verifier_collateral * roster.units_per_round)
        commit = (
            roster.committed < roster.rounds
            and self._now() <= order.deadline
            and _mostly(data, 4, "commit next")
        )
        verifiers: Sequence[str] = VERIFIERS
        post = False
        signers: int | None = None
        if roster.verifiers:  # round audits: the seed's hash sometimes gone (every unit drawn)
            if not (not audited and _mostly(data, 1, "seed kept")):
                self.chain.mine(max(0, roster.pending_block + 257 - self.chain.pending_block()))
            post = not _mostly(data, 2, "no posting")
            if not post and _mostly(data, 2, "pend drawn units"):
                verifiers = ()
            signers = self._draw_signers(roster, data)
        sender = (
            "operator" if _mostly(data, 3, "the operator's step") else data.draw(st.sampled_from(PROVIDERS))
        )
        self.do_step_round(
            order_id,
            commit=commit,
            withheld=withheld,
            deviant=deviant,
            verifiers=verifiers,
            post=post,
            sender=sender,
            signers=signers,
            colluding=colluding,
        )
        if post and roster.verifiers:  # a challenge fits in the posting's window only if it comes soon
            self._audit_dispute_phase(order_id, data)

    def _draw_signers(self, roster: RosterState, data: st.DataObject) -> int | None:
        """Who signs a posting: every roster verifier, or (three of them) mostly a bare quorum of two."""
        if len(roster.verifiers) != 3:
            return None
        return data.draw(st.sampled_from([0b011, 0b101, 0b110] * 2 + [0b111]), label="signers")

    def _audit_dispute_phase(self, order_id: int, data: st.DataObject) -> bool:
        """A roster with round audits: mostly challenge a unit a posting paid while its window is open
        (sometimes late, with a signer among the verifiers, twice, or not by the operator), or slash the
        signers of a challenged unit's audit once its truth is fixed (sometimes early, or with another
        truth); False when it did neither."""
        roster = self.model.rosters[order_id]
        now = self._now()
        disputed = [
            u
            for u, unit in self.model.units.items()
            if unit.order_id == order_id and unit.audit_signers and unit.state == UnitState.VERDICTED
        ]
        caught = [  # slashable once the truth is fixed: the others only refuse (slashed, or no fraud)
            u
            for u in disputed
            if FRAUD in self._fixed_truth(self.model.units[u]) and not self.model.units[u].audit_slashed
        ]
        if (caught and _usually(data, 2, "slash an audit")) or (
            disputed and not _usually(data, 5, "no refused slash")
        ):
            pool = caught if caught and _usually(data, 3, "a caught audit") else disputed
            unit_id = data.draw(st.sampled_from(pool), label="challenged unit")
            unit = self.model.units[unit_id]
            truth = self._fixed_truth(unit) if _mostly(data, 5, "its truth") else self._truth(unit)
            appeal = self.model.appeals.get(unit_id)
            if (appeal is None or appeal.state != AppealState.PENDING) and _mostly(data, 1, "truth fixed"):
                self.chain.advance(max(0, self.model.appeal_closes(unit) - self._now() + 1))
            sender = data.draw(st.sampled_from(["operator", *BUYERS, *PROVIDERS]), label="slasher")
            self.do_slash_round_audit(unit_id, truth, sender)
            return True
        candidates = self._challengeable(order_id)
        vw = self.chain.params.verdict_window

        def window_end(index: int) -> int:
            posting = next(i for i, _ in roster.audit_records[index:] if i >> 255)
            return (posting >> 72 & (2**40 - 1)) + vw

        in_time = [c for c in candidates if now <= window_end(c[0])]
        forged = [c for c in in_time if self._forged(order_id, *c)]  # what a re-execution would catch
        if not in_time or not _usually(data, 3 if forged else 2, "challenge"):
            return False
        kind = data.draw(
            st.sampled_from(["in time"] * 8 + ["late", "a signer", "again", "by a provider"]),
            label="challenge",
        )
        pool = forged if forged and _usually(data, 3, "a forged unit") else in_time
        index, unit = data.draw(st.sampled_from(pool), label="audited unit")
        posting = next(i for i, _ in roster.audit_records[index:] if i >> 255)
        signers = [self.label_of[roster.verifiers[i]] for i in bits(posting >> 64 & 0xFF)]
        others = [v for v in ALL_VERIFIERS if v not in signers]
        verifiers = list(data.draw(st.permutations(others), label="challenge verifiers"))[:2]
        if kind == "a signer" or len(verifiers) < 2:
            verifiers = [*verifiers[:1], data.draw(st.sampled_from(signers), label="signer")]
        if kind == "late":
            self.chain.advance(window_end(index) - self._now() + 1)
        for verifier in verifiers:
            self._ensure_stake(verifier, self.chain.params.verifier_collateral)
        sender = "operator" if kind != "by a provider" else data.draw(st.sampled_from(PROVIDERS))
        from_posting = _mostly(data, 1, "records from the posting")
        units_before = len(self.model.units)
        self.do_challenge_audit(order_id, index, unit, verifiers, sender, from_posting)
        if kind == "again":
            self.do_challenge_audit(order_id, index, unit, verifiers, sender, not from_posting)  # NotAudited
        if len(self.model.units) > units_before and (index, unit) in forged:
            self.call_stats.setdefault("challengeAudit (a forged unit)", [0, 0])[0] += 1
        if len(self.model.units) > units_before:
            self._carry_dispute(units_before + 1, data)
        return True

    def _forged(self, order_id: int, index: int, unit: int) -> bool:
        """Whether unit `unit` of the roster's record `index` was audited on a forged digest."""
        roster = self.model.rosters[order_id]
        round_ = roster.audit_records[index][0] >> 176 & 0xFFFFFFFF
        digests = roster.revealed[round_][1] if round_ in roster.revealed else []
        return unit < len(digests) and digests[unit] != keccak(text=f"honest-r{order_id}-{round_}-{unit}")

    def _carry_dispute(self, unit_id: int, data: st.DataObject) -> None:
        """A challenged unit's dispute at once: its verifiers' verdict (what re-executing it shows), then
        usually its truth fixed (nobody appeals within the appeal window) and the challenged audit's signers
        slashed by anyone (refused when the truth holds no fraud); else the slash is left to later steps
        (`_audit_dispute_phase`: early, late, with another truth). Without it a random run seldom lines up
        the half dozen steps of a dispute (the 60 x 40 CI run slashed once or twice)."""
        unit = self.model.units[unit_id]
        self.do_submit_verdict(unit_id, self._truth(unit), [self.label_of[v] for v in unit.verifiers])
        if unit.state != UnitState.VERDICTED or not _usually(data, 3, "truth fixed at once"):
            return
        self.chain.advance(max(0, self.model.appeal_closes(unit) - self._now() + 1))
        sender = data.draw(st.sampled_from(["operator", *BUYERS, *PROVIDERS]), label="slasher")
        self.do_slash_round_audit(unit_id, self._fixed_truth(unit), sender)

    def _audit_phase(self, order_id: int, data: st.DataObject) -> None:
        """A roster with pending round records: a posting alone (no round to reveal), the operator setting
        the last few aside with its verifiers, or anyone dropping them after the order's deadline +
        verdictWindow (sometimes too early: refused)."""
        roster, order = self.model.rosters[order_id], self.model.orders[order_id]
        pending = len(roster.pending_records)
        count = data.draw(st.integers(1, pending), label="records taken")
        choice = data.draw(st.sampled_from(["post", "set aside", "drop"]), label="way out")
        if choice == "post" and not roster.pending_block:
            signers = self._draw_signers(roster, data)
            self.do_step_round(order_id, commit=False, reveal=False, post=True, signers=signers)
            self._audit_dispute_phase(order_id, data)
        elif choice == "set aside":
            for verifier in VERIFIERS:
                self._ensure_stake(
                    verifier, self.chain.params.verifier_collateral * pending * roster.units_per_round
                )
            self.do_set_aside_pending(order_id, count)
        else:
            droppable = order.deadline + self.chain.params.verdict_window
            if _mostly(data, 3, "in time"):
                self.chain.advance(max(0, droppable - self._now() + 1))
            closer = data.draw(st.sampled_from(["operator", *BUYERS, *PROVIDERS]), label="dropper")
            self.do_set_aside_pending(order_id, count, (), closer)

    def _progress_open_roster(self, data: st.DataObject, audited: bool = False) -> None:
        """Open a roster on an order that can take one (posting a fitting order when none can)."""
        now = self._now()
        fits = [
            o
            for o, order in self.model.orders.items()
            if not order.closed
            and o not in self.model.rosters
            and order.deadline >= now + 500
            and order.delivered + order.open_units < order.units
        ]
        if not fits or not _mostly(data, 2, "an existing order"):
            buyer = data.draw(st.sampled_from(BUYERS), label="buyer")
            units = data.draw(st.integers(1, 4), label="units")
            if _mostly(data, 2, "fixed order"):
                self.do_post_order(
                    buyer, units, data.draw(st.integers(1, 3), label="replicas"), 100, 50, 3_000
                )
            else:
                self.do_post_adaptive_order(buyer, units, (1, 3), data.draw(st.sampled_from([0, 1])), 100, 50)
            fits = [len(self.model.orders)] if self.model.orders else []
            if not fits:
                return
        order_id = data.draw(st.sampled_from(fits), label="order")
        order = self.model.orders[order_id]
        free_units = order.units - order.delivered - order.open_units
        low = order.min_replicas or order.replicas
        trusted = [
            p for p in PROVIDERS if self.model.rep(self.address_of[p]).consecutive >= order.trusted_streak
        ]
        replicas = order.replicas
        if low < order.replicas and len(trusted) >= low and _mostly(data, 2, "fewer replicas"):
            replicas = data.draw(st.integers(low, min(order.replicas - 1, len(trusted))), label="k")
        pool = list(PROVIDERS) if replicas == order.replicas else trusted
        per_round = data.draw(st.integers(1, max(1, min(2, free_units))), label="units per round")
        rounds = data.draw(st.integers(1, max(1, min(3, free_units // per_round))), label="rounds")
        slots = [
            list(data.draw(st.permutations(pool), label="unit providers")[:replicas])
            for _ in range(per_round)
        ]
        uses: dict[str, int] = {}
        for unit in slots:
            for label in unit:
                uses[label] = uses.get(label, 0) + 1
        for label, count in uses.items():
            self._ensure_stake(label, count * self.chain.params.provider_collateral)
        stale = not _mostly(data, 19, "fresh nonces")
        verifiers: Sequence[str] = ()
        if audited or _mostly(data, 1, "the roster's verifiers"):
            verifiers = VERIFIERS if _mostly(data, 1, "two verifiers") else AUDITORS_OF_THREE
            for verifier in verifiers:
                self._ensure_stake(verifier, self.chain.params.verifier_collateral)
        self.do_open_roster(order_id, slots, rounds, stale, verifiers)

    @rule(data=st.data())
    def progress_roster_1(self, data: st.DataObject) -> None:
        self._progress_roster(data)

    @rule(data=st.data())
    def progress_roster_2(self, data: st.DataObject) -> None:
        """A second: a roster's life takes a few steps (open, a step per round, close)."""
        self._progress_roster(data)

    @rule(data=st.data())
    def progress_roster_3(self, data: st.DataObject) -> None:
        self._progress_roster(data)

    @rule(data=st.data())
    def progress_round_audits(self, data: st.DataObject) -> None:
        """A roster with verifiers whose rounds' seeds are gone (every unit drawn): round audits pended,
        posted (by a bare quorum of three), challenged, their signers slashed."""
        self._progress_roster(data, audited=True)

    @rule(data=st.data())
    def progress_round_audits_2(self, data: st.DataObject) -> None:
        """A second: a dispute takes a few steps (a colluding round, its posting, the challenge, the verdict,
        its truth fixed, the slash)."""
        self._progress_roster(data, audited=True)

    @precondition(lambda self: bool(self.model.rosters))
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            [
                "forged",
                "tampered",
                "early withheld",
                "wrong key",
                "close",
                "open again",
                "publish",
                "bad publish",
                "empty",
                "by a provider",
                "thin verifiers",
                "thin quorum",
                "challenge",
            ]
        ),
    )
    def roster_misuse(self, data: st.DataObject, kind: str) -> None:
        """A round-path call that is mostly refused: a forged work, a tampered opening, a slot given as
        withheld inside the reveal window, another roster's layout, an early close, a second roster, a
        bad or valid published opening, an empty step, a step by a provider or with too few verifiers
        (refused when the round has a unit to set aside)."""
        order_id = data.draw(st.sampled_from(sorted(self.model.rosters)), label="roster")
        roster = self.model.rosters[order_id]
        slots = roster.units_per_round * roster.replicas
        slot = data.draw(st.integers(0, slots - 1), label="slot")
        if kind == "forged":
            self.do_step_round(order_id, forged=slot)
        elif kind == "tampered":
            self.do_step_round(order_id, commit=False, tampered=slot)
        elif kind == "early withheld":
            self.do_step_round(order_id, commit=False, withheld=1 << slot)
        elif kind == "wrong key":
            self.do_step_round(order_id, wrong_key=True)
        elif kind == "close":
            self.do_close_roster(order_id, data.draw(st.sampled_from(["operator", *BUYERS]), label="closer"))
        elif kind == "open again":
            unit = [self.label_of[roster.provider_of(r)] for r in range(roster.replicas)]
            self.do_open_roster(order_id, [unit], 1)
        elif kind in ("publish", "bad publish"):
            self.do_publish_opening(
                order_id,
                slot,
                wrong_salt=kind == "bad publish" and _mostly(data, 1, "salt"),
                wrong_commitments=kind == "bad publish" and not _mostly(data, 1, "salt"),
            )
        elif kind == "empty":
            self.do_step_round(order_id, commit=False, reveal=False)
        elif kind == "by a provider":
            self.do_step_round(order_id, sender=data.draw(st.sampled_from(PROVIDERS), label="sender"))
        elif kind == "thin quorum":  # one signature: below any roster's majority
            self.do_step_round(order_id, commit=False, post=True, signers=1)
        elif kind == "challenge":  # any record and unit, mostly not one a posting paid
            index = data.draw(st.integers(0, len(roster.audit_records)), label="record")
            unit = data.draw(st.integers(0, roster.units_per_round), label="unit")
            self.do_challenge_audit(order_id, index, unit, SPARE_VERIFIERS)
        else:
            self.do_step_round(order_id, commit=False, verifiers=VERIFIERS[:1])

    # ------------------------------------------------------------------------------------------
    # Invariants
    # ------------------------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.check_step()

    def check_step(self) -> None:
        """Check every invariant on the whole state (storage reads are cheap); raise once with all."""
        self.steps += 1
        self._check_solvency()
        self._check_settlements()
        self._check_unit_states()
        self._check_collateral_locked()
        self._check_slashed_not_withdrawable()
        self._compare_accounts()
        self._compare_orders()
        self._compare_rosters()
        self._check_audit_challenges()
        self._raise_failures()

    def _raise_failures(self) -> None:
        if self.failures:
            failures, self.failures = self.failures, []
            self.broken = True
            raise InvariantViolation(failures)

    def _check_solvency(self) -> None:
        storage = self.storage
        sm_balance, jm_balance = self._sm_balance(), self._jm_balance()
        total_staked = storage.total_staked()
        escrow, total_credits = storage.totals()
        stake_sum = sum(
            bonded + unbonding for bonded, _, unbonding, _ in map(storage.stake_of, self.staker_addresses)
        )
        credit_sum = sum(storage.account(address)[0] for address in self.address_of.values())
        if not sm_balance == total_staked == stake_sum:
            self._fail(
                "solvency",
                f"StakeManager holds {sm_balance}, totalStaked {total_staked}, "
                f"Σ bonded+unbonding {stake_sum}",
            )
        if jm_balance != escrow + total_credits or credit_sum != total_credits:
            self._fail(
                "solvency",
                f"JobMarket holds {jm_balance}; totalEscrow {escrow} + totalCredits {total_credits}; "
                f"Σ credits {credit_sum}",
            )
        va_balance = storage.token_balance(self.chain.appeals.address)
        if va_balance:
            self._fail("solvency", f"VerdictAppeals holds {va_balance}; slashes only pass through it")
        want = (self.model.total_staked(), self.model.total_escrow(), self.model.total_credits())
        if (total_staked, escrow, total_credits) != want:
            self._fail(
                "model_agreement",
                f"totals staked/escrow/credits {(total_staked, escrow, total_credits)}, model {want}",
            )

    def _check_settlements(self) -> None:
        for unit_id, count in self.ghosts.settlements.items():
            if count > 1:
                self._fail("no_double_settlement", f"unit {unit_id} settled {count} times")
        for unit_id, count in self.ghosts.held_settlements.items():
            if count > 1:
                self._fail("no_double_settlement", f"unit {unit_id}'s held replicas settled {count} times")
        held_prices: dict[int, int] = {}
        for unit_id, model_unit in self.model.units.items():
            if self.storage.unit(unit_id)["state"] == UnitState.VERDICTED:
                held = len(bits(self.storage.held(unit_id) & 0xFF))
                self._add(
                    held_prices, model_unit.order_id, held * self.model.orders[model_unit.order_id].price
                )
        for order_id, order in self.model.orders.items():
            out = self.ghosts.escrow_out.get(order_id, 0)
            if out > order.escrow0:
                self._fail(
                    "no_double_settlement", f"order {order_id} paid out {out} of escrow {order.escrow0}"
                )
            # a closed order keeps in escrow only the prices of its held replicas (until their truth)
            want = order.escrow0 - held_prices.get(order_id, 0)
            if self.storage.order(order_id)["closed"] and out != want:
                self._fail(
                    "no_double_settlement",
                    f"closed order {order_id} paid out {out} of {order.escrow0}; "
                    f"held prices {held_prices.get(order_id, 0)}",
                )

    def _check_unit_states(self) -> None:
        for unit_id, model_unit in self.model.units.items():
            stored = self.storage.unit(unit_id)
            state = UnitState(stored["state"])
            previous = self.ghosts.unit_states.get(unit_id, UnitState.NONE)
            if state != previous and state not in LEGAL_TRANSITIONS[previous]:
                self._fail(
                    "unit_state_machine",
                    f"unit {unit_id}: illegal transition {previous.name} -> {state.name}",
                )
            self.ghosts.unit_states[unit_id] = state
            if stored["drawn"] and state == UnitState.FINALIZED:
                # a spot-checked unit settles by verdict or expiry only: the fast path must not skip the check
                self._fail(
                    "drawn_never_finalized", f"unit {unit_id} was drawn for a spot check, then finalized"
                )
            if state != model_unit.state:
                self._fail(
                    "unit_state_machine",
                    f"unit {unit_id} is {state.name}, model says {model_unit.state.name}",
                )
            committed = sum(1 << i for i, r in enumerate(model_unit.replicas) if r.commitment is not None)
            revealed = sum(1 << i for i, r in enumerate(model_unit.replicas) if r.digest is not None)
            want = (
                committed,
                revealed,
                int(model_unit.drawn),
                model_unit.commit_deadline,
                model_unit.reveal_deadline,
            )
            got = (
                stored["committedMask"],
                stored["revealedMask"],
                stored["drawn"],
                stored["commitDeadline"],
                stored["revealDeadline"],
            )
            if got != want:
                self._fail("model_agreement", f"unit {unit_id} masks/drawn/deadlines {got}, model {want}")
            if state == UnitState.VERDICTED and self.storage.held(unit_id) != model_unit.held_word:
                self._fail(
                    "model_agreement",
                    f"unit {unit_id} holds {self.storage.held(unit_id):#x}, model {model_unit.held_word:#x}",
                )

    def _check_collateral_locked(self) -> None:
        """Every open unit holds its providers' and verifiers' collateral, every held replica (a verdict
        called it fraud, its truth is not settled) its provider's, every open roster one collateral per
        slot of a round of its providers (a set-aside unit's providers and held replicas lock nothing more:
        theirs is the roster's, released early only before a slash), every pending appeal its bond and the
        pool its referee's stake: an account never slashed has exactly that sum locked (a slash may clamp
        the lock to the remaining stake, so those are skipped)."""
        params = self.chain.params
        want = dict.fromkeys(self.staker_addresses, 0)
        for unit_id, model_unit in self.model.units.items():
            state = self.storage.unit(unit_id)["state"]
            if state == UnitState.VERDICTED and not model_unit.rostered:
                for index in bits(self.storage.held(unit_id) & 0xFF):
                    self._add(want, model_unit.replicas[index].provider, params.provider_collateral)
            if state not in (UnitState.COMMITTING, UnitState.REVEALING):
                continue
            for replica in model_unit.replicas:  # a set-aside unit's providers: the roster's lock
                if not model_unit.rostered:
                    want[replica.provider] = want.get(replica.provider, 0) + params.provider_collateral
            for verifier in model_unit.verifiers:
                want[verifier] = want.get(verifier, 0) + params.verifier_collateral
        for order_id, roster in self.model.rosters.items():  # one collateral per slot, until close
            if self.storage.roster(order_id)["closed"]:
                continue
            for i, verifier in enumerate(roster.verifiers):  # one collateral each, until close or a slash
                if not roster.audit_released >> i & 1:
                    self._add(want, verifier, params.verifier_collateral)
            for provider, uses in zip(roster.providers, roster.uses, strict=True):
                # its lock is released early only before a slash of the provider (RosterLock), and a
                # slashed account is skipped below: so all of it
                self._add(want, provider, uses * params.provider_collateral)
        for appeal in self.model.appeals.values():
            if appeal.state == AppealState.PENDING:
                self._add(want, appeal.appellant, self.chain.appeal_params.appeal_bond)
        for referee in self.model.entry_of:
            self._add(want, referee, self.chain.appeal_params.referee_stake)
        for account, locked_sum in want.items():
            if self.ghosts.slashed.get(account, 0):
                continue
            locked = self.storage.stake_of(account)[1]
            if locked != locked_sum:
                self._fail(
                    "collateral_locked",
                    f"{self.label_of.get(account, account)}: {locked} locked, open units need {locked_sum}",
                )

    def _check_slashes(
        self,
        receipt: Any,
        pre: dict[str, tuple[int, int, int, int]],
        requested: dict[str, int],
        sm_before: int,
    ) -> None:
        """slash_reaches_unbonding: each slash took min(requested, bonded + unbonding); those tokens left."""
        reported = _slash_events(receipt)
        total = 0
        for account, amount in requested.items():
            bonded, _, unbonding, _ = pre[account]
            want = min(amount, bonded + unbonding)
            got = reported.pop(account.lower(), 0)
            total += got
            self._add(self.ghosts.slashed, account, got)
            if got != want:
                self._fail(
                    "slash_reaches_unbonding",
                    f"slash of {amount} on {self.label_of.get(account, account)} with bonded {bonded}, "
                    f"unbonding {unbonding} took {got}, should take {want}",
                )
        for account, got in reported.items():  # a slash the rules do not call for here
            label = next((label for a, label in self.label_of.items() if a.lower() == account), account)
            total += got
            self._add(self.ghosts.slashed, self.address_of.get(label, account), got)
            self._fail("model_agreement", f"{label} slashed {got}, which no rule calls for here")
        left = sm_before - self._sm_balance()
        if left != total:
            self._fail(
                "slash_reaches_unbonding", f"slashes reported {total} but {left} tokens left StakeManager"
            )

    def _check_slashed_not_withdrawable(self) -> None:
        g = self.ghosts
        for account in self.staker_addresses:
            bonded, _, unbonding, _ = self.storage.stake_of(account)
            deposited, withdrawn = g.deposited.get(account, 0), g.withdrawn.get(account, 0)
            slashed = g.slashed.get(account, 0)
            if bonded + unbonding != deposited - withdrawn - slashed:
                self._fail(
                    "slashed_never_withdrawable",
                    f"{self.label_of[account]}: bonded {bonded} + unbonding {unbonding} != "
                    f"deposited {deposited} - withdrawn {withdrawn} - slashed {slashed}",
                )

    def _compare_accounts(self) -> None:
        storage, model = self.storage, self.model
        for label, account in self.address_of.items():
            got_tokens = storage.token_balance(account)
            if got_tokens != model.tokens.get(account, 0):
                self._fail(
                    "model_agreement", f"{label} holds {got_tokens}, model {model.tokens.get(account, 0)}"
                )
            acc = model.stake_of(account)
            got_stake = storage.stake_of(account)
            if got_stake != (acc.bonded, acc.locked, acc.unbonding, acc.thaw_at):
                self._fail("model_agreement", f"{label} stake {got_stake}, model {acc}")
            rep = model.rep(account)
            got_account = storage.account(account)
            want_account = (model.credits.get(account, 0), rep.valid, rep.fault, rep.fraud, rep.consecutive)
            if got_account != want_account:
                self._fail(
                    "model_agreement", f"{label} credit+reputation {got_account}, model {want_account}"
                )

    def _compare_nonces(self) -> None:
        """Through the views, once per example: every signed action already proves its nonce."""
        chain, model = self.chain, self.model
        for label, account in self.address_of.items():
            got = (chain.view(chain.market, "nonces", account), chain.view(chain.stakes, "nonces", account))
            want = (model.jm_nonces.get(account, 0), model.sm_nonces.get(account, 0))
            if got != want:
                self._fail("model_agreement", f"{label} nonces (market, stake) {got}, model {want}")

    def _compare_rosters(self) -> None:
        """Each roster's stored fields, per-provider set-aside slots and roster locks against the model
        (model_agreement); and no_double_settlement on the round path: no provider is paid for more of a
        roster's slots (by its close and by its set-aside units' settlements together) than it holds in
        the rounds revealed so far."""
        price_of = {o: order.price for o, order in self.model.orders.items()}
        for order_id, roster in self.model.rosters.items():
            stored = self.storage.roster(order_id)
            marks = sum(mark << (8 * p) for p, mark in enumerate(roster.fault_marks))
            want = {
                "requiredStreak": roster.required_streak,
                "committed": roster.committed,
                "pendingBlock": roster.pending_block,
                "pendingSince": roster.pending_since,
                "closed": int(roster.closed),
                "setAsideUnits": roster.set_aside_units,
                "openSetAside": roster.open_set_aside,
                "auditsPending": int(bool(roster.pending_records)),
                "faultMarks": marks,
            }
            if stored != want:
                self._fail("model_agreement", f"roster of order {order_id}: {stored}, model {want}")
            self._check_pending_audits(order_id, roster, bool(stored["closed"]))
            settled = stored["committed"] - (1 if stored["pendingBlock"] else 0)
            for index, (provider, uses) in enumerate(zip(roster.providers, roster.uses, strict=True)):
                label = self.label_of.get(provider, provider)
                got = (
                    self.storage.set_aside_slots(order_id, index),
                    *self.storage.roster_lock(order_id, provider),
                )
                model = (
                    roster.set_aside_slots.get(index, 0),
                    roster.lock_held.get(provider, 0),
                    roster.lock_released.get(provider, 0),
                )
                if got != model:
                    self._fail(
                        "model_agreement",
                        f"roster of order {order_id}, {label}: set-aside slots / lock held / released {got}, "
                        f"model {model}",
                    )
                paid = self.ghosts.slot_pay.get((order_id, provider), 0)
                dropped = roster.dropped_slots.get(index, 0)
                if price_of.get(order_id) and paid > uses * settled - dropped:
                    self._fail(
                        "no_double_settlement",
                        f"roster of order {order_id}: {label} was paid for {paid} slots, holds {uses} a "
                        f"round in {settled} revealed rounds, {dropped} of them dropped unpaid",
                    )

    def _check_pending_audits(self, order_id: int, roster: RosterState, closed: bool) -> None:
        """pending_audits: the roster's round hash holds exactly the model's pending chain (with the committed
        round's commitments), its audit key the model's verifiers and posted chain, and a closed roster has
        nothing pending: no record is paid unposted, dropped twice, or posted after it was taken off."""
        posted, pending = self._audit_chains(order_id)
        if closed and roster.pending_records:
            self._fail("pending_audits", f"roster of order {order_id} closed with records pending")
        key = bytes(32)
        if roster.verifiers:
            verifiers_hash = keccak(abi_encode(["address[]"], [roster.verifiers]))
            key = keccak(verifiers_hash + posted)
        round_hash: bytes | None = None
        if roster.pending_block:
            round_hash = eip712.round_commitments_chain(order_id, roster.committed - 1, roster.commitments)
            if roster.pending_records:
                round_hash = keccak(round_hash + pending)
        elif roster.pending_records:
            round_hash = keccak(bytes(32) + pending)
        stored_hash = self.storage.round_hash(order_id)
        if self.storage.audit_key(order_id) != key or (round_hash is not None and stored_hash != round_hash):
            self._fail(
                "pending_audits",
                f"roster of order {order_id}: stored audit key / round hash "
                f"{self.storage.audit_key(order_id).hex()} / {stored_hash.hex()}, model {key.hex()} / "
                f"{round_hash.hex() if round_hash else None} ({len(roster.pending_records)} records pending)",
            )

    def _check_audit_challenges(self) -> None:
        """audit_challenges (see the module notice), from the ghosts of slashRoundAudit and closeRoster."""
        for (unit_id, account), count in self.ghosts.audit_slashes.items():
            if count > 1:
                self._fail(
                    "audit_challenges", f"{account} slashed {count} times for the audit of unit {unit_id}"
                )
        fee_share: dict[tuple[int, str], int] = {}
        for order_id, roster in self.model.rosters.items():
            if not roster.verifiers:
                continue
            closed = bool(self.storage.roster(order_id)["closed"])
            share = self.model.orders[order_id].fee // len(roster.verifiers)
            units = 0
            for info, _ in roster.audit_records:  # each signer's unchallenged audited units, by postings
                if not info >> 255:
                    units += len(bits(info & (2**64 - 1) & ~(info >> 112)))
                    continue
                for i, verifier in enumerate(roster.verifiers):
                    if info >> (64 + i) & 1:
                        self._add(fee_share, (order_id, verifier), units * share)
                units = 0
            for verifier in roster.verifiers:
                key = (order_id, verifier)
                label = self.label_of.get(verifier, verifier)
                releases = self.ghosts.audit_releases.get(key, 0)
                if releases > 1 or (closed and not releases and key not in self.ghosts.audit_unclear):
                    self._fail(
                        "audit_challenges",
                        f"roster of order {order_id}: {label}'s collateral released {releases} times"
                        f"{' after the close' if closed else ' while open'}, should be once by the close",
                    )
                paid = self.ghosts.audit_pay.get(key, 0)
                if paid > fee_share.get(key, 0):
                    self._fail(
                        "audit_challenges",
                        f"roster of order {order_id}: {label} was paid {paid} in audit fees; its share of "
                        f"the unchallenged units it signed is {fee_share.get(key, 0)}",
                    )

    def _compare_orders(self) -> None:
        for order_id, order in self.model.orders.items():
            stored = self.storage.order(order_id)
            got = (stored["balance"], stored["delivered"], stored["openUnits"], bool(stored["closed"]))
            got += (stored["minReplicas"], stored["trustedStreak"])
            want = (order.balance, order.delivered, order.open_units, order.closed)
            want += (order.min_replicas or order.replicas, order.trusted_streak)
            if got != want:
                self._fail(
                    "model_agreement", f"order {order_id} balance/delivered/open/closed {got}, model {want}"
                )

    # ------------------------------------------------------------------------------------------
    # Liveness: every fund exits after its deadline
    # ------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        if self.broken or self.failures:
            return
        self.drain_everything()

    def drain_everything(self) -> None:
        """Past all deadlines: expire units, decide or lapse appeals, settle every held replica, close
        orders, leave the referee pool, withdraw credits and stake; nothing may remain.

        Decisions come from the chain's own state (not the model), so a seeded bug that already made
        the model disagree still gets its funds-exit verdict.
        """
        self.draining = True
        storage = self.storage
        horizon = max(
            [self.model.appeal_closes(u) for u in self.model.units.values()]
            + [a.vote_deadline for a in self.model.appeals.values()]
            + [o.deadline for o in self.model.orders.values()]
            + [r.pending_since + self.chain.params.reveal_window for r in self.model.rosters.values()]
            + [r.last_posting_time + self.chain.params.verdict_window for r in self.model.rosters.values()]
            + [o.deadline + self.chain.params.verdict_window for o in self.model.orders.values()]
            + [0]
        )
        if horizon >= self._now():
            self.chain.advance(horizon - self._now() + 1)
        for unit_id in self.model.units:
            if storage.unit(unit_id)["state"] in (UnitState.COMMITTING, UnitState.REVEALING):
                self.do_expire(unit_id)
            if storage.unit(unit_id)["state"] == UnitState.REVEALING:  # unanimous, undrawn: UnitFinalizable
                self.do_finalize(unit_id, by_operator=False)  # anyone's, past the verdict deadline
        for unit_id, appeal in self.model.appeals.items():
            if (
                self.chain.view_struct(self.chain.appeals, "getAppeal", unit_id)["state"]
                != AppealState.PENDING
            ):
                continue
            verdict = list(self.model.units[unit_id].verdict or ())
            if appeal.decided is not None:
                self.do_resolve(unit_id, verdict, list(appeal.decided))
            else:
                self.do_lapse(unit_id)
        for unit_id, unit in self.model.units.items():  # every held replica can be settled
            if storage.unit(unit_id)["state"] == UnitState.VERDICTED and storage.held(unit_id):
                self.do_settle_verdict(unit_id, list(unit.verdict or ()))
        for unit_id, unit in self.model.units.items():  # every lazy audit a challenge caught is slashed
            if unit.audit_signers and not unit.audit_slashed and FRAUD in self._fixed_truth(unit):
                appeal = self.model.appeals.get(unit_id)
                if storage.unit(unit_id)["state"] == UnitState.VERDICTED and (
                    appeal is None or appeal.state != AppealState.LAPSED
                ):
                    self.do_slash_round_audit(unit_id, self._fixed_truth(unit))
        for order_id, roster in self.model.rosters.items():  # their set-aside units all settled above
            if not storage.roster(order_id)["closed"] and roster.pending_records:  # the way out: dropped
                self.do_set_aside_pending(
                    order_id,
                    len(roster.pending_records),
                    (),
                    self.label_of[self.model.orders[order_id].buyer],
                )
            if not storage.roster(order_id)["closed"]:
                self.do_close_roster(order_id)
        for order_id in self.model.orders:
            if not storage.order(order_id)["closed"]:
                self.do_close_order(order_id, by_buyer=False)
        for label in self.referees:
            referee = self.actors[label]
            self._run(
                f"leavePool({label})",
                referee,
                "appeals",
                "leavePool",
                [],
                functools.partial(self.model.leave_pool, referee.address),
            )
        for index, label in enumerate(FUNDED):  # alternate plain and relayed (signed) withdrawals
            if storage.account(self.address_of[label])[0]:
                self.do_withdraw_credit(label, signed=index % 2 == 1)
        for label in ALL_STAKERS:
            bonded, locked, _, _ = storage.stake_of(self.address_of[label])
            if bonded > locked:
                self.do_request_unstake(label, bonded - locked)
        self.chain.advance(self.chain.params.unbonding_period + 1)
        for index, label in enumerate(ALL_STAKERS):
            if storage.stake_of(self.address_of[label])[2]:
                self.do_withdraw_stake(label, signed=index % 2 == 1)
        sm_balance, jm_balance = self._sm_balance(), self._jm_balance()
        if sm_balance or jm_balance:
            self._fail(
                "funds_exit",
                f"after closing everything StakeManager holds {sm_balance}, JobMarket {jm_balance}",
            )
        self._compare_nonces()
        for problem in self.storage.cross_check(
            list(self.address_of.values()),
            list(self.model.orders),
            list(self.model.units),
            list(self.model.rosters),
        ):
            self._fail("storage_layout", problem)
        self.check_step()

    # ------------------------------------------------------------------------------------------
    # Small helpers
    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _add(counter: dict[Any, int], key: Any, amount: int) -> None:
        counter[key] = counter.get(key, 0) + amount

    def _free_stake(self, label: str) -> int:
        acc = self.model.stake_of(self.address_of[label])
        return acc.bonded - acc.locked

    def _sm_balance(self) -> int:
        return self.storage.token_balance(self.chain.stakes.address)

    def _earned(self, account: str) -> int:
        """What the market owes or paid `account`: its credit and its tokens."""
        return self.storage.account(account)[0] + self.storage.token_balance(account)

    def _jm_balance(self) -> int:
        return self.storage.token_balance(self.chain.market.address)

    def _escrow(self) -> int:
        return self.storage.totals()[0]


def machine_for(chain: Chain) -> type[MarketMachine]:
    """A MarketMachine subclass bound to one deployed contract variant (real or mutant)."""
    return type(
        "MarketMachineOnChain", (MarketMachine,), {"chain": chain, "call_stats": {}, "error_stats": {}}
    )


__all__ = ["FAULT", "INVARIANTS", "InvariantViolation", "MarketMachine", "build_chain", "machine_for"]
