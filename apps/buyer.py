"""What a buyer does, once for the `veritrain order` commands and the demo: build and check an order spec,
escrow it by permit and register it, read where its money went from chain events, and collect the verified
result (PoL manifests and the final state) over libp2p, checked against the digests the chain settled.

Why here and not in a role: the buyer is not a market, provider or verifier; it is an application on top
of the kernel (chain client, market HTTP client, blob plane) and reuses the market's escrow rule so the
escrow it shows and signs is exactly what the market checks.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from apps.demo_report import OrderMoney
from veritrain.errors import DigestMismatch, InvalidOrderSpec, UnderfundedOrder, VeritrainError
from veritrain.wallet import TOKEN, veri

if TYPE_CHECKING:
    from collections.abc import Sequence

    from eth_account.signers.local import LocalAccount

    from market.domain.pricing import EscrowPlan
    from veritrain.agentkit import BlobPlane, UnitManifest
    from veritrain.chain.client import ChainClient
    from veritrain.chain.tx import Event
    from veritrain.messages import OrderSpec, OrderStatus
    from veritrain.pol import State

PERMIT_TTL_S = 600
OUTCOME_NAMES = {0: "accept", 1: "fault", 2: "fraud"}
FRAUD = 2
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AMOUNT = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]+)?)\s*VERI\s*$", re.IGNORECASE)
MONEY_FIELDS = ("max_price_per_pflop", "verifier_fee_per_unit")
AUTO_MAX_REPLICAS = 3  # a newcomer's units under `replicas = "auto"` (BOINC's); trusted providers work alone


class RosterMismatch(VeritrainError):
    """A roster's close paid other than its events say it should (`roster_payouts`)."""


# --- the order spec from a TOML file ---------------------------------------------------------------


def load_spec_file(path: Path) -> dict[str, Any]:
    """The TOML table of an order file; InvalidOrderSpec if it is missing or not TOML."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidOrderSpec(f"order file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InvalidOrderSpec(f"order file {path} is not valid TOML: {err}") from None


def spec_from_table(table: dict[str, Any], *, buyer: str, now: int) -> OrderSpec:
    """An OrderSpec from the file's keys, which are OrderSpec's own field names (so a field the spec gains
    needs no change here), with three conveniences: `deadline_in` ("90m", "2h", "1d" or seconds) or
    `deadline` as a TOML datetime; prices as base units or "1.5 VERI"; and the buyer's address and the
    recipe's dataset digest filled in. An unknown key, a wrong type or a past deadline is InvalidOrderSpec."""
    from veritrain.datasets import load_dataset
    from veritrain.messages import OrderSpec
    from veritrain.recipes import get_recipe

    values = dict(table)
    _replication(values)
    values["deadline"] = _deadline(values, now)
    for name in MONEY_FIELDS:
        if name in values:
            values[name] = parse_amount(values[name], name)
    if "buyer" in values and str(values["buyer"]).lower() != buyer.lower():
        raise InvalidOrderSpec(f"the file names buyer {values['buyer']} but the key is {buyer}")
    values["buyer"] = buyer
    recipe = get_recipe(str(values.get("recipe", "")))  # UnknownRecipe before anything else is read
    values.setdefault("dataset_digest", "0x" + load_dataset(recipe.dataset).digest_hex)
    try:
        spec = OrderSpec.model_validate(values)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in err.errors())
        raise InvalidOrderSpec(f"invalid order: {problems}") from None
    if spec.total_steps % spec.unit_steps:
        raise InvalidOrderSpec(
            f"total_steps {spec.total_steps} is not a multiple of unit_steps {spec.unit_steps}"
        )
    return spec


def _replication(values: dict[str, Any]) -> None:
    """`replicas = "auto"`: adaptive replication with at most `max_replicas` (default 3) per unit."""
    if "max_replicas" in values and values.get("replicas") != "auto":
        raise InvalidOrderSpec("max_replicas goes with replicas = 'auto'; a fixed order gives replicas alone")
    if values.get("replicas") == "auto":
        values["replicas"] = values.pop("max_replicas", AUTO_MAX_REPLICAS)
        values["adaptive_replication"] = True


