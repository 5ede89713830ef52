"""Provider agent (`veritrain node run`): sells this machine's training compute on the market.

Why it is built this way:
- It *pulls*: a signed heartbeat is both liveness and the request for work, so it runs behind home NAT
  and holds no broker credentials (DESIGN.md §2). Heartbeats go on while a unit trains (training runs in
  a worker thread), so the market never mistakes a busy provider for a lost one.
- It never sends a transaction: stake (ERC-2612 permit), accepts and commits are EIP-712 signatures the
  market relays; reveals are the commitment's preimage, valid from anyone. A provider needs no gas.
- Everything it must not forget lives in its data dir: unit checkpoints (node/unit.py resumes from the
  last one) and the salt and result of a commit (written *before* the commit is sent). A crash or restart
  costs at most the steps since the last checkpoint of one unit.
- Its blobs (start/final states, checkpoints, PoL transcripts) stay in its own BlobStore and are served
  over libp2p; a state blob is the canonical encoding of the state, so its content address (sha256 of
  the bytes) *is* its canonical state digest (veritrain.pol.state_digest) — one name for one state.
- `--dishonest STRATEGY` turns it into a cheater from node/dishonest.py, for demos and tests only; it
  says so loudly in its log and registration name.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
from pydantic import Field

from veritrain.codec import WireModel
from veritrain.errors import AgentError, InvalidInput, MarketError, VeritrainError

if TYPE_CHECKING:
    import torch
    from eth_account.signers.local import LocalAccount

    from veritrain.blobstore import BlobStore
    from veritrain.chain.client import ChainClient
    from veritrain.datasets import Dataset
    from veritrain.messages import Assignment, VerificationJobView
    from veritrain.pol import State, Transcript, UnitSpec

logger = logging.getLogger("veritrain.node")

HEARTBEAT_INTERVAL_S = 0.5
SIGNATURE_TTL_S = 600
HTTP_TIMEOUT_S = 15.0
DEFAULT_PRICE_PER_PFLOP = 10**18  # 1 VERI per PFLOP of training compute
MAX_STATE_BLOB_BYTES = 2 * 1024**3


# --- canonical state blobs ----------------------------------------------------------------------------
#
# The blob of a state is exactly the byte stream veritrain.pol.state_digest hashes: the domain tag, the
# tensor count, then per tensor (sorted by name) its name, dtype, shape and raw little-endian bytes, each
# length-prefixed. So sha256(blob) == state_digest(state), and fetching a state by its canonical digest
# over the content-addressed data plane needs no second name.

_STATE_DOMAIN = b"veritrain/state/v1"
_DTYPE_NAMES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


def encode_state(state: Mapping[str, torch.Tensor]) -> bytes:
    """The canonical bytes of a state (see above); their sha256 equals veritrain.pol.state_digest."""
    import torch

    parts = [_STATE_DOMAIN, len(state).to_bytes(8, "big")]
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        name_bytes = name.encode()
        dtype_bytes = str(tensor.dtype).removeprefix("torch.").encode()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        parts += [
            len(name_bytes).to_bytes(4, "big") + name_bytes,
            len(dtype_bytes).to_bytes(4, "big") + dtype_bytes,
            tensor.ndim.to_bytes(4, "big") + b"".join(d.to_bytes(8, "big") for d in tensor.shape),
            len(raw).to_bytes(8, "big"),
            raw,
        ]
    return b"".join(parts)


def decode_state(blob: bytes) -> dict[str, torch.Tensor]:
    """Tensors from canonical state bytes; InvalidInput for anything truncated, oversized or inconsistent."""
    import torch

    view = memoryview(blob)
    offset = 0

    def take(count: int) -> memoryview:
        nonlocal offset
        if count < 0 or offset + count > len(view):
            raise InvalidInput(f"state blob truncated at byte {offset} (needs {count} more)")
        chunk = view[offset : offset + count]
        offset += count
        return chunk

    def number(width: int) -> int:
        return int.from_bytes(take(width), "big")

    if bytes(take(len(_STATE_DOMAIN))) != _STATE_DOMAIN:
        raise InvalidInput("not a canonical state blob (wrong domain tag)")
    count = number(8)
    if count > 100_000:
        raise InvalidInput(f"state blob claims {count} tensors")
    state: dict[str, torch.Tensor] = {}
    previous = ""
    for _ in range(count):
        name = bytes(take(number(4))).decode("utf-8", errors="strict")
        if state and name <= previous:
            raise InvalidInput("state blob tensors are not in strictly sorted order")
        previous = name
        dtype_name = bytes(take(number(4))).decode("ascii", errors="strict")
        if dtype_name not in _DTYPE_NAMES:
            raise InvalidInput(f"state blob tensor {name!r} has unsupported dtype {dtype_name!r}")
        dtype = getattr(torch, dtype_name)
        ndim = number(4)
        if ndim > 16:
            raise InvalidInput(f"state blob tensor {name!r} has {ndim} dimensions")
        shape = tuple(number(8) for _ in range(ndim))
        size = number(8)
        expected = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        if size != expected:
            raise InvalidInput(f"state blob tensor {name!r}: {size} bytes for shape {shape} of {dtype_name}")
        raw = bytearray(take(size))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        state[name] = flat.view(dtype).reshape(shape).clone()
    if offset != len(view):
        raise InvalidInput(f"state blob has {len(view) - offset} trailing bytes")
    return state


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


# --- unit manifest: what a replica's result consists of, as one blob --------------------------------


@dataclass(frozen=True)
class UnitManifest:
    """A replica's result in one small blob: the PoL transcript and the blob of every checkpoint state.

    Verifiers fetch this first (by `transcript_digest`, its sha256), then only the checkpoints they replay.
    """

    transcript: dict[str, Any]
    result_digest: str
    state_digest: str
    transcript_root: str

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "transcript": self.transcript,
                "result_digest": self.result_digest,
                "state_digest": self.state_digest,
                "transcript_root": self.transcript_root,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitManifest:
        try:
            raw = json.loads(data)
            return cls(
                transcript=dict(raw["transcript"]),
                result_digest=str(raw["result_digest"]),
                state_digest=str(raw["state_digest"]),
                transcript_root=str(raw["transcript_root"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidInput(f"malformed unit manifest: {err}") from err


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


def load_account(key_file: Path) -> LocalAccount:
    """The agent's eth-account key from a file holding its hex private key (mode 0600 recommended)."""
    from eth_account import Account

    try:
        text = key_file.read_text().strip()
        return Account.from_key(text)
    except FileNotFoundError:
        raise AgentError(f"key file {key_file} does not exist") from None
    except ValueError as err:
        raise AgentError(f"key file {key_file} does not hold a private key: {err}") from err


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
        )

    def start(self) -> str:
        """Start listening; returns the full multiaddr (with /p2p/<peer id>) other agents dial."""
        return self._node.start()

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


