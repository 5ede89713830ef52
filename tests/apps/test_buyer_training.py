"""The buyer's verified loss curve of a round-path order (apps/buyer.py `round_path_units`,
`collect_training`): every training unit the chain accepted, the units its rounds' steps paid (which have no
chain unit) included, in training order with round boundaries, each manifest opening the digest the chain
fixed for it and its losses hashing to the PoL root that digest binds. The chain, its events and the peers
are fakes; the manifests, transcripts and digests are the real ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from apps.buyer import (
    AcceptedUnit,
    FinalState,
    UnitOutcome,
    _fetch_manifest,
    collect_training,
    order_money,
    round_path_units,
    set_aside_digests,
)
from tests.apps.buyer_fixtures import (
    FEE,
    LAYOUT,
    ORDER,
    PRICE,
    SLOTS,
    SPLIT,
    Plane,
    Replica,
    honest_manifest,
)
from tests.apps.buyer_fixtures import event as _event
from veritrain.agentkit import UnitManifest
from veritrain.chain.tx import Event
from veritrain.errors import DigestMismatch

P1, P2, P3, V1 = "0x1", "0x2", "0x3", "0xV1"
PROVIDERS = [P1, P2, P3]  # SLOTS: unit 0 on (P1, P2), unit 1 on (P3, P1)
PEERS = {P1: "peer-1", P2: "peer-2", P3: "peer-3"}
STEPS = 4


def _manifest(round_index: int, shard: int, first_loss: float) -> UnitManifest:
    """A replica's honest manifest of unit (round, shard): a real transcript, its root and result digest."""
    return honest_manifest(round_index, shard, [first_loss - 0.1 * step for step in range(STEPS)])


def _raw(manifest: UnitManifest) -> bytes:
    return bytes.fromhex(manifest.result_digest.removeprefix("0x"))


# round 0 and round 1's unit 0 unanimous; round 1's unit 1 split: P3 (replica 0) cheated, P1 was accepted
GOOD = {(r, m): _manifest(r, m, 3.0 - r - 0.5 * m) for r in range(2) for m in range(2)}
CHEAT = replace(GOOD[(1, 1)], result_digest="0x" + "cc" * 32)


def _events() -> list[Event]:
    """A closed two-round roster: its steps paid three units, the fourth (round 1, unit 1) was set aside as
    chain unit SPLIT, whose verdict called P3 fraud and accepted P1."""
    digests = [[_raw(GOOD[(r, 0)]), _raw(GOOD[(r, 1)])] for r in range(2)]
    digests[1][1] = bytes.fromhex("cc" * 32)  # the step names replica 0's (the cheat's) digest only
    return [
        _event(
            "OrderPosted",
            orderId=ORDER,
            escrow=5 * (2 * PRICE + FEE),
            pricePerReplica=PRICE,
            verifierFeePerUnit=FEE,
        ),
        _event(
            "RosterOpened",
            orderId=ORDER,
            providers=PROVIDERS,
            layout=LAYOUT,
            replicas=2,
            unitsPerRound=2,
            rounds=2,
        ),
        _event("RoundCommitted", orderId=ORDER, round=0),
        _event("RoundRevealed", orderId=ORDER, round=0, digests=digests[0], audited=0),
        _event("RoundCommitted", orderId=ORDER, round=1),
        _event("RoundRevealed", orderId=ORDER, round=1, digests=digests[1], audited=0),
        _event(
            "UnitAssigned",
            unitId=SPLIT,
            orderId=ORDER,
            unitKey=b"\x01" * 32,
            providers=[P3, P1],
            verifiers=[V1],
        ),
        _event("UnitSetAside", orderId=ORDER, round=1, unit=1, unitId=SPLIT),
        _event("VerdictRecorded", unitId=SPLIT, outcomes=[2, 0], verifiers=[V1]),
        _event("HeldSettled", unitId=SPLIT, truth=[2, 0]),
        _event("RosterClosed", orderId=ORDER, settledRounds=2, paid=6 * PRICE),
    ]


class _Chain:
    """What the buyer reads by call: the roster's progress and the split unit's replicas."""

    def __init__(self, closed: bool = True) -> None:
        self.closed = closed

    def get_roster(self, order_id: int) -> SimpleNamespace:
        assert order_id == ORDER
        return SimpleNamespace(closed=self.closed, committed=2)

    def replica(self, unit_id: int, index: int) -> Replica:
        assert unit_id == SPLIT
        return Replica([bytes.fromhex("cc" * 32), _raw(GOOD[(1, 1)])][index])


def _served(*extra: tuple[str, UnitManifest]) -> dict[str, dict[str, UnitManifest]]:
    """Each provider serves the manifests of the units it worked and was accepted for."""
    served: dict[str, dict[str, UnitManifest]] = {peer: {} for peer in PEERS.values()}
    for (r, m), manifest in GOOD.items():
        holders = [P1] if (r, m) == (1, 1) else [PROVIDERS[SLOTS[2 * m]], PROVIDERS[SLOTS[2 * m + 1]]]
        for provider in holders:
            served[PEERS[provider]][manifest.result_digest] = manifest
    served[PEERS[P3]][CHEAT.result_digest] = CHEAT
    for peer, manifest in extra:
        served[peer][manifest.result_digest] = manifest
    return served


CLOSED = SimpleNamespace(state="closed")  # the market's RosterStatus, as far as the buyer reads it


def _status(roster: object = CLOSED) -> Any:
    spec = SimpleNamespace(shards=2, rounds=2, outer_step="folded")
    return SimpleNamespace(spec=spec, roster=roster, chain_order_id=ORDER)


