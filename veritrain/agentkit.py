"""Shared agent plumbing: keys, clock, chain connection, blob plane, manifests, CLI arguments, run loop.

Why it exists: the provider (node/agent.py) and the verifier (verifier/agent.py) open the same key, chain
connection, nonce clock, blob store and libp2p data plane, read the same unit manifests and take the same
command-line arguments; this kernel module holds that once, so neither role imports the other's code.
It holds no role logic: what an agent does with a heartbeat reply stays in its role package.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field

from veritrain.backoff import backoff_delay
from veritrain.codec import WireModel
from veritrain.errors import AgentError, InvalidInput, VeritrainError
from veritrain.metrics import AgentMetrics

if TYPE_CHECKING:
    import torch
    from eth_account.signers.local import LocalAccount

    from veritrain.api_client import MarketClient
    from veritrain.blobstore import BlobStore
    from veritrain.chain.client import ChainClient
    from veritrain.device import DeviceProfile
    from veritrain.diloco import AggregateInputs, Fold, FoldedStart
    from veritrain.messages import AgentRole, Custody, Registration, Signed, StateSource, UnitWork
    from veritrain.p2p.blob_protocol import Authorizer
    from veritrain.pol import State

logger = logging.getLogger("veritrain.agent")

SIGNATURE_TTL_S = 600
HTTP_TIMEOUT_S = 15.0
REGISTER_PATIENCE_S = 300.0
MAX_STATE_BLOB_BYTES = 2 * 1024**3


# --- canonical state blobs ----------------------------------------------------------------------------
#
# The blob of a state is exactly the byte stream veritrain.pol.state_digest hashes
# (veritrain.pol.canonical_state_bytes). So sha256(blob) == state_digest(state), and fetching a state by
# its canonical digest over the content-addressed data plane needs no second name.


def encode_state(state: Mapping[str, torch.Tensor]) -> bytes:
    """A state's blob: its canonical bytes, whose sha256 equals veritrain.pol.state_digest."""
    from veritrain.pol import canonical_state_bytes

    return canonical_state_bytes(state)


def decode_state(blob: bytes) -> State:
    """Tensors from a state blob; InvalidInput for anything truncated, oversized or inconsistent."""
    from veritrain.pol import state_from_canonical_bytes

    return state_from_canonical_bytes(blob)


# --- unit manifest: what a replica's result consists of, as one blob --------------------------------


@dataclass(frozen=True)
class UnitManifest:
    """A replica's result in one small blob: the PoL transcript and the blob of every checkpoint state.

    Verifiers fetch this first (by `transcript_digest`, its sha256), then only the checkpoints they replay.
    A folded shard unit's manifest also names the outer step it ran first (``round_state_digest``,
    ``inputs_commitment``), which its result digest binds.
    """

    transcript: dict[str, Any]
    result_digest: str
    state_digest: str
    transcript_root: str
    round_state_digest: str | None = None
    inputs_commitment: str | None = None

    def to_bytes(self) -> bytes:
        fields: dict[str, Any] = {
            "transcript": self.transcript,
            "result_digest": self.result_digest,
            "state_digest": self.state_digest,
            "transcript_root": self.transcript_root,
        }
        if self.round_state_digest is not None or self.inputs_commitment is not None:
            fields["round_state_digest"] = self.round_state_digest
            fields["inputs_commitment"] = self.inputs_commitment
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitManifest:
        try:
            raw = json.loads(data)
            folded = {
                name: str(raw[name])
                for name in ("round_state_digest", "inputs_commitment")
                if raw.get(name) is not None
            }
            manifest = cls(
                transcript=dict(raw["transcript"]),
                result_digest=str(raw["result_digest"]),
                state_digest=str(raw["state_digest"]),
                transcript_root=str(raw["transcript_root"]),
                **folded,
            )
            manifest.fold()  # both outer step fields or neither, 32 bytes each
            return manifest
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidInput(f"malformed unit manifest: {err}") from err

    def fold(self) -> Fold | None:
        """The outer step this folded unit's result binds, or None for any other unit."""
        from veritrain.diloco import Fold

        if self.round_state_digest is None and self.inputs_commitment is None:
            return None
        if self.round_state_digest is None or self.inputs_commitment is None:
            raise InvalidInput("a folded unit's manifest names both its round state and inputs commitment")
        fold = Fold(unhex32(self.round_state_digest), unhex32(self.inputs_commitment))
        if len(fold.round_state_digest) != 32 or len(fold.inputs_commitment) != 32:
            raise InvalidInput("round state digest and inputs commitment must be 32 bytes each")
        return fold

    def opened_result_digest(self) -> str:
        """The result digest this manifest's state digest, PoL root (and fold) hash to."""
        from veritrain.diloco import folded_result_digest
        from veritrain.pol import result_digest

        trained = result_digest(unhex32(self.state_digest), unhex32(self.transcript_root))
        fold = self.fold()
        return hex32(trained if fold is None else folded_result_digest(trained, fold))


