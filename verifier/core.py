"""Verifier core: per-replica verdicts for one unit (accept / fault / fraud), each with a reason. No IO.

The protocol (DESIGN.md §4, docs/VERIFICATION.md):

1. Each submission is checked on its own: it exists and was on time (the caller says), its reveal opens
   its commitment (which binds provider and unit, so a copied commitment cannot be opened), its result
   digest is ``sha256(final state digest, transcript Merkle root)``, the transcript is for this unit's spec,
   starts at the unit's start state and carries the data-order commitment derived from the spec.
   Any failure is a **fault** (unpaid, never slashed): nothing is paid, so nothing needs re-execution.
   A folded shard unit (``UnitRequest.fold``: the outer step it must run first, recomputed by the verifier)
   opens its result digest with the outer step it claims (``diloco.folded_result_digest``); a claimed
   outer step other than the recomputed one, or a transcript that does not start from its output, is
   **fraud**: the outer step is bitwise reproducible, so no tolerance applies.
2. Equal result digests everywhere and no spot-check draw → **fast path**: accept, no work.
3. Otherwise replicas are grouped by result digest and the groups clustered by the distance of their final
   states (relative L2 and the angle between the two updates, of the model weights) under the calibrated
   tolerance for H steps.
4. A reference group (largest cluster; ties by the post-commit randomness) is checked against every other
   cluster by **refereed delegation**: bisect the two transcripts for the first checkpoint where they
   disagree beyond tolerance, then re-execute that one segment from each side's own checkpoint (once when
   both sides hold the same state there). A side whose committed checkpoint is outside tolerance of the
   re-execution is **fraud**. If both sides survive (a cheater can stay under tolerance per segment and
   still drift away), the verifier re-executes the whole unit from the agreed start state and judges
   every remaining group against that.
5. A spot-checked unit also re-executes the reference's PoL segments: random ones drawn from the
   post-commit randomness plus the top-q largest updates (Jia et al. 2021).

Fraud therefore always rests on a re-execution by the verifier, never on a PoL distance alone (Zhang et
al. 2022 and Fang et al. 2023 spoof PoL distances). The caller supplies the IO and compute as two small
interfaces: ``Evidence`` (a replica's checkpoints) and ``Reexecutor`` (train a segment).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from verifier.segments import Segment, first_divergence, segments_of, select_segments, tie_break
from veritrain import pol
from veritrain.diloco import folded_result_digest
from veritrain.errors import InvalidInput, ToleranceUnavailable, VeritrainError

if TYPE_CHECKING:
    import torch

    from veritrain.diloco import AggregateInputs, Fold

StateLike = Mapping[str, "torch.Tensor"]

METRICS = ("rel_l2", "linf", "angle")
# What a verdict rests on. L∞ and the Adam moments are measured and logged but do not decide: Adam turns a
# rounding-level sign flip of a near-zero gradient into a full ±lr step, so honest per-coordinate drift
# (L∞) is as large as one step's update, and the moments' relative drift is heavy-tailed (measured in
# docs/VERIFICATION.md). Relative L2 and the update angle of the weights aggregate over all coordinates.
DECISION_GROUPS = ("model",)
DECISION_METRICS = ("rel_l2", "angle")
GROUP_PREFIXES = (
    ("exp_avg_sq", pol.EXP_AVG_SQ_PREFIX),
    ("exp_avg", pol.EXP_AVG_PREFIX),
    ("model", pol.MODEL_PREFIX),
)


class Verdict(StrEnum):
    ACCEPT = "accept"
    FAULT = "fault"
    FRAUD = "fraud"


# ---------------------------------------------------------------- distances and tolerances


@dataclass(frozen=True)
class Distance:
    """How far two states of one tensor group are apart.

    rel_l2: ||a - b|| / max(||a||, ||b||); linf: max |a - b|; angle: the angle in radians between the two
    *updates* a - origin and b - origin (the angle between whole weight vectors is ~0 for any two nearby
    models and carries no signal). The angle, unlike 1 - cos, grows linearly with a small disagreement,
    so a margin on it means what it says.
    """

    rel_l2: float
    linf: float
    angle: float

    def over(self, limit: Distance, metrics: tuple[str, ...] = DECISION_METRICS) -> tuple[str, ...]:
        """Names of the `metrics` that exceed `limit` (NaN counts as exceeding)."""
        return tuple(name for name in metrics if not getattr(self, name) <= getattr(limit, name))

    def worst(self, other: Distance) -> Distance:
        return Distance(*(max(getattr(self, name), getattr(other, name)) for name in METRICS))

    def scaled(self, factor: float) -> Distance:
        return Distance(*(getattr(self, name) * factor for name in METRICS))

    def to_json(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in METRICS}


INFINITE = Distance(math.inf, math.inf, math.inf)
ZERO = Distance(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class StateDistance:
    """Distance per tensor group, plus the non-float tensors (step counter) and names that differ exactly."""

    groups: Mapping[str, Distance]
    exact_mismatches: tuple[str, ...] = ()

    def violations(self, tolerance: SegmentTolerance) -> tuple[str, ...]:
        """'group.metric' for every deciding metric over its tolerance; exact mismatches always count."""
        found = [f"exact:{name}" for name in self.exact_mismatches]
        for group, distance in sorted(self.groups.items()):
            if group not in DECISION_GROUPS:
                continue
            limit = tolerance.groups.get(group)
            if limit is None:
                raise ToleranceUnavailable(f"no tolerance for tensor group {group!r}")
            found.extend(f"{group}.{metric}" for metric in distance.over(limit))
        return tuple(found)

    def describe(self) -> str:
        parts = [
            f"{group}: rel_l2={d.rel_l2:.3g} linf={d.linf:.3g} angle={d.angle:.3g}"
            for group, d in sorted(self.groups.items())
        ]
        if self.exact_mismatches:
            parts.append(f"exact mismatch: {', '.join(self.exact_mismatches[:3])}")
        return "; ".join(parts)


def tensor_group(name: str) -> str:
    for group, prefix in GROUP_PREFIXES:
        if name.startswith(prefix):
            return group
    return "other"


def state_distance(a: StateLike, b: StateLike, origin: StateLike) -> StateDistance:
    """Per-group distances between states a and b; updates for the angle are taken from `origin`."""
    import torch

    mismatches = sorted(set(a) ^ set(b))
    flat: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]] = {}
    for name in sorted(set(a) & set(b)):
        ta, tb = a[name], b[name]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            mismatches.append(name)
            continue
        if not ta.is_floating_point():
            if not torch.equal(ta, tb):
                mismatches.append(name)
            continue
        to = origin.get(name)
        usable_origin = to if to is not None and to.shape == ta.shape else None
        flat.setdefault(tensor_group(name), []).append((ta, tb, usable_origin))
    groups: dict[str, Distance] = {}
    for group, triples in flat.items():
        va = torch.cat([ta.detach().reshape(-1).double() for ta, _, _ in triples])
        vb = torch.cat([tb.detach().reshape(-1).double() for _, tb, _ in triples])
        groups[group] = _distance(va, vb, _origin_vector(triples, va))
    return StateDistance(groups=groups, exact_mismatches=tuple(sorted(mismatches)))


def _origin_vector(
    triples: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], va: torch.Tensor
) -> torch.Tensor:
    import torch

    parts = [(to if to is not None else ta).detach().reshape(-1).double() for ta, _, to in triples]
    return torch.cat(parts) if parts else torch.zeros_like(va)


def _distance(va: torch.Tensor, vb: torch.Tensor, vo: torch.Tensor) -> Distance:
    import torch

    if not (bool(torch.isfinite(va).all()) and bool(torch.isfinite(vb).all())):
        return INFINITE
    difference = va - vb
    scale = max(float(va.norm()), float(vb.norm()))
    rel_l2 = float(difference.norm()) / scale if scale > 0 else 0.0
    linf = float(difference.abs().max()) if difference.numel() else 0.0
    ua, ub = va - vo, vb - vo
    na, nb = float(ua.norm()), float(ub.norm())
    if na == 0.0 and nb == 0.0:
        angle = 0.0
    elif na == 0.0 or nb == 0.0:
        angle = math.pi / 2  # one side did not move at all
    else:  # 2·atan2(|â - b̂|, |â + b̂|): accurate for tiny angles, where acos(cos) is not
        da, db = ua / na, ub / nb
        angle = 2.0 * math.atan2(float((da - db).norm()), float((da + db).norm()))
    return Distance(rel_l2=rel_l2, linf=linf, angle=angle)


@dataclass(frozen=True)
class SegmentTolerance:
    """Largest honest disagreement allowed after a given number of steps from a common state."""

    groups: Mapping[str, Distance]
    loss_abs: float


@dataclass(frozen=True)
class ToleranceTable:
    """Tolerances per segment length for one recipe, derived from calibration (max honest × margin)."""

    recipe: str
    margin: float
    by_steps: Mapping[int, SegmentTolerance]

    def for_steps(self, steps: int) -> SegmentTolerance:
        """Tolerance of the smallest calibrated length ≥ steps; beyond the largest, scaled linearly."""
        if not self.by_steps:
            raise ToleranceUnavailable(f"{self.recipe}: empty tolerance table")
        if steps <= 0:
            raise InvalidInput(f"segment length must be positive, got {steps}")
        lengths = sorted(self.by_steps)
        for length in lengths:
            if length >= steps:
                return self.by_steps[length]
        longest = lengths[-1]
        base, factor = self.by_steps[longest], steps / longest
        return SegmentTolerance(
            groups={group: d.scaled(factor) for group, d in base.groups.items()},
            loss_abs=base.loss_abs * factor,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "margin": self.margin,
            "by_steps": {
                str(steps): {
                    "groups": {group: d.to_json() for group, d in sorted(tol.groups.items())},
                    "loss_abs": tol.loss_abs,
                }
                for steps, tol in sorted(self.by_steps.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ToleranceTable:
        try:
            by_steps_raw = data["by_steps"]
            if not isinstance(by_steps_raw, Mapping):
                raise TypeError("by_steps must be an object")
            by_steps = {
                int(steps): SegmentTolerance(
                    groups={
                        str(group): Distance(**{name: float(values[name]) for name in METRICS})
                        for group, values in entry["groups"].items()
                    },
                    loss_abs=float(entry["loss_abs"]),
                )
                for steps, entry in by_steps_raw.items()
            }
            return cls(recipe=str(data["recipe"]), margin=float(str(data["margin"])), by_steps=by_steps)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ToleranceUnavailable(f"malformed tolerance table: {error}") from error


# ---------------------------------------------------------------- inputs and outputs


class Evidence(Protocol):
    """One replica's served checkpoints (fetched and parsed by the caller; may raise VeritrainError)."""

    def checkpoint(self, step: int) -> StateLike: ...


