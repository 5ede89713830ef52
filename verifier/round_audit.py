"""A roster verifier's round audit (docs/VERIFICATION.md, "Round audits"): what it signs is recomputed here
from the chain's own state, never taken from the market that asks for it.

The market hands a `RoundAuditJob`: the round's openings, the pending audit chain before the round, the
units it says the chain drew, and one per-unit verification job per such unit. Before the agent
re-executes anything (verifier/agent.py), :func:`audit_records` checks that the openings and the pending
chain hash to the roster's round hash on chain (so they are the committed ones), that the roster is the one
on chain, that the units are exactly the chain's draw (the commit block's hash, the chain's rate, the
providers' streaks), and that each unit's job names the digests its replicas opened; it returns the
records to sign, or raises :class:`RoundAuditRefused` with why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from veritrain.chain import eip712
from veritrain.chain.client import ChainClient
from veritrain.chain.round_audit import ZERO32, audited_units, records_through, round_hash, unit_digests
from veritrain.errors import VeritrainError
from veritrain.messages import ReplicaOutcome, RoundAuditJob, RoundAuditSubmission, VerificationJobView

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

# a unit's re-execution: its replicas' outcomes (ReplicaOutcome numbering) and the reasons behind them
Decide = Callable[[VerificationJobView], tuple[Sequence[int], object]]

BLOCKHASH_WINDOW = 256  # the EVM's readable block hashes: past them the contract draws every unit


class RoundAuditRefused(VeritrainError):
    """What the verifier was asked to sign is not what the chain says (or not what it re-executed)."""


def _word(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text.removeprefix("0x"))


def audit_records(chain: ChainClient, job: RoundAuditJob, verifier: str) -> bytes:
    """The pending audit chain through the job's round, recomputed from chain state (RoundAuditRefused when
    the job is not the chain's round: another roster, round, opening, pending chain or draw)."""
    if verifier not in job.verifiers:
        raise RoundAuditRefused(f"{verifier} is not one of the roster's verifiers")
    info = chain.get_roster(job.chain_order_id)
    k, units_per_round = job.replicas, len(job.slots) // job.replicas
    layout = sum(index << (5 * slot) for slot, index in enumerate(job.slots))
    parties = eip712.roster_key(job.providers, layout, k, units_per_round, job.rounds)
    if info.key != parties:
        raise RoundAuditRefused(f"the roster of order {job.chain_order_id} on chain is not the job's")
    if info.closed:
        raise RoundAuditRefused(f"the roster of order {job.chain_order_id} is closed")
    if info.pending_block == 0 or info.committed - 1 != job.round_index:
        return _revealed_records(chain, job)
    if len(job.openings) != len(job.slots):
        raise RoundAuditRefused(f"{len(job.openings)} openings for {len(job.slots)} slots")
    values = [_word(o.result_digest) for o in job.openings]
    commitments = [
        eip712.commitment(
            opening.result_digest,
            opening.salt,
            job.providers[job.slots[slot]],
            eip712.round_unit_id(job.chain_order_id, job.round_index, slot // k),
        )
        for slot, opening in enumerate(job.openings)
    ]
    pending = _word(job.pending)
    if round_hash(job.chain_order_id, job.round_index, commitments, pending) != info.pending_round_hash:
        raise RoundAuditRefused(
            "the openings or the pending audit chain are not the ones the chain committed"
        )
    head = int(chain.w3.eth.block_number)
    seed = ZERO32
    if head - info.pending_block < BLOCKHASH_WINDOW:
        seed = bytes(chain.w3.eth.get_block(info.pending_block)["hash"])
    params = chain.params
    rate = params.solo_spot_check_ppm if k == 1 else params.spot_check_ppm
    weak = {
        p
        for p in job.providers
        if info.required_streak and chain.reputation(p).consecutive_valid < info.required_streak
    }
    units = audited_units(
        job.chain_order_id, job.round_index, job.providers, job.slots, k, values, seed, rate, weak
    )
    if units != job.units:
        raise RoundAuditRefused(f"the chain draws units {units:#x}, the job names {job.units:#x}")
    if sorted(view.shard for view in job.jobs) != [u for u in range(units_per_round) if units >> u & 1]:
        raise RoundAuditRefused("the job's unit checks are not one per drawn unit")
    for view in job.jobs:
        opened = {o.result_digest for o in job.openings[view.shard * k : (view.shard + 1) * k]}
        if {r.result_digest for r in view.replicas} != opened or len(view.replicas) != k:
            raise RoundAuditRefused(f"unit {view.shard}'s check names other results than its openings")
    return records_through(pending, job.round_index, units, unit_digests(values, k))


def _revealed_records(chain: ChainClient, job: RoundAuditJob) -> bytes:
    """The pending audit chain through the job's round when someone revealed the round already (steps are
    permissionless): its pending record on chain names the drawn units and every unit's digest, which the
    job's units, openings and pending chain before it must be (RoundAuditRefused otherwise)."""
    records = chain.audit_records(job.chain_order_id)
    start = max((i + 1 for i, r in enumerate(records) if r.posting), default=0)
    index = next((i for i in range(start, len(records)) if records[i].round == job.round_index), None)
    if index is None:
        raise RoundAuditRefused(f"round {job.round_index} is neither pending nor pending an audit on chain")
    record = records[index]
    pending = eip712.audit_chains([r.as_tuple() for r in records[:index]])[1]
    if pending != _word(job.pending):
        raise RoundAuditRefused("the pending audit chain is not the one before the round's record on chain")
    units = record.units
    if units != job.units:
        raise RoundAuditRefused(f"the chain's record audits units {units:#x}, the job names {job.units:#x}")
    k = job.replicas
    if len(job.openings) != len(job.slots):
        raise RoundAuditRefused(f"{len(job.openings)} openings for {len(job.slots)} slots")
    digests = unit_digests([_word(o.result_digest) for o in job.openings], k)
    if eip712.digests_hash(digests) != record.digests_hash:
        raise RoundAuditRefused("the openings are not the digests the chain revealed")
    for view in job.jobs:
        opened = {o.result_digest for o in job.openings[view.shard * k : (view.shard + 1) * k]}
        if len(opened) != 1 or {r.result_digest for r in view.replicas} != opened or len(view.replicas) != k:
            raise RoundAuditRefused(f"unit {view.shard}'s check names other results than the chain's")
    if sorted(view.shard for view in job.jobs) != [u for u in range(len(digests)) if units >> u & 1]:
        raise RoundAuditRefused("the job's unit checks are not one per drawn unit")
    return records_through(pending, job.round_index, units, digests)


def signed_audit(
    chain: ChainClient, account: LocalAccount, job: RoundAuditJob, decide: Decide
) -> RoundAuditSubmission:
    """The verifier's answer to `job`: the records recomputed from the chain (`audit_records`), every audited
    unit re-executed by `decide` and accepted on every replica, then `RoundAudit(order, records)` signed;
    RoundAuditRefused with why when any of it does not hold (the agent then sends a signed refusal)."""
    records = audit_records(chain, job, account.address)
    for view in job.jobs:
        outcomes, reasons = decide(view)
        if any(outcome != ReplicaOutcome.ACCEPT for outcome in outcomes):
            raise RoundAuditRefused(f"unit {view.shard}: outcomes {tuple(outcomes)}: {reasons}")
    signature = chain.round_audit_signature(account, job.chain_order_id, records)
    return RoundAuditSubmission(
        order_id=job.order_id,
        round_index=job.round_index,
        verifier=account.address,
        records="0x" + records.hex(),
        signature="0x" + signature.hex(),
    )