def hex32(raw: bytes) -> str:
    return "0x" + raw.hex()


def unhex32(text: str) -> bytes:
    raw = bytes.fromhex(text.removeprefix("0x"))
    if len(raw) != 32:
        raise InvalidInput(f"expected 32 bytes of hex, got {len(raw)}")
    return raw


class ManifestQuery(WireModel):
    """Which manifest blob belongs to this revealed result digest (64 lowercase hex)?"""

    result_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class ManifestAnswer(WireModel):
    """A pointer to the manifest blob (sha256 hex), or not_found."""

    status: Literal["ok", "not_found"]
    manifest_digest: Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")] = ""


# --- keys, chain reads, market HTTP -------------------------------------------------------------------


def connect_chain(rpc_url: str, deployments: Path) -> ChainClient:
    """Read-and-sign access to the deployed contracts; agents never send a transaction themselves."""
    from veritrain.chain.backends import RpcBackend
    from veritrain.chain.client import ChainClient

    return ChainClient.connect(RpcBackend(rpc_url), deployments)


class AgentClock:
    """Strictly increasing message nonces that survive restarts (microseconds since the epoch)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next_nonce(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last

    @staticmethod
    def now() -> int:
        return int(time.time())


# --- the data plane behind one small interface --------------------------------------------------------


MANIFEST_INDEX_PROTOCOL = "/veritrain/manifest-index/1.0.0"
MANIFEST_INDEX_LIMITS_BYTES = 512


class BlobPlane:
    """This agent's libp2p host: serves its BlobStore, fetches blobs from other agents by multiaddr.

    Besides the data plane's blob protocol it answers one tiny lookup, `/veritrain/manifest-index/1.0.0`:
    "which blob is the manifest of your revealed result R?". A revealed result digest is public, the answer
    is only a pointer, and the fetched manifest is checked against R, so a lying peer gains nothing; it
    lets a verifier find a replica's PoL transcript from what is on chain alone.
    """

    def __init__(
        self,
        store: BlobStore,
        account: LocalAccount,
        listen_port: int,
        data_dir: Path,
        host: str = "127.0.0.1",
        authorize: Authorizer | None = None,
    ) -> None:
        from veritrain.p2p import P2PNode, load_or_create_peer_key

        self.store = store
        self.index_dir = data_dir / "manifest-index"
        self.index_dir.mkdir(parents=True, exist_ok=True)
        self._node = P2PNode(
            account,
            peer_key=load_or_create_peer_key(data_dir / "peer.key"),
            store=store,
            listen_addr=f"/ip4/{host}/tcp/{listen_port}",
            max_blob_bytes=MAX_STATE_BLOB_BYTES,
            extra_protocols={MANIFEST_INDEX_PROTOCOL: self._serve_index},
            authorize=authorize,
        )

    def start(self) -> str:
        """Start listening; returns the full multiaddr (with /p2p/<peer id>) other agents dial."""
        return self._node.start()

    def bytes_served(self) -> int:
        """Blob bytes this host served, from the data plane's server counters."""
        return int(self._node.counters.snapshot().bytes_served)

    def fetch(self, peer_addr: str, digest: str) -> bytes:
        """The blob `digest` (sha256 hex) from the peer at `peer_addr`, also kept in our own store."""
        if self.store.has(digest):
            return self.store.get(digest)
        data = self._node.fetch(peer_addr, digest)
        self.store.put(data, expected_digest=digest)
        return data

    def publish_manifest(self, result_digest: str, manifest_digest: str) -> None:
        """Answer index lookups for `result_digest` (0x-hex) with `manifest_digest` (sha256 hex)."""
        from veritrain.blobstore import check_digest

        key = check_digest(result_digest.removeprefix("0x"))
        tmp = self.index_dir / f"{key}.tmp"
        tmp.write_text(check_digest(manifest_digest.removeprefix("0x")))
        os.replace(tmp, self.index_dir / key)

    def lookup_manifest(self, peer_addr: str, result_digest: str) -> str:
        """The manifest blob digest a peer publishes for its revealed `result_digest`; AgentError if none."""
        from veritrain.codec import CodecLimits, FrameReader, encode, write_frame
        from veritrain.p2p import parse_peer_addr
        from veritrain.p2p.blob_protocol import StreamSource

        peer = parse_peer_addr(peer_addr)
        query = ManifestQuery(result_digest=result_digest.removeprefix("0x"))
        limits = CodecLimits(max_frame_bytes=MANIFEST_INDEX_LIMITS_BYTES, max_depth=2)

        async def ask(host: Any) -> ManifestAnswer:
            from libp2p.custom_types import TProtocol

            await host.connect(peer)
            stream = await host.new_stream(peer.peer_id, [TProtocol(MANIFEST_INDEX_PROTOCOL)])
            try:
                await write_frame(stream.write, encode(query))
                reader = FrameReader(StreamSource(stream), MANIFEST_INDEX_LIMITS_BYTES)
                return await reader.read_message(ManifestAnswer, limits)
            finally:
                await stream.close()

        answer = self._node.run_on_host(ask, timeout=30.0)
        if answer.status != "ok":
            raise AgentError(f"peer {peer_addr} publishes no manifest for result {result_digest}")
        return answer.manifest_digest

    async def _serve_index(self, stream: Any) -> None:
        from veritrain.codec import CodecLimits, FrameReader, encode, write_frame
        from veritrain.p2p.blob_protocol import StreamSource

        limits = CodecLimits(max_frame_bytes=MANIFEST_INDEX_LIMITS_BYTES, max_depth=2)
        try:
            reader = FrameReader(StreamSource(stream), MANIFEST_INDEX_LIMITS_BYTES)
            query = await reader.read_message(ManifestQuery, limits)
            path = self.index_dir / query.result_digest
            if path.is_file():
                answer = ManifestAnswer(status="ok", manifest_digest=path.read_text().strip())
            else:
                answer = ManifestAnswer(status="not_found")
            await write_frame(stream.write, encode(answer))
            await stream.close()
        except Exception as err:  # a broken peer must never take the host down
            logger.info("manifest index stream aborted: %r", err)
            await stream.reset()

    def fetch_any(self, peer_addrs: tuple[str, ...] | list[str], digest: str) -> bytes:
        """The blob from our store or the first peer that serves it; AgentError if none does."""
        if self.store.has(digest):
            return self.store.get(digest)
        errors: list[str] = []
        for addr in peer_addrs:
            try:
                return self.fetch(addr, digest)
            except VeritrainError as err:
                errors.append(f"{addr}: {err}")
        raise AgentError(f"no holder served blob {digest}: {'; '.join(errors) or 'no holders listed'}")

    def stop(self) -> None:
        self._node.stop()