# --- provider agent -----------------------------------------------------------------------------------


def unit_spec_of(unit: Assignment | VerificationJobView) -> Any:
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


@dataclass
class UnitRecord:
    """What the agent remembers about one assigned unit, persisted as JSON in the unit's folder."""

    unit_id: int
    accept_signature: str | None = None
    accept_nonce: int | None = None
    accept_deadline: int | None = None
    result_digest: str | None = None
    salt: str | None = None
    state_digest: str | None = None
    transcript_root: str | None = None
    transcript_digest: str | None = None
    committed: bool = False
    revealed: bool = False
    losses: list[float] = field(default_factory=list)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "record.json.tmp"
        tmp.write_text(json.dumps(self.__dict__, sort_keys=True))
        os.replace(tmp, folder / "record.json")

    @classmethod
    def load(cls, folder: Path, unit_id: int) -> UnitRecord:
        path = folder / "record.json"
        if not path.exists():
            return cls(unit_id=unit_id)
        return cls(**json.loads(path.read_text()))


@dataclass(frozen=True)
class AgentConfig:
    name: str
    key_file: Path
    data_dir: Path
    market_url: str
    rpc_url: str
    deployments: Path
    p2p_port: int
    p2p_host: str
    price_per_pflop: int
    price_step_bps: int
    stake: int | None
    dishonest: str | None
    device: str = "cpu"
    threads: int = 1


