"""The physics cost model, checked against steps worked out by hand (issue 26, point 3).

Coefficients are set here (the shipped defaults are being fitted and are never asserted).
Llama-2-7B on one H100-SXM, by hand:

* weights read every step: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP)
  + the 32000 x 4096 LM head = 6,607,077,376 parameters, FP16: 13,214,154,752 bytes;
* KV of one token: 2 x 32 layers x 32 KV heads x 128 x 2 bytes = 524,288 bytes;
* linear FLOPs of one token: 2 x 6,476,005,376 (the layers), and 2 x 131,072,000 per
  sequence for the LM head (only each sequence's last token is sampled);
* attention FLOPs of one (query, key) pair: 4 x 32 layers x 32 heads x 128 = 524,288.
"""

from __future__ import annotations

import math

import pytest

import simsim
from simsim.gpu import load_gpu, load_model
from simsim.gpu.physics import PhysicsBackend, PhysicsCoefficients

H100 = load_gpu("H100")
LLAMA2 = load_model("meta-llama/Llama-2-7b-hf")
MIXTRAL = load_model("mistralai/Mixtral-8x7B-v0.1")

WEIGHT_BYTES = 13_214_154_752
KV_BYTES_PER_TOKEN = 524_288
LINEAR_FLOPS_PER_TOKEN = 2 * 6_476_005_376
LM_HEAD_FLOPS = 2 * 131_072_000
ATTENTION_FLOPS_PER_PAIR = 524_288
HBM = 3.35e12  # bytes/s
PEAK = 989.5e12  # dense BF16/FP16 FLOP/s
LINK = 450e9  # NVLink, one direction, bytes/s

COEFFICIENTS = PhysicsCoefficients(
    memory_scale=1.25,
    compute_scale=2.0,
    allreduce_scale=1.5,
    per_step_us=100.0,
    per_layer_us=10.0,
    per_sequence_us=4.0,
    before_queue_us=15_000.0,
    per_output_token_us=50.0,
    at_completion_us=800.0,
)
OVERHEAD_US = 100.0 + 10.0 * 32  # per step, per layer


def backend(tp: int = 1, model: simsim.gpu.ModelSpec = LLAMA2) -> PhysicsBackend:
    return PhysicsBackend(model, H100, tp, coefficients=COEFFICIENTS)


def test_the_model_figures_the_hand_computation_starts_from() -> None:
    assert LLAMA2.params_total - LLAMA2.embedding_params == WEIGHT_BYTES // 2
    assert LLAMA2.kv_bytes_per_token == KV_BYTES_PER_TOKEN
    assert (H100.hbm_bandwidth, H100.bf16_flops, H100.interconnect_bandwidth) == (HBM, PEAK, LINK)


def test_a_decode_step_is_memory_bound_and_priced_by_hand() -> None:
    # One sequence with 1023 tokens cached: it reads them and writes its new one (1024).
    memory_us = (WEIGHT_BYTES + 1024 * KV_BYTES_PER_TOKEN) / HBM * 1e6
    compute_us = (
        (LINEAR_FLOPS_PER_TOKEN + LM_HEAD_FLOPS + 1024 * ATTENTION_FLOPS_PER_PAIR) / PEAK * 1e6
    )
    assert memory_us == pytest.approx(4104.784, abs=1e-3)
    assert compute_us == pytest.approx(13.897, abs=1e-3)
    terms = backend().terms((), (1023,))
    assert terms.memory_us == pytest.approx(memory_us)
    assert terms.compute_us == pytest.approx(compute_us)
    assert (terms.allreduce_us, terms.layers, terms.sequences) == (0.0, 32, 1)
    # max(1.25 x 4104.784, 2 x 13.897) + 100 + 10 x 32 + 4 x 1 = 5554.98
    expected = 1.25 * memory_us + OVERHEAD_US + 4.0
    assert expected == pytest.approx(5554.98, abs=0.01)
    assert backend().step_us((), (1023,)) == 5555


def test_a_long_prefill_is_compute_bound_with_quadratic_attention() -> None:
    new = 4096
    pairs = new * (new + 1) // 2  # causal: token i attends to i tokens
    compute_us = (
        (LINEAR_FLOPS_PER_TOKEN * new + LM_HEAD_FLOPS + ATTENTION_FLOPS_PER_PAIR * pairs)
        / PEAK
        * 1e6
    )
    memory_us = (WEIGHT_BYTES + 2 * new * KV_BYTES_PER_TOKEN) / HBM * 1e6
    assert compute_us == pytest.approx(58_060.45, abs=0.01)
    assert 2.0 * compute_us > 1.25 * memory_us
    terms = backend().terms(((new, 0),), ())
    assert terms.compute_us == pytest.approx(compute_us)
    assert terms.memory_us == pytest.approx(memory_us)
    assert backend().step_us(((new, 0),), ()) == math.floor(
        2.0 * compute_us + OVERHEAD_US + 4.0 + 0.5
    )


def test_a_chunk_over_cached_tokens_attends_to_them_and_reads_them() -> None:
    new, cached = 512, 1536
    terms = backend().terms(((new, cached),), ())
    pairs = new * cached + new * (new + 1) / 2
    flops = LINEAR_FLOPS_PER_TOKEN * new + LM_HEAD_FLOPS + ATTENTION_FLOPS_PER_PAIR * pairs
    assert terms.compute_us == pytest.approx(flops / PEAK * 1e6)
    kv = (cached + 2 * new) * KV_BYTES_PER_TOKEN  # read the cache, write and read the chunk
    assert terms.memory_us == pytest.approx((WEIGHT_BYTES + kv) / HBM * 1e6)


