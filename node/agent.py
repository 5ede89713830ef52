"""Provider agent (`veritrain node run`): sells this machine's training compute on the market.

Why it is built this way:
- It *pulls*: a signed heartbeat is both liveness and the request for work, so it runs behind home NAT
  and holds no broker credentials (DESIGN.md §2). Heartbeats go on while a unit trains (training runs in
  a worker thread), so the market never mistakes a busy provider for a lost one.
- It sends no transaction to work: stake (ERC-2612 permit), accepts and commits are EIP-712 signatures
  the market relays; reveals are the commitment's preimage, valid from anyone. Its transactions of its
  own are an appeal (veritrain.chain.appeal_watch) of a verdict that calls a result it computed honestly
  fraud: colluding verifiers could otherwise frame it, with no honest minority to appeal; and, on the
  round path (veritrain.chain.slot_watch), the opening of a roster slot whose round is still unrevealed
  near the end of its reveal window (`publishOpening`): a market that left it out could otherwise give the
  slot as withheld. Both need gas; without it the transaction fails, is logged, and the chain decides
  without it.
- Everything it must not forget lives in its data dir: unit checkpoints (node/unit.py resumes from the
  last one) and the salt and result of a commit (written *before* the commit is sent). A crash or restart
  costs at most the steps since the last checkpoint of one unit.
- Its blobs (start/final states, checkpoints, PoL transcripts) stay in its own BlobStore and are served
  over libp2p; a state blob is the canonical encoding of the state, so its content address (sha256 of
  the bytes) *is* its canonical state digest (veritrain.pol.state_digest) — one name for one state.
- `--dishonest STRATEGY` turns it into a cheater from node/dishonest.py, for demos and tests only; it
  says so loudly in its log and registration name. With `--dishonest-after N` it works its first N units
  honestly and cheats from then on: a cheater that first earns the trust that lets it work units alone.
- `--plant` (with `--dishonest`) is the operator's own planted cheat, a verifier canary: the market routes
  only planted canary units to it (VERITRAIN_PLANT_AGENTS), it forges each one, and it appeals a verdict
  that *accepts* a forged result, since only verifiers who did not re-execute can have signed that. A
  caught plant is spent (its fraud record would give its next unit away): with `--plant-keys DIR` the
  keystore is the market's canary account, which enrolls each key of DIR with the market, and the agent
  moves to the next key once the current one is caught (node/plant.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from veritrain.agentkit import (
    HTTP_TIMEOUT_S,
    SIGNATURE_TTL_S,
    AgentCommonConfig,
    AgentPlumbing,
    UnitManifest,
    add_common_agent_arguments,
    aggregate_inputs_of,
    chain_patiently,
    encode_state,
    folded_start_of,
    hex32,
    preload_datasets,
    register_patiently,
    resolve_common,
    run_agent,
    setup_logging,
    stake_by_permit,
    tick_forever,
    unhex32,
    unit_spec_of,
    unit_start_of,
)
from veritrain.chain.appeal_watch import VerdictWatch
from veritrain.chain.slot_watch import SlotWatch
from veritrain.errors import AgentError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from veritrain.datasets import Dataset
    from veritrain.messages import Assignment
    from veritrain.pol import State, Transcript, UnitSpec

logger = logging.getLogger("veritrain.node")

HEARTBEAT_INTERVAL_S = 0.5
APPEAL_WATCH_INTERVAL_S = 5.0  # how often the verdicts of our revealed units are checked (chain reads)
DEFAULT_PRICE_PER_PFLOP = 10**18  # 1 VERI per PFLOP of training compute
PROGRESS_POINTS_PER_UNIT = 200  # loss points a replica reports to the market's live curve, at most


# --- provider agent -----------------------------------------------------------------------------------


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
    round_state_digest: str | None = None  # a folded unit's outer step, revealed with its result
    inputs_commitment: str | None = None
    transcript_digest: str | None = None
    committed: bool = False
    revealed: bool = False
    forged: bool = False  # --dishonest forged this result: never vouched for in an appeal
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


@dataclass(frozen=True, kw_only=True)
class AgentConfig(AgentCommonConfig):
    price_per_pflop: int
    price_step_bps: int
    dishonest: str | None
    dishonest_after: int = 0  # units trained honestly before the strategy takes over
    plant: bool = False  # the operator's planted cheat: appeal a verdict that accepts a forged result
    device: str = "cpu"


class ProviderAgent(AgentPlumbing):
    """One provider: register, stake, heartbeat, accept, train, commit, reveal, serve blobs."""

    def __init__(self, config: AgentConfig, account: LocalAccount | None = None) -> None:
        from veritrain.api_client import MarketClient

        super().__init__(config, account)
        self.config = config
        self.market = MarketClient(config.market_url, timeout=HTTP_TIMEOUT_S)
        self.units_dir = config.data_dir / "units"
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
        self._stop = threading.Event()
        self._progress: list[tuple[int, int, float]] = []  # (unit, step, loss) the next tick reports
        self._progress_lock = threading.Lock()
        self.dishonest = load_forger(config.dishonest) if config.dishonest else None
        self._units_trained = 0  # this process's training units, for --dishonest-after
        # the units we revealed honestly: a verdict calling our replica fraud is appealed
        self.watch = VerdictWatch(self.chain, self.account, config.data_dir / "appeals.json")
        # the roster slots we opened: published on chain if their round is still pending late in its reveal
        # window, and a set-aside unit of ours handed to `watch`
        self.slots = SlotWatch(self.chain, self.account, config.data_dir / "slots.json", self.watch)
        self._watch_at = 0.0
        self.caught = False  # a plant whose fraud is on record, stopped once its open work is done
        if config.dishonest:
            logger.warning(
                "*** DISHONEST MODE: strategy %r — this agent cheats on purpose ***", config.dishonest
            )

    # lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Measure the device, open the data plane, stake, register, offer."""
        from veritrain.device import measure_device

        self.start_metrics()
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
        chain_patiently(self.ensure_stake)  # before registering: the market reads our free stake then
        self.register()
        self.send_offer()

    def stop(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=30)
        self.blobs.stop()
        self.market.close()
        self.metrics.close()

    def run_forever(self) -> None:
        """Heartbeat loop: every reply may hand out work; market and chain outages are logged and retried."""
        tick_forever(self.tick, self._stop, self.metrics.heartbeats, HEARTBEAT_INTERVAL_S)

    # market messages ----------------------------------------------------------------------------------

    def register(self) -> None:
        from veritrain.messages import AgentRole

        register_patiently(
            lambda: self.market.register(self.signed_registration(AgentRole.PROVIDER, self.device))
        )
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
        self.keep_custody(self.market, reply.custody)
        self.send_progress()
        if time.monotonic() >= self._watch_at:
            self._watch_at = time.monotonic() + APPEAL_WATCH_INTERVAL_S
            self.slots.tick()
            self.watch.tick()
            if self.config.plant and not reply.assignments:
                self._retire_if_caught()

    def _retire_if_caught(self) -> None:
        """A plant with fraud on record gets no more planted units (the market routes them only to plants
        never caught): once it has no work left, not even an appeal to follow, it stops."""
        if self._worker is None and not self.watch.units and self.chain.reputation(self.address).fraud:
            logger.info("plant %s is caught and has nothing left to do: stopping", self.address)
            self.caught = True
            self._stop.set()

    def send_progress(self) -> None:
        """Report the losses recorded since the last tick, signed, at most MAX_PROGRESS_POINTS per message
        (from the heartbeat thread, so its nonces stay in order with the heartbeats')."""
        from veritrain.api_client import MarketRefused
        from veritrain.messages import LOSS_SCALE, MAX_PROGRESS_POINTS, Progress, sign_message

        with self._progress_lock:
            points, self._progress = self._progress, []
        while points:
            unit_id = points[0][0]
            batch = [p for p in points if p[0] == unit_id][:MAX_PROGRESS_POINTS]
            points = [p for p in points if p not in batch]
            message = Progress(
                agent=self.address,
                nonce=self.clock.next_nonce(),
                timestamp=self.clock.now(),
                unit_id=unit_id,
                steps=tuple(step for _, step, _ in batch),
                losses_e6=tuple(max(0, round(loss * LOSS_SCALE)) for _, _, loss in batch),
            )
            try:
                self.market.progress(sign_message(message, self.account.key, self.deployment.chain_id))
            except MarketRefused as err:  # the unit moved on (dropped, settled): the points are moot
                logger.info("progress of unit %d not taken: %s", unit_id, err)

    # unit phases --------------------------------------------------------------------------------------

    def unit_dir(self, unit_id: int) -> Path:
        return self.units_dir / str(unit_id)

    def accept(self, assignment: Assignment) -> None:
        """Sign the contract's Accept (same signature again if the market asks twice)."""
        from veritrain.messages import AcceptSubmission

        self.grant_buyer_of(assignment.chain_order_id)  # the buyer will fetch what this unit produces
        if assignment.settlement == "rounds":
            self.accept_roster(assignment)
            return
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

    def accept_roster(self, assignment: Assignment) -> None:
        """Sign the Accept of a round-path order's roster once (its unit key is the roster key, whatever the
        slots held) and hand it in; the same signature again if the market asks twice."""
        from veritrain.messages import RosterAcceptSubmission

        path = self.config.data_dir / "rosters" / f"{assignment.chain_order_id}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        if (
            record.get("unit_key") != assignment.unit_key
            or record.get("deadline") != assignment.accept_deadline
        ):
            signed = self.chain.sign_accept(
                self.account, assignment.chain_order_id, assignment.unit_key, assignment.accept_deadline
            )
            record = {
                "unit_key": assignment.unit_key,
                "deadline": assignment.accept_deadline,
                "nonce": signed.nonce,
                "signature": "0x" + signed.signature.hex(),
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, sort_keys=True))
            os.replace(tmp, path)
        self.market.roster_accept(
            RosterAcceptSubmission(
                order_id=assignment.order_id,
                provider=self.address,
                nonce=record["nonce"],
                deadline=record["deadline"],
                signature=record["signature"],
            )
        )
        logger.info("accepted the roster of order %d (key %s)", assignment.order_id, assignment.unit_key)

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
                self.metrics.units.labels("failed").inc()
                logger.error("unit failed: %s: %s", type(error).__name__, error)
            elif self.config.price_step_bps:
                self.send_offer()

    def _train_guarded(self, assignment: Assignment) -> None:
        try:
            self.train(assignment)
        except BaseException as err:  # reported by the heartbeat loop; the agent itself keeps running
            self._worker_error = err

    def aggregate(self, assignment: Assignment) -> None:
        """Run an aggregate unit (the DiLoCo outer step) and keep its output state, the next round's start.
        Its reveal carries the output digest and the inputs commitment, which open its result digest."""
        from veritrain.diloco import aggregate

        folder = self.unit_dir(assignment.unit_id)
        result = aggregate(aggregate_inputs_of(assignment, self.blobs))
        self.store.put(encode_state(result.output_state))
        record = UnitRecord.load(folder, assignment.unit_id)
        record.result_digest = hex32(result.result_digest)
        record.state_digest = hex32(result.output_digest)
        record.transcript_root = hex32(result.inputs_commitment)
        record.salt = hex32(secrets.token_bytes(32))
        record.save(folder)  # salt and result on disk before the commitment leaves this process
        logger.info(
            "aggregate unit %d done: next round starts from %s", assignment.unit_id, record.state_digest
        )

    def train(self, assignment: Assignment) -> None:
        """Run the unit (resuming from its checkpoints) and keep its blobs; the next heartbeat commits."""
        from node.unit import run_unit
        from veritrain.datasets import load_dataset
        from veritrain.diloco import folded_result_digest
        from veritrain.messages import UnitKind
        from veritrain.pol import result_digest
        from veritrain.progress import progress_bar

        if assignment.kind == UnitKind.AGGREGATE:
            self.aggregate(assignment)
            return
        folder = self.unit_dir(assignment.unit_id)
        spec = unit_spec_of(assignment)
        folded = folded_start_of(assignment, self.blobs) if assignment.folds else None
        start = unit_start_of(assignment, self.blobs) if folded is None else folded.start_state
        self.store.put(encode_state(start))
        if folded is not None:  # the round's state: the next round's units and the last aggregate fetch it
            self.store.put(encode_state(folded.round_state))
        dataset = load_dataset(spec.recipe_config().dataset, unhex32(assignment.dataset_digest))
        started = time.monotonic()
        report_every = max(1, spec.steps // 4)
        sample_every = max(1, spec.steps // PROGRESS_POINTS_PER_UNIT)
        steps_run = 0
        saved = sorted((folder / "work").glob("ckpt-*.safetensors")) if (folder / "work").is_dir() else []
        if saved:
            logger.info("unit %d: resuming after a restart from %s", assignment.unit_id, saved[-1].name)

        def on_progress(step: int, total: int, loss: float) -> None:
            nonlocal steps_run
            steps_run += 1
            if step % sample_every == 0 or step == total:
                with self._progress_lock:
                    self._progress.append((assignment.unit_id, step, loss))
            if step % report_every == 0 or step == total:
                logger.info(
                    "unit %d: step %d/%d loss %.4f (%.1fs)",
                    assignment.unit_id,
                    step,
                    total,
                    loss,
                    time.monotonic() - started,
                )

        cheat = self.dishonest is not None and self._units_trained >= self.config.dishonest_after
        self._units_trained += 1
        if cheat and self.dishonest is not None:
            logger.warning(
                "*** DISHONEST: forging unit %d with %s ***", assignment.unit_id, self.config.dishonest
            )
            final_state, transcript, checkpoints = self.dishonest(spec, start, dataset)
        else:
            with progress_bar(f"unit {assignment.unit_id}", spec.steps) as bar:

                def tracked(step: int, total: int, loss: float) -> None:
                    on_progress(step, total, loss)
                    bar(step, loss=loss)

                result = run_unit(spec, start, folder / "work", on_progress=tracked, dataset=dataset)
            final_state, transcript = result.final_state, result.transcript
            checkpoints = [load_state_file(path) for path in result.checkpoint_paths]
        for checkpoint in checkpoints:
            self.store.put(encode_state(checkpoint))
        self.store.put(encode_state(final_state))
        root = transcript.merkle_root()
        trained = result_digest(transcript.final_digest, root)
        outer = None if folded is None else folded.fold
        manifest = UnitManifest(
            transcript=transcript.to_json(),
            result_digest=hex32(trained if outer is None else folded_result_digest(trained, outer)),
            state_digest=hex32(transcript.final_digest),
            transcript_root=hex32(root),
            round_state_digest=None if outer is None else hex32(outer.round_state_digest),
            inputs_commitment=None if outer is None else hex32(outer.inputs_commitment),
        )
        manifest_digest = self.store.put(manifest.to_bytes())
        self.blobs.publish_manifest(manifest.result_digest, manifest_digest)
        record = UnitRecord.load(folder, assignment.unit_id)
        record.transcript_digest = "0x" + manifest_digest
        record.result_digest, record.state_digest = manifest.result_digest, manifest.state_digest
        record.transcript_root = manifest.transcript_root
        record.round_state_digest, record.inputs_commitment = (
            manifest.round_state_digest,
            manifest.inputs_commitment,
        )
        record.salt = hex32(secrets.token_bytes(32))
        record.losses = [float(loss) for loss in transcript.losses]
        record.forged = cheat
        record.save(folder)  # salt and result on disk before the commitment leaves this process
        elapsed = time.monotonic() - started
        self.metrics.record_unit("trained", elapsed, steps_run * spec.recipe_config().tokens_per_step)
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
        if assignment.settlement == "rounds":
            if not self.commit_round(assignment, value):
                return  # the round's other slots of ours are still training
        else:
            deadline = self.chain.deadline(SIGNATURE_TTL_S)  # the contract's commit window bounds it anyway
            signed = self.chain.sign_unit_commit(self.account, assignment.chain_unit_id, value, deadline)
            self.market.commit(
                CommitSubmission(
                    unit_id=assignment.unit_id,
                    provider=self.address,
                    commitment=value,
                    deadline=deadline,
                    signature="0x" + signed.signature.hex(),
                ),
            )
        record.committed = True
        record.save(self.unit_dir(assignment.unit_id))
        logger.info("committed unit %d (chain unit %d)", assignment.unit_id, assignment.chain_unit_id)

    def commit_round(self, assignment: Assignment, commitment: str) -> bool:
        """Hold a roster slot's commitment until every slot this provider holds in the round has one
        (`round_units`), then sign one `RoundCommit` over them (slot order, the deadline the market names:
        one for every signature of a step) and hand it in. True once handed in."""
        from veritrain.messages import RosterWorkSubmission

        assert assignment.commit_deadline is not None
        path = (
            self.config.data_dir
            / "rosters"
            / f"{assignment.chain_order_id}.round{assignment.round_index}.json"
        )
        held: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        fresh = held.get(str(assignment.shard)) != commitment
        if fresh:
            held[str(assignment.shard)] = commitment
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(held, sort_keys=True))
            os.replace(tmp, path)
        units = assignment.round_units or (assignment.shard,)
        waiting = [unit for unit in units if str(unit) not in held]
        if waiting:
            if not fresh:  # asked again on a later heartbeat: still waiting, already said so
                return False
            logger.info(
                "unit %d (round %d, shard %d) done; its round commit waits for shards %s",
                assignment.unit_id,
                assignment.round_index,
                assignment.shard,
                waiting,
            )
            return False
        commitments = [held[str(unit)] for unit in units]
        signature = self.chain.round_commit_signature(
            self.account,
            assignment.chain_order_id,
            assignment.round_index,
            commitments,
            assignment.commit_deadline,
        )
        self.market.roster_work(
            RosterWorkSubmission(
                order_id=assignment.order_id,
                provider=self.address,
                round_index=assignment.round_index,
                commitments=tuple(commitments),
                signature="0x" + signature.hex(),
            )
        )
        return True

    def reveal(self, assignment: Assignment) -> None:
        """Reveal the result (the commitment's preimage and the state it reports); a roster slot's goes to
        the market's round path, which keeps it off chain until the step that reveals the round; the slot
        watch remembers it first (it publishes it if the round is still pending late in its reveal window,
        and watches the verdict of a unit the step sets aside)."""
        from veritrain.messages import RevealSubmission, RosterOpeningSubmission

        folder = self.unit_dir(assignment.unit_id)
        record = UnitRecord.load(folder, assignment.unit_id)
        if record.revealed or record.result_digest is None:
            return
        assert record.salt and record.state_digest and record.transcript_root
        opening = {
            "provider": self.address,
            "result_digest": record.result_digest,
            "salt": record.salt,
            "state_digest": record.state_digest,
            "transcript_root": record.transcript_root,
            "round_state_digest": record.round_state_digest,
            "inputs_commitment": record.inputs_commitment,
        }
        rostered = assignment.settlement == "rounds"
        if rostered:
            self.slots.opened(
                assignment.chain_order_id,
                assignment.round_index,
                assignment.shard,
                record.result_digest,
                record.salt,
                honest=not record.forged,
            )
            where = {
                "order_id": assignment.order_id,
                "round_index": assignment.round_index,
                "unit": assignment.shard,
            }
            self.market.roster_opening(RosterOpeningSubmission.model_validate(where | opening))
        else:
            self.market.reveal(RevealSubmission.model_validate({"unit_id": assignment.unit_id} | opening))
        record.revealed = True
        record.save(folder)
        if assignment.chain_unit_id is not None and not rostered:
            if not record.forged:
                self.watch.revealed(assignment.chain_unit_id)
            elif self.config.plant:
                self.watch.planted(assignment.chain_unit_id)
        logger.info(
            "%s unit %d (round %d, shard %d): %s",
            "opened" if rostered else "revealed",
            assignment.unit_id,
            assignment.round_index,
            assignment.shard,
            record.result_digest,
        )


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


def load_state_file(path: Path) -> State:
    from node.unit import load_checkpoint

    return dict(load_checkpoint(path))


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
    parser.add_argument(
        "--dishonest-after",
        type=int,
        default=0,
        metavar="N",
        help="DEMO/TEST ONLY: with --dishonest, train the first N units honestly (to earn trust) first",
    )
    parser.add_argument(
        "--plant",
        action="store_true",
        help="OPERATOR: with --dishonest, be a planted cheat (a verifier canary): forge the units the market "
        "routes here (list this address in its VERITRAIN_PLANT_AGENTS) and appeal a verdict that accepts one",
    )
    parser.add_argument(
        "--plant-keys",
        type=Path,
        default=None,
        metavar="DIR",
        help="OPERATOR: with --plant, work under the keys in DIR (funded by you, unlinked on chain) one "
        "after the other, the next once the current one is caught; the --keystore is then the market's "
        "canary account (VERITRAIN_CANARY_KEY), which enrolls each key with the market by its signature",
    )


def run(args: argparse.Namespace) -> int:
    if args.plant and not args.dishonest:
        raise AgentError("--plant needs --dishonest STRATEGY: a planted cheat forges every unit it works")
    if args.plant_keys is not None and not args.plant:
        raise AgentError("--plant-keys needs --plant: it runs the operator's plant under those keys")
    if args.plant_keys is not None and not args.plant_keys.is_dir():
        raise AgentError(f"--plant-keys {args.plant_keys} is not a folder of keys")
    common = resolve_common(args)
    setup_logging(common["name"])
    import torch

    torch.set_num_threads(max(1, common["threads"]))
    config = AgentConfig(
        price_per_pflop=args.price_per_pflop,
        price_step_bps=args.price_step_bps,
        dishonest=args.dishonest,
        dishonest_after=args.dishonest_after,
        plant=args.plant,
        device=args.device,
        **common,
    )
    if args.plant_keys is not None:
        from node.plant import run_plants

        return run_plants(config, args.plant_keys)
    return run_agent(lambda: ProviderAgent(config))