class Reexecutor(Protocol):
    """Train unit steps [start_step, end_step) from `state` on the verifier's machine."""

    def __call__(self, state: StateLike, start_step: int, end_step: int) -> tuple[StateLike, list[float]]: ...


@dataclass(frozen=True)
class Submission:
    """What one replica delivered. `problem` is set by the caller for missing, late or unparseable results.

    `commitment`/`salt` are checked when given (the chain checks them too; checking here makes the verdict
    self-contained). `evidence` serves the checkpoints named in the transcript.
    """

    provider: str
    result_digest: bytes | None = None
    transcript: pol.Transcript | None = None
    evidence: Evidence | None = None
    commitment: bytes | None = None
    salt: bytes | None = None
    problem: str | None = None
    fold: Fold | None = None  # the outer step a folded unit's served manifest names


@dataclass(frozen=True)
class UnitRequest:
    """The public facts of the unit: spec, agreed start state, expected data order, post-commit randomness."""

    spec: pol.UnitSpec
    start_state: StateLike
    data_order_commitment: bytes
    randomness: bytes
    spot_checked: bool = False
    chain_unit_id: int | None = None
    fold: Fold | None = None  # a folded unit: the outer step recomputed (``start_state`` is its output's)


@dataclass(frozen=True)
class VerifierPolicy:
    """How many PoL segments a spot check re-executes (random from the seed + top-q largest updates)."""

    random_segments: int = 1
    top_q: int = 1
    spot_check_bps: int = 1000


