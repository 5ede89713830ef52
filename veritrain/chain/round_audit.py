"""Deferred round audits (JobMarket `stepRound`, `RoundAudit(orderId, records)`): what a roster verifier
signs, recomputed from the chain's own state, never taken from whoever asks for the signature.

A verifier signs the roster's pending audit chain through a round it audited. Everything that chain holds
is fixed on chain before the round is revealed: the round's commitments and the pending chain before it
are bound by the roster's round hash (`getRoster`), so the openings a market hands out are checked by
recomputing that hash; the units the reveal leaves pending are the contract's draw (the commit block's
hash, the chain's rate) less the split ones and those of a provider below the roster's streak. The
market computes the same (market/rosters.py), the verifier agent checks it (verifier/agent.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from eth_hash.auto import keccak

from veritrain.chain import eip712

PPM = 1_000_000
ZERO32 = b"\x00" * 32


def chained(a: bytes, b: bytes) -> bytes:
    """JobMarket `_chain`: keccak256(a ‖ b)."""
    return keccak(eip712.as_bytes32(a, "a") + eip712.as_bytes32(b, "b"))


def round_hash(order_id: int, round_index: int, commitments: Sequence[bytes], pending: bytes) -> bytes:
    """The roster's round hash while round `round_index` is pending: its commitments in slot order chained
    after (orderId, round), then the pending audit chain when there is one."""
    value = chained(order_id.to_bytes(32, "big"), round_index.to_bytes(32, "big"))
    for commitment in commitments:
        value = chained(value, commitment)
    return value if pending == ZERO32 else chained(value, pending)


def drawn_by(seed: bytes, unit_id: int, rate_ppm: int) -> bool:
    """JobMarket `_drawnBy`: keccak256(abi.encode(seed, unitId)) mod 10⁶ < rate; every unit once the seed
    block's hash is unreadable (zero)."""
    if seed == ZERO32:
        return True
    draw = int.from_bytes(keccak(eip712.as_bytes32(seed, "seed") + unit_id.to_bytes(32, "big")), "big")
    return draw % PPM < rate_ppm


def audited_units(
    order_id: int,
    round_index: int,
    providers: Sequence[str],
    slots: Sequence[int],
    replicas: int,
    values: Sequence[bytes | None],
    seed: bytes,
    rate_ppm: int,
    weak: Collection[str] = (),
) -> int:
    """The units (bit u for unit u) a step revealing the round leaves pending for a round audit: drawn by
    the seed, every replica opened one digest (`values`, per slot; None: not opened), no provider in
    `weak` (below the roster's streak)."""
    weak_lower = {address.lower() for address in weak}
    units = 0
    for unit in range(len(slots) // replicas):
        opened = values[unit * replicas : (unit + 1) * replicas]
        if any(value is None for value in opened) or len(set(opened)) != 1:
            continue
        if any(providers[slots[unit * replicas + r]].lower() in weak_lower for r in range(replicas)):
            continue
        if drawn_by(seed, eip712.round_unit_id(order_id, round_index, unit), rate_ppm):
            units |= 1 << unit
    return units


def unit_digests(values: Sequence[bytes | None], replicas: int) -> list[bytes]:
    """Each unit's digest as `RoundRevealed` gives it (its replica 0's), from every slot's opened digest."""
    digests = []
    for unit in range(len(values) // replicas):
        value = values[unit * replicas]
        if value is None:
            raise ValueError(f"unit {unit}'s first replica has no opened digest")
        digests.append(value)
    return digests


def records_through(pending: bytes, round_index: int, units: int, digests: Sequence[bytes]) -> bytes:
    """The pending audit chain once round `round_index`'s record (its audited `units`, every unit's digest)
    is added: what `RoundAudit.records` is for a posting that covers the round."""
    record = units | (round_index << 176)
    return eip712.audit_chain([(record, eip712.digests_hash(digests))], pending)
