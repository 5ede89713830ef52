"""Stake-weighted random selection seeded by chain randomness (who runs a unit's replicas, who verifies it).

Why: a ranking the market computes, or a verifier list it rotates, lets the operator steer who is picked,
and self-declared operators let one party run every replica. Here each candidate gets a key from a public
seed and its bonded stake, and the smallest keys win (Efraimidis–Spirakis weighted sampling without
replacement): the first pick is candidate i with probability stake_i / Σ stake, later picks likewise among
the rest. Splitting stake across sybil keys buys nothing, and a candidate's key does not depend on who else
is eligible, so an adversary that learns the seed cannot improve its odds by taking some of its own keys
offline (it can only remove its own entries; honest keys keep their places).

Recomputable by anyone from public data, with h = blockhash(B) of the matching pass:

- unit seed ``s = keccak(h ‖ unit_key)`` (recorded with the unit);
- candidate hash ``a = sha256(h ‖ address)[:8]`` (big-endian uint64: one per candidate and pass);
- unit tweak ``t = keccak(s ‖ role)[:8]``, role ``"replicas"`` or ``"verifiers"``;
- ``x = mix64(a XOR t)`` (the splitmix64 finaliser, a bijection of 64-bit words), ``u = ((x >> 11) + 1) /
  2⁵³`` in (0, 1], key ``-ln(u) / stake`` in float64; zero stake never precedes a staked candidate.

Why a per-pass hash and a per-unit tweak instead of one hash per candidate and unit: the market draws a
thousand units among ten thousand providers in one pass; with ``a`` uniform and unknown before B, any
fixed bijection of ``a XOR t`` is again uniform and independent across candidates, so each unit's draw is
exact, and the per-unit work is a few vector operations instead of ten thousand hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from eth_hash.auto import keccak

ROLE_REPLICAS = "replicas"
ROLE_VERIFIERS = "verifiers"
NO_BLOCK_HASH = "0x" + "00" * 32  # a market without a chain: the seed is then the unit key's alone
HEAD = 64  # keys sorted up front; a draw that declines more candidates sorts the rest when it gets there

Hashes = npt.NDArray[np.uint64]


def _bytes32(value: str) -> bytes:
    raw = bytes.fromhex(value.removeprefix("0x"))
    if len(raw) != 32:
        raise ValueError(f"expected 32 bytes of hex, got {len(raw)}: {value!r}")
    return raw


def _address_bytes(address: str) -> bytes:
    """The 20 bytes of an 0x address; other identifiers (the simulator's) as UTF-8."""
    if address.startswith("0x") and len(address) == 42:
        return bytes.fromhex(address[2:])
    return address.encode()


def selection_seed(block_hash: str, unit_key: str) -> str:
    """The unit's draw seed: keccak(blockhash(B) ‖ unit_key), both 32 bytes."""
    return "0x" + keccak(_bytes32(block_hash) + _bytes32(unit_key)).hex()


def candidate_hashes(block_hash: str, addresses: Sequence[str]) -> Hashes:
    """sha256(blockhash ‖ address)[:8] of each address: the pass's randomness per candidate."""
    prefix = _bytes32(block_hash)
    return np.fromiter(
        (int.from_bytes(hashlib.sha256(prefix + _address_bytes(a)).digest()[:8], "big") for a in addresses),
        dtype=np.uint64,
        count=len(addresses),
    )


def unit_tweak(seed: str, role: str) -> np.uint64:
    """keccak(seed ‖ role)[:8]: separates units, and the replica draw from the verifier draw."""
    return np.uint64(int.from_bytes(keccak(_bytes32(seed) + role.encode())[:8], "big"))


def draw_keys(hashes: Hashes, stakes: npt.NDArray[np.float64], tweak: np.uint64) -> npt.NDArray[np.float64]:
    """Each candidate's key for one unit and role (smaller wins; ``inf`` for zero stake)."""
    x = hashes ^ tweak
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    u = ((x >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    with np.errstate(divide="ignore"):
        return -np.log(u) / stakes


def draw_order(keys: npt.NDArray[np.float64], positions: npt.NDArray[np.intp] | None = None) -> Iterator[int]:
    """Positions (into ``keys``; only ``positions`` if given) in draw order, smallest key first, ties by
    position; lazily: only the first ``HEAD`` are sorted unless the caller reads further."""
    candidates = np.arange(len(keys)) if positions is None else positions
    values = keys[candidates]
    if len(values) > HEAD:
        head = np.argpartition(values, HEAD - 1)[:HEAD]
        head = head[np.lexsort((head, values[head]))]
        yield from (int(i) for i in candidates[head])
        rest = np.setdiff1d(np.arange(len(values)), head, assume_unique=True)
        rest = rest[np.lexsort((rest, values[rest]))]
        yield from (int(i) for i in candidates[rest])
    else:
        order = np.lexsort((np.arange(len(values)), values))
        yield from (int(i) for i in candidates[order])


def sample(
    block_hash: str,
    seed: str,
    role: str,
    stakes: Mapping[str, int],
    k: int,
    eligible: Callable[[str], bool] = lambda _: True,
) -> tuple[str, ...]:
    """The first ``k`` eligible addresses of ``stakes`` in draw order (fewer if not enough are eligible).

    ``stakes`` is taken in sorted address order, so ties (probability about 2⁻⁵³) fall to the lower address.
    """
    addresses = sorted(stakes, key=str.lower)
    weights = np.array([float(stakes[a]) for a in addresses], dtype=np.float64)
    keys = draw_keys(candidate_hashes(block_hash, addresses), weights, unit_tweak(seed, role))
    chosen: list[str] = []
    for i in draw_order(keys):
        if len(chosen) == k:
            break
        if eligible(addresses[i]):
            chosen.append(addresses[i])
    return tuple(chosen)
