"""Serving hardware from public facts: model architectures, GPU datasheets, GPU memory.

``models`` reads a model's shape (a bundled preset or a local ``config.json``), ``gpus``
holds GPU datasheet presets, ``memory`` sizes a replica's KV cache as vLLM does.
"""

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