@dataclass(frozen=True)
class ReplicaVerdict:
    provider: str
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class UnitVerdict:
    """Verdicts in submission order, the adopted result, the work done and an evidence log."""

    replicas: tuple[ReplicaVerdict, ...]
    path: str
    accepted_result: bytes | None
    reexecuted_steps: int
    log: tuple[str, ...] = field(default=())

    def verdicts(self) -> tuple[Verdict, ...]:
        return tuple(replica.verdict for replica in self.replicas)


def judge_aggregate(
    inputs: AggregateInputs, revealed: Sequence[tuple[str, bytes | None]]
) -> tuple[bytes, tuple[ReplicaVerdict, ...]]:
    """Verdicts on an aggregate unit's replicas ((provider, revealed result digest or None) in assignment
    order) and the recomputed result digest. The outer step is bitwise reproducible on every
    configuration, so recomputation decides alone: the recomputed digest is accepted, any other revealed
    digest is fraud (no tolerance applies), no reveal is a fault."""
    from veritrain.diloco import verify_aggregate

    claimed = [digest for _, digest in revealed if digest is not None]
    check = verify_aggregate(inputs, claimed)
    honest = iter(check.honest)
    verdicts = []
    for provider, digest in revealed:
        if digest is None:
            verdicts.append(ReplicaVerdict(provider, Verdict.FAULT, "no result revealed"))
        elif next(honest):
            verdicts.append(ReplicaVerdict(provider, Verdict.ACCEPT, "recomputed bitwise"))
        else:
            reason = "result digest differs from the recomputed outer step"
            verdicts.append(ReplicaVerdict(provider, Verdict.FRAUD, reason))
    return check.expected.result_digest, tuple(verdicts)