def test_tensor_parallelism_splits_the_work_and_adds_the_all_reduce() -> None:
    # tp=2: each rank reads half the weights and half the KV heads; every layer
    # all-reduces twice, a ring moving 2 x (2 - 1) / 2 = 1 x the 2-byte activations.
    tokens = 3
    terms = backend(tp=2).terms((), (99, 99, 99))
    kv = 3 * 100 * KV_BYTES_PER_TOKEN / 2
    assert terms.memory_us == pytest.approx((WEIGHT_BYTES / 2 + kv) / HBM * 1e6)
    allreduce_us = 2 * 32 * 1.0 * 4096 * 2 / LINK * tokens * 1e6
    assert allreduce_us == pytest.approx(3.4953, abs=1e-4)
    assert terms.allreduce_us == pytest.approx(allreduce_us)
    expected = max(1.25 * terms.memory_us, 2.0 * terms.compute_us) + 1.5 * allreduce_us
    expected += OVERHEAD_US + 4.0 * 3
    assert backend(tp=2).step_us((), (99, 99, 99)) == math.floor(expected + 0.5)
    assert backend(tp=1).terms((), (99,)).allreduce_us == 0.0


@pytest.mark.parametrize("tokens", [1, 2, 3, 16])
def test_a_moe_step_reads_the_experts_its_tokens_touch(tokens: int) -> None:
    # Mixtral: 2 of 8 experts per token; T tokens touch E x (1 - (1 - k/E)^T) of them.
    touched = 8 * (1 - (1 - 2 / 8) ** tokens)
    if tokens == 1:
        assert touched == 2
    expert_bytes = MIXTRAL.moe_layers * MIXTRAL.params_per_expert * 2
    dense = MIXTRAL.weight_bytes - MIXTRAL.embedding_params * 2 - 8 * expert_bytes
    kv = tokens * MIXTRAL.kv_bytes_per_token
    terms = backend(model=MIXTRAL).terms((), (0,) * tokens)
    assert terms.memory_us == pytest.approx((dense + touched * expert_bytes + kv) / HBM * 1e6)


def test_an_empty_step_costs_nothing_and_results_are_plain_ints() -> None:
    physics = backend()
    assert physics.step_us((), ()) == 0
    assert type(physics.step_us((), (5,))) is int
    assert physics.prefill_us(4096, 1) == physics.step_us(((4096, 0),), ())
    assert physics.decode_step_us(3) == physics.step_us((), (0, 0, 0))
    assert physics.prefill_us(0, 1) == physics.step_us(((0, 0),), ())
    assert isinstance(physics, simsim.StepCostBackend)


def test_a_half_microsecond_rounds_up_once_per_step() -> None:
    zero = PhysicsCoefficients(
        memory_scale=0.0,
        compute_scale=0.0,
        allreduce_scale=0.0,
        per_step_us=0.5,
        per_layer_us=0.0,
        per_sequence_us=0.0,
        before_queue_us=0.0,
        per_output_token_us=0.0,
        at_completion_us=0.0,
    )
    half = PhysicsBackend(LLAMA2, H100, coefficients=zero)
    assert half.step_us((), (0,)) == 1  # floor(0.5 + 0.5)
    quarter = PhysicsBackend(
        LLAMA2, H100, coefficients=PhysicsCoefficients(**{**_fields(zero), "per_step_us": 0.25})
    )
    assert quarter.step_us((), (0,)) == 0


def _fields(coefficients: PhysicsCoefficients) -> dict[str, float]:
    return {name: getattr(coefficients, name) for name in coefficients.__dataclass_fields__}


def test_repr_properties_and_frontend() -> None:
    physics = backend(tp=2)
    assert repr(physics) == "PhysicsBackend('meta-llama/Llama-2-7b-hf', 'H100-SXM', tp=2)"
    assert (physics.model, physics.gpu, physics.tp) == (LLAMA2, H100, 2)
    assert physics.coefficients is COEFFICIENTS
    assert physics.frontend == simsim.gpu.physics.FrontendOverheads(15_000.0, 50.0, 800.0)


def test_bad_arguments_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="tp"):
        PhysicsBackend(LLAMA2, H100, 0)
    with pytest.raises(TypeError, match="coefficients must be a PhysicsCoefficients"):
        PhysicsBackend(LLAMA2, H100, coefficients={"memory_scale": 1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_scale"):
        PhysicsCoefficients(**{**_fields(COEFFICIENTS), "memory_scale": -1.0})
    with pytest.raises((TypeError, ValueError), match="prompt_token_count"):
        backend().prefill_us(-1, 1)
    with pytest.raises(TypeError, match="active_sequence_count"):
        backend().decode_step_us(1.5)  # type: ignore[arg-type]


def test_names_are_read_and_tp_must_split_the_heads() -> None:
    by_name = PhysicsBackend("meta-llama/Llama-3.1-8B-Instruct", "H100", 2)
    by_spec = PhysicsBackend(
        load_model("meta-llama/Llama-3.1-8B-Instruct"), load_gpu("H100-SXM"), 2
    )
    assert by_name.step_us((), (100,) * 8) == by_spec.step_us((), (100,) * 8)
    with pytest.raises(ValueError, match=r"tp=3 does not divide .*32 attention heads"):
        PhysicsBackend("meta-llama/Llama-3.1-8B-Instruct", "H100", 3)
    with pytest.raises(ValueError, match="unknown GPU 'H10'"):
        PhysicsBackend("meta-llama/Llama-3.1-8B-Instruct", "H10")
