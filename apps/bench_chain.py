"""`veritrain bench chain`: the contract figures of :mod:`veritrain.chain.bench` (hand-written flows, kept as
references) and, beside them, gas per settled unit on the path the market takes by default, measured by
driving the market's own code.

Why here: the kernel's bench cannot import the market (import layers). The market-path figures run whole
orders through :class:`market.service.MarketService` on freshly deployed contracts (the in-process EVM, or
``--rpc``): a buyer posts an M = 8 order of R = 10 folded rounds without naming a settlement, so the market
picks its default (the round path for such an order, ``settlement_of``); simulated honest providers answer
their heartbeats' assignments as the node agent does (the roster's Accept, one RoundCommit a round over its
slots' commitments and each slot's opening; Accept, commit and reveal for a unit on the per-unit path, such
as a retry); simulated verifiers pull their jobs as the verifier agent does and sign accepting verdicts; the
worker's passes (sweep, roster outbox, per-unit outbox, chain sync, matching, advancing) run until the order
completes (with its last round: the buyer runs the last outer step itself, so the order escrows and runs no
aggregate unit); the buyer closes it (the roster's close paid its providers and verifiers, the order's close
pays the buyer) and every party with a credit left withdraws it. Every transaction sent to the
market's contracts in between is counted (the buyer's token approval is not, as in the hand-written
flows), divided by the R x M shard units trained.

What the market does with a drawn unit is the market's: the bench only answers what the agents are handed.
A roster opens with verifiers, who audit its rounds' drawn unanimous units: the simulated verifiers answer
each round audit as the verifier agent does (`verifier.round_audit.signed_audit`: the records recomputed
from chain state, then signed), the per-unit re-execution replaced by the accepting judgement they give
verdicts; a unit the chain sets aside (split, a weak provider) settles by its own verdict. A verifier job
the bench cannot sign stops it with a typed error, rather than measuring a path nobody takes.

Audit draws come from block hashes the bench cannot choose, so each k is measured twice: with no unit drawn
(the floor: the market's round path alone) and at the deployed default audit rates (one run; its drawn
units are reported beside the number expected). Probation is off, standing for providers past it, as in
the hand-written flows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from veritrain.chain import bench as chain_bench
from veritrain.chain.errors import ChainError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount
    from eth_typing import ABIFunction

    from apps.protocol_harness import ChainMarket
    from veritrain.chain.backends import Backend
    from veritrain.messages import Assignment, VerificationJobView

SHARDS = chain_bench.DILOCO_SHARDS
ROUNDS = 10
PROVIDERS = 3
VERIFIERS = 2
TOKEN = 10**18
STAKE = 1500 * TOKEN  # a roster locks one provider collateral per slot it holds: 8 at k = 3, M = 8
SALT = "0x" + "5b" * 32
REASONS = "0x" + "00" * 32
MAX_PASSES = 400  # worker passes before the bench gives up on an order (a bug, not a figure)
STALL_PASSES = 3  # passes without progress before the clock is moved on, as a waiting market would see


def configure(parser: argparse.ArgumentParser) -> None:
    chain_bench.configure(parser)
    parser.add_argument(
        "--market-path-floor",
        action="store_true",
        help="also run the market-path orders with no unit drawn (audit rates 0): the round path's floor "
        "(about a minute more)",
    )


def run(args: argparse.Namespace) -> int:
    from veritrain.chain.backends import open_backend

    with open_backend(args.rpc, in_process=not args.rpc) as backend:
        report = chain_bench.measure(backend)
        report.update(market_path_report(backend, floor=args.market_path_floor))
    print(chain_bench.format_table(report))
    print(format_market_path(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def market_path_report(backend: Backend, floor: bool = False) -> dict[str, Any]:
    """The market-driven figures, k = 3 and k = 1, at the default audit rates (and with no draw when
    `floor`); the headline `gas_per_settled_unit_market_path` is k = 3 at the default rates."""
    from veritrain.chain.deployment import MarketParams

    defaults = MarketParams()
    orders: dict[str, Any] = {}
    settings = [("default_rates", defaults.spot_check_ppm, defaults.solo_spot_check_ppm)]
    if floor:
        settings.insert(0, ("no_draw", 0, 0))
    for label, spot, solo in settings:
        with market_on(backend, spot, solo) as market:
            _run_order(market, 3, rounds=1)  # warm-up: the parties' storage slots exist, as on a live market
            for k in (3, 1):
                orders[f"k{k}_m{SHARDS}_r{ROUNDS}_{label}"] = _run_order(market, k, ROUNDS)
    k3, k1 = (orders[f"k{k}_m{SHARDS}_r{ROUNDS}_default_rates"] for k in (3, 1))
    return {
        "gas_per_settled_unit_market_path": k3["per_shard_unit"],
        "gas_per_settled_unit_market_path_k3_m8": k3["per_shard_unit"],
        "gas_per_settled_unit_market_path_k1_m8": k1["per_shard_unit"],
        **{
            f"gas_per_settled_unit_market_path_k{o['replicas']}_m8_no_draw": o["per_shard_unit"]
            for name, o in orders.items()
            if name.endswith("no_draw")
        },
        "market_path_orders": orders,
        "market_path_note": (
            f"whole orders through the market's code (MarketService: RosterBook, RosterOutbox, the per-unit "
            f"outbox), M = {SHARDS}, R = {ROUNDS}, folded, settlement left to the market; every transaction "
            "to the market's contracts from postOrder to the last withdrawal / shard units; default_rates: "
            "the deployed spotCheckPpm / soloSpotCheckPpm, one run (draws by block hash: see drawn_units); "
            "no_draw (--market-path-floor): rates 0"
        ),
    }


def format_market_path(report: dict[str, Any]) -> str:
    rows = ["the market's default path, driven through the market's code, per shard unit:"]
    for name, order in report["market_path_orders"].items():
        rows.append(
            f"  {name:<28}{order['per_shard_unit']:>12,}   ({order['transactions']} transactions; "
            f"{order['drawn_units']} units drawn, {order['expected_drawn_units']:g} expected; "
            f"settlement {order['settlement']})"
        )
    for k, target in ((3, chain_bench.GAS_TARGET_K3_M8), (1, chain_bench.GAS_TARGET_K1_M8)):
        measured = report[f"gas_per_settled_unit_market_path_k{k}_m8"]
        verdict = "within" if measured <= target else "OVER"
        rows.append(
            f"issue 9 target at k = {k}, M = 8, market path: {target:,}: {verdict} ({measured / target:.1%})"
        )
    return "\n".join(rows)


@contextmanager
def market_on(backend: Backend, spot_check_ppm: int, solo_spot_check_ppm: int) -> Iterator[ChainMarket]:
    """The market service on contracts freshly deployed at these audit rates (probation off), with
    PROVIDERS providers and VERIFIERS verifiers funded and staked, its store a SQLite file."""
    from apps.protocol_harness import ChainMarket
    from market.store import MarketStore
    from veritrain.chain.client import ChainClient
    from veritrain.chain.deployment import MarketParams

    accounts = backend.dev_accounts(2 + PROVIDERS + VERIFIERS)
    params = MarketParams(
        min_verifiers=VERIFIERS,
        spot_check_ppm=spot_check_ppm,
        solo_spot_check_ppm=solo_spot_check_ppm,
        probation_streak=0,
    )
    client = ChainClient.deploy(backend, accounts[0], params=params)
    buyer, agents = accounts[1], accounts[2:]
    client.mint(buyer, 100_000 * TOKEN)
    client.approve(buyer, client.deployment.job_market, 2**256 - 1)
    for agent in agents:
        client.mint(agent, STAKE)
        client.approve(agent, client.deployment.stake_manager, STAKE)
        client.stake(agent, STAKE)
    with tempfile.TemporaryDirectory(prefix="veritrain-bench-chain-") as tmp:
        store = MarketStore(f"sqlite:///{Path(tmp) / 'market.sqlite3'}")
        store.create_schema()
        try:
            yield ChainMarket(
                client, store, buyer, list(agents[:PROVIDERS]), list(agents[PROVIDERS:]), verifiers_per_unit=2
            )
        finally:
            store.dispose()


def _run_order(market: ChainMarket, replicas: int, rounds: int) -> dict[str, Any]:
    """One folded M = 8 order of `rounds` rounds through the market until the buyer and every party have
    withdrawn; its gas per shard unit and what it sent."""
    from market.domain.rosters import settlement_of
    from veritrain.messages import OrderSpec

    client = market.client
    first_block = client.w3.eth.block_number + 1
    order_id = market.post_order(rounds=rounds, shards=SHARDS, outer_step="folded", replicas=replicas)
    with market.store.transaction() as session:
        order = market.store.get_order(session, order_id)
        spec, chain_order = OrderSpec.from_stored(order.spec_json), order.chain_order_id
    agents = _Agents(market)
    passes = 0
    while not _completed(market, order_id):
        passes += 1
        if passes > MAX_PASSES:
            raise ChainError(f"bench: order {order_id} did not complete in {MAX_PASSES} worker passes")
        progressed = agents.step()
        progressed += _worker_pass(market)
        agents.stalled = 0 if progressed else agents.stalled + 1
        if agents.stalled >= STALL_PASSES:  # nothing to do but wait: let the chain's clock move on
            client.advance_time(client.params.verdict_window + 1)
            agents.stalled = 0
    _close_and_withdraw(market, chain_order)
    gas = _gas_since(market, first_block)
    shard_units = rounds * SHARDS
    params = client.params
    rate = params.solo_spot_check_ppm if replicas == 1 else params.spot_check_ppm
    return {
        "replicas": replicas,
        "rounds": rounds,
        "shard_units": shard_units,
        "settlement": settlement_of(spec, None),
        "passes": passes,
        "transactions": sum(count for count, _ in gas.values()),
        "gas_by_action": {name: used for name, (_, used) in sorted(gas.items())},
        "count_by_action": {name: count for name, (count, _) in sorted(gas.items())},
        "drawn_units": agents.drawn_units(),
        "expected_drawn_units": shard_units * rate / 1_000_000,
        "per_shard_unit": sum(used for _, used in gas.values()) // shard_units,
    }


def _completed(market: ChainMarket, order_id: int) -> bool:
    status = market.service.orders.order_status(order_id)
    roster_done = status.roster is None or status.roster.state == "closed"
    return status.state == "completed" and roster_done


def _worker_pass(market: ChainMarket) -> int:
    """One pass of the market's worker (market/tasks.py `tick`, in order): what landed on chain."""
    service = market.service
    service.agents.sweep()
    service.sync.sync_chain_events()
    service.matching.match_pending()
    service.orders.advance_orders()
    sent = len(market.send_outbox())
    sent += service.roster_outbox.run()
    service.sync.sync_chain_events()
    service.orders.advance_orders()
    return sent


