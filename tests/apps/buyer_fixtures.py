"""What the buyer's tests (tests/apps/test_buyer_*.py) share: the order's numbers, chain events by name, a
roster's slot layout, peers serving manifests by result digest (and states by digest), and a replica's
honest manifest (a real transcript, its root and the result digest they open). Each test file names its
own providers and builds its own events and chain from these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from veritrain.agentkit import UnitManifest, encode_state
from veritrain.chain.tx import Event
from veritrain.errors import BlobNotFound
from veritrain.pol import State, Transcript, UnitSpec, state_digest

ORDER, SPLIT = 3, 7  # the chain order, the chain unit a roster unit set aside became
PRICE, FEE = 100, 10  # per replica, per unit (verifier fee)
SLOTS = [0, 1, 2, 0]  # 2 units a round, k = 2: unit 0 on providers 0 and 1, unit 1 on providers 2 and 0


def layout(slots: Sequence[int]) -> int:
    """`RosterOpened`'s layout: slot s's provider index in bits 5s..5s+4."""
    return sum(index << (5 * slot) for slot, index in enumerate(slots))


LAYOUT = layout(SLOTS)


@dataclass(frozen=True)
class Replica:
    """A replica as `ChainClient.replica` reads it (what the buyer's set-aside digests come from)."""

    commitment_or_digest: bytes
    revealed: bool = True


def event(name: str, **args: object) -> Event:
    """A JobMarket event as `ChainClient.events` returns it."""
    return Event(name=name, address="0xJobMarket", args=dict(args))


def honest_manifest(
    round_index: int,
    shard: int,
    losses: Sequence[float],
    *,
    checkpoint_every: int = 2,
    state: bytes | None = None,
    fold: tuple[str, str] | None = None,
) -> UnitManifest:
    """A replica's honest manifest of unit (round, shard) of a two-shard digits-mlp order (seed 1): a real
    transcript of one loss a step, its checkpoints' digests made up (the last one `state` when given), its
    PoL root, and the result digest they open (with `fold`, a folded unit's: (round state digest, inputs
    commitment))."""
    spec = UnitSpec("digits-mlp", 1, round_index, shard, len(losses), checkpoint_every, num_shards=2)
    steps = spec.checkpoint_steps()
    digests = [bytes([10 * round_index + shard, i]) * 16 for i in range(len(steps))]
    if state is not None:
        digests[-1] = state
    transcript = Transcript(spec, steps, tuple(digests), tuple(losses), b"\x07" * 32)
    round_state, commitment = fold if fold is not None else (None, None)
    manifest = UnitManifest(
        transcript.to_json(),
        "",
        "0x" + transcript.final_digest.hex(),
        "0x" + transcript.merkle_root().hex(),
        round_state_digest=round_state,
        inputs_commitment=commitment,
    )
    return replace(manifest, result_digest=manifest.opened_result_digest())


class Plane:
    """Peers serving manifests by result digest (`served`: peer -> result digest -> manifest; a peer not in
    it serves nothing) and `states` by their digest to anyone (`fetch_any`); `asked` records who was asked
    for which manifest."""

    def __init__(self, served: dict[str, dict[str, UnitManifest]], states: Iterable[State] = ()) -> None:
        self.served = served
        self.states = {state_digest(state).hex(): encode_state(state) for state in states}
        self.asked: list[tuple[str, str]] = []

    def lookup_manifest(self, peer: str, digest: str) -> str:
        self.asked.append((peer, digest))
        if digest not in self.served.get(peer, {}):
            raise BlobNotFound(f"{peer} has no manifest of {digest}")
        return digest

    def fetch(self, peer: str, key: str) -> bytes:
        return self.served[peer][key].to_bytes()

    def fetch_any(self, peers: list[str], digest: str) -> bytes:
        if digest not in self.states:
            raise BlobNotFound(f"nobody serves state {digest}")
        return self.states[digest]
