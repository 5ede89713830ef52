"""DiLoCo kernel: round states, unit start states, the outer step (bitwise on every CPU configuration),
the aggregate unit's digests (a fixed vector, tests/fixtures/aggregate_vector.json) and its verification."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from typing import Any

import pytest

from tests.training.aggregate_vector import VECTOR_PATH, build_vector
from tests.training.conftest import REPO_ROOT

pytestmark = pytest.mark.torch


def states(values: dict[str, list[float]]) -> dict[str, Any]:
    import torch

    return {name: torch.tensor(value, dtype=torch.float32) for name, value in values.items()}


def round_state(weights: list[float], momentum: list[float]) -> dict[str, Any]:
    return states({"model.w": weights, "outer.momentum.w": momentum})


def test_outer_step_is_nesterov_over_the_mean_of_pseudo_gradients_exactly() -> None:
    from veritrain import diloco

    config = diloco.OuterConfig(lr=0.5, momentum=0.5)  # every intermediate is exact in float32
    start = round_state([1.0, -2.0], [0.25, 0.0])
    results = [states({"model.w": [0.5, -2.0]}), None, states({"model.w": [0.0, -1.0]})]
    new = diloco.outer_step(start, results, config)
    # Δ = mean(θ − θ_m) = [0.75, -0.5]; v = 0.5·v + Δ = [0.875, -0.5]; θ' = θ − 0.5·(Δ + 0.5·v)
    assert new["outer.momentum.w"].tolist() == [0.875, -0.5]
    assert new["model.w"].tolist() == [1.0 - 0.5 * (0.75 + 0.4375), -2.0 - 0.5 * (-0.5 - 0.25)]


def test_outer_step_matches_a_float64_reference_for_every_rule() -> None:
    import torch

    from veritrain import diloco

    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(4096, generator=generator)
    momentum = torch.randn(4096, generator=generator) * 0.01
    start = {"model.w": weights, "outer.momentum.w": momentum}
    results = [{"model.w": weights + torch.randn(4096, generator=generator) * 0.01} for _ in range(5)]
    deltas = torch.stack([weights.double() - r["model.w"].double() for r in results])
    ordered = deltas.sort(dim=0).values
    references = {
        diloco.OuterConfig(): deltas.mean(0),
        diloco.OuterConfig("trimmed_mean", trim=1): ordered[1:4].mean(0),
        diloco.OuterConfig("median"): ordered[2],
    }
    for config, delta in references.items():
        velocity = config.momentum * momentum.double() + delta
        expected = weights.double() - config.lr * (delta + config.momentum * velocity)
        new = diloco.outer_step(start, results, config)
        assert torch.allclose(new["model.w"].double(), expected, rtol=0, atol=1e-6), config
        assert torch.allclose(new["outer.momentum.w"].double(), velocity, rtol=0, atol=1e-6), config


def test_robust_rules_resist_one_scaled_sign_flipped_shard_and_the_mean_does_not() -> None:
    import torch

    from veritrain import diloco

    weights = torch.zeros(1000)
    start = {"model.w": weights, "outer.momentum.w": torch.zeros(1000)}
    honest = [{"model.w": weights - 0.01 * (1 + 0.1 * m)} for m in range(7)]
    poisoned = [*honest, {"model.w": weights + 100.0}]  # Δ = -100: scaled and sign-flipped
    momentum_free = {"momentum": 0.0, "lr": 1.0}
    for config in (
        diloco.OuterConfig("trimmed_mean", trim=1, **momentum_free),
        diloco.OuterConfig("median", **momentum_free),
    ):
        moved = -diloco.outer_step(start, poisoned, config)["model.w"]  # = the aggregated Δ
        assert bool(((moved >= 0.01 - 1e-7) & (moved <= 0.016 + 1e-7)).all()), config.aggregation
    mean = -diloco.outer_step(start, poisoned, diloco.OuterConfig(**momentum_free))["model.w"]
    assert bool((mean < -10).all())


def test_shards_without_a_result_are_left_out_and_too_few_are_refused() -> None:
    from veritrain import diloco, pol
    from veritrain.errors import AggregateMismatch

    start = round_state([1.0], [0.0])
    one = states({"model.w": [0.5]})
    with_gap = diloco.outer_step(start, [one, None], diloco.OuterConfig())
    assert pol.state_digest(with_gap) == pol.state_digest(
        diloco.outer_step(start, [one], diloco.OuterConfig())
    )
    trimmed = diloco.OuterConfig("trimmed_mean", trim=1)
    assert trimmed.min_shards == 3
    with pytest.raises(AggregateMismatch, match="needs 3"):
        diloco.outer_step(start, [one, one, None], trimmed)
    with pytest.raises(AggregateMismatch):
        diloco.outer_step(start, [states({"model.w": [0.5, 1.0]})], diloco.OuterConfig())
    with pytest.raises(AggregateMismatch):
        diloco.outer_step(states({"model.w": [1.0]}), [one], diloco.OuterConfig())  # no momentum


def test_outer_config_is_validated_and_its_digest_pins_every_field() -> None:
    from veritrain import diloco
    from veritrain.errors import InvalidInput

    for bad in (
        {"aggregation": "max"},
        {"aggregation": "trimmed_mean"},
        {"aggregation": "mean", "trim": 1},
        {"lr": 0.0},
        {"lr": float("inf")},
        {"momentum": 1.0},
        {"momentum": -0.1},
    ):
        with pytest.raises(InvalidInput):
            diloco.OuterConfig(**bad)
    variants = [
        diloco.OuterConfig(),
        diloco.OuterConfig(lr=0.7000000000000001),
        diloco.OuterConfig(momentum=0.95),
        diloco.OuterConfig("median"),
        diloco.OuterConfig("trimmed_mean", trim=1),
        diloco.OuterConfig("trimmed_mean", trim=2),
    ]
    assert len({config.digest() for config in variants}) == len(variants)


def test_unit_start_carries_the_shards_own_inner_state_and_the_rounds_weights() -> None:
    import torch

    from veritrain import diloco, pol
    from veritrain.errors import AggregateMismatch
    from veritrain.recipes import get_recipe

    genesis = pol.initial_state(get_recipe("digits-mlp"), 0)
    state0 = diloco.genesis_round_state(genesis)
    assert pol.state_digest(diloco.unit_start_state(state0, None)) == pol.state_digest(genesis)
    anchored = {m: pol.state_digest(diloco.order_genesis(get_recipe("digits-mlp"), 0, m)) for m in (1, 2, 8)}
    assert anchored == {
        1: pol.state_digest(genesis),
        2: pol.state_digest(state0),
        8: pol.state_digest(state0),
    }
    previous = {
        name: tensor + 1 if name != pol.STEP_KEY else torch.tensor(12) for name, tensor in genesis.items()
    }
    state1 = diloco.outer_step(state0, [previous], diloco.OuterConfig())
    start = diloco.unit_start_state(state1, previous)
    for name, tensor in start.items():
        source = state1 if name.startswith(pol.MODEL_PREFIX) else previous
        assert tensor is source[name]
    pol.check_state(get_recipe("digits-mlp"), start)
    with pytest.raises(AggregateMismatch):
        diloco.unit_start_state(state1, {**previous, pol.STEP_KEY: torch.tensor(1.0)})
    with pytest.raises(AggregateMismatch):
        diloco.unit_start_state(genesis, None)  # a training state is not a round state


def test_r9_formulas_byte_by_byte() -> None:
    from veritrain import diloco

    start, config, shard = (hashlib.sha256(label).digest() for label in (b"s", b"c", b"m1"))
    expected = hashlib.sha256(
        b"veritrain/aggregate-inputs/v1"
        + start
        + (7).to_bytes(4, "big")
        + (2).to_bytes(2, "big")
        + bytes(32)
        + shard
        + config
    ).digest()
    commitment = diloco.inputs_commitment(start, 7, [None, shard], config)
    assert commitment == expected
    output = hashlib.sha256(b"o").digest()
    assert (
        diloco.aggregate_result_digest(output, commitment)
        == hashlib.sha256(b"veritrain/aggregate-result/v1" + output + commitment).digest()
    )
    mean = diloco.OuterConfig()
    assert mean.canonical_bytes() == (
        b"veritrain/outer-config/v1" + b"\x08nesterov" + b"\x04mean" + struct.pack(">Hdd", 0, 0.7, 0.9)
    )


def test_aggregate_vector_file_is_what_the_code_computes() -> None:
    assert json.loads(VECTOR_PATH.read_text()) == build_vector()


def test_outer_step_digests_are_bitwise_equal_on_every_calibration_configuration() -> None:
    """Thread counts, the generic and AVX2 vector paths and MKL's compatible mode, each in a fresh process
    (the variables are read at torch import): every one reproduces the committed vector bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    from verifier.bench_workers import CONFIGS, HardwareConfig

    configs = (*CONFIGS, HardwareConfig("isa-avx2-1t", 1, {"ATEN_CPU_CAPABILITY": "avx2"}))

    def run(config: HardwareConfig) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
        completed = subprocess.run(
            [sys.executable, "-m", "tests.training.aggregate_vector", "--threads", str(config.threads)],
            cwd=REPO_ROOT,
            env={**env, "OMP_WAIT_POLICY": "PASSIVE", **config.env},
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return completed.stdout

    with ThreadPoolExecutor(len(configs)) as pool:
        outputs = dict(zip((c.name for c in configs), pool.map(run, configs), strict=True))
    committed = VECTOR_PATH.read_text()
    assert {name: output == committed for name, output in outputs.items()} == dict.fromkeys(outputs, True)


def test_verifier_recomputes_the_aggregate_and_flags_any_other_digest() -> None:
    from veritrain import diloco

    start = round_state([1.0, 2.0], [0.0, 0.0])
    inputs = diloco.AggregateInputs(3, start, (states({"model.w": [0.5, 1.5]}), None), diloco.OuterConfig())
    honest = diloco.aggregate(inputs)
    forged = diloco.aggregate_result_digest(
        hashlib.sha256(b"other weights").digest(), honest.inputs_commitment
    )
    check = diloco.verify_aggregate(inputs, [honest.result_digest, forged, honest.result_digest])
    assert check.honest == (True, False, True) and check.expected.result_digest == honest.result_digest
    wrong_round = diloco.aggregate(diloco.AggregateInputs(4, start, inputs.results, inputs.config))
    assert wrong_round.output_digest == honest.output_digest  # same bytes, but bound to another round
    assert diloco.verify_aggregate(inputs, [wrong_round.result_digest]).honest == (False,)


def test_two_diloco_rounds_of_two_shards_train(digits_dataset: Any) -> None:
    from veritrain import diloco, pol
    from veritrain.recipes import get_recipe

    recipe, config, steps = get_recipe("digits-mlp"), diloco.OuterConfig(), 8
    state = diloco.genesis_round_state(pol.initial_state(recipe, 0))
    inner: list[Any] = [None, None]
    first_losses, last_losses = [], []
    for round_index in range(3):
        results = []
        for shard in range(2):
            spec = pol.UnitSpec("digits-mlp", 5, round_index, shard, steps, steps, num_shards=2)
            execution = pol.execute_unit(digits_dataset, spec, diloco.unit_start_state(state, inner[shard]))
            inner[shard] = execution.final_state
            results.append(execution.final_state)
            (first_losses if round_index == 0 else last_losses).append(execution.transcript.losses[-1])
        state = diloco.aggregate(
            diloco.AggregateInputs(round_index, state, tuple(results), config)
        ).output_state
    assert pol.state_step(inner[0]) == 3 * steps  # the inner AdamW state kept running on its shard
    assert max(last_losses[-2:]) < min(first_losses)


class _Blobs:
    """A blob plane of content-addressed state blobs in memory (what agentkit's helpers fetch from)."""

    def __init__(self, *states: Any) -> None:
        from veritrain.agentkit import encode_state

        self.blobs = {hashlib.sha256(encode_state(s)).hexdigest(): encode_state(s) for s in states}

    def fetch_any(self, holders: list[str], digest: str) -> bytes:
        return self.blobs[digest]


def test_agents_derive_unit_starts_and_aggregate_inputs_from_the_assignment() -> None:
    from veritrain import diloco, pol
    from veritrain.agentkit import aggregate_inputs_of, unit_start_of
    from veritrain.errors import AgentError
    from veritrain.messages import OuterFields, StateSource, UnitKind, UnitWork
    from veritrain.recipes import get_recipe

    def source(state: Any) -> StateSource:
        return StateSource(state_digest="0x" + pol.state_digest(state).hex(), holders=("peer",))

    recipe = get_recipe("digits-mlp")
    genesis = pol.initial_state(recipe, 5)
    base = {"order_id": 1, "recipe": "digits-mlp", "dataset_digest": "0x" + "00" * 32, "seed": 5}
    base |= {"start_step": 0, "checkpoint_every": 1, "num_shards": 2, "unit_id": 3}
    round0 = UnitWork(**base, round_index=0, shard=1, steps=4, start_state=StateSource(state_digest=None))
    assert pol.state_digest(unit_start_of(round0, _Blobs())) == pol.state_digest(genesis)

    round_state = diloco.genesis_round_state(genesis)
    moved = {name: tensor + 1 for name, tensor in genesis.items() if name.startswith("model.")}
    previous = {**genesis, **moved, pol.STEP_KEY: genesis[pol.STEP_KEY] + 4}
    blobs = _Blobs(round_state, previous)
    round1 = round0.model_copy(
        update={"round_index": 1, "start_state": source(round_state), "previous": source(previous)}
    )
    expected = diloco.unit_start_state(round_state, previous)
    assert pol.state_digest(unit_start_of(round1, blobs)) == pol.state_digest(expected)

    outer = OuterFields(aggregation="median", trim=0, lr=0.5, momentum=0.8)
    work = round1.model_copy(
        update={
            "kind": UnitKind.AGGREGATE,
            "previous": None,
            "shard_results": (None, source(previous)),
            "outer": outer,
        }
    )
    inputs = aggregate_inputs_of(work, blobs)
    assert inputs.config == diloco.OuterConfig("median", 0, 0.5, 0.8) and inputs.round_index == 1
    assert inputs.results[0] is None and inputs.results[1] is not None
    assert pol.state_digest(inputs.round_state) == pol.state_digest(round_state)
    with pytest.raises(AgentError, match="aggregate"):
        aggregate_inputs_of(work.model_copy(update={"shard_results": (None,)}), blobs)


def _aggregate_job(start: Any, results: tuple[Any, ...]) -> tuple[dict[str, Any], Any]:
    """The UnitWork fields of aggregate unit 9 (round 1, M = 2) over `start` and `results`, and a blob
    plane stand-in serving those states by digest."""
    from types import SimpleNamespace

    from veritrain import pol
    from veritrain.agentkit import encode_state
    from veritrain.messages import OuterFields, StateSource, UnitKind

    def source(state: Any) -> StateSource:
        return StateSource(state_digest="0x" + pol.state_digest(state).hex(), holders=("peer",))

    blobs = {
        hashlib.sha256(encode_state(s)).hexdigest(): encode_state(s)
        for s in (start, *results)
        if s is not None
    }
    fields = {
        "unit_id": 9,
        "order_id": 1,
        "recipe": "digits-mlp",
        "dataset_digest": "0x" + "00" * 32,
        "seed": 5,
        "round_index": 1,
        "shard": 2,
        "start_step": 20,
        "steps": 0,
        "checkpoint_every": 1,
        "num_shards": 2,
        "start_state": source(start),
        "kind": UnitKind.AGGREGATE,
        "shard_results": tuple(None if r is None else source(r) for r in results),
        "outer": OuterFields(aggregation="mean", trim=0, lr=0.7, momentum=0.9),
    }
    return fields, SimpleNamespace(fetch_any=lambda holders, digest: blobs[digest])


def test_a_provider_runs_an_aggregate_unit_and_keeps_what_opens_its_result(tmp_path: Any) -> None:
    """node.agent.ProviderAgent.aggregate: output blob stored (the next round's start), and the record's
    state digest and root (= inputs commitment) open the result digest it will commit to."""
    from types import SimpleNamespace

    from node.agent import ProviderAgent, UnitRecord
    from veritrain import diloco
    from veritrain.messages import UnitWork

    start, result = round_state([1.0, 2.0], [0.0, 0.5]), states({"model.w": [0.25, 1.5]})
    fields, blobs = _aggregate_job(start, (result, None))
    stored: dict[str, bytes] = {}
    agent = SimpleNamespace(
        blobs=blobs,
        store=SimpleNamespace(put=lambda data: stored.setdefault(hashlib.sha256(data).hexdigest(), data)),
        unit_dir=lambda unit_id: tmp_path / str(unit_id),
    )
    ProviderAgent.aggregate(agent, UnitWork(**fields))
    record = UnitRecord.load(tmp_path / "9", 9)
    expected = diloco.aggregate(diloco.AggregateInputs(1, start, (result, None), diloco.OuterConfig()))
    assert record.result_digest == "0x" + expected.result_digest.hex() and record.salt
    assert record.state_digest == "0x" + expected.output_digest.hex()
    assert record.transcript_root == "0x" + expected.inputs_commitment.hex()
    assert expected.output_digest.hex() in stored  # served to the next round's providers


def test_the_verifier_agent_decides_outcomes_of_an_aggregate_job_from_fetched_blobs() -> None:
    """verifier.agent.VerifierAgent.decide_aggregate: one outcome per replica in assignment order (accept,
    fraud, fault), reasons that name the recomputed digest."""
    from types import SimpleNamespace

    from verifier.agent import VerifierAgent
    from veritrain import diloco
    from veritrain.messages import ReplicaResult, VerificationJobView

    start, result = round_state([1.0, 2.0], [0.0, 0.5]), states({"model.w": [0.25, 1.5]})
    fields, blobs = _aggregate_job(start, (result, result))
    honest = diloco.aggregate(diloco.AggregateInputs(1, start, (result, result), diloco.OuterConfig()))
    revealed = [
        ("0x" + "a" * 40, honest.result_digest),
        ("0x" + "b" * 40, b"\x01" * 32),
        ("0x" + "c" * 40, None),
    ]
    replicas = tuple(
        ReplicaResult(
            provider=p,
            result_digest=d and "0x" + d.hex(),
            state_digest=None,
            transcript_root=None,
            p2p_addr="x",
        )
        for p, d in revealed
    )
    job = VerificationJobView(
        **fields,
        job_id=4,
        chain_unit_id=7,
        randomness="0x" + "11" * 32,
        reason="spot_check",
        replicas=replicas,
    )
    counted: list[str] = []
    agent = SimpleNamespace(
        blobs=blobs,
        metrics=SimpleNamespace(
            verdicts=SimpleNamespace(labels=lambda v: SimpleNamespace(inc=lambda: counted.append(v)))
        ),
    )
    outcomes, reasons = VerifierAgent.decide_aggregate(agent, job)  # what verify() then signs and submits
    assert outcomes == (0, 2, 1) and counted == ["accept", "fraud", "fault"]
    assert json.loads(reasons)["expected"] == "0x" + honest.result_digest.hex()