def _close_and_withdraw(market: ChainMarket, chain_order: int) -> None:
    """The buyer closes the order (which pays it its leftover escrow); every party with a credit left (a
    set-aside unit's verdict credits its verifiers; a close credits a party the token refuses) withdraws it,
    once, as at the end of an order: none is sent for nothing."""
    client = market.client
    market.send_outbox()
    client.close_order(chain_order, sender=market.buyer)
    for party in [market.buyer, *market.providers, *market.verifiers]:
        if client.credits(party.address):
            client.withdraw_credit(party)


def _gas_since(market: ChainMarket, first_block: int) -> dict[str, tuple[int, int]]:
    """(count, gas) per action of every transaction sent to the market's contracts since `first_block`
    (the token's are left out: the buyer's approval of the escrow)."""
    from eth_utils import function_abi_to_4byte_selector

    client = market.client
    deployment = client.deployment
    targets = {
        a.lower() for a in (deployment.job_market, deployment.stake_manager, deployment.verdict_appeals)
    }
    names = {
        function_abi_to_4byte_selector(cast("ABIFunction", item)): item["name"]
        for data in client.contracts.values()
        for item in data.abi
        if item.get("type") == "function"
    }
    totals: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for number in range(first_block, client.w3.eth.block_number + 1):
        block = client.w3.eth.get_block(number, full_transactions=True)
        for raw in block["transactions"]:
            tx = cast("dict[str, Any]", raw)  # full transactions: mappings, not hashes
            if tx.get("to") is None or tx["to"].lower() not in targets:
                continue
            data = bytes(tx.get("input", tx.get("data", b"")))  # eth-tester names the calldata "data"
            name = names.get(data[:4], "0x" + data[:4].hex())
            totals[name] += int(client.w3.eth.get_transaction_receipt(tx["hash"])["gasUsed"])
            counts[name] += 1
    return {name: (counts[name], totals[name]) for name in totals}


