"""GPU memory: how many KV-cache blocks a vLLM replica gets, as vLLM sizes them.

vLLM takes ``gpu_mem_util`` of each GPU's memory, loads the rank's share of the weights,
profiles one forward pass of ``max_num_batched_tokens`` tokens (and the sampler over
``max_num_seqs`` sequences) to learn the activation peak, and gives what is left to the
KV cache, in blocks of ``block_size`` tokens. :func:`memory_plan` does the same sum from
the model's and the GPU's figures; :func:`kv_cache_blocks` is its block count.

The activation reserve per GPU (the one estimated term; see ``docs/gpu.md``) is

* the forward pass's peak: ``max_num_batched_tokens * 2 bytes * (2 * hidden +
  max(mlp, attention))``: the hidden states and the residual, plus the widest block's
  intermediates on this rank: a gated MLP holds its gate-and-up output and the activated
  product, ``3 * width / tp`` (width: the dense MLP's, or ``experts_per_token`` experts
  plus the shared one for MoE, as the fused-MoE kernel's caches hold), attention holds
  q, k, v and its output, ``(2 * heads / tp + 2 * kv_heads_per_rank) * head_dim``;
* the sampler's logits: ``max_num_seqs * vocab * 4 bytes * 2`` (FP32 logits and the
  probabilities computed from them; the vocabulary is gathered whole on every rank);
* a fixed allowance of :data:`CUDA_GRAPH_BYTES` (0.5 GiB: vLLM logs 0.3 to 0.6 GiB for
  capturing its decode graphs on 7B to 70B models) plus :data:`NON_TORCH_BYTES`
  (0.25 GiB of cuBLAS workspaces and the allocator's slack, and as much again for NCCL's
  buffers when ``tp > 1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict, Unpack

from simsim.checks import check_positive_int, check_real
from simsim.gpu.gpus import GpuSpec, load_gpu
from simsim.gpu.models import ModelSpec

__all__ = [
    "CUDA_GRAPH_BYTES",
    "NON_TORCH_BYTES",
    "DoesNotFitError",
    "MemoryPlan",
    "MemorySettings",
    "check_tensor_parallel",
    "kv_cache_blocks",
    "memory_plan",
]

_GIB = 2**30
CUDA_GRAPH_BYTES = _GIB // 2
"""Memory set aside per GPU for vLLM's captured CUDA graphs."""
NON_TORCH_BYTES = _GIB // 4
"""Memory per GPU outside PyTorch's tensors (cuBLAS workspaces, allocator slack); once
more for NCCL's buffers when ``tp > 1``."""
_ACTIVATION_BYTES = 2  # activations stay 16-bit, FP8 weights or not
_LOGIT_BYTES = 4 * 2  # FP32 logits and the probabilities made from them
_MAX_SUGGESTED_TP = 64


