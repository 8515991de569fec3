"""The physics cost model: a step's time from what one tensor-parallel rank computes and moves.

:class:`PhysicsBackend` prices each step of a model on a GPU at a tensor-parallel degree
from public facts only (the model's architecture, the GPU's datasheet), with a handful of
coefficients fitted once on real vLLM measurements (:data:`DEFAULT_COEFFICIENTS`; the
procedure is ``benchmarks/vllm_reference/fit.py``, documented in ``docs/predict.md``).

For a step with prefilling sequences *i* (``new_i`` tokens computed now, ``cached_i``
already in the KV cache) and decoding sequences *j* (``context_j`` tokens in the KV cache),
``T = sum(new_i) + count(j)`` tokens and ``n`` sequences, per rank of a TP group of ``tp``
GPUs (all sizes in bytes, FLOPs and seconds)::

    weights read  = (dense weights + experts touched * bytes per expert) / tp
    KV moved      = kv_per_token_rank * (sum(cached_i + 2 * new_i) + sum(context_j + 1))
    linear FLOPs  = (2 * active linear params * T + 2 * lm_head params * n) / tp
    attention     = 4 * layers * heads * head_dim / tp
                    * (sum(new_i * cached_i + new_i * (new_i + 1) / 2) + sum(context_j + 1))
    memory time   = (weights read + KV moved) / HBM bandwidth
    compute time  = (linear FLOPs + attention) / peak FLOP/s (FP8 when weights are FP8)
    all-reduce    = 2 * layers * 2 * (tp - 1) / tp * T * hidden * 2 / interconnect bandwidth
    all-reduces   = 2 * layers when tp > 1, else 0

    step = max(memory_scale * memory time, compute_scale * compute time)
           + allreduce_scale * all-reduce + allreduce_latency_us * all-reduces
           + per_step_us + per_layer_us * layers + per_sequence_us * n

``experts touched`` is the expected number of distinct experts the step's ``T`` tokens
route to in each MoE layer, ``E * (1 - (1 - k / E) ** T)`` for ``k`` of ``E`` experts per
token. ``kv_per_token_rank`` is the KV cache one token takes on one rank: KV heads are
split over the ranks and replicated when there are fewer of them than ranks. The step is
rounded once to integer microseconds (:func:`simsim.backend.round_us`).

Three request-level terms are not GPU work and do not slow other requests: the time a
request spends in vLLM's frontend before it is queued (``before_queue_us``: HTTP,
tokenisation), per output token (``per_output_token_us``: detokenising and streaming) and at
completion (``at_completion_us``). :class:`FrontendOverheads` holds them;
:func:`client_latencies` adds them to a request table and :func:`client_token_gaps_us`
to the gaps between tokens: the one place where a client's view is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from simsim.backend import IntArray, round_us, rounded_us
from simsim.checks import check_real
from simsim.clock import check_count
from simsim.gpu.gpus import GpuSpec, load_gpu
from simsim.gpu.memory import check_tensor_parallel
from simsim.gpu.models import ModelSpec, load_model

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "FrontendOverheads",
    "PhysicsBackend",
    "PhysicsCoefficients",
    "StepTerms",
    "check_coefficients",
    "client_latencies",
    "client_token_gaps_us",
]


@dataclass(frozen=True, slots=True)
class PhysicsCoefficients:
    """The fitted coefficients of :class:`PhysicsBackend`, each with a physical meaning.

    ``memory_scale`` and ``compute_scale`` are the inverse of the fraction of the GPU's
    datasheet HBM bandwidth and peak FLOP/s that a step achieves (1.0: the datasheet;
    2.0: half of it); ``allreduce_scale`` the same for the tensor-parallel all-reduce over
    the interconnect, and ``allreduce_latency_us`` the fixed time of one all-reduce
    (launch and synchronisation, whatever its size; two per layer when ``tp > 1``).
    ``per_step_us`` is the scheduler's and launch overhead of one step,
    ``per_layer_us`` the kernel launches and small operations of one layer, and
    ``per_sequence_us`` the per-sequence work of a step (input preparation, sampling).
    ``before_queue_us``, ``per_output_token_us`` and ``at_completion_us`` are the
    frontend's request-level overheads (:class:`FrontendOverheads`). All are finite and
    non-negative.
    """

    memory_scale: float
    compute_scale: float
    allreduce_scale: float
    per_step_us: float
    per_layer_us: float
    per_sequence_us: float
    before_queue_us: float
    per_output_token_us: float
    at_completion_us: float
    allreduce_latency_us: float = 0.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = check_real(getattr(self, spec.name), spec.name, positive=False)
            object.__setattr__(self, spec.name, float(value))

    @property
    def frontend(self) -> FrontendOverheads:
        """The request-level terms, as :class:`FrontendOverheads`."""
        return FrontendOverheads(
            self.before_queue_us, self.per_output_token_us, self.at_completion_us
        )


@dataclass(frozen=True, slots=True)
class FrontendOverheads:
    """What a client sees beyond the GPU's steps, in microseconds (floats, non-negative).

    A client's time to first token is the engine's plus ``before_queue_us``; its
    end-to-end latency is the engine's plus ``before_queue_us``, plus
    ``per_output_token_us`` per output token, plus ``at_completion_us``. None of them
    occupies the GPU, so none of them delays another request.
    """

    before_queue_us: float = 0.0
    per_output_token_us: float = 0.0
    at_completion_us: float = 0.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = check_real(getattr(self, spec.name), spec.name, positive=False)
            object.__setattr__(self, spec.name, float(value))


DEFAULT_COEFFICIENTS = PhysicsCoefficients(
    memory_scale=1.092,
    compute_scale=2.975,
    allreduce_scale=2.0,
    per_step_us=0.0,
    per_layer_us=19.81,
    per_sequence_us=23.55,
    before_queue_us=22950.0,
    per_output_token_us=906.8,
    at_completion_us=2500.0,
    allreduce_latency_us=21.71,
)
"""The shipped coefficients, fitted once on ``../shared/vllm-reference/train.csv``."""


def check_coefficients(coefficients: object) -> PhysicsCoefficients:
    """*coefficients* if it is a :class:`PhysicsCoefficients`, the shipped ones for
    ``None``, else ``TypeError``."""
    if coefficients is None:
        return DEFAULT_COEFFICIENTS
    if not isinstance(coefficients, PhysicsCoefficients):
        raise TypeError(
            f"coefficients must be a PhysicsCoefficients, got {type(coefficients).__name__}"
        )
    return coefficients


class StepTerms(NamedTuple):
    """One step's physical quantities before the coefficients (microseconds and counts).

    ``memory_us`` and ``compute_us`` are the datasheet times of the bytes moved and the
    FLOPs computed per rank, ``allreduce_us`` the all-reduces' datasheet time, ``layers``
    the model's layers, ``sequences`` the sequences in the step and ``allreduces`` the
    tensor-parallel all-reduces it takes.
    """

    memory_us: float
    compute_us: float
    allreduce_us: float
    layers: int
    sequences: int
    allreduces: int


class PhysicsBackend:
    """Prices steps of *model* on *gpu* at tensor-parallel degree *tp* (see the module docs).

    *model* is a :class:`~simsim.gpu.models.ModelSpec` or what
    :func:`~simsim.gpu.models.load_model` takes, *gpu* a :class:`~simsim.gpu.gpus.GpuSpec`
    or a preset name; *tp* must split the model's heads (``ValueError`` otherwise). It
    implements :class:`simsim.StepCostBackend`. ``prefill_us`` and ``decode_step_us``
    (for code that knows no context) price a prompt with nothing cached and decode steps
    of sequences with an empty context.
    """

    __slots__ = (
        "_allreduce_s_per_token",
        "_allreduces",
        "_attention_flops",
        "_coefficients",
        "_compute_s_per_flop",
        "_dense_weight_bytes",
        "_expert_bytes",
        "_experts",
        "_experts_per_token",
        "_gpu",
        "_kv_bytes_per_token",
        "_layer_us",
        "_linear_flops_per_token",
        "_lm_head_flops",
        "_memory_s_per_byte",
        "_model",
        "_tp",
    )

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GpuSpec | str,
        tp: int = 1,
        *,
        coefficients: PhysicsCoefficients | None = None,
    ) -> None:
        model = model if isinstance(model, ModelSpec) else load_model(model)
        gpu = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
        tp = check_tensor_parallel(model, tp)
        coefficients = check_coefficients(coefficients)
        self._model = model
        self._gpu = gpu
        self._tp = tp
        self._coefficients = coefficients
        layers = model.num_layers
        moe_layers = model.moe_layers if model.num_experts else 0
        dense_layers = layers - moe_layers
        wb = model.weight_bytes_per_param
        # Weights every step reads whatever the batch: attention, dense MLPs, shared
        # experts, routers and the LM head (the embedding is a lookup of T rows).
        always_params = (
            layers * model.attention_params_per_layer
            + dense_layers * model.mlp_params_per_dense_layer
            + moe_layers * (3 * model.hidden_size * model.shared_expert_intermediate_size)
            + moe_layers * model.router_params_per_layer
            + (model.vocab_size * model.hidden_size)  # the LM head's matrix, tied or not
        )
        self._dense_weight_bytes = always_params * wb / tp
        self._experts = model.num_experts if moe_layers else 0
        self._experts_per_token = model.experts_per_token if moe_layers else 0
        self._expert_bytes = moe_layers * model.params_per_expert * wb / tp
        kv_heads_per_rank = math.ceil(model.num_kv_heads / tp)
        self._kv_bytes_per_token = (
            2 * layers * kv_heads_per_rank * model.head_dim * model.kv_bytes_per_element
        )
        linear_params = (
            layers * model.attention_params_per_layer
            + dense_layers * model.mlp_params_per_dense_layer
            + moe_layers
            * (
                model.experts_per_token * model.params_per_expert
                + 3 * model.hidden_size * model.shared_expert_intermediate_size
                + model.router_params_per_layer
            )
        )
        self._linear_flops_per_token = 2.0 * linear_params / tp
        self._lm_head_flops = 2.0 * model.vocab_size * model.hidden_size / tp
        self._attention_flops = 4.0 * layers * model.num_heads * model.head_dim / tp
        precision = "fp8" if wb <= 1.0 else "bf16"
        self._compute_s_per_flop = 1.0 / gpu.flops(precision)
        self._memory_s_per_byte = 1.0 / gpu.hbm_bandwidth
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            activation_bytes = model.hidden_size * 2.0  # BF16 activations of one token
            self._allreduce_s_per_token = (
                2 * layers * ring * activation_bytes / gpu.interconnect_bandwidth
            )
        else:
            self._allreduce_s_per_token = 0.0
        self._allreduces = 2 * layers if tp > 1 else 0
        # The terms that do not depend on the batch, summed once.
        self._layer_us = (
            coefficients.per_step_us
            + coefficients.per_layer_us * layers
            + coefficients.allreduce_latency_us * self._allreduces
        )

    @property
    def model(self) -> ModelSpec:
        """The model whose steps this backend prices."""
        return self._model

    @property
    def gpu(self) -> GpuSpec:
        """The GPU each tensor-parallel rank runs on."""
        return self._gpu

    @property
    def tp(self) -> int:
        """The tensor-parallel degree (GPUs per replica)."""
        return self._tp

    @property
    def coefficients(self) -> PhysicsCoefficients:
        """The coefficients this backend prices with."""
        return self._coefficients

    @property
    def frontend(self) -> FrontendOverheads:
        """The request-level overheads a client sees (not GPU work)."""
        return self._coefficients.frontend

    def __repr__(self) -> str:
        return f"PhysicsBackend({self._model.name!r}, {self._gpu.name!r}, tp={self._tp})"

    def terms(self, prefills: Sequence[tuple[int, int]], decodes: Sequence[int]) -> StepTerms:
        """The step's physical quantities (see the module docs), before any coefficient."""
        tokens = len(decodes)
        kv_tokens = 0
        attention = 0.0
        for new, cached in prefills:
            tokens += new
            kv_tokens += cached + 2 * new
            attention += new * cached + new * (new + 1) / 2
        context = sum(decodes) + len(decodes)
        kv_tokens += context
        attention += context
        sequences = len(prefills) + len(decodes)
        weight_bytes = self._dense_weight_bytes
        if self._experts:
            share = self._experts_per_token / self._experts
            touched = self._experts * (1.0 - (1.0 - share) ** tokens)
            weight_bytes += touched * self._expert_bytes
        memory_s = (weight_bytes + kv_tokens * self._kv_bytes_per_token) * self._memory_s_per_byte
        flops = (
            self._linear_flops_per_token * tokens
            + self._lm_head_flops * sequences
            + self._attention_flops * attention
        )
        compute_s = flops * self._compute_s_per_flop
        return StepTerms(
            memory_s * 1e6,
            compute_s * 1e6,
            self._allreduce_s_per_token * tokens * 1e6,
            self._model.num_layers,
            sequences,
            self._allreduces,
        )

    def step_us(self, prefills: Sequence[tuple[int, int]], decodes: Sequence[int]) -> int:
        """One step's duration in whole microseconds (see the module docs)."""
        if not prefills and not decodes:
            return 0
        memory_us, compute_us, allreduce_us, _, sequences, _ = self.terms(prefills, decodes)
        c = self._coefficients
        total = (
            max(c.memory_scale * memory_us, c.compute_scale * compute_us)
            + c.allreduce_scale * allreduce_us
            + self._layer_us
            + c.per_sequence_us * sequences
        )
        return round_us(total, "step_us")

    def decode_steps_us(self, count: int, context_sums: npt.NDArray[np.int64]) -> IntArray | None:
        """Many decode-only steps at once: for each entry of *context_sums*, exactly what
        :meth:`step_us` gives for *count* decoding sequences whose contexts sum to it
        (:meth:`terms` and :meth:`step_us` written for an array, operation for
        operation, so every step rounds alike); ``None`` if a step would pass
        ``2**63 - 1``."""
        if count == 0:
            return np.zeros(len(context_sums), dtype=np.int64)
        # terms((), decodes), with T = n = count
        context = context_sums + count
        attention = context.astype(np.float64)
        weight_bytes = self._dense_weight_bytes
        if self._experts:
            share = self._experts_per_token / self._experts
            touched = self._experts * (1.0 - (1.0 - share) ** count)
            weight_bytes += touched * self._expert_bytes
        memory_s = (weight_bytes + context * self._kv_bytes_per_token) * self._memory_s_per_byte
        flops = (
            self._linear_flops_per_token * count
            + self._lm_head_flops * count
            + self._attention_flops * attention
        )
        compute_s = flops * self._compute_s_per_flop
        memory_us = memory_s * 1e6
        compute_us = compute_s * 1e6
        allreduce_us = self._allreduce_s_per_token * count * 1e6
        # step_us
        c = self._coefficients
        totals = (
            np.maximum(c.memory_scale * memory_us, c.compute_scale * compute_us)
            + c.allreduce_scale * allreduce_us
            + self._layer_us
            + c.per_sequence_us * count
        )
        return rounded_us(totals)

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        """A prefill of *prompt_token_count* tokens, one sequence with nothing cached."""
        tokens = check_count(prompt_token_count, "prompt_token_count")
        check_count(active_batch_size, "active_batch_size")
        return self.step_us(((tokens, 0),), ())

    def decode_step_us(self, active_sequence_count: int) -> int:
        """A decode step of *active_sequence_count* sequences with an empty context."""
        count = check_count(active_sequence_count, "active_sequence_count")
        return self.step_us((), (0,) * count)