# --- custody: states kept for other parties' orders ----------------------------------------------------


class CustodyKeeper:
    """Keeps the states the market asks this agent to hold beside their producers (market/custody.py), so
    an order does not lose an accepted result when its only producer disappears.

    Each heartbeat reply lists every state the agent should keep. One not in the store is fetched in a
    background thread (the heartbeat goes on; the content address checks the bytes), and reported once
    stored; a state no longer listed is released. Only blobs fetched for custody are ever deleted: one the
    agent had already (its own result, a start state it trained from) stays.
    """

    def __init__(self, blobs: BlobPlane, data_dir: Path) -> None:
        self._blobs = blobs
        self._file = data_dir / "custody"
        self._pinned: set[str] = set(self._file.read_text().split()) if self._file.exists() else set()
        self._fetching: threading.Thread | None = None
        self._lock = threading.Lock()

    def update(self, requests: tuple[Custody, ...]) -> list[str]:
        """Act on one reply's custody list; returns the digests (0x-hex) now stored but not yet reported."""
        wanted = {c.state.state_digest.removeprefix("0x"): c for c in requests if c.state.state_digest}
        with self._lock:
            released = sorted(self._pinned - set(wanted))
            for digest in released:
                self._blobs.store.remove(digest)
                self._pinned.discard(digest)
                logger.info("custody of state %s released", digest)
            if released:  # every heartbeat calls this: rewrite the file only when it changes
                self._save()
        to_report = []
        for digest, request in wanted.items():
            if self._blobs.store.has(digest):
                if not request.held:  # fetched for custody, or stored already (e.g. a verifier's replay)
                    logger.info("holding state %s in custody (reporting it)", digest)
                    to_report.append("0x" + digest)
            elif self._fetching is None or not self._fetching.is_alive():
                self._fetching = threading.Thread(
                    target=self._fetch, args=(request.state,), daemon=True, name=f"custody-{digest[:8]}"
                )
                self._fetching.start()
        return to_report

    def _fetch(self, source: StateSource) -> None:
        digest = (source.state_digest or "").removeprefix("0x")
        try:
            self._blobs.fetch_any(list(source.holders), digest)
        except VeritrainError as err:  # the next reply asks again; the market may pick another custodian
            logger.warning("custody of state %s: %s", digest, err)
            return
        with self._lock:
            self._pinned.add(digest)
            self._save()
        logger.info("holding state %s in custody", digest)

    def _save(self) -> None:
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text("".join(f"{digest}\n" for digest in sorted(self._pinned)))
        os.replace(tmp, self._file)


