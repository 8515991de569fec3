"""A vLLM-shaped server: the batching engine set up as vLLM runs a model on GPUs.

:class:`VllmConfig` holds vLLM's serving settings under vLLM's names (``max_num_seqs``,
``max_num_batched_tokens``, ``gpu_mem_util``, ``block_size``, ``enable_prefix_caching``)
beside the model, the GPU and the tensor-parallel degree, and builds a
:class:`~simsim.BatchingEngine` that behaves as vLLM's V1 scheduler does:

* chunked prefill (``policy="mixed"``): running decodes first, then what is left of
  ``max_num_batched_tokens`` to prefill chunks in admission order;
* at most ``max_num_seqs`` running requests;
* a KV cache of ``block_size``-token blocks sized from GPU memory
  (:func:`simsim.gpu.memory.kv_cache_blocks`: memory x ``gpu_mem_util`` minus the rank's
  weights and an activation reserve), with prefix caching on by default, and preemption
  by recompute when it runs short;
* the first output token sampled at the end of the prefill step
  (``first_token_at_prefill=True``), as vLLM does;
* every step priced by :class:`~simsim.gpu.physics.PhysicsBackend`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

from simsim.checks import check_positive_int, check_real
from simsim.engines.batching import BatchingEngine, KvCacheConfig
from simsim.gpu.gpus import GpuSpec, load_gpu
from simsim.gpu.memory import MemoryPlan, memory_plan
from simsim.gpu.models import ModelSpec, load_model
from simsim.gpu.physics import (
    FrontendOverheads,
    PhysicsBackend,
    PhysicsCoefficients,
    check_coefficients,
)

if TYPE_CHECKING:
    from simsim.admission import AdmissionControl
    from simsim.backend import Backend
    from simsim.clock import Environment
    from simsim.scheduler import Scheduler

__all__ = ["VllmConfig", "VllmSettings", "vllm_server"]


@dataclass(frozen=True, slots=True, init=False)
class VllmConfig:
    """One vLLM replica: a model on ``tp`` GPUs with vLLM's serving settings.

    *model* is a :class:`~simsim.gpu.models.ModelSpec` or anything
    :func:`~simsim.gpu.models.load_model` takes (a preset's Hugging Face id, a local
    ``config.json``); *gpu* a :class:`~simsim.gpu.gpus.GpuSpec` or a preset name. The
    defaults are vLLM's: 256 running sequences, a step budget of 8,192 tokens, 90% of GPU
    memory, 16-token blocks, prefix caching on. Every value is checked at construction,
    including that the model fits in the GPUs' memory at this TP.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_mem_util: float
    block_size: int
    enable_prefix_caching: bool
    coefficients: PhysicsCoefficients

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GpuSpec | str = "H100",
        tp: int = 1,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        gpu_mem_util: float = 0.9,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        coefficients: PhysicsCoefficients | None = None,
    ) -> None:
        spec = model if isinstance(model, ModelSpec) else load_model(model)
        chip = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
        seqs = check_positive_int(max_num_seqs, "max_num_seqs")
        budget = check_positive_int(max_num_batched_tokens, "max_num_batched_tokens")
        if budget < seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({seqs}): "
                "every running sequence decodes a token in each step"
            )
        util = check_real(gpu_mem_util, "gpu_mem_util")
        if not 0 < util <= 1:
            raise ValueError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util!r}")
        if type(enable_prefix_caching) is not bool:
            raise TypeError(
                f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}"
            )
        values = {
            "model": spec,
            "gpu": chip,
            "tp": check_positive_int(tp, "tp"),
            "max_num_seqs": seqs,
            "max_num_batched_tokens": budget,
            "gpu_mem_util": float(util),
            "block_size": check_positive_int(block_size, "block_size"),
            "enable_prefix_caching": enable_prefix_caching,
            "coefficients": check_coefficients(coefficients),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.memory()  # refuses a model that does not fit, naming by how much

    def memory(self) -> MemoryPlan:
        """Where one GPU's memory goes: weights, the reserve, the KV cache (its blocks)."""
        return memory_plan(
            self.model,
            self.gpu,
            self.tp,
            gpu_mem_util=self.gpu_mem_util,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )

    def kv_cache(self) -> KvCacheConfig:
        """The replica's KV cache: ``block_size``-token blocks, as many as memory leaves."""
        return KvCacheConfig(self.block_size, self.memory().kv_blocks)

    def backend(self) -> PhysicsBackend:
        """The physics cost model of this model, GPU and TP."""
        return PhysicsBackend(self.model, self.gpu, self.tp, coefficients=self.coefficients)

    @property
    def frontend(self) -> FrontendOverheads:
        """The request-level overheads a client sees beyond the steps."""
        return self.coefficients.frontend

    @property
    def gpus(self) -> int:
        """GPUs one replica takes (``tp``)."""
        return self.tp

    def engine(
        self,
        scheduler: Scheduler | None = None,
        *,
        env: Environment | None = None,
        admission: AdmissionControl | None = None,
        backend: Backend | None = None,
    ) -> BatchingEngine:
        """A new :class:`~simsim.BatchingEngine` set up as this vLLM replica (priced by
        *backend* instead of :meth:`backend` when given: a wrapper that records steps,
        say)."""
        return BatchingEngine(
            self.backend() if backend is None else backend,
            scheduler,
            max_active_requests=self.max_num_seqs,
            max_batch_tokens=self.max_num_batched_tokens,
            policy="mixed",
            kv_cache=self.kv_cache(),
            prefix_cache=self.enable_prefix_caching,
            first_token_at_prefill=True,
            env=env,
            admission=admission,
        )


class VllmSettings(TypedDict, total=False):
    """vLLM's serving settings :func:`vllm_server` takes by keyword, as
    :class:`VllmConfig` takes them (defaults: ``max_num_seqs`` 256,
    ``max_num_batched_tokens`` 8192, ``gpu_mem_util`` 0.9, ``block_size`` 16,
    ``enable_prefix_caching`` True, ``coefficients`` the shipped ones)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_mem_util: float
    block_size: int
    enable_prefix_caching: bool
    coefficients: PhysicsCoefficients


def vllm_server(
    model: ModelSpec | str | os.PathLike[str],
    gpu: GpuSpec | str = "H100",
    tp: int = 1,
    *,
    precision: str | None = None,
    kv_cache_dtype: str | None = None,
    scheduler: Scheduler | None = None,
    env: Environment | None = None,
    admission: AdmissionControl | None = None,
    **settings: Unpack[VllmSettings],
) -> BatchingEngine:
    """A new vLLM-shaped :class:`~simsim.BatchingEngine`, ready for requests.

    ``vllm_server("meta-llama/Llama-3.1-8B-Instruct", "H100", tp=1, max_num_seqs=128)``
    is ``VllmConfig(model, gpu, tp, **settings).engine(scheduler, env=env,
    admission=admission)``; *model* may also be a ``config.json`` path, loaded with
    *precision* and *kv_cache_dtype* (:func:`~simsim.gpu.models.load_model`), which
    apply only to a model given by name or path. Its request table gives the engine's
    times: add the frontend's overheads a client sees with
    :func:`simsim.gpu.physics.client_latencies` (``VllmConfig.frontend``).
    """
    if isinstance(model, ModelSpec):
        if precision is not None or kv_cache_dtype is not None:
            raise ValueError(
                f"precision ({precision!r}) and kv_cache_dtype ({kv_cache_dtype!r}) apply "
                "to a model given by name or path; for a ModelSpec use "
                "dataclasses.replace or load_model(..., precision=...)"
            )
        spec = model
    else:
        spec = load_model(model, precision=precision, kv_cache_dtype=kv_cache_dtype)
    config = VllmConfig(spec, gpu, tp, **settings)
    return config.engine(scheduler, env=env, admission=admission)