class ProviderAgent:
    """One provider: register, stake, heartbeat, accept, train, commit, reveal, serve blobs."""

    def __init__(self, config: AgentConfig) -> None:
        from market.client import MarketClient
        from veritrain.blobstore import BlobStore

        self.config = config
        self.account = load_account(config.key_file)
        self.address = str(self.account.address)
        self.chain = connect_chain(config.rpc_url, config.deployments)
        self.deployment = self.chain.deployment
        self.market = MarketClient(config.market_url, timeout=HTTP_TIMEOUT_S)
        self.clock = AgentClock()
        self.store = BlobStore(config.data_dir / "blobs")
        self.blobs = BlobPlane(self.store, self.account, config.p2p_port, config.data_dir, config.p2p_host)
        self.units_dir = config.data_dir / "units"
        self.p2p_addr = ""
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
        self._stop = threading.Event()
        self.dishonest = load_forger(config.dishonest) if config.dishonest else None
        if config.dishonest:
            logger.warning(
                "*** DISHONEST MODE: strategy %r — this agent cheats on purpose ***", config.dishonest
            )

    # lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Measure the device, open the data plane, stake, register, offer."""
        from node.device import measure_device

        self.device = measure_device(self.config.device)
        logger.info(
            "device %s: %.3f TFLOP/s, %d MiB free, class %s",
            self.device.device,
            self.device.tflops,
            self.device.memory_bytes // 2**20,
            self.device.hardware_class,
        )
        self.p2p_addr = self.blobs.start()
        logger.info("serving blobs at %s", self.p2p_addr)
        preload_datasets()
        self.ensure_stake()  # before registering: the market reads our free stake when we register
        self.register()
        self.send_offer()

    def stop(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=30)
        self.blobs.stop()
        self.market.close()

    def run_forever(self) -> None:
        """Heartbeat loop: every reply may hand out work; errors from the market are logged and retried."""
        while not self._stop.is_set():
            try:
                self.tick()
            except (MarketError, httpx.HTTPError) as err:  # market restarting or refusing: keep state, retry
                logger.warning("market: %s", err)
            self._stop.wait(HEARTBEAT_INTERVAL_S)

    # market messages ----------------------------------------------------------------------------------

    def register(self) -> None:
        from veritrain.messages import AgentRole, Registration, sign_message
        from veritrain.recipes import RECIPES

        message = Registration(
            agent=self.address,
            nonce=self.clock.next_nonce(),
            timestamp=self.clock.now(),
            role=AgentRole.PROVIDER,
            operator=self.address,
            memory_mb=self.device.memory_bytes // 2**20,
            gflops=max(1, int(self.device.tflops * 1000)),
            hardware_class=self.device.hardware_class[:128],
            recipes=tuple(sorted(RECIPES)),
            p2p_addr=self.p2p_addr,
        )
        self.market.register(sign_message(message, self.account.key, self.deployment.chain_id))
        logger.info("registered %s as provider %s", self.address, self.config.name)

    def units_done(self) -> int:
        """Units this agent has finished training (their records survive restarts)."""
        if not self.units_dir.is_dir():
            return 0
        records = (json.loads(path.read_text()) for path in self.units_dir.glob("*/record.json"))
        return sum(1 for record in records if record.get("result_digest"))

    def current_price(self) -> int:
        """The ask: base price raised by `price_step_bps` per unit done (busy providers get dearer, so work
        spreads over the market instead of piling onto the cheapest few)."""
        base = self.config.price_per_pflop
        return base + base * self.config.price_step_bps * self.units_done() // 10_000

    def send_offer(self) -> None:
        from veritrain.messages import Offer, sign_message

        message = Offer(
            agent=self.address,
            nonce=self.clock.next_nonce(),
            timestamp=self.clock.now(),
            price_per_pflop=self.current_price(),
            expires_at=self.clock.now() + 24 * 3600,
        )
        self.market.offer(sign_message(message, self.account.key, self.deployment.chain_id))
        logger.info("offer: %d base units per PFLOP", message.price_per_pflop)

    def ensure_stake(self) -> None:
        """Stake by an ERC-2612 permit unless enough is already bonded (default: every token we hold)."""
        wanted = (
            self.config.stake if self.config.stake is not None else self.chain.token_balance(self.address)
        )
        bonded = self.chain.stake_of(self.address).bonded
        if bonded >= wanted or wanted == 0:
            logger.info("bonded stake %d already covers %d", bonded, wanted)
            return
        amount = min(wanted - bonded, self.chain.token_balance(self.address))
        if amount <= 0:
            raise AgentError(f"{self.address} has no tokens to stake (bonded {bonded}, wanted {wanted})")
        stake_by_permit(self.chain, self.account, amount)
        logger.info("staked %d by permit (bonded now %d)", amount, self.chain.stake_of(self.address).bonded)

    def tick(self) -> None:
        """One heartbeat and the work its reply asks for."""
        from veritrain.messages import AssignmentPhase, Heartbeat, sign_message

        self._check_worker()
        message = Heartbeat(
            agent=self.address,
            nonce=self.clock.next_nonce(),
            timestamp=self.clock.now(),
            busy=self._worker is not None,
        )
        reply = self.market.heartbeat(sign_message(message, self.account.key, self.deployment.chain_id))
        for assignment in reply.assignments:
            if assignment.phase == AssignmentPhase.ACCEPT:
                self.accept(assignment)
            elif assignment.phase == AssignmentPhase.RUN:
                self.run_or_commit(assignment)
            elif assignment.phase == AssignmentPhase.REVEAL:
                self.reveal(assignment)

    # unit phases --------------------------------------------------------------------------------------

    def unit_dir(self, unit_id: int) -> Path:
        return self.units_dir / str(unit_id)

    def accept(self, assignment: Assignment) -> None:
        """Sign the contract's Accept (same signature again if the market asks twice)."""
        from veritrain.messages import AcceptSubmission

        folder = self.unit_dir(assignment.unit_id)
        record = UnitRecord.load(folder, assignment.unit_id)
        if record.accept_signature is None or record.accept_deadline != assignment.accept_deadline:
            signed = self.chain.sign_accept(
                self.account, assignment.chain_order_id, assignment.unit_key, assignment.accept_deadline
            )
            record.accept_signature, record.accept_nonce = "0x" + signed.signature.hex(), signed.nonce
            record.accept_deadline = assignment.accept_deadline
            record.save(folder)
        assert record.accept_signature is not None and record.accept_nonce is not None
        self.market.accept(
            AcceptSubmission(
                unit_id=assignment.unit_id,
                provider=self.address,
                nonce=record.accept_nonce,
                deadline=assignment.accept_deadline,
                signature=record.accept_signature,
            ),
        )
        logger.info(
            "accepted unit %d (order %d, round %d)",
            assignment.unit_id,
            assignment.order_id,
            assignment.round_index,
        )

    def run_or_commit(self, assignment: Assignment) -> None:
        """Start training the unit in the background, or commit its result once it is there."""
        folder = self.unit_dir(assignment.unit_id)
        record = UnitRecord.load(folder, assignment.unit_id)
        if record.committed:
            return
        if record.result_digest is not None:
            self.commit(assignment, record)
            return
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._train_guarded, args=(assignment,), daemon=True, name=f"unit-{assignment.unit_id}"
            )
            self._worker.start()

    def _check_worker(self) -> None:
        if self._worker is not None and not self._worker.is_alive():
            self._worker.join()
            self._worker = None
            if self._worker_error is not None:
                error, self._worker_error = self._worker_error, None
                logger.error("unit failed: %s: %s", type(error).__name__, error)
            elif self.config.price_step_bps:
                self.send_offer()

    def _train_guarded(self, assignment: Assignment) -> None:
        try:
            self.train(assignment)
        except BaseException as err:  # reported by the heartbeat loop; the agent itself keeps running
            self._worker_error = err

    def start_state(self, assignment: Assignment) -> State:
        """The unit's start state: the recipe's seeded init for the first round, else fetched by digest."""
        from veritrain.pol import initial_state

        spec = unit_spec_of(assignment)
        source = assignment.start_state
        if source.state_digest is None:
            return initial_state(spec.recipe_config(), assignment.seed)
        digest = source.state_digest.removeprefix("0x")
        return decode_state(self.blobs.fetch_any(list(source.holders), digest))

    def train(self, assignment: Assignment) -> None:
        """Run the unit (resuming from its checkpoints) and keep its blobs; the next heartbeat commits."""
        from node.unit import run_unit
        from veritrain.datasets import load_dataset
        from veritrain.pol import result_digest

        folder = self.unit_dir(assignment.unit_id)
        spec = unit_spec_of(assignment)
        start = self.start_state(assignment)
        self.store.put(encode_state(start))
        dataset = load_dataset(spec.recipe_config().dataset, unhex32(assignment.dataset_digest))
        started = time.monotonic()
        report_every = max(1, spec.steps // 4)
        saved = sorted((folder / "work").glob("ckpt-*.safetensors")) if (folder / "work").is_dir() else []
        if saved:
            logger.info("unit %d: resuming after a restart from %s", assignment.unit_id, saved[-1].name)

        def on_progress(step: int, total: int, loss: float) -> None:
            if step % report_every == 0 or step == total:
                logger.info(
                    "unit %d: step %d/%d loss %.4f (%.1fs)",
                    assignment.unit_id,
                    step,
                    total,
                    loss,
                    time.monotonic() - started,
                )

        if self.dishonest is not None:
            logger.warning(
                "*** DISHONEST: forging unit %d with %s ***", assignment.unit_id, self.config.dishonest
            )
            final_state, transcript, checkpoints = self.dishonest(spec, start, dataset)
        else:
            result = run_unit(spec, start, folder / "work", on_progress=on_progress, dataset=dataset)
            final_state, transcript = result.final_state, result.transcript
            checkpoints = [load_state_file(path) for path in result.checkpoint_paths]
        for checkpoint in checkpoints:
            self.store.put(encode_state(checkpoint))
        self.store.put(encode_state(final_state))
        root = transcript.merkle_root()
        manifest = UnitManifest(
            transcript=transcript.to_json(),
            result_digest=hex32(result_digest(transcript.final_digest, root)),
            state_digest=hex32(transcript.final_digest),
            transcript_root=hex32(root),
        )
        manifest_digest = self.store.put(manifest.to_bytes())
        self.blobs.publish_manifest(manifest.result_digest, manifest_digest)
        record = UnitRecord.load(folder, assignment.unit_id)
        record.transcript_digest = "0x" + manifest_digest
        record.result_digest, record.state_digest = manifest.result_digest, manifest.state_digest
        record.transcript_root = manifest.transcript_root
        record.salt = hex32(secrets.token_bytes(32))
        record.losses = [float(loss) for loss in transcript.losses]
        record.save(folder)  # salt and result on disk before the commitment leaves this process
        logger.info(
            "unit %d done in %.1fs: result %s, final loss %.4f",
            assignment.unit_id,
            time.monotonic() - started,
            record.result_digest,
            record.losses[-1],
        )

    def commit(self, assignment: Assignment, record: UnitRecord) -> None:
        from veritrain.messages import CommitSubmission

        if assignment.chain_unit_id is None:
            return
        assert record.result_digest is not None and record.salt is not None
        value = hex32(
            self.chain.commitment(record.result_digest, record.salt, self.address, assignment.chain_unit_id)
        )
        deadline = self.chain.now() + SIGNATURE_TTL_S  # the contract's commit window bounds it anyway
        signed = self.chain.sign_commit(self.account, assignment.chain_unit_id, value, deadline)
        self.market.commit(
            CommitSubmission(
                unit_id=assignment.unit_id,
                provider=self.address,
                commitment=value,
                nonce=signed.nonce,
                deadline=deadline,
                signature="0x" + signed.signature.hex(),
            ),
        )
        record.committed = True
        record.save(self.unit_dir(assignment.unit_id))
        logger.info("committed unit %d (chain unit %d)", assignment.unit_id, assignment.chain_unit_id)

    def reveal(self, assignment: Assignment) -> None:
        from veritrain.messages import RevealSubmission

        folder = self.unit_dir(assignment.unit_id)
        record = UnitRecord.load(folder, assignment.unit_id)
        if record.revealed or record.result_digest is None:
            return
        assert record.salt and record.state_digest and record.transcript_root
        self.market.reveal(
            RevealSubmission(
                unit_id=assignment.unit_id,
                provider=self.address,
                result_digest=record.result_digest,
                salt=record.salt,
                state_digest=record.state_digest,
                transcript_root=record.transcript_root,
            ),
        )
        record.revealed = True
        record.save(folder)
        logger.info("revealed unit %d: %s", assignment.unit_id, record.result_digest)


Forger = Callable[["UnitSpec", "State", "Dataset"], tuple["State", "Transcript", list["State"]]]


def load_forger(strategy: str) -> Forger:
    """A cheating unit runner from node/dishonest.py: (spec, start, dataset) -> (final, transcript, ckpts)."""
    from node import dishonest

    try:
        forge = dishonest.forge_unit
    except AttributeError as err:
        raise AgentError(f"node.dishonest has no forge_unit: {err}") from err
    names = getattr(dishonest, "STRATEGIES", None)
    if names is not None and strategy not in names:
        raise AgentError(f"unknown dishonest strategy {strategy!r}; known: {sorted(names)}")

    def run(spec: UnitSpec, start: State, dataset: Dataset) -> tuple[State, Transcript, list[State]]:
        forged = forge(strategy, spec, start, dataset)
        return forged.final_state, forged.transcript, list(forged.checkpoints.values())

    return run


def preload_datasets() -> None:
    """Build every registered recipe's dataset now (seconds for the stdlib corpus), not in the first unit."""
    from veritrain.datasets import load_dataset
    from veritrain.recipes import RECIPES

    for name in sorted({recipe.dataset for recipe in RECIPES.values()}):
        try:
            load_dataset(name)
        except VeritrainError as err:  # a recipe this machine cannot serve: matching will not pick us for it
            logger.warning("dataset %s unavailable here: %s", name, err)


def load_state_file(path: Path) -> State:
    from node.unit import load_checkpoint

    return dict(load_checkpoint(path))


def stake_by_permit(chain: ChainClient, account: LocalAccount, amount: int) -> None:
    """Bond `amount` by an ERC-2612 permit and `stakeWithPermit`, which anyone may relay.

    The market has no relay route for stake permits yet, so the agent relays its own permit: one
    transaction whose gas it pays (every later action of the agent is a signature the market relays).
    """
    permit = chain.sign_permit(account, chain.deployment.stake_manager, amount, chain.now() + SIGNATURE_TTL_S)
    chain.stake_with_permit(account.address, amount, permit, relayer=account)


# --- CLI ----------------------------------------------------------------------------------------------


def add_common_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments both agents take; URLs default to veritrain.settings (VERITRAIN_* environment)."""
    parser.add_argument(
        "--key-file", type=Path, required=True, help="file holding the agent's hex private key"
    )
    parser.add_argument("--name", default="", help="a label for logs")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: $VERITRAIN_DATA_DIR")
    parser.add_argument("--market-url", default=None)
    parser.add_argument("--rpc-url", default=None)
    parser.add_argument("--deployments", type=Path, default=None, help="default: $VERITRAIN_DEPLOYMENTS_FILE")
    parser.add_argument("--p2p-port", type=int, default=0, help="libp2p TCP port (0: any free port)")
    parser.add_argument("--p2p-host", default="127.0.0.1", help="IPv4 address to listen on for libp2p")
    parser.add_argument(
        "--stake", type=int, default=None, help="base units to keep bonded (default: all tokens)"
    )
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))


def resolve_common(args: argparse.Namespace) -> dict[str, Any]:
    from veritrain.settings import load_settings

    settings = load_settings(data_dir=args.data_dir)
    deployments = args.deployments or settings.deployments_file or settings.data_dir / "deployments.json"
    return {
        "name": args.name or args.key_file.stem,
        "key_file": args.key_file,
        "data_dir": Path(settings.data_dir),
        "market_url": args.market_url or settings.market_url,
        "rpc_url": args.rpc_url or settings.chain_rpc_url,
        "deployments": deployments,
        "p2p_port": args.p2p_port,
        "p2p_host": args.p2p_host,
        "stake": args.stake,
        "threads": args.threads,
    }


def setup_logging(name: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat drowns the story


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_agent_arguments(parser)
    parser.add_argument("--price-per-pflop", type=int, default=DEFAULT_PRICE_PER_PFLOP)
    parser.add_argument(
        "--price-step-bps", type=int, default=0, help="raise the ask by this much of the base per unit done"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dishonest",
        default=None,
        metavar="STRATEGY",
        help="DEMO/TEST ONLY: cheat with a strategy from node/dishonest.py",
    )


def run(args: argparse.Namespace) -> int:
    common = resolve_common(args)
    setup_logging(common["name"])
    import torch

    torch.set_num_threads(max(1, common["threads"]))
    config = AgentConfig(
        price_per_pflop=args.price_per_pflop,
        price_step_bps=args.price_step_bps,
        dishonest=args.dishonest,
        device=args.device,
        **common,
    )
    return run_agent(lambda: ProviderAgent(config))


def run_agent(factory: Callable[[], Any]) -> int:
    """Start an agent and run it until SIGTERM/SIGINT; exit code 0 on a clean stop, 1 on a fatal error."""
    import signal

    stop = threading.Event()
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