def _deadline(values: dict[str, Any], now: int) -> int:
    if "deadline_in" in values:
        if "deadline" in values:
            raise InvalidOrderSpec("give deadline or deadline_in, not both")
        raw = values.pop("deadline_in")
        match = _DURATION.match(raw) if isinstance(raw, str) else None
        if isinstance(raw, int) and not isinstance(raw, bool):
            seconds = raw
        elif match:
            seconds = int(match[1]) * _SECONDS[match[2]]
        else:
            raise InvalidOrderSpec(f"deadline_in {raw!r}: give seconds or a duration like '90m', '2h', '1d'")
        deadline = now + seconds
    elif isinstance(values.get("deadline"), dt.datetime):
        stamp = values["deadline"]
        if stamp.tzinfo is None:
            raise InvalidOrderSpec("deadline needs a time zone, e.g. 2026-12-01T12:00:00Z")
        deadline = int(stamp.timestamp())
    elif isinstance(values.get("deadline"), int):
        deadline = int(values["deadline"])
    else:
        raise InvalidOrderSpec("the order needs deadline_in (e.g. '2h') or deadline (a TOML datetime)")
    if deadline <= now:
        raise InvalidOrderSpec(f"deadline {deadline} is not after the chain's time {now}")
    return deadline


def parse_amount(value: Any, name: str) -> int:
    """Token base units from an integer or a "1.5 VERI" string; a fraction of a base unit is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _AMOUNT.match(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidOrderSpec(f"{name} {value!r}: give base units (an integer) or an amount like '1.5 VERI'")
    try:
        units = Decimal(match[1].replace("_", "")) * TOKEN
    except InvalidOperation:
        raise InvalidOrderSpec(f"{name} {value!r} is not a number") from None
    if units != units.to_integral_value():
        raise InvalidOrderSpec(f"{name} {value!r} is finer than one base unit (10^-18 VERI)")
    return int(units)


# --- escrow and posting ------------------------------------------------------------------------------


def escrow_for(spec: OrderSpec, settlement: Literal["units", "rounds"] | None = "units") -> EscrowPlan:
    """The escrow the market will require for this spec settled by `settlement` (None: the market's default
    for the spec; its own rule, market.domain.pricing)."""
    from market.domain.pricing import escrow_plan
    from veritrain.recipes import get_recipe

    return escrow_plan(spec, get_recipe(spec.recipe).flops_per_step(), settlement)


def check_funds(client: ChainClient, buyer: str, plan: EscrowPlan) -> None:
    """UnderfundedOrder unless the buyer's token balance covers the escrow (checked before any signature)."""
    balance = client.token_balance(buyer)
    if balance < plan.total:
        raise UnderfundedOrder(
            f"the escrow is {veri(plan.total)} but {buyer} holds {veri(balance)} on chain {client.chain_id}"
        )


@dataclass(frozen=True)
class PostedOrder:
    chain_order_id: int
    market_order_id: int
    posted_block: int
    escrow: int


def post_order(
    client: ChainClient,
    account: LocalAccount,
    spec: OrderSpec,
    plan: EscrowPlan,
    market_url: str,
    settlement: Literal["units", "rounds"] | None = None,
) -> PostedOrder:
    """Allow the JobMarket to pull the escrow by an ERC-2612 permit (no standing approval is left behind
    beyond this order), post the order on chain, then register its spec with the market (`settlement`: how
    the market settles it, per unit or by a roster, one step per round; None: the market's default)."""
    from veritrain.api_client import MarketClient
    from veritrain.messages import OrderRequest

    posted_block = int(client.w3.eth.block_number)
    market = client.deployment.job_market
    if client.allowance(account, market) < plan.total:
        permit = client.sign_permit(account, market, plan.total, client.deadline(PERMIT_TTL_S))
        client.relay_permit(account.address, market, plan.total, permit, relayer=account)
    chain_order_id, _ = client.post_order(
        account,
        spec.spec_hash(),
        plan.units,
        plan.replicas,
        plan.price_per_replica,
        plan.verifier_fee_per_unit,
        spec.deadline,
        min_replicas=plan.min_replicas,
        trusted_streak=plan.trusted_streak,
    )
    with MarketClient(market_url, timeout=30) as api:
        status = api.post_order(OrderRequest(spec=spec, chain_order_id=chain_order_id, settlement=settlement))
    return PostedOrder(chain_order_id, status.order_id, posted_block, plan.total)


def close_order(
    client: ChainClient, chain_order_id: int, account: LocalAccount, timeout_s: float, poll_s: float = 0.5
) -> int:
    """Close the order (the close pays the buyer what is left of its escrow: its credit only when the token
    refuses the transfer) and return the refund. A unit
    the market saw accepted may still be settling on chain, so UnitsStillOpen is retried until `timeout_s`."""
    from veritrain.chain.errors import UnitsStillOpen

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            receipt = client.close_order(chain_order_id, sender=account)
            return int(receipt.event("OrderClosed").args["refund"])
        except UnitsStillOpen:
            if time.monotonic() > deadline:
                raise
            time.sleep(poll_s)


# --- where an order's money went, from chain events -------------------------------------------------