def _h(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).hexdigest()


@dataclass
class _Agents:
    """Honest providers and verifiers answering what the market hands them, as node/agent.py and
    verifier/agent.py do (signatures and submissions; the training itself is a digest per unit, the same
    for every replica)."""

    market: ChainMarket
    stalled: int = 0
    accepted_rosters: set[tuple[str, str]] = field(default_factory=set)
    done: set[tuple[str, int, int, str]] = field(default_factory=set)
    # a roster provider's commitments of a round, held until it has one for every slot it holds in the round
    round_works: dict[tuple[str, int, int], dict[int, str]] = field(default_factory=dict)
    verdicts: set[tuple[str, int]] = field(default_factory=set)
    drawn: set[int] = field(default_factory=set)

    def step(self) -> int:
        """Every provider's heartbeat answered, then every verifier's jobs; how many submissions."""
        submitted = 0
        for provider in self.market.providers:
            for work in self._heartbeat(provider):
                submitted += self._answer(provider, work)
        for verifier in self.market.verifiers:
            submitted += self._judge(verifier)
        return submitted

    def drawn_units(self) -> int:
        """Units the verifiers were asked to judge (audited in a round, set aside by the chain, or drawn per
        unit)."""
        return len(self.drawn)

    def _heartbeat(self, account: LocalAccount) -> list[Assignment]:
        from veritrain.messages import Heartbeat, sign_message

        market = self.market
        beat = Heartbeat(agent=account.address, nonce=next(market.nonces), timestamp=market.now())
        reply = market.service.agents.heartbeat(sign_message(beat, account.key, market.client.chain_id))
        return list(reply.assignments)

    def _answer(self, provider: LocalAccount, work: Assignment) -> int:
        from veritrain.messages import AssignmentPhase

        key = (provider.address, work.unit_id, work.replica_index, str(work.phase))
        if work.phase == AssignmentPhase.DONE or key in self.done:
            return 0
        if work.phase == AssignmentPhase.ACCEPT:
            return self._accept(provider, work)
        self.done.add(key)
        if work.phase == AssignmentPhase.RUN:
            return self._commit(provider, work)
        return self._reveal(provider, work)

    def _accept(self, provider: LocalAccount, work: Assignment) -> int:
        from veritrain.messages import AcceptSubmission

        market = self.market
        if work.settlement == "rounds":
            roster = (provider.address, work.unit_key)
            if roster in self.accepted_rosters:  # one Accept covers every slot of the roster
                return 0
            self.accepted_rosters.add(roster)
        signed = market.client.sign_accept(provider, work.chain_order_id, work.unit_key, work.accept_deadline)
        signature = "0x" + signed.signature.hex()
        if work.settlement == "rounds":
            market.service.rosters.accept(
                work.order_id, provider.address, signed.nonce, work.accept_deadline, signature
            )
        else:
            self.done.add((provider.address, work.unit_id, work.replica_index, str(work.phase)))
            market.service.assignments.accept(
                AcceptSubmission(
                    unit_id=work.unit_id,
                    provider=provider.address,
                    nonce=signed.nonce,
                    deadline=work.accept_deadline,
                    signature=signature,
                )
            )
        return 1

    def _commit(self, provider: LocalAccount, work: Assignment) -> int:
        from veritrain.messages import CommitSubmission

        market, client = self.market, self.market.client
        if work.chain_unit_id is None or work.commit_deadline is None:
            raise ChainError(f"bench: unit {work.unit_id} is to run without its chain unit or deadline")
        result = _result(work)["result_digest"]
        commitment = client.commitment(result, SALT, provider.address, work.chain_unit_id)
        if work.settlement == "rounds":  # one RoundCommit once every slot of ours in the round has run
            held = self.round_works.setdefault((provider.address, work.order_id, work.round_index), {})
            held[work.shard] = "0x" + commitment.hex()
            units = work.round_units or (work.shard,)
            if any(unit not in held for unit in units):
                return 0
            commitments = [held[unit] for unit in units]
            signature = client.round_commit_signature(
                provider, work.chain_order_id, work.round_index, commitments, work.commit_deadline
            )
            market.service.rosters.submit_work(
                work.order_id, provider.address, work.round_index, commitments, "0x" + signature.hex()
            )
        else:
            signed = client.sign_unit_commit(provider, work.chain_unit_id, commitment, work.commit_deadline)
            market.service.assignments.commit(
                CommitSubmission(
                    unit_id=work.unit_id,
                    provider=provider.address,
                    commitment="0x" + commitment.hex(),
                    deadline=work.commit_deadline,
                    signature="0x" + signed.signature.hex(),
                )
            )
        return 1

    def _reveal(self, provider: LocalAccount, work: Assignment) -> int:
        from veritrain.messages import RevealSubmission, RosterOpeningSubmission

        result = _result(work)
        if work.settlement == "rounds":
            self.market.service.rosters.open_slot(
                RosterOpeningSubmission(
                    order_id=work.order_id,
                    provider=provider.address,
                    round_index=work.round_index,
                    unit=work.shard,
                    salt=SALT,
                    **result,
                )
            )
        else:
            self.market.service.assignments.reveal(
                RevealSubmission(unit_id=work.unit_id, provider=provider.address, salt=SALT, **result)
            )
        return 1

    def _judge(self, verifier: LocalAccount) -> int:
        """The verifier's open jobs, each judged honest (every replica accepted: all providers are), then
        the round audits it owes, answered as the verifier agent answers them."""
        from veritrain.messages import Heartbeat, ReplicaOutcome, VerdictSubmission, sign_message

        market = self.market
        beat = Heartbeat(agent=verifier.address, nonce=next(market.nonces), timestamp=market.now())
        reply = market.service.verification.pull_jobs(
            sign_message(beat, verifier.key, market.client.chain_id)
        )
        signed = 0
        for job in reply.jobs:
            if job.chain_unit_id is None:
                raise ChainError(
                    f"bench: verifier job {job.job_id} ({job.reason}) names no chain unit; the bench's "
                    "verifier signs unit verdicts only: teach it this job before measuring"
                )
            if (verifier.address, job.job_id) in self.verdicts:
                continue
            self.verdicts.add((verifier.address, job.job_id))
            self.drawn.add(job.unit_id)
            outcomes = _accepting(job)[0]
            deadline = market.client.now() + 3600
            verdict = market.client.sign_verdict(verifier, job.chain_unit_id, outcomes, deadline)
            market.service.verification.submit_verdict(
                VerdictSubmission(
                    job_id=job.job_id,
                    verifier=verifier.address,
                    outcomes=tuple(ReplicaOutcome(o) for o in outcomes),
                    reasons_hash=REASONS,
                    deadline=deadline,
                    signature="0x" + verdict.signature.hex(),
                )
            )
            signed += 1
        return signed + self._audit_rounds(verifier)

    def _audit_rounds(self, verifier: LocalAccount) -> int:
        """The round audits `verifier` owes (its signed pull, as verifier/agent.py `audit_rounds`), each
        answered once by the agent's own `signed_audit`; a refusal would be the market's or the chain's
        disagreement with what it was handed: a bug here, so it stops the bench."""
        from verifier.round_audit import signed_audit
        from veritrain.messages import Heartbeat, sign_message

        market = self.market
        beat = Heartbeat(agent=verifier.address, nonce=next(market.nonces), timestamp=market.now())
        signed_beat = sign_message(beat, verifier.key, market.client.chain_id)
        reply = market.service.rosters.audits.jobs(signed_beat, market.service.orders.unit_work)
        for job in reply.audits:
            self.drawn.update(view.unit_id for view in job.jobs)
            market.service.rosters.audits.submit(signed_audit(market.client, verifier, job, _accepting))
        return len(reply.audits)