# --- units and agents -------------------------------------------------------------------------------


def unit_spec_of(unit: UnitWork) -> Any:
    """The unit exactly as the market specified it (shard of num_shards, checkpoint interval), so every
    replica and verifier cuts the same PoL transcript."""
    from veritrain.pol import UnitSpec

    return UnitSpec(
        recipe=unit.recipe,
        order_seed=unit.seed,
        round_index=unit.round_index,
        shard=unit.shard,
        steps=unit.steps,
        checkpoint_every=unit.checkpoint_every,
        num_shards=unit.num_shards,
    )


def fetch_state(blobs: BlobPlane, source: StateSource) -> State:
    """A state by its digest, from our store or a holder (the content address checks the bytes)."""
    if source.state_digest is None:
        raise AgentError("a state source without a digest names no blob")
    return decode_state(blobs.fetch_any(list(source.holders), source.state_digest.removeprefix("0x")))


def round_state_of(work: UnitWork, blobs: BlobPlane) -> State:
    """The state a unit's round starts from: fetched by digest, or regenerated at round 0 (the portable
    genesis is the same bytes on every machine: the training state for M = 1, its round state for M > 1)."""
    from veritrain.diloco import order_genesis
    from veritrain.recipes import get_recipe

    if work.start_state.state_digest is None:
        return order_genesis(get_recipe(work.recipe), work.seed, work.num_shards)
    return fetch_state(blobs, work.start_state)


def unit_start_of(work: UnitWork, blobs: BlobPlane) -> State:
    """A training unit's start state, the same for every replica and verifier: the round's state for
    M = 1; for M > 1 the round's weights plus the shard's own AdamW moments from its last accepted result
    (a folded unit's round weights being the outer step it runs first, ``folded_start_of``)."""
    from veritrain.diloco import unit_start_state

    if work.folds:
        return folded_start_of(work, blobs).start_state
    round_state = round_state_of(work, blobs)
    if work.num_shards == 1:
        return round_state
    return unit_start_state(round_state, _previous_of(work, blobs))


def _previous_of(work: UnitWork, blobs: BlobPlane) -> State | None:
    return None if work.previous is None else fetch_state(blobs, work.previous)


def folded_start_of(work: UnitWork, blobs: BlobPlane) -> FoldedStart:
    """A folded shard unit's outer step over the previous round's inputs, and the state it trains from."""
    from veritrain.diloco import fold

    return fold(aggregate_inputs_of(work, blobs), _previous_of(work, blobs))


def aggregate_inputs_of(work: UnitWork, blobs: BlobPlane) -> AggregateInputs:
    """What an outer step reads: the round's state, each shard's accepted result, the outer config; an
    aggregate unit's own round, or for a folded shard unit of round r the inputs of round r - 1."""
    from veritrain.diloco import AggregateInputs
    from veritrain.messages import UnitKind

    if work.outer is None or len(work.shard_results) != work.num_shards:
        raise AgentError(f"unit {work.unit_id} is not a complete aggregate unit")
    if work.folds and work.round_index < 1:
        raise AgentError(f"unit {work.unit_id}: a round-0 unit has no previous round to aggregate")
    return AggregateInputs(
        round_index=work.round_index if work.kind == UnitKind.AGGREGATE else work.round_index - 1,
        round_state=round_state_of(work, blobs),
        results=tuple(None if s is None else fetch_state(blobs, s) for s in work.shard_results),
        config=work.outer.config(),
    )