@dataclass
class UnitOutcome:
    """One on-chain unit of the order, as the chain settled it."""

    chain_unit_id: int
    providers: list[str]
    verifiers: list[str]
    settlement: str = "open"
    outcomes: list[str] = field(default_factory=list)
    result_digests: dict[str, str] = field(default_factory=dict)
    slashed: dict[str, int] = field(default_factory=dict)
    # VerifierSlashed: verifiers whose own signature contradicted the unit's verdict, and the amount
    slashed_verifiers: dict[str, int] = field(default_factory=dict)
    signing_verifiers: list[str] = field(default_factory=list)
    finalized_digest: str | None = None  # the resultDigest the chain recorded on the fast path
    # replicas the verdict called fraud, held by the chain until the unit's truth is fixed (HeldSettled)
    held: list[int] = field(default_factory=list)
    round_unit: tuple[int, int] | None = None  # set aside by the round path: (round, unit of the round)

    @property
    def accepted(self) -> list[str]:
        return [p for p, o in zip(self.providers, self.outcomes, strict=False) if o == "accept"]


def order_money(events: list[Event], order_id: int) -> tuple[OrderMoney, list[UnitOutcome]]:
    """Where one order's escrow went, from its JobMarket events alone (no market database involved): the
    per-unit path's payouts (`UnitFinalized`, `VerdictRecorded`, `HeldSettled`) and, for a round-path
    order, what its roster's close paid (`roster_payouts`).

    A unit the round path set aside (`UnitSetAside`) gets only its replica 0's result digest here (the one
    `RoundRevealed` names for it); its other replicas' are on chain, not in events (`set_aside_digests`)."""
    deposit = refund = price = fee = verdict_fees = held_refunds = 0
    units: dict[int, UnitOutcome] = {}
    payouts: dict[str, int] = {}
    slashed: dict[str, int] = {}
    slashed_verifiers: dict[str, int] = {}
    reporters: set[str] = set()
    round_digests: dict[int, list[str]] = {}  # the round path: each revealed round's digests, by unit
    set_aside: dict[int, tuple[int, int]] = {}  # a set-aside unit's chain id -> (round, unit of the round)
    for event in events:
        args = event.args
        if event.name == "RoundRevealed" and int(args["orderId"]) == order_id:
            round_digests[int(args["round"])] = [_hex(digest) for digest in args["digests"]]
        elif event.name == "UnitSetAside" and int(args["orderId"]) == order_id:
            set_aside[int(args["unitId"])] = (int(args["round"]), int(args["unit"]))
        if event.name == "OrderPosted" and int(args["orderId"]) == order_id:
            deposit, price, fee = (
                int(args["escrow"]),
                int(args["pricePerReplica"]),
                int(args["verifierFeePerUnit"]),
            )
        elif event.name == "OrderClosed" and int(args["orderId"]) == order_id:
            refund = int(args["refund"])
        elif event.name == "UnitAssigned" and int(args["orderId"]) == order_id:
            unit_id = int(args["unitId"])
            units[unit_id] = UnitOutcome(unit_id, list(args["providers"]), list(args["verifiers"]))
        elif "unitId" in args and int(args["unitId"]) in units:
            unit = units[int(args["unitId"])]
            if event.name == "ReplicaRevealed":
                unit.result_digests[str(args["provider"])] = _hex(args["resultDigest"])
            elif event.name == "UnitFinalized":
                unit.settlement, unit.outcomes = "finalized (fast path)", ["accept"] * len(unit.providers)
                unit.finalized_digest = _hex(args["resultDigest"]) if "resultDigest" in args else None
                for provider in unit.providers:
                    payouts[provider] = payouts.get(provider, 0) + price
            elif event.name == "UnitExpired":
                unit.settlement, unit.outcomes = "expired", ["none"] * len(unit.providers)
            elif event.name in ("ReplicaSlashed", "RevealWithheld"):  # fraud, or a commit never revealed
                provider, amount = str(args["provider"]), int(args["amount"])
                unit.slashed[provider] = unit.slashed.get(provider, 0) + amount
                slashed[provider] = slashed.get(provider, 0) + amount
            elif event.name == "VerifierSlashed":
                verifier, amount = str(args["verifier"]), int(args["amount"])
                unit.slashed_verifiers[verifier] = amount
                slashed_verifiers[verifier] = slashed_verifiers.get(verifier, 0) + amount
                reporters.add(str(args["reporter"]))
            elif event.name == "VerdictRecorded":
                outcomes = [int(o) for o in args["outcomes"]]
                unit.settlement, unit.outcomes = "verdict", [OUTCOME_NAMES[o] for o in outcomes]
                unit.signing_verifiers = [str(v) for v in args["verifiers"]]
                verdict_fees += fee
                unit.held = [i for i, outcome in enumerate(outcomes) if outcome == FRAUD]
                for provider, outcome in zip(unit.providers, outcomes, strict=True):
                    if outcome == 0:
                        payouts[provider] = payouts.get(provider, 0) + price
            elif event.name == "HeldSettled":  # the truth settles the held replicas: paid, or refunded
                truth = [int(o) for o in args["truth"]]
                for i in unit.held:
                    unit.outcomes[i] = OUTCOME_NAMES[truth[i]]
                    if truth[i] == 0:
                        payouts[unit.providers[i]] = payouts.get(unit.providers[i], 0) + price
                    else:
                        held_refunds += price
                unit.held = []
    for unit_id, (round_index, index) in set_aside.items():
        # a unit the round path set aside was revealed by its round's step, not by ReplicaRevealed; the step
        # names one digest per unit, its replica 0's (a split unit's other replicas differ: set_aside_digests)
        found, digests = units.get(unit_id), round_digests.get(round_index, [])
        if found is not None and index < len(digests) and found.providers:
            found.round_unit = (round_index, index)
            found.result_digests.setdefault(found.providers[0], digests[index])
    closed = roster_payouts(events, order_id, price, fee)
    for provider, amount in closed.payouts.items():
        payouts[provider] = payouts.get(provider, 0) + amount
    money = OrderMoney(
        deposit=deposit,
        payouts=payouts,
        verdict_fees=verdict_fees,
        refund=refund,
        held_refunds=held_refunds,
        held_replicas=sum(len(u.held) for u in units.values()),
        slashed=slashed,
        slashed_verifiers=slashed_verifiers,
        reporters=frozenset(reporters),
        audit_fees=closed.audit_fees,
    )
    return money, [units[key] for key in sorted(units)]


