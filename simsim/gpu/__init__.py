"""Serving hardware from public facts: model architectures, GPU datasheets, GPU memory.

``models`` reads a model's shape (a bundled preset or a local ``config.json``), ``gpus``
holds GPU datasheet presets, ``memory`` sizes a replica's KV cache as vLLM does;
``physics`` prices a step from them and ``vllm`` builds a vLLM-shaped server (their
``VllmConfig``, ``PhysicsBackend``, ``client_latencies``... import from here too, on
first use: they build on the engines, a layer above this one).
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

__all__ = [
    "GPUS",
    "MODELS",
    "DoesNotFitError",
    "GpuSpec",
    "MemoryPlan",
    "MemorySettings",
    "ModelConfigError",
    "ModelSpec",
    "check_tensor_parallel",
    "kv_cache_blocks",
    "load_gpu",
    "load_model",
    "memory_plan",
]


# Names of the layers above the hardware facts, imported on first use (see __getattr__).
_PHYSICS_NAMES = (
    "DEFAULT_COEFFICIENTS",
    "FrontendOverheads",
    "PhysicsBackend",
    "PhysicsCoefficients",
    "client_latencies",
    "client_token_gaps_us",
)
_VLLM_NAMES = ("VllmConfig", "VllmSettings", "vllm_server")


def __getattr__(name: str) -> Any:
    # The vLLM server and its cost model build on the engines, a layer above the hardware
    # facts; the docs name them from here (simsim.gpu.VllmConfig), so they load on use.
    if name in _PHYSICS_NAMES:
        from simsim.gpu import physics

        return getattr(physics, name)
    if name in _VLLM_NAMES:
        from simsim.gpu import vllm

        return getattr(vllm, name)
    # The planner lives with the sweeps (it drives many runs); importing it here eagerly
    # would import the scenario layer from the hardware facts below it.
    if name in ("plan_capacity", "CapacityPlan", "PlannedDeployment"):
        from simsim.sweeps import plan

        return getattr(plan, name)
    raise AttributeError(f"module 'simsim.gpu' has no attribute {name!r}")