@dataclass(frozen=True, kw_only=True)
class AgentCommonConfig:
    """What both agents are configured with (`resolve_common`); each role's config adds its own fields."""

    name: str
    keystore: Path
    password_env: str
    data_dir: Path
    market_url: str
    rpc_url: str
    deployments: Path
    p2p_port: int
    p2p_host: str
    metrics_port: int
    metrics_host: str
    stake: int | None
    threads: int = 1


def tick_forever(tick: Callable[[], None], stop: threading.Event, heartbeats: Any, interval_s: float) -> None:
    """An agent's main loop: `tick` every `interval_s` until `stop`. A market or chain outage inside a tick
    is logged and the next tick does the same work again (the agent keeps its state; it never exits for
    one); `heartbeats` (the agent's counter) counts each tick ok or error."""
    import httpx

    from veritrain.chain.errors import RpcUnavailable
    from veritrain.errors import MarketError

    while not stop.is_set():
        try:
            tick()
            heartbeats.labels("ok").inc()
        except (MarketError, httpx.HTTPError) as err:  # market restarting or refusing: keep state, retry
            heartbeats.labels("error").inc()
            logger.warning("market: %s", err)
        except RpcUnavailable as err:  # a chain read failed mid-tick; the next tick does it again
            heartbeats.labels("error").inc()
            logger.warning("chain: %s", err)
        stop.wait(interval_s)


class AgentPlumbing:
    """What every agent opens the same way before its role logic: its key and address, the chain, a nonce
    clock, its blob store and the libp2p data plane serving it. Role agents subclass it."""

    def __init__(self, settings: AgentCommonConfig, account: LocalAccount | None = None) -> None:
        """``account``: the key to work under instead of the keystore's (a plant's key from its folder)."""
        from veritrain.blobstore import BlobStore
        from veritrain.keys import load_signer
        from veritrain.p2p.access import PartyAccess

        self.account = account or load_signer(settings.keystore, password_env=settings.password_env)
        self.address = str(self.account.address)
        self.chain = chain_patiently(lambda: connect_chain(settings.rpc_url, settings.deployments))
        self.deployment = self.chain.deployment
        self.clock = AgentClock()
        self.store = BlobStore(settings.data_dir / "blobs")
        self.access = PartyAccess(self._is_staked_party)
        self._buyers_file = settings.data_dir / "granted-buyers"
        self._buyers_of: set[int] = set()
        self._load_granted_buyers()
        self.blobs = BlobPlane(
            self.store,
            self.account,
            settings.p2p_port,
            settings.data_dir,
            settings.p2p_host,
            authorize=self.access,
        )
        self.p2p_addr = ""
        self.custody = CustodyKeeper(self.blobs, settings.data_dir)
        self.metrics = AgentMetrics(self.blobs.bytes_served)
        self._metrics_at = (settings.metrics_host, settings.metrics_port)

    def _is_staked_party(self, address: str) -> bool:
        """A blob requester is a party when it holds at least the smaller of the provider collateral and
        the verifier collateral as bonded stake (veritrain.p2p.access)."""
        params = self.chain.params
        threshold = min(params.provider_collateral, params.verifier_collateral)
        return self.chain.stake_of(address).bonded >= threshold

    def grant_buyer_of(self, chain_order_id: int) -> None:
        """Serve this order's buyer (its verified results and manifests) from now on, across restarts."""
        if chain_order_id in self._buyers_of:
            return
        buyer = self.chain.get_order(chain_order_id).buyer
        self.access.grant([buyer])
        self._buyers_of.add(chain_order_id)
        with self._buyers_file.open("a") as out:
            out.write(f"{chain_order_id} {buyer}\n")

    def _load_granted_buyers(self) -> None:
        if not self._buyers_file.exists():
            return
        for line in self._buyers_file.read_text().splitlines():
            order_id, _, buyer = line.partition(" ")
            try:
                self.access.grant([buyer])
            except InvalidInput:  # a line cut by a crash mid-write: the order is looked up again
                continue
            if order_id.isdigit():
                self._buyers_of.add(int(order_id))

    def keep_custody(self, market: MarketClient, requests: tuple[Custody, ...]) -> None:
        """Fetch, report and release the states the market asks us to keep (CustodyKeeper); called from the
        heartbeat thread, so the reports' nonces stay in order with the heartbeats'."""
        from veritrain.api_client import MarketRefused
        from veritrain.messages import CustodyReport, sign_message

        for digest in self.custody.update(requests):
            message = CustodyReport(
                agent=self.address,
                nonce=self.clock.next_nonce(),
                timestamp=self.clock.now(),
                state_digest=digest,
            )
            try:
                market.custody(sign_message(message, self.account.key, self.deployment.chain_id))
            except MarketRefused as err:  # released meanwhile: the next reply no longer lists it
                logger.info("custody report of %s not taken: %s", digest, err)

    def start_metrics(self) -> None:
        """Serve this agent's /metrics when a port is configured (0: off)."""
        host, port = self._metrics_at
        if port:
            self.metrics.serve(host, port)

    def signed_registration(self, role: AgentRole, device: DeviceProfile) -> Signed[Registration]:
        """This agent's registration for the market: measured device, recipes, libp2p address, signed."""
        from veritrain.messages import Registration, sign_message
        from veritrain.recipes import RECIPES

        message = Registration(
            agent=self.address,
            nonce=self.clock.next_nonce(),
            timestamp=self.clock.now(),
            role=role,
            operator=self.address,
            memory_mb=device.memory_bytes // 2**20,
            gflops=max(1, int(device.tflops * 1000)),
            hardware_class=device.hardware_class[:128],
            recipes=tuple(sorted(RECIPES)),
            p2p_addr=self.p2p_addr,
        )
        return sign_message(message, self.account.key, self.deployment.chain_id)