# ---------------------------------------------------------------- submission checks (no re-execution)


def submission_problem(request: UnitRequest, submission: Submission) -> str | None:
    """Why this submission cannot be verified at all (a fault), or None when it is well-formed."""
    if submission.problem:
        return submission.problem
    if submission.result_digest is None:
        return "no result revealed"
    if submission.commitment is not None:
        if request.chain_unit_id is None or submission.salt is None:
            return "commitment given without salt or unit id: cannot open it"
        if _commitment(submission, request.chain_unit_id) != submission.commitment:
            return "reveal does not open the commitment (commitments bind provider and unit)"
    transcript = submission.transcript
    if transcript is None or submission.evidence is None:
        return "no transcript or checkpoints served"
    if transcript.spec != request.spec:
        return "transcript is for another unit spec"
    opened = pol.result_digest(transcript.final_digest, transcript.merkle_root())
    if request.fold is not None:
        if submission.fold is None:
            return "a folded unit's manifest names no outer step"
        opened = folded_result_digest(opened, submission.fold)
    if opened != submission.result_digest:
        return "revealed result digest does not match the transcript's Merkle root and final state digest"
    if request.fold is None and transcript.checkpoint_digests[0] != pol.state_digest(request.start_state):
        return "transcript does not start from the unit's start state"
    if transcript.data_order_commitment != request.data_order_commitment:
        return "data-order commitment differs from the one derived from the unit spec"
    if not all(math.isfinite(loss) for loss in transcript.losses):
        return "transcript holds a non-finite loss"
    return None


def fold_fraud(request: UnitRequest, submission: Submission) -> str | None:
    """Why a well-formed submission of a folded unit skipped or forged its outer step (fraud), or None."""
    claimed, expected = submission.fold, request.fold
    if expected is None or claimed is None or submission.transcript is None:
        return None
    if claimed.inputs_commitment != expected.inputs_commitment:
        return "outer step over other inputs: inputs commitment differs from the unit's"
    if claimed.round_state_digest != expected.round_state_digest:
        return "outer step forged: its output differs from the recomputed outer step"
    if submission.transcript.checkpoint_digests[0] != pol.state_digest(request.start_state):
        return "outer step skipped: training did not start from the outer step's output"
    return None


def _commitment(submission: Submission, chain_unit_id: int) -> bytes:
    from veritrain.chain.eip712 import commitment

    assert submission.result_digest is not None and submission.salt is not None
    try:
        return commitment(submission.result_digest, submission.salt, submission.provider, chain_unit_id)
    except (ValueError, TypeError) as error:
        raise InvalidInput(f"cannot compute commitment for {submission.provider!r}: {error}") from error


# ---------------------------------------------------------------- the verification session


class _Unverifiable(Exception):
    """A group's served data cannot be checked (missing/forged checkpoint, unrunnable state): a fault."""

    def __init__(self, group: bytes, reason: str) -> None:
        super().__init__(reason)
        self.group = group
        self.reason = reason