class DoesNotFitError(ValueError):
    """A model whose weights and reserve leave no room for one KV block on the GPU at
    that tensor parallelism; the message says by how much and suggests a larger tp."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """One replica's memory, per GPU (bytes), as :func:`memory_plan` sizes it.

    ``usable_bytes`` = memory x ``gpu_mem_util``; ``weight_bytes`` the rank's share of
    the weights; ``reserve_bytes`` the activation reserve; ``kv_bytes`` what is left for
    the KV cache; ``block_bytes`` one block's KV on this rank; ``kv_blocks`` whole blocks
    (the same on every rank, so the replica's count); ``kv_tokens`` = blocks x
    ``block_size``.
    """

    model: str
    gpu: str
    tp: int
    block_size: int
    usable_bytes: int
    weight_bytes: int
    reserve_bytes: int
    kv_bytes: int
    block_bytes: int
    kv_blocks: int
    kv_tokens: int


def check_tensor_parallel(model: ModelSpec, tp: object) -> int:
    """*tp* as an int if *model* can be split that way, else one-line ``ValueError``.

    Rules (vLLM's): a positive int; it divides the attention heads; it divides the KV
    heads when there are at least *tp* of them, or else is a multiple of them (each
    rank then holds a replica of one KV head).
    """
    tp = check_positive_int(tp, "tp")
    if model.num_heads % tp:
        raise ValueError(
            f"tp={tp} does not divide {model.name}'s {model.num_heads} attention heads"
        )
    kv = model.num_kv_heads
    if kv >= tp and kv % tp:
        raise ValueError(f"tp={tp} does not divide {model.name}'s {kv} KV heads")
    if kv < tp and tp % kv:
        raise ValueError(
            f"tp={tp} is not a multiple of {model.name}'s {kv} KV heads "
            "(KV heads are replicated over ranks only evenly)"
        )
    return tp


def _kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    return math.ceil(model.num_kv_heads / tp)


def _reserve_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    widths = []
    if model.moe_layers < model.num_layers:
        widths.append(model.dense_intermediate_size)
    if model.moe_layers:
        widths.append(
            model.experts_per_token * model.intermediate_size
            + model.shared_expert_intermediate_size
        )
    mlp = 3 * max(widths) / tp
    attention = (2 * model.num_heads / tp + 2 * _kv_heads_per_rank(model, tp)) * model.head_dim
    activations = (
        max_num_batched_tokens * _ACTIVATION_BYTES * (2 * model.hidden_size + max(mlp, attention))
    )
    logits = max_num_seqs * model.vocab_size * _LOGIT_BYTES
    fixed = CUDA_GRAPH_BYTES + NON_TORCH_BYTES * (2 if tp > 1 else 1)
    return math.ceil(activations + logits) + fixed


def _plan(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    gpu_mem_util: float,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> MemoryPlan:
    usable = int(gpu.memory_bytes * gpu_mem_util)
    weights = math.ceil(model.weight_bytes / tp)
    reserve = _reserve_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    block = math.ceil(
        block_size
        * 2
        * model.num_layers
        * _kv_heads_per_rank(model, tp)
        * model.head_dim
        * model.kv_bytes_per_element
    )
    kv = usable - weights - reserve
    blocks = max(kv // block, 0)
    return MemoryPlan(
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        block_size=block_size,
        usable_bytes=usable,
        weight_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes=kv,
        block_bytes=block,
        kv_blocks=blocks,
        kv_tokens=blocks * block_size,
    )


def memory_plan(
    model: ModelSpec,
    gpu: GpuSpec | str,
    tp: int,
    *,
    gpu_mem_util: float = 0.9,
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
) -> MemoryPlan:
    """One replica's memory per GPU at tensor parallelism *tp* (see the module docstring).

    Raises ``ValueError`` for a *tp* the model cannot be split by
    (:func:`check_tensor_parallel`) or a bad setting, and :class:`DoesNotFitError` when
    not even one KV block fits: ``meta-llama/Llama-3.1-70B-Instruct needs 131.4 GiB of
    weights per GPU at tp=1 on H100-SXM (80 GiB x 0.9 = 72.0 GiB usable, 2.3 GiB
    reserved): short by 61.7 GiB; try tp=4``.
    """
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec, got {type(model).__name__}")
    gpu = load_gpu(gpu)
    tp = check_tensor_parallel(model, tp)
    gpu_mem_util = check_real(gpu_mem_util, "gpu_mem_util", positive=True)
    if gpu_mem_util > 1:
        raise ValueError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util!r}")
    block_size = check_positive_int(block_size, "block_size")
    settings = (
        gpu_mem_util,
        block_size,
        check_positive_int(max_num_batched_tokens, "max_num_batched_tokens"),
        check_positive_int(max_num_seqs, "max_num_seqs"),
    )
    plan = _plan(model, gpu, tp, *settings)
    if plan.kv_blocks >= 1:
        return plan
    short = plan.weight_bytes + plan.reserve_bytes + plan.block_bytes - plan.usable_bytes
    raise DoesNotFitError(
        f"{model.name} needs {plan.weight_bytes / _GIB:.1f} GiB of weights per GPU at "
        f"tp={tp} on {gpu.name} ({gpu.memory_bytes / _GIB:g} GiB x {gpu_mem_util:g} = "
        f"{plan.usable_bytes / _GIB:.1f} GiB usable, {plan.reserve_bytes / _GIB:.1f} GiB "
        f"reserved): short by {max(short / _GIB, 0.1):.1f} GiB; "
        f"{_suggestion(model, gpu, tp, settings)}"
    )


def _suggestion(
    model: ModelSpec, gpu: GpuSpec, tp: int, settings: tuple[float, int, int, int]
) -> str:
    """``try tp=N`` for the smallest larger tp (doubling) that fits, or why none does."""
    larger = tp * 2
    while larger <= _MAX_SUGGESTED_TP:
        try:
            check_tensor_parallel(model, larger)
        except ValueError:
            break  # a doubling that stops dividing the heads never divides them again
        if _plan(model, gpu, larger, *settings).kv_blocks >= 1:
            return f"try tp={larger}"
        larger *= 2
    return f"no larger tp that divides its heads (up to {_MAX_SUGGESTED_TP}) fits either"


class MemorySettings(TypedDict, total=False):
    """The server settings :func:`memory_plan` takes by keyword, with its defaults:
    ``gpu_mem_util`` (0.9), ``block_size`` (16 tokens), ``max_num_batched_tokens`` (8192),
    ``max_num_seqs`` (256)."""

    gpu_mem_util: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int


def kv_cache_blocks(
    model: ModelSpec, gpu: GpuSpec | str, tp: int, **settings: Unpack[MemorySettings]
) -> int:
    """The KV-cache blocks of one replica of *model* on *tp* GPUs: :func:`memory_plan`'s
    ``kv_blocks``, with the same keyword settings (:class:`MemorySettings`: ``gpu_mem_util``
    0.9, ``block_size`` 16, ``max_num_batched_tokens`` 8192, ``max_num_seqs`` 256) and
    the same errors."""
    return memory_plan(model, gpu, tp, **settings).kv_blocks