T = TypeVar("T")


def register_patiently(
    register: Callable[[], T],
    *,
    patience_s: float = REGISTER_PATIENCE_S,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``register`` (which signs a fresh registration each call, so a retry is never a replay) until
    the market answers, backing off 0.5 s, 1 s, 2 s … up to 30 s. Why: an agent started before its market,
    or while the market is too loaded to answer in time, should wait for it, not exit. Only an unreachable
    market, a timeout, 429 or a 5xx is retried; any other refusal (bad signature, wrong chain …) is final,
    and after ``patience_s`` the last error is raised."""
    from veritrain.api_client import MarketRefused
    from veritrain.errors import MarketError

    deadline = clock() + patience_s
    attempt = 0
    while True:
        try:
            return register()
        except MarketError as err:
            attempt += 1
            delay = backoff_delay(attempt, base=0.5, cap=30.0)
            transient = not isinstance(err, MarketRefused) or err.status == 429 or err.status >= 500
            if not transient or clock() + delay > deadline:
                raise
            logger.warning("market not ready (%s); registering again in %.1f s", err, delay)
            sleep(delay)


def chain_patiently(
    call: Callable[[], T],
    *,
    patience_s: float = REGISTER_PATIENCE_S,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``call`` (idempotent: it re-reads the chain first) until the chain node answers, with
    register_patiently's backoff. Why: an agent that starts while its link to the node is down (a machine
    booting offline, a node restarting) must wait for it like it waits for the market, not exit; only
    RpcUnavailable is retried, and after ``patience_s`` it is raised."""
    from veritrain.chain.errors import RpcUnavailable

    deadline = clock() + patience_s
    attempt = 0
    while True:
        try:
            return call()
        except RpcUnavailable as err:
            attempt += 1
            delay = backoff_delay(attempt, base=0.5, cap=30.0)
            if clock() + delay > deadline:
                raise
            logger.warning("chain not reachable (%s); trying again in %.1f s", err, delay)
            sleep(delay)


def preload_datasets() -> None:
    """Build every registered recipe's dataset now (seconds for the stdlib corpus), not in the first unit."""
    from veritrain.datasets import load_dataset
    from veritrain.recipes import RECIPES

    for name in sorted({recipe.dataset for recipe in RECIPES.values()}):
        try:
            load_dataset(name)
        except VeritrainError as err:  # a recipe this machine cannot serve: matching will not pick us for it
            logger.warning("dataset %s unavailable here: %s", name, err)


def stake_by_permit(chain: ChainClient, account: LocalAccount, amount: int) -> None:
    """Bond `amount` by an ERC-2612 permit and `stakeWithPermit`, which anyone may relay.

    The market has no relay route for stake permits yet, so the agent relays its own permit: one
    transaction whose gas it pays (every later action of the agent is a signature the market relays).
    A front-run permit does not block it: the allowance that permit set is used instead.
    """
    from veritrain.chain.errors import ContractReverted

    deadline = chain.deadline(SIGNATURE_TTL_S)
    permit = chain.sign_permit(account, chain.deployment.stake_manager, amount, deadline)
    try:
        chain.stake_with_permit(account.address, amount, permit, relayer=account)
    except ContractReverted:
        # Someone submitted the permit to the token first (copied from the mempool): the permit fails,
        # but the allowance it set is ours to stake with (issue 8 finding 11).
        if chain.allowance(account, chain.deployment.stake_manager) < amount:
            raise
        chain.stake(account, amount)


# --- CLI ----------------------------------------------------------------------------------------------


def add_common_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments both agents take; URLs default to veritrain.settings (VERITRAIN_* environment)."""
    parser.add_argument(
        "--keystore",
        "--key-file",
        dest="keystore",
        type=Path,
        default=None,
        help="the agent's encrypted keystore (`veritrain keys new`; a plain hex key file works but warns); "
        "default: $VERITRAIN_KEYSTORE",
    )
    parser.add_argument(
        "--password-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the keystore passphrase (default VERITRAIN_KEYSTORE_PASSWORD); "
        "a prompt when it is unset",
    )
    parser.add_argument("--name", default="", help="a label for logs")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: $VERITRAIN_DATA_DIR")
    parser.add_argument("--market-url", default=None)
    parser.add_argument("--rpc-url", default=None)
    parser.add_argument("--deployments", type=Path, default=None, help="default: $VERITRAIN_DEPLOYMENTS_FILE")
    parser.add_argument("--p2p-port", type=int, default=None, help="libp2p TCP port (default 0: any free)")
    parser.add_argument("--p2p-host", default=None, help="IPv4 address to listen on for libp2p")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--metrics-host", default=None, help="address /metrics listens on")
    parser.add_argument(
        "--stake", type=int, default=None, help="base units to keep bonded (default: all tokens)"
    )
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))


def resolve_common(args: argparse.Namespace) -> dict[str, Any]:
    from veritrain.settings import load_settings

    settings = load_settings(
        data_dir=args.data_dir,
        keystore=args.keystore,
        keystore_password_env=args.password_env,
        market_url=args.market_url,
        chain_rpc_url=args.rpc_url,
        deployments_file=args.deployments,
        p2p_port=args.p2p_port,
        p2p_host=args.p2p_host,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    if settings.keystore is None:
        raise AgentError("no key: give --keystore FILE or set keystore in the configuration")
    return {
        "name": args.name or settings.keystore.stem,
        "keystore": settings.keystore,
        "password_env": settings.keystore_password_env,
        "data_dir": Path(settings.data_dir),
        "market_url": settings.market_url,
        "rpc_url": settings.chain_rpc_url,
        "deployments": settings.deployments_file or settings.data_dir / "deployments.json",
        "p2p_port": settings.p2p_port,
        "p2p_host": settings.p2p_host,
        "metrics_port": settings.metrics_port,
        "metrics_host": settings.metrics_host,
        "stake": args.stake,
        "threads": args.threads,
    }


def setup_logging(name: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat drowns the story


def run_agent(factory: Callable[[], Any], stop: threading.Event | None = None) -> int:
    """Start an agent and run it until SIGTERM/SIGINT (which set ``stop``) or until it stops itself; exit
    code 0 on a clean stop, 1 on a fatal error."""
    import signal

    stop = stop or threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        agent = factory()
        agent.start()
    except VeritrainError as err:
        logger.error("cannot start: %s: %s", type(err).__name__, err)
        return 1
    runner = threading.Thread(target=agent.run_forever, daemon=True, name="heartbeat")
    runner.start()
    try:
        while not stop.is_set() and runner.is_alive():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    agent.stop()
    return 0