class _Session:
    """Caches fetched checkpoints and re-executions of one unit; counts re-executed steps."""

    def __init__(
        self,
        request: UnitRequest,
        representatives: Mapping[bytes, Submission],
        reexecute: Reexecutor,
        tolerances: ToleranceTable,
        policy: VerifierPolicy,
    ) -> None:
        self.request = request
        self.representatives = representatives
        self.reexecute = reexecute
        self.tolerances = tolerances
        self.policy = policy
        self.steps = request.spec.checkpoint_steps()
        self.reexecuted_steps = 0
        self.log: list[str] = []
        self._states: dict[tuple[bytes, int], StateLike] = {}
        self._replays: dict[tuple[bytes, int, int], tuple[StateLike, list[float]]] = {}
        self._reference: StateLike | None = None

    def transcript(self, group: bytes) -> pol.Transcript:
        transcript = self.representatives[group].transcript
        assert transcript is not None
        return transcript

    def digest_at(self, group: bytes, step: int) -> bytes:
        return self.transcript(group).checkpoint_digests[self.steps.index(step)]

    def checkpoint(self, group: bytes, step: int) -> StateLike:
        """The group's checkpoint at `step`, verified against the digest its transcript commits to."""
        key = (group, step)
        if key not in self._states:
            if step == 0:
                self._states[key] = self.request.start_state
            else:
                evidence = self.representatives[group].evidence
                assert evidence is not None
                try:
                    state = evidence.checkpoint(step)
                except VeritrainError as error:
                    raise _Unverifiable(group, f"checkpoint at step {step} unavailable: {error}") from error
                if pol.state_digest(state) != self.digest_at(group, step):
                    raise _Unverifiable(
                        group, f"served checkpoint at step {step} does not match its committed digest"
                    )
                self._states[key] = state
        return self._states[key]

    def agrees_at(self, g: bytes, h: bytes, step: int) -> bool:
        if self.digest_at(g, step) == self.digest_at(h, step):
            return True
        distance = state_distance(
            self.checkpoint(g, step), self.checkpoint(h, step), self.request.start_state
        )
        return not distance.violations(self.tolerances.for_steps(step))

    def replay(self, group: bytes, segment: Segment) -> tuple[StateLike, list[float]]:
        """Re-execute `segment` from the group's own checkpoint (shared when two groups hold the same one)."""
        start_digest = self.digest_at(group, segment.start)
        key = (start_digest, segment.start, segment.end)
        if key not in self._replays:
            start = self.checkpoint(group, segment.start)
            try:
                result = self.reexecute(start, segment.start, segment.end)
            except InvalidInput as error:
                raise _Unverifiable(
                    group, f"checkpoint at step {segment.start} cannot be trained: {error}"
                ) from error
            self.reexecuted_steps += segment.length
            self._replays[key] = result
        return self._replays[key]

    def refutation(self, group: bytes, segment: Segment) -> str | None:
        """Why re-execution refutes the group's committed segment, or None if it is consistent."""
        replayed, losses = self.replay(group, segment)
        claimed = self.checkpoint(group, segment.end)
        tolerance = self.tolerances.for_steps(segment.length)
        distance = state_distance(replayed, claimed, self.checkpoint(group, segment.start))
        violations = distance.violations(tolerance)
        claimed_losses = self.transcript(group).losses[segment.start : segment.end]
        loss_gap = max((abs(x - y) for x, y in zip(losses, claimed_losses, strict=True)), default=0.0)
        if not loss_gap <= tolerance.loss_abs:
            violations = (*violations, "loss")
        self.log.append(
            f"replay {group.hex()[:8]} [{segment.start},{segment.end}): "
            f"{distance.describe()}; loss gap {loss_gap:.3g}"
        )
        if not violations:
            return None
        return (
            f"re-execution of steps [{segment.start}, {segment.end}) from its own checkpoint is outside "
            f"tolerance ({', '.join(violations)}; {distance.describe()}; loss gap {loss_gap:.3g})"
        )

    def delegate(self, reference: bytes, other: bytes) -> tuple[Segment, str | None, str | None]:
        """Refereed delegation: first divergent segment, then each side's refutation (or None)."""
        segment = first_divergence(self.steps, lambda step: self.agrees_at(reference, other, step))
        self.log.append(f"delegation {reference.hex()[:8]} vs {other.hex()[:8]}: first divergence {segment}")
        return segment, self.refutation(reference, segment), self.refutation(other, segment)

    def spot_check(self, group: bytes) -> str | None:
        """Re-execute random + top-q segments of one group; the first refutation found, or None."""
        states = [self.checkpoint(group, step) for step in self.steps]
        norms = [_model_update_norm(a, b) for a, b in itertools.pairwise(states)]
        chosen = select_segments(
            self.steps, self.request.randomness, self.policy.random_segments, norms, self.policy.top_q
        )
        self.log.append(f"spot check {group.hex()[:8]}: segments {[(s.start, s.end) for s in chosen]}")
        for segment in chosen:
            reason = self.refutation(group, segment)
            if reason:
                return reason
        return None

    def reference_final(self) -> StateLike:
        """The verifier's own full re-execution from the agreed start state (the last-resort referee)."""
        if self._reference is None:
            state: StateLike = self.request.start_state
            for segment in segments_of(self.steps):
                state, _ = self.reexecute(state, segment.start, segment.end)
                self.reexecuted_steps += segment.length
            self._reference = state
            self.log.append("full re-execution from the agreed start state")
        return self._reference

    def final_distance(self, g: bytes, h_state: StateLike) -> StateDistance:
        """Distance of group g's final state to `h_state`, updates taken from the unit's start state."""
        return state_distance(self.checkpoint(g, self.steps[-1]), h_state, self.request.start_state)


