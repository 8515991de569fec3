"""Serving hardware from public facts, and the vLLM-shaped server priced on it.

``models`` reads a model's shape (a bundled preset or a local ``config.json``), ``gpus``
holds GPU datasheet presets, ``memory`` sizes a replica's KV cache as vLLM does.
``physics`` prices each step from them (:class:`PhysicsBackend`, coefficients fitted once
on real vLLM runs), ``vllm`` builds the server (:class:`VllmConfig`), ``reference``
predicts real vLLM runs (docs/predict.md).
``simsim.gpu.plan_capacity`` (:func:`simsim.sweeps.plan_capacity`, imported on first
use: it runs sweeps, a layer above this one) finds the cheapest GPU type x tp x replicas
within SLO targets.
"""

from typing import Any

from simsim.gpu.gpus import GPUS, GpuSpec, load_gpu
from simsim.gpu.memory import (
    DoesNotFitError,
    MemoryPlan,
    MemorySettings,
    check_tensor_parallel,
    kv_cache_blocks,
    memory_plan,
)
from simsim.gpu.models import MODELS, ModelConfigError, ModelSpec, load_model
from simsim.gpu.physics import (
    DEFAULT_COEFFICIENTS,
    FrontendOverheads,
    PhysicsBackend,
    PhysicsCoefficients,
    client_latencies,
    client_token_gaps_us,
)
from simsim.gpu.vllm import VllmConfig, vllm_server

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "GPUS",
    "MODELS",
    "DoesNotFitError",
    "FrontendOverheads",
    "GpuSpec",
    "MemoryPlan",
    "MemorySettings",
    "ModelConfigError",
    "ModelSpec",
    "PhysicsBackend",
    "PhysicsCoefficients",
    "VllmConfig",
    "check_tensor_parallel",
    "client_latencies",
    "client_token_gaps_us",
    "kv_cache_blocks",
    "load_gpu",
    "load_model",
    "memory_plan",
    "vllm_server",
]


def __getattr__(name: str) -> Any:
    # The planner lives with the sweeps (it drives many runs); importing it here eagerly
    # would import the scenario layer from the hardware facts below it.
    if name in ("plan_capacity", "CapacityPlan", "PlannedDeployment"):
        from simsim.sweeps import plan

        return getattr(plan, name)
    raise AttributeError(f"module 'simsim.gpu' has no attribute {name!r}")