def client_latencies(requests: pd.DataFrame, overheads: FrontendOverheads) -> pd.DataFrame:
    """*requests* (a requests frame) with the frontend's overheads added, as a client sees them.

    Returns the finished requests with two columns appended (floats, microseconds):
    ``client_ttft_us = ttft_us + before_queue_us`` and ``client_e2e_us = e2e_latency_us
    + before_queue_us + per_output_token_us * generated_token_count + at_completion_us``.
    """
    finished = requests[requests["state"] == "FINISHED"].copy()
    arrival = finished["arrival_time_us"].astype("float64")
    finished["client_ttft_us"] = (
        finished["first_token_time_us"].astype("float64") - arrival + overheads.before_queue_us
    )
    finished["client_e2e_us"] = (
        finished["finish_time_us"].astype("float64")
        - arrival
        + overheads.before_queue_us
        + overheads.per_output_token_us * finished["generated_token_count"].astype("float64")
        + overheads.at_completion_us
    )
    return finished


def client_token_gaps_us(events: pd.DataFrame, overheads: FrontendOverheads) -> np.ndarray:
    """Every gap between an output token and its request's previous one, as a client sees
    it: from an ``events_frame()``'s ``DECODE_STEP_COMPLETE`` rows, plus
    ``per_output_token_us`` each (microseconds, floats)."""
    tokens = events[events["event_type"] == "DECODE_STEP_COMPLETE"]
    if tokens.empty:
        return np.zeros(0)
    ordered = tokens.sort_values(["request_id", "timestamp_us"], kind="stable")
    gaps = ordered.groupby("request_id", sort=False)["timestamp_us"].diff().dropna()
    return gaps.to_numpy(dtype="float64") + overheads.per_output_token_us