@dataclass(frozen=True)
class RosterClose:
    """What a round-path order's `closeRoster` paid: per provider, and its roster verifiers' audit fees."""

    payouts: dict[str, int]
    audit_fees: int = 0


def roster_payouts(events: list[Event], order_id: int, price: int, fee: int) -> RosterClose:
    """What the roster of order `order_id` paid at its close (nothing before `RosterClosed`), recomputed
    from events as JobMarket `closeRoster` pays it, whether it credits or transfers: each provider its
    `price` for every replica slot it holds (`RosterOpened`'s providers, layout, replicas and unitsPerRound)
    in each of the `settledRounds` revealed rounds (`RosterClosed`), but the slots of units set aside
    (`UnitSetAside`, a verdict's or dropped unpaid); each roster verifier (`RosterVerifiers`) `fee` divided
    among them for every unit of a posted audit it signed that no challenge took back (the audit records:
    `RoundRevealed`'s `audited`, `AuditPosted`, `AuditChallenged`, `PendingSetAside`). The providers' sum
    must be the event's `paid`, else RosterMismatch (this reading of the contract is wrong)."""
    from veritrain.chain.client import audit_records_of

    mine = [e for e in events if "orderId" in e.args and int(e.args["orderId"]) == order_id]
    opened = [e.args for e in mine if e.name == "RosterOpened"]
    closing = [e.args for e in mine if e.name == "RosterClosed"]
    if not opened or not closing:
        return RosterClose({})
    roster, settled = opened[0], int(closing[0]["settledRounds"])
    providers, layout = [str(p) for p in roster["providers"]], int(roster["layout"])
    replicas, slots = int(roster["replicas"]), int(roster["unitsPerRound"]) * int(roster["replicas"])
    holder = [(layout >> (5 * slot)) & 31 for slot in range(slots)]
    counts = [0] * len(providers)
    for index in holder:
        counts[index] += settled
    for event in mine:
        if event.name == "UnitSetAside":
            unit = int(event.args["unit"])
            for slot in range(unit * replicas, (unit + 1) * replicas):
                counts[holder[slot]] -= 1
    payouts = {p: n * price for p, n in zip(providers, counts, strict=True) if n}
    if "paid" in closing[0] and sum(payouts.values()) != int(closing[0]["paid"]):
        raise RosterMismatch(
            f"order {order_id}: RosterClosed paid {closing[0]['paid']}, the roster's slots make "
            f"{sum(payouts.values())}"
        )
    verifiers = next((len(e.args["verifiers"]) for e in mine if e.name == "RosterVerifiers"), 0)
    audit_fees = units = 0
    for record in audit_records_of(mine) if verifiers else []:
        if not record.posting:
            units += bin(record.units & ~record.challenged).count("1")
            continue
        signers = bin(record.signers & (2**verifiers - 1)).count("1")
        audit_fees += signers * units * (fee // verifiers)
        units = 0
    return RosterClose(payouts, audit_fees)


def set_aside_digests(client: ChainClient, units: list[UnitOutcome]) -> None:
    """Fill in each revealed replica's own result digest of the units the round path set aside, from the
    chain's state of the unit (`order_money` has only replica 0's from `RoundRevealed`: a split unit's
    replicas revealed different results, each checked by the step against its slot's commitment)."""
    for unit in units:
        if unit.round_unit is None:
            continue
        for index, provider in enumerate(unit.providers):
            replica = client.replica(unit.chain_unit_id, index)
            if replica.revealed:
                unit.result_digests[provider] = "0x" + replica.commitment_or_digest.hex()
            else:
                unit.result_digests.pop(provider, None)  # its commitment, not a result


def _hex(value: Any) -> str:
    return "0x" + bytes(value).hex() if isinstance(value, bytes | bytearray) else str(value)


# --- the verified result over libp2p ---------------------------------------------------------------


@dataclass
class TrainingResult:
    """The verified training: per accepted training unit its losses (in training order; `round_boundaries`:
    where each unit starts, on the round path where each round starts, the first left out), and the final
    state's model weights."""

    losses: list[float]
    round_boundaries: list[int]
    final_state_digest: str
    weights_path: Path


def collect_training(
    plane: BlobPlane,
    units: list[UnitOutcome],
    peers: dict[str, str],
    out: Path,
    *,
    recipe: str,
    final_digest: str,
    aggregates: frozenset[int] = frozenset(),
    final: FinalState | None = None,
    round_units: Sequence[AcceptedUnit] | None = None,
) -> TrainingResult:
    """Fetch each accepted training unit's PoL manifest from a provider the chain accepted (`peers`:
    address → libp2p address), each checked against the result digest the chain settled, then the order's
    final state `final_digest` (the market's word), and write the model's weights as safetensors at `out`.

    M = 1 (no `aggregates`, the chain unit ids of DiLoCo aggregate units): the final state must be the one
    the last accepted unit's chain-verified manifest names. M > 1: the last unit the chain accepted must be
    an aggregate; its output is taken by `final_digest`, which the fetched bytes must hash to (the buyer does
    not re-derive the aggregate's result digest from the round's inputs yet). A round-path order has no
    final aggregate unit: `final` is the buyer's own last outer step (`final_outer_step`), taken as is, and
    its losses are those of `round_units` (`round_path_units`: every training unit the chain accepted, the
    roster's unanimous units included, which have no chain unit in `units`), not of `units`. Every manifest's
    losses must hash to the PoL root its result digest binds (`_opening_problem`)."""
    from safetensors.torch import save_file

    from veritrain.agentkit import decode_state

    losses: list[float] = []
    boundaries: list[int] = []
    last_manifest: UnitManifest | None = None
    last: UnitOutcome | None = None
    if round_units is not None:
        losses, boundaries = _round_path_losses(plane, round_units, peers)
    else:
        for unit in units:
            if not unit.accepted:
                continue
            last = unit
            if unit.chain_unit_id in aggregates:
                continue
            last_manifest = _fetch_manifest(plane, unit, peers)
            boundaries.append(len(losses))
            losses.extend(float(loss) for loss in last_manifest.transcript["losses"])
        boundaries = boundaries[1:]
    if final is not None:
        state, final_digest = final.state, final.digest
    else:
        if last is None or last_manifest is None:
            raise DigestMismatch("no training unit of the order was accepted on chain: no verified result")
        if not aggregates and last_manifest.state_digest != final_digest:
            raise DigestMismatch(
                f"the market names final state {final_digest}; the chain-verified last unit made "
                f"{last_manifest.state_digest}"
            )
        if aggregates and last.chain_unit_id not in aggregates:
            raise DigestMismatch(
                f"the last unit the chain accepted ({last.chain_unit_id}) is not an aggregate"
            )
        holders = [peers[p] for p in last.accepted if p in peers]
        holders += [address for address in peers.values() if address not in holders]
        state = decode_state(
            plane.fetch_any(holders, final_digest.removeprefix("0x"))
        )  # blob address = digest
    weights = {
        name.removeprefix("model."): tensor.contiguous()
        for name, tensor in state.items()
        if name.startswith("model.")
    }
    save_file(weights, str(out), metadata={"state_digest": final_digest, "recipe": recipe})
    return TrainingResult(losses, boundaries, final_digest, out)


def _round_path_losses(
    plane: BlobPlane, round_units: Sequence[AcceptedUnit], peers: dict[str, str]
) -> tuple[list[float], list[int]]:
    """A round-path order's losses, unit after unit in training order, each from a manifest that opens the
    result digest the chain accepted for it (asked first of the providers that worked it, then of the other
    peers: the digest, not the peer, makes it the unit's), and where each round after the first starts."""
    losses: list[float] = []
    boundaries: list[int] = []
    for index, unit in enumerate(round_units):
        if index and unit.round_index != round_units[index - 1].round_index:
            boundaries.append(len(losses))
        holders = [peers[p] for p in unit.providers if p in peers]
        holders += [address for address in peers.values() if address not in holders]
        try:
            manifest = _manifest_of(plane, holders, unit.result_digest)
        except DigestMismatch as err:
            raise DigestMismatch(f"round {unit.round_index}, shard {unit.shard}: {err}") from None
        losses.extend(float(loss) for loss in manifest.transcript["losses"])
    return losses, boundaries


@dataclass(frozen=True)
class FinalState:
    """A round-path order's final state, computed by the buyer (`final_outer_step`)."""

    digest: str
    state: State


def round_path_final(
    plane: BlobPlane,
    peers: dict[str, str],
    status: OrderStatus,
    events: list[Event],
    round_units: Sequence[AcceptedUnit] | None,
) -> FinalState | None:
    """A round-path order's final state, run by the buyer (`final_outer_step`) from the chain's `events`
    over the last round's units of `round_units` (what `round_path_units` found: the chain is read once);
    None for an order that ends with an aggregate unit (per unit, or M = 1:
    `market.domain.rounds.final_aggregate`), for which `round_path_units` finds None too."""
    spec = _round_path_spec(status)
    if spec is None or round_units is None:
        return None
    last = spec.rounds - 1
    found = {unit.shard: unit for unit in round_units if unit.round_index == last}
    accepted = [found.get(shard) for shard in range(spec.shards)]
    return final_outer_step(plane, peers, spec, status.chain_order_id, events, accepted)


def round_path_units(
    client: ChainClient, status: OrderStatus, units: list[UnitOutcome], events: list[Event]
) -> list[AcceptedUnit] | None:
    """Every training unit the chain accepted for a round-path order, round by round and shard by shard
    (`accepted_round_results`; a shard left out has none): what its loss curve is made of, the units its
    rounds' steps paid included (they have no chain unit of their own, so `units` lacks them); of an order
    whose roster failed, its per-unit chain units. None for an order that ends with an aggregate unit,
    whose units are all chain units (`collect_training` reads them)."""
    spec = _round_path_spec(status)
    if spec is None:
        return None
    on_roster = _on_roster(status)
    return [
        unit
        for round_index in range(spec.rounds)
        for unit in accepted_round_results(
            client, events, units, status.chain_order_id, round_index, spec, on_roster=on_roster
        )
        if unit is not None
    ]


def _round_path_spec(status: OrderStatus) -> OrderSpec | None:
    """The spec of an order the round path settles with no aggregate unit after its last round, else None.
    An order whose roster failed is one too: the market settles every order that has a roster, failed or
    not, by `final_aggregate(spec, rounds_path=True)` (market/orders.py), so none of them has a final
    aggregate unit, and the buyer runs that outer step (over per-unit units: `_on_roster`)."""
    from market.domain.rounds import final_aggregate

    spec = status.spec
    if status.roster is None or spec is None or spec.shards < 2 or final_aggregate(spec, rounds_path=True):
        return None
    return spec


def _on_roster(status: OrderStatus) -> bool:
    """Whether the order's units ran on its roster: not when the roster failed before it opened
    (market/rosters.py `fall_back`: nothing of it reached the chain, every unit ran on the per-unit path).
    The market's "failed" is its word; `accepted_round_results` checks it against the chain's events."""
    return status.roster is None or status.roster.state != "failed"


def final_outer_step(
    plane: BlobPlane,
    peers: dict[str, str],
    spec: OrderSpec,
    chain_order_id: int,
    events: list[Event],
    accepted: Sequence[AcceptedUnit | None],
) -> FinalState:
    """The last outer step of a folded order settled on the round path, which escrows no aggregate unit for
    it (market.domain.rounds `final_aggregate`): `diloco.aggregate` over the last round's state and each
    shard's accepted result, as that unit would have run it (bitwise: the outer step is deterministic).

    Nothing is the market's word: `spec` must be the escrowed one (its hash on chain), each shard's result
    (`accepted`, per shard of the last round: `accepted_round_results`) is one the chain accepted, its
    manifest must hash to that digest and its state to the manifest's state digest, and the round's state
    is the one every last-round result binds (its fold), or for a one-round order the spec's genesis."""
    from veritrain.diloco import AggregateInputs, aggregate, order_genesis
    from veritrain.recipes import get_recipe

    posted = [
        _hex(e.args["specHash"]).lower()
        for e in events
        if e.name == "OrderPosted" and int(e.args["orderId"]) == chain_order_id
    ]
    if posted != [spec.spec_hash()]:
        raise DigestMismatch(f"order {chain_order_id} on chain does not escrow this spec")
    last = spec.rounds - 1
    if len(accepted) != spec.shards or any(a is not None and a.round_index != last for a in accepted):
        raise ValueError(f"the outer step takes one result per shard of round {last}")
    everyone = list(peers.values())
    manifests = [None if a is None else _manifest_of(plane, everyone, a.result_digest) for a in accepted]
    results = tuple(
        None if m is None else _verified_state(plane, everyone, m.state_digest) for m in manifests
    )
    if last == 0:
        round_state = order_genesis(get_recipe(spec.recipe), spec.seed, spec.shards)
    else:
        bound = {m.round_state_digest for m in manifests if m is not None}
        if len(bound) != 1 or None in bound:
            raise DigestMismatch(
                f"the last round's accepted results bind round states {sorted(map(str, bound))}"
            )
        round_state = _verified_state(plane, everyone, str(bound.pop()))
    step = aggregate(AggregateInputs(last, round_state, results, spec.outer_config()))
    return FinalState("0x" + step.output_digest.hex(), step.output_state)


@dataclass(frozen=True)
class AcceptedUnit:
    """A training unit (round, shard) of a round-path order as the chain accepted it: the result digests of
    its accepted replicas, in replica order, and the providers that worked it (its accepted replicas' for a
    chain unit, the roster's slots of the unit for one its round's step paid)."""

    round_index: int
    shard: int
    digests: tuple[str, ...]
    providers: tuple[str, ...]

    @property
    def result_digest(self) -> str:
        """The result the next round (or the final outer step) took: the most accepted one."""
        return _majority(list(self.digests))


def accepted_round_results(
    client: ChainClient,
    events: list[Event],
    units: list[UnitOutcome],
    chain_order_id: int,
    round_index: int,
    spec: OrderSpec,
    *,
    on_roster: bool = True,
) -> list[AcceptedUnit | None]:
    """Per shard of a round-path order's round, what the chain accepted (None: no accepted result, a shard
    left out under the quorum or dropped): a retry's on the per-unit path if one was accepted (known by its
    unit key), else a unit the step set aside, by its verdict, else the digest `RoundRevealed` names (every
    replica's: the unit was unanimous, and a closed roster has no audit pending), worked by the slots
    `RosterOpened` gave the unit. DigestMismatch unless the roster is closed with the round revealed.

    `on_roster` False: the order's roster failed before it opened (market/rosters.py `fall_back`), so every
    unit ran on the per-unit path: a shard's result is its latest accepted attempt's, attempt 0 included,
    and no roster is read (DigestMismatch if the chain's events say one opened)."""
    from market.orders import unit_key_for

    if on_roster:
        info = client.get_roster(chain_order_id)
        if not info.closed or info.committed <= round_index:
            raise DigestMismatch(
                f"order {chain_order_id}'s roster is not closed with round {round_index} revealed"
            )
    revealed: list[str] | None = None
    set_aside: dict[int, int] = {}  # unit of the round -> its chain unit id
    keys: dict[str, int] = {}  # unit key -> chain unit id, of the order's per-unit units
    roster: dict[str, Any] | None = None
    for event in events:
        args = event.args
        if int(args.get("orderId", -1)) != chain_order_id:
            continue
        if event.name == "RosterOpened":
            roster = dict(args)
        elif event.name == "RoundRevealed" and int(args["round"]) == round_index:
            revealed = [_hex(digest) for digest in args["digests"]]
        elif event.name == "UnitSetAside" and int(args["round"]) == round_index:
            set_aside[int(args["unit"])] = int(args["unitId"])
        elif event.name == "UnitAssigned":
            keys[_hex(args["unitKey"])] = int(args["unitId"])
    if not on_roster:
        if roster is not None:
            raise DigestMismatch(f"order {chain_order_id}'s roster opened on chain: it did not fail")
    elif revealed is None or roster is None:
        raise DigestMismatch(
            f"no RosterOpened and RoundRevealed for round {round_index} of order {chain_order_id}"
        )
    outcomes = {unit.chain_unit_id: unit for unit in units}
    found: list[AcceptedUnit | None] = []
    for shard in range(spec.shards):
        # a per-unit retry's attempt is 1, 2, ... (latest first); without a roster attempt 0 is a chain unit
        attempts = range(len(keys), 0 if on_roster else -1, -1)
        chain_units = [
            keys[k] for a in attempts if (k := unit_key_for(chain_order_id, round_index, shard, a)) in keys
        ]
        if shard in set_aside:
            chain_units.append(set_aside[shard])
        accepted_unit: AcceptedUnit | None = None
        if not chain_units and roster is not None and revealed is not None:
            replicas, layout = int(roster["replicas"]), int(roster["layout"])
            slots = range(shard * replicas, (shard + 1) * replicas)
            workers = tuple(str(roster["providers"][(layout >> (5 * slot)) & 31]) for slot in slots)
            accepted_unit = AcceptedUnit(round_index, shard, (revealed[shard],) * replicas, workers)
        for unit_id in chain_units:
            outcome = outcomes.get(unit_id)
            accepted = [i for i, o in enumerate(outcome.outcomes if outcome else []) if o == "accept"]
            if outcome is not None and accepted:
                digests = ["0x" + client.replica(unit_id, i).commitment_or_digest.hex() for i in accepted]
                workers = tuple(outcome.providers[i] for i in accepted)
                accepted_unit = AcceptedUnit(round_index, shard, tuple(digests), workers)
                break
        found.append(accepted_unit)
    return found


def _majority(digests: list[str]) -> str:
    """The most accepted result, ties broken by replica order (the market's `next_state` rule)."""
    return max(digests, key=lambda d: (digests.count(d), -digests.index(d)))


def _manifest_of(plane: BlobPlane, peers: list[str], result_digest: str) -> UnitManifest:
    """A manifest that hashes to `result_digest` (its result digest recomputed from what it opens)."""
    from veritrain.agentkit import UnitManifest

    errors = []
    for peer in peers:
        try:
            manifest = UnitManifest.from_bytes(plane.fetch(peer, plane.lookup_manifest(peer, result_digest)))
        except (VeritrainError, ValueError) as err:
            errors.append(f"{peer}: {type(err).__name__}: {err}")
            continue
        problem = _opening_problem(manifest, result_digest)
        if problem is None:
            return manifest
        errors.append(f"{peer}: {problem}")
    raise DigestMismatch(f"no peer served a manifest of result {result_digest}: {errors}")


def _opening_problem(manifest: UnitManifest, result_digest: str) -> str | None:
    """Why `manifest` does not open `result_digest`, or None when it does: its state digest, PoL root (and a
    folded unit's outer step) hash to that digest, and its transcript, losses included, hashes to that root
    and ends at that state (the digest binds the root alone: without this the losses are the peer's word)."""
    from veritrain.agentkit import unhex32
    from veritrain.pol import Transcript

    try:
        if not manifest.result_digest == result_digest == manifest.opened_result_digest():
            return f"its manifest does not hash to the result digest {result_digest}"
        transcript = Transcript.from_json(manifest.transcript)
        root, state = unhex32(manifest.transcript_root), unhex32(manifest.state_digest)
    except VeritrainError as err:
        return f"its manifest is malformed: {type(err).__name__}: {err}"
    if transcript.merkle_root() != root:
        return f"its transcript (losses included) does not hash to the PoL root of {result_digest}"
    if transcript.final_digest != state:
        return f"its transcript does not end at the state of {result_digest}"
    return None


def _verified_state(plane: BlobPlane, peers: list[str], digest: str) -> State:
    """The state whose digest is `digest`, from any peer (its bytes checked by that digest)."""
    from veritrain.agentkit import decode_state
    from veritrain.pol import state_digest

    state = decode_state(plane.fetch_any(peers, digest.removeprefix("0x")))
    if state_digest(state).hex() != digest.removeprefix("0x").lower():
        raise DigestMismatch(f"a peer served a state that is not {digest}")
    return state


def _fetch_manifest(plane: BlobPlane, unit: UnitOutcome, peers: dict[str, str]) -> UnitManifest:
    """The manifest of an accepted replica whose result digest is the one revealed on chain and is
    sha256(domain, its state digest, its PoL root) (and a folded unit's outer step), its transcript hashing
    to that root (`_opening_problem`): a peer cannot hand us another state or other losses."""
    from veritrain.agentkit import UnitManifest

    errors = []
    for provider in unit.accepted:
        try:
            onchain = unit.result_digests[provider]
            peer = peers[provider]
            manifest = UnitManifest.from_bytes(plane.fetch(peer, plane.lookup_manifest(peer, onchain)))
            problem = _opening_problem(manifest, onchain)
        except (VeritrainError, KeyError, ValueError) as err:
            errors.append(f"{provider}: {type(err).__name__}: {err}")
            continue
        if problem is None:
            return manifest
        errors.append(f"{provider}: {problem} (on chain)")
    raise DigestMismatch(
        f"unit {unit.chain_unit_id}: no accepted replica served a verified manifest: {errors}"
    )
