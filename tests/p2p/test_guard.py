"""The blob server's admission rules in isolation: replay cache, token buckets, fair share, slots, access."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest
import trio
import trio.testing
from eth_account import Account
from libp2p.peer.id import ID

from veritrain.errors import InvalidInput
from veritrain.p2p import PartyAccess, ServerCounters, ServerLimits, sign_blob_request
from veritrain.p2p.guard import ReplayCache, StreamGuard, TokenBuckets

HONEST = "0x" + "ab" * 20


def peer(n: int) -> ID:
    return ID(n.to_bytes(4, "big") + b"peer")


def test_throwaway_signers_filling_the_replay_cache_do_not_refuse_an_honest_signer() -> None:
    """Before: once 100k live entries from throwaway keys filled the cache, every request was refused."""
    cache = ReplayCache(max_per_signer=4096, max_entries=100_000)
    now = 1_000.0
    for index in range(100_000):
        assert cache.first_use(f"0x{index:040x}", b"n" * 16, now + 60, now) is None
    assert len(cache) == 100_000
    assert cache.first_use(HONEST, os.urandom(16), now + 60, now) is None
    assert len(cache) == 100_000, "full: the entry that expires first made room"


def test_replay_cache_refuses_replays_and_forgets_expired_entries() -> None:
    cache = ReplayCache(max_per_signer=10, max_entries=1000)
    nonce = os.urandom(16)
    assert cache.first_use(HONEST, nonce, expires_at=160.0, now=100.0) is None
    assert cache.first_use(HONEST, nonce, expires_at=160.0, now=159.0) == "request nonce already used"
    other_signer = "0x" + "cd" * 20
    assert cache.first_use(other_signer, nonce, expires_at=160.0, now=159.0) is None, "nonces are per signer"
    assert cache.first_use(HONEST, os.urandom(16), expires_at=500.0, now=160.0) is None
    assert len(cache) == 1, "both entries of t=160 expired; past it the clock check refuses their requests"


def test_replay_cache_bounds_each_signer_without_touching_others() -> None:
    cache = ReplayCache(max_per_signer=3, max_entries=1000)
    greedy = "0x" + "ee" * 20
    for _ in range(3):
        assert cache.first_use(greedy, os.urandom(16), 200.0, 100.0) is None
    assert cache.first_use(greedy, os.urandom(16), 200.0, 100.0) == (
        "too many requests from this signer within the clock window"
    )
    assert cache.first_use(HONEST, os.urandom(16), 200.0, 100.0) is None
    assert cache.first_use(greedy, os.urandom(16), 300.0, 200.0) is None, "room again once its entries expire"


def test_token_buckets_limit_each_peer_alone_and_forget_idle_peers() -> None:
    buckets = TokenBuckets(rate_per_s=2.0, burst=3)
    greedy, quiet = peer(1), peer(2)
    assert [buckets.take(greedy, 10.0) for _ in range(4)] == [True, True, True, False]
    assert buckets.take(quiet, 10.0)
    assert not buckets.take(greedy, 10.2)
    assert buckets.take(greedy, 10.6), "one token back after 0.5 s at 2/s"
    for n in range(3, 5000):
        buckets.take(peer(n), 20.0 + n)  # each of these refills to the brim within 1.5 s
    assert len(buckets) <= 1024, "idle peers are pruned"


def test_pending_fair_share_displaces_the_heaviest_peer_only() -> None:
    limits = ServerLimits(max_pending_per_peer=4, max_pending_total=6)

    async def main() -> None:
        guard = StreamGuard(limits, ServerCounters())
        flood_a, flood_b, honest = peer(1), peer(2), peer(3)
        with ExitStack() as stack:

            def open_pending(who: ID) -> object:
                return stack.enter_context(guard.pending(who, 5))

            a = [open_pending(flood_a) for _ in range(4)]
            assert open_pending(flood_a) == "peer_busy"
            b = [open_pending(flood_b) for _ in range(2)]
            assert not isinstance(open_pending(honest), str), "total full: the heaviest peer gives one back"
            assert [getattr(t, "evicted", None) for t in a] == [True, False, False, False]
            assert open_pending(flood_b) == "busy", "b (2) vs heaviest a (3): nothing to take back"
            assert not isinstance(open_pending(honest), str), "honest (1) vs a (3): a gives another back"
            assert [getattr(t, "evicted", None) for t in a] == [True, True, False, False]
            assert open_pending(honest) == "busy", "now everyone holds 2"
            assert all(not getattr(t, "evicted", True) for t in b)
            assert all(t.scope.cancel_called for t in a[:2])  # type: ignore[attr-defined]
        assert guard._pending == {} and guard._pending_total == 0

    trio.run(main)


def test_serving_slots_per_peer_and_in_total() -> None:
    limits = ServerLimits(
        max_serving_per_peer=2, max_serving_total=3, max_pending_per_peer=1, slot_wait_s=0.2
    )

    async def main() -> None:
        guard = StreamGuard(limits, ServerCounters())
        flood, honest, other = peer(1), peer(2), peer(3)
        assert await guard.acquire_serving(flood) is None
        assert await guard.acquire_serving(flood) is None
        assert await guard.acquire_serving(flood) == "peer_busy", "waits for its own slot, then gives up"
        assert await guard.acquire_serving(honest) is None, "the flooding peer cannot take the last slot"
        assert await guard.acquire_serving(other) == "busy", "all slots taken: bounded wait"
        async with trio.open_nursery() as nursery:
            outcomes: list[object] = []

            async def wait_for_slot() -> None:
                outcomes.append(await guard.acquire_serving(other))

            nursery.start_soon(wait_for_slot)
            await trio.testing.wait_all_tasks_blocked()
            guard.release_serving(flood)
        assert outcomes == [None], "a freed slot goes to the waiter"
        for holder in (flood, honest, other):
            guard.release_serving(holder)
        assert guard._serving == {} and guard._peer_slots == {}

    trio.run(main)


def test_server_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_serving_total"):
        ServerLimits(max_serving_total=0)


def test_party_access_serves_staked_parties_and_granted_buyers_only() -> None:
    clock = [1000.0]
    provider, buyer, stranger = Account.create(), Account.create(), Account.create()
    staked = {provider.address.lower()}
    lookups: list[str] = []

    def is_staked(address: str) -> bool:
        lookups.append(address)
        return address in staked

    access = PartyAccess(is_staked, ttl_s=60.0, refuse_ttl_s=5.0, clock=lambda: clock[0])
    digest = "aa" * 32
    assert access(sign_blob_request(provider, digest, "QmPeer"))
    assert not access(sign_blob_request(stranger, digest, "QmPeer"))
    assert not access(sign_blob_request(buyer, digest, "QmPeer"))
    access.grant([buyer.address])
    assert access(sign_blob_request(buyer, digest, "QmPeer")), "a granted buyer needs no stake"
    assert not access(sign_blob_request(stranger, digest, "QmPeer"))
    assert lookups.count(stranger.address.lower()) == 1, "a refusal is cached for refuse_ttl_s"
    staked.add(stranger.address.lower())
    clock[0] += 5.0
    assert access(sign_blob_request(stranger, digest, "QmPeer")), "asked again once the refusal expired"
    staked.discard(provider.address.lower())
    assert access(sign_blob_request(provider, digest, "QmPeer")), "a party stays cached for ttl_s"
    clock[0] += 60.0
    assert not access(sign_blob_request(provider, digest, "QmPeer")), "an unstaked party loses access"
    with pytest.raises(InvalidInput):
        access.grant(["not-an-address"])


def test_party_access_refuses_when_the_stake_lookup_fails_and_asks_again() -> None:
    answers: list[bool | Exception] = [ConnectionError("rpc down"), True]

    def is_staked(address: str) -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    access = PartyAccess(is_staked)
    request = sign_blob_request(Account.create(), "aa" * 32, "QmPeer")
    assert not access(request)
    assert access(request), "a failed lookup is not cached"