def _units(events: list[Event]) -> list[UnitOutcome]:
    _, units = order_money(events, ORDER)
    set_aside_digests(_Chain(), units)  # type: ignore[arg-type]
    return units


def _collect(
    plane: Plane, round_units: list[AcceptedUnit] | None, units: list[UnitOutcome], out: Path
) -> Any:
    final = FinalState("0x" + "ff" * 32, {"model.w": torch.zeros(2)})
    return collect_training(
        plane,  # type: ignore[arg-type]
        units,
        PEERS,
        out / "w.safetensors",
        recipe="digits-mlp",
        final_digest="0x" + "00" * 32,
        final=final,
        round_units=round_units,
    )


def _losses(*keys: tuple[int, int]) -> list[float]:
    return [float(loss) for key in keys for loss in GOOD[key].transcript["losses"]]


def test_the_curve_holds_every_unit_the_chain_accepted_round_by_round_shard_by_shard(tmp_path: Path) -> None:
    events = _events()
    units = _units(events)
    assert [u.chain_unit_id for u in units] == [SPLIT]  # the three units the steps paid have no chain unit
    found = round_path_units(_Chain(), _status(), units, events)  # type: ignore[arg-type]
    assert found is not None
    assert [(u.round_index, u.shard, u.result_digest) for u in found] == [
        (r, m, GOOD[(r, m)].result_digest) for r in range(2) for m in range(2)
    ]
    # a unit its step paid: every slot's provider; the split unit: its accepted replica only
    assert [u.providers for u in found] == [(P1, P2), (P3, P1), (P1, P2), (P1,)]
    plane = Plane(_served())
    training = _collect(plane, found, units, tmp_path)
    assert training.losses == _losses((0, 0), (0, 1), (1, 0), (1, 1))
    assert len(training.losses) == 4 * STEPS and training.round_boundaries == [2 * STEPS]
    assert all(peer == PEERS[P1] or digest != GOOD[(0, 0)].result_digest for peer, digest in plane.asked)
    assert (PEERS[P3], GOOD[(0, 1)].result_digest) == plane.asked[1]  # asked of its slot's first provider


def test_without_round_units_the_curve_is_the_chain_units_alone(tmp_path: Path) -> None:
    """The per-unit reading, unchanged, and all a round-path order's fetch read before `round_units`: the
    losses of its chain units only, here the one set-aside unit of four (none at all when nothing is set
    aside)."""
    events = _events()
    training = _collect(Plane(_served()), None, _units(events), tmp_path)
    assert training.losses == _losses((1, 1))


def test_a_dropped_unit_has_no_losses_and_a_per_unit_order_has_no_round_units() -> None:
    events = [e for e in _events() if e.name not in ("UnitAssigned", "VerdictRecorded", "HeldSettled")]
    events = [
        replace(e, args={**e.args, "unitId": 0}) if e.name == "UnitSetAside" else e for e in events
    ]  # pending units dropped unpaid past the deadline: UnitSetAside with unit id 0
    found = round_path_units(_Chain(), _status(), _units(events), events)  # type: ignore[arg-type]
    assert found is not None and [(u.round_index, u.shard) for u in found] == [(0, 0), (0, 1), (1, 0)]
    assert round_path_units(_Chain(), _status(roster=None), [], events) is None  # type: ignore[arg-type]


def test_an_open_roster_gives_no_verified_curve() -> None:
    events = _events()
    with pytest.raises(DigestMismatch, match="not closed"):
        round_path_units(_Chain(closed=False), _status(), _units(events), events)  # type: ignore[arg-type]


def test_a_roster_unit_nobody_serves_a_matching_manifest_for_is_a_digest_mismatch(tmp_path: Path) -> None:
    events = _events()
    units = _units(events)
    found = round_path_units(_Chain(), _status(), units, events)  # type: ignore[arg-type]
    served = _served()
    wanted = GOOD[(1, 0)].result_digest
    for peer in served:  # every holder serves another unit's manifest under round 1 unit 0's digest
        if wanted in served[peer]:
            served[peer][wanted] = GOOD[(0, 0)]
    with pytest.raises(DigestMismatch, match="round 1, shard 0"):
        _collect(Plane(served), found, units, tmp_path)


def _forged_losses(manifest: UnitManifest) -> UnitManifest:
    """The manifest with its losses lowered: its digest fields as they were, its transcript not the root's."""
    transcript = dict(manifest.transcript)
    transcript["losses"] = [loss - 1.0 for loss in transcript["losses"]]
    return replace(manifest, transcript=transcript)


def test_losses_that_do_not_hash_to_the_pol_root_are_refused_on_both_paths(tmp_path: Path) -> None:
    events = _events()
    units = _units(events)
    found = round_path_units(_Chain(), _status(), units, events)  # type: ignore[arg-type]
    # the round path: P1 forges unit (0, 0)'s losses, P2 (its other replica) is honest and is used
    served = _served()
    digest = GOOD[(0, 0)].result_digest
    served[PEERS[P1]][digest] = _forged_losses(GOOD[(0, 0)])
    training = _collect(Plane(served), found, units, tmp_path)
    assert training.losses[:STEPS] == _losses((0, 0))
    served[PEERS[P2]][digest] = _forged_losses(GOOD[(0, 0)])
    with pytest.raises(DigestMismatch, match="does not hash to the PoL root"):
        _collect(Plane(served), found, units, tmp_path)
    # the per-unit path: the split unit's accepted replica (P1) serves forged losses
    (split,) = units
    served = _served()
    served[PEERS[P1]][GOOD[(1, 1)].result_digest] = _forged_losses(GOOD[(1, 1)])
    with pytest.raises(DigestMismatch, match="does not hash to the PoL root"):
        _fetch_manifest(Plane(served), split, PEERS)  # type: ignore[arg-type]