def _accepting(job: VerificationJobView) -> tuple[list[int], str]:
    """The simulated verifiers' re-execution: every replica accepted (every provider here is honest)."""
    return [0] * len(job.replicas), ""  # Outcome.ACCEPT for each


def _result(work: Assignment) -> dict[str, Any]:
    """The honest result of `work` (the same for each replica): its state and transcript digests bound to
    its result digest as the market checks (`market.domain.binding.is_bound`), a folded unit's outer step
    included (a round-path order has no aggregate unit)."""
    from veritrain.diloco import Fold, folded_result_digest
    from veritrain.pol import result_digest

    label = f"{work.order_id} {work.round_index} {work.shard} {work.kind}"
    state, root = _h(f"state {label}"), _h(f"root {label}")
    parts = bytes.fromhex(state[2:]), bytes.fromhex(root[2:])
    body: dict[str, Any] = {"state_digest": state, "transcript_root": root}
    trained = result_digest(*parts)
    if work.folds:
        round_state, inputs = _h(f"round {work.order_id} {work.round_index}"), _h(f"inputs {work.order_id}")
        fold = Fold(bytes.fromhex(round_state[2:]), bytes.fromhex(inputs[2:]))
        trained = folded_result_digest(trained, fold)
        body |= {"round_state_digest": round_state, "inputs_commitment": inputs}
    return {"result_digest": "0x" + trained.hex(), **body}
