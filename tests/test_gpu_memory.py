"""KV-cache capacity (issue 26, point 4's memory): the sum, tp rules, does-not-fit errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simsim.gpu import (
    MODELS,
    DoesNotFitError,
    ModelSpec,
    check_tensor_parallel,
    kv_cache_blocks,
    load_gpu,
    load_model,
    memory_plan,
)
from simsim.gpu.memory import CUDA_GRAPH_BYTES, NON_TORCH_BYTES

GIB = 2**30
LLAMA_8B = load_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA_70B = load_model("meta-llama/Llama-3.1-70B-Instruct")


def test_llama_8b_on_one_h100_by_hand() -> None:
    plan = memory_plan(LLAMA_8B, "H100", 1)
    assert plan.usable_bytes == int(80 * GIB * 0.9)
    assert plan.weight_bytes == LLAMA_8B.weight_bytes
    activations = 8192 * 2 * (2 * 4096 + 3 * 14336)  # hidden + residual, gate-up + product
    logits = 256 * 128256 * 4 * 2
    assert plan.reserve_bytes == activations + logits + CUDA_GRAPH_BYTES + NON_TORCH_BYTES
    assert plan.block_bytes == 16 * LLAMA_8B.kv_bytes_per_token == 16 * 131072
    expected = (plan.usable_bytes - plan.weight_bytes - plan.reserve_bytes) // plan.block_bytes
    assert plan.kv_blocks == expected == kv_cache_blocks(LLAMA_8B, "H100", 1)
    assert plan.kv_tokens == 16 * expected
    assert plan.kv_bytes == plan.usable_bytes - plan.weight_bytes - plan.reserve_bytes


def test_tp_shards_weights_and_kv_heads() -> None:
    two, four = memory_plan(LLAMA_70B, "H100", 2), memory_plan(LLAMA_70B, "H100", 4)
    assert two.weight_bytes == -(-LLAMA_70B.weight_bytes // 2)
    assert two.block_bytes == 16 * 2 * 80 * 4 * 128 * 2  # 8 KV heads, 4 per rank
    assert four.block_bytes == two.block_bytes // 2
    assert four.kv_blocks > 2 * two.kv_blocks
    # 16 ranks, 8 KV heads: each rank keeps a replica of one head.
    assert memory_plan(LLAMA_70B, "H100", 16).block_bytes == 16 * 2 * 80 * 1 * 128 * 2


def test_fp8_kv_cache_doubles_the_blocks_roughly() -> None:
    fp8 = load_model("meta-llama/Llama-3.1-8B-Instruct", kv_cache_dtype="fp8")
    assert (
        memory_plan(fp8, "H100", 1).block_bytes == memory_plan(LLAMA_8B, "H100", 1).block_bytes // 2
    )
    assert kv_cache_blocks(fp8, "H100", 1) == pytest.approx(
        2 * kv_cache_blocks(LLAMA_8B, "H100", 1), abs=1
    )


def test_a_model_that_does_not_fit_says_by_how_much_and_suggests_tp() -> None:
    with pytest.raises(DoesNotFitError) as info:
        kv_cache_blocks(LLAMA_70B, "H100", 1)
    message = str(info.value)
    assert message.startswith(
        "meta-llama/Llama-3.1-70B-Instruct needs 131.4 GiB of weights per GPU at tp=1 on "
        "H100-SXM (80 GiB x 0.9 = 72.0 GiB usable, 2.6 GiB reserved): short by 62."
    )
    assert message.endswith("GiB; try tp=2") and "\n" not in message
    plan = memory_plan(LLAMA_70B, "H100", 2)
    assert plan.kv_blocks > 0


def test_no_tp_fits_is_said() -> None:
    small = load_model("Qwen/Qwen2.5-0.5B-Instruct")  # 14 heads: tp=2 divides, tp=4 does not
    with pytest.raises(DoesNotFitError, match="no larger tp that divides its heads"):
        memory_plan(small, "L4", 1, gpu_mem_util=0.01)


@pytest.mark.parametrize(
    ("tp", "error", "message"),
    [
        (0, ValueError, "tp must be >= 1, got 0"),
        (1.5, TypeError, "tp must be an int"),
        (
            3,
            ValueError,
            "tp=3 does not divide meta-llama/Llama-3.1-70B-Instruct's 64 attention heads",
        ),
    ],
)
def test_bad_tp(tp: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        kv_cache_blocks(LLAMA_70B, "H100", tp)  # type: ignore[arg-type]


def test_tp_must_divide_kv_heads_or_be_a_multiple() -> None:
    qwen = load_model("Qwen/Qwen2.5-7B-Instruct")  # 28 heads, 4 KV heads
    assert check_tensor_parallel(qwen, 4) == 4
    with pytest.raises(
        ValueError, match=r"tp=14 is not a multiple of Qwen/Qwen2.5-7B-Instruct's 4 KV heads"
    ):
        check_tensor_parallel(qwen, 14)
    yi = load_model("01-ai/Yi-34B")  # 56 heads, 8 KV heads
    with pytest.raises(ValueError, match="tp=7 does not divide 01-ai/Yi-34B's 8 KV heads"):
        check_tensor_parallel(yi, 7)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("gpu_mem_util", 0, "gpu_mem_util must be a finite number > 0"),
        ("gpu_mem_util", 1.2, r"gpu_mem_util must be in \(0, 1\]"),
        ("block_size", 0, "block_size must be >= 1"),
        ("max_num_batched_tokens", -1, "max_num_batched_tokens must be >= 1"),
        ("max_num_seqs", 0, "max_num_seqs must be >= 1"),
    ],
)
def test_bad_settings(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        memory_plan(LLAMA_8B, "H100", 1, **{option: value})  # type: ignore[arg-type]


def test_unknown_gpu_and_non_spec_model() -> None:
    with pytest.raises(ValueError, match="unknown GPU 'H101'"):
        kv_cache_blocks(LLAMA_8B, "H101", 1)
    with pytest.raises(TypeError, match="model must be a ModelSpec"):
        kv_cache_blocks("meta-llama/Llama-3.1-8B-Instruct", "H100", 1)  # type: ignore[arg-type]


def test_moe_reserve_uses_the_experts_a_token_touches() -> None:
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    plan = memory_plan(mixtral, "H100", 4)
    activations = 8192 * 2 * (2 * 4096 + 3 * 2 * 14336 / 4)
    logits = 256 * 32000 * 8
    assert plan.reserve_bytes == int(activations + logits) + CUDA_GRAPH_BYTES + 2 * NON_TORCH_BYTES


@given(
    low=st.floats(min_value=0.5, max_value=0.95),
    step=st.floats(min_value=0.0, max_value=0.05),
    model=st.sampled_from(
        ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B"]
    ),
    gpu=st.sampled_from(["H100", "H200", "A100", "MI300X"]),
)
def test_blocks_grow_with_gpu_mem_util_and_tp(
    low: float, step: float, model: str, gpu: str
) -> None:
    spec = load_model(model)
    assert _blocks(spec, gpu, 1, low) <= _blocks(spec, gpu, 1, low + step)
    assert _blocks(spec, gpu, 1, low) <= _blocks(spec, gpu, 2, low)


def _blocks(model: ModelSpec, gpu: str, tp: int, gpu_mem_util: float) -> int:
    """The blocks, or 0 where the model does not fit (the error is the plan's zero)."""
    try:
        return kv_cache_blocks(model, gpu, tp, gpu_mem_util=gpu_mem_util)
    except DoesNotFitError:
        return 0


def test_every_preset_fits_somewhere_on_an_mi300x_node() -> None:
    gpu = load_gpu("MI300X")
    for name in MODELS:
        model = load_model(name)
        assert any(_splits(model, tp) and _fits(model, gpu, tp) for tp in (1, 2, 4, 8)), name


def _splits(model: object, tp: int) -> bool:
    try:
        check_tensor_parallel(model, tp)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _fits(model: object, gpu: object, tp: int) -> bool:
    try:
        memory_plan(model, gpu, tp)  # type: ignore[arg-type]
    except DoesNotFitError:
        return False
    return True