def _model_update_norm(a: StateLike, b: StateLike) -> float:
    total = 0.0
    for name in a:
        if name.startswith(pol.MODEL_PREFIX) and name in b and a[name].shape == b[name].shape:
            total += float((b[name].double() - a[name].double()).pow(2).sum())
    return math.sqrt(total)


# ---------------------------------------------------------------- the decision


def verify_unit(
    request: UnitRequest,
    submissions: Sequence[Submission],
    reexecute: Reexecutor,
    tolerances: ToleranceTable,
    policy: VerifierPolicy | None = None,
) -> UnitVerdict:
    """Per-replica verdicts for one unit. See the module docstring for the protocol."""
    policy = policy or VerifierPolicy()
    group_verdict: dict[bytes, tuple[Verdict, str]] = {}
    members: dict[bytes, list[int]] = {}
    faults: dict[int, str] = {}
    frauds: dict[int, str] = {}
    for index, submission in enumerate(submissions):
        problem = submission_problem(request, submission)
        if problem:
            faults[index] = problem
        elif forged := fold_fraud(request, submission):
            frauds[index] = forged
        else:
            assert submission.result_digest is not None
            members.setdefault(submission.result_digest, []).append(index)
    representatives = {digest: submissions[indices[0]] for digest, indices in members.items()}
    session = _Session(request, representatives, reexecute, tolerances, policy)
    path = "none"
    if len(members) == 1 and not request.spot_checked:
        path = "fast"
        group_verdict = {
            digest: (Verdict.ACCEPT, "all revealed digests are equal (fast path)") for digest in members
        }
    elif members:
        path = "spot-check" if request.spot_checked and len(members) == 1 else "verifier"
        group_verdict = _resolve(session, members)
    replicas = tuple(
        ReplicaVerdict(submission.provider, Verdict.FAULT, faults[index])
        if index in faults
        else ReplicaVerdict(submission.provider, Verdict.FRAUD, frauds[index])
        if index in frauds
        else ReplicaVerdict(submission.provider, *group_verdict[_group_of(members, index)])
        for index, submission in enumerate(submissions)
    )
    accepted = [digest for digest, (verdict, _) in group_verdict.items() if verdict is Verdict.ACCEPT]
    accepted.sort(key=lambda digest: (-len(members[digest]), tie_break(request.randomness, digest)))
    return UnitVerdict(
        replicas=replicas,
        path=path,
        accepted_result=accepted[0] if accepted else None,
        reexecuted_steps=session.reexecuted_steps,
        log=tuple(session.log),
    )


def _group_of(members: Mapping[bytes, list[int]], index: int) -> bytes:
    return next(digest for digest, indices in members.items() if index in indices)


def _resolve(session: _Session, members: Mapping[bytes, list[int]]) -> dict[bytes, tuple[Verdict, str]]:
    """Decide every digest group; each round decides at least one group, so this terminates."""
    decided: dict[bytes, tuple[Verdict, str]] = {}
    while True:
        live = [digest for digest in members if digest not in decided]
        if not live:
            return decided
        try:
            _round(session, members, live, decided)
        except _Unverifiable as unverifiable:
            decided[unverifiable.group] = (Verdict.FAULT, unverifiable.reason)


def _clusters(session: _Session, members: Mapping[bytes, list[int]], live: list[bytes]) -> list[list[bytes]]:
    """Single-linkage clusters of final states under the H-step tolerance, largest (by replicas) first."""
    final_step = session.steps[-1]
    randomness = session.request.randomness
    live = sorted(live, key=lambda digest: (-len(members[digest]), tie_break(randomness, digest)))
    parent = {digest: digest for digest in live}

    def root(digest: bytes) -> bytes:
        while parent[digest] != digest:
            digest = parent[digest]
        return digest

    for i, g in enumerate(live):
        for h in live[i + 1 :]:
            if root(g) != root(h) and session.agrees_at(g, h, final_step):
                parent[root(h)] = root(g)
    clusters: dict[bytes, list[bytes]] = {}
    for digest in live:
        clusters.setdefault(root(digest), []).append(digest)
    ordered = list(clusters.values())
    ordered.sort(key=lambda c: (-sum(len(members[d]) for d in c), tie_break(randomness, c[0])))
    return ordered


def _round(
    session: _Session,
    members: Mapping[bytes, list[int]],
    live: list[bytes],
    decided: dict[bytes, tuple[Verdict, str]],
) -> None:
    for digest in live:  # fetch every final state first: an unservable result is a fault, not a dispute
        session.checkpoint(digest, session.steps[-1])
    clusters = _clusters(session, members, live)
    reference = clusters[0][0]
    if session.request.spot_checked:
        reason = session.spot_check(reference)
        if reason:
            decided[reference] = (Verdict.FRAUD, f"spot check: {reason}")
            return
    survivors: list[bytes] = []
    for cluster in clusters[1:]:
        other = cluster[0]
        _, reference_refuted, other_refuted = session.delegate(reference, other)
        if other_refuted:
            decided[other] = (Verdict.FRAUD, f"refereed delegation: {other_refuted}")
        if reference_refuted:
            decided[reference] = (Verdict.FRAUD, f"refereed delegation: {reference_refuted}")
            return
        if not other_refuted:
            survivors.append(other)
    if survivors:
        _judge_by_full_reexecution(session, [d for d in live if d not in decided], decided)
        return
    decided[reference] = (
        Verdict.ACCEPT,
        "consistent with re-execution" + (" (spot-checked)" if session.request.spot_checked else ""),
    )
    final_tolerance = session.tolerances.for_steps(session.steps[-1])
    undecided: list[bytes] = []
    for digest in live:
        if digest in decided:
            continue
        distance = session.final_distance(digest, session.checkpoint(reference, session.steps[-1]))
        if not distance.violations(final_tolerance):
            decided[digest] = (Verdict.ACCEPT, "final state within tolerance of the accepted result")
            continue
        _, _, refuted = session.delegate(reference, digest)
        if refuted:
            decided[digest] = (Verdict.FRAUD, f"refereed delegation: {refuted}")
        else:
            undecided.append(digest)
    if undecided:
        _judge_by_full_reexecution(session, undecided, decided)


def _judge_by_full_reexecution(
    session: _Session, groups: list[bytes], decided: dict[bytes, tuple[Verdict, str]]
) -> None:
    """Last resort when delegation could not refute either side: compare with the verifier's own run."""
    reference = session.reference_final()
    tolerance = session.tolerances.for_steps(session.steps[-1])
    for digest in groups:
        distance = session.final_distance(digest, reference)
        violations = distance.violations(tolerance)
        if violations:
            decided[digest] = (
                Verdict.FRAUD,
                "final state outside tolerance of the verifier's full re-execution from the agreed start "
                f"state ({', '.join(violations)}; {distance.describe()})",
            )
        else:
            decided[digest] = (
                Verdict.ACCEPT,
                "final state within tolerance of the verifier's full re-execution",
            )
