"""A scenario's GPU tables: ``[gpus.<name>]``, ``[vllm]`` and ``[backend] kind = "physics"``.

``[gpus.<name>]`` defines a GPU of the user's own (:meth:`simsim.gpu.GpuSpec.from_mapping`),
usable by name wherever a GPU is named. ``[vllm]`` (with ``[scenario] engine = "vllm"``)
is a :class:`~simsim.gpu.vllm.VllmConfig`: a model on ``tp`` GPUs with vLLM's settings. A
``[backend]`` table of ``kind = "physics"`` prices steps with
:class:`~simsim.gpu.physics.PhysicsBackend`: beside ``engine = "vllm"`` it only adjusts the
coefficients (the model, GPU and tp are ``[vllm]``'s); with another engine it names its
own model, GPU and tp. Every bad value is one :class:`ScenarioError` naming its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from simsim.checks import closest
from simsim.engines import KvCacheConfig
from simsim.gpu.gpus import GpuSpec, load_gpu
from simsim.gpu.memory import DoesNotFitError, check_tensor_parallel, memory_plan
from simsim.gpu.models import MODELS, ModelSpec, load_model
from simsim.gpu.physics import DEFAULT_COEFFICIENTS, PhysicsCoefficients
from simsim.gpu.vllm import VllmConfig
from simsim.scenario.checker import TomlChecker
from simsim.scenario.model import BatchingSpec, PhysicsBackendSpec

__all__ = [
    "COEFFICIENT_KEYS",
    "PHYSICS_KEYS",
    "VLLM_KEYS",
    "parse_gpus",
    "parse_physics_backend",
    "parse_vllm",
    "vllm_batching",
]

VLLM_KEYS = (
    "model",
    "gpu",
    "tp",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_mem_util",
    "block_size",
    "enable_prefix_caching",
    "precision",
    "kv_cache_dtype",
)
"""The keys of a ``[vllm]`` table (``model`` is required)."""

COEFFICIENT_KEYS = tuple(spec.name for spec in fields(PhysicsCoefficients))
"""The physics backend's coefficients a ``[backend] kind = "physics"`` table may set."""

_MODEL_KEYS = ("model", "gpu", "tp", "precision", "kv_cache_dtype")
PHYSICS_KEYS = ("kind", *_MODEL_KEYS, *COEFFICIENT_KEYS)
"""The keys of a ``[backend] kind = "physics"`` table (with ``engine = "vllm"``: ``kind``
and the coefficients only)."""

_PRECISIONS = ("bf16", "fp16", "fp8")
_KV_CACHE_DTYPES = ("auto", "fp8")


def parse_gpus(check: TomlChecker, data: Mapping[str, Any]) -> dict[str, GpuSpec]:
    """The ``[gpus.<name>]`` tables, by name (a preset's name is replaced by the user's)."""
    table = check.table(data, "gpus", "gpus")
    gpus: dict[str, GpuSpec] = {}
    for name, row in table.items():
        where = f"gpus.{name}"
        if not isinstance(row, dict):
            raise check.fail(
                where,
                "must be a table of the GPU's figures ([gpus.<name>] bf16_tflops = ..., "
                "hbm_tb_s = ..., memory_gib = ..., interconnect_gb_s = ...)",
            )
        try:
            gpus[name] = GpuSpec.from_mapping(name, row)
        except (TypeError, ValueError) as error:
            raise check.fail(where, str(error).removeprefix(f"GPU {name!r}").lstrip(": ")) from None
    return gpus


def parse_vllm(
    check: TomlChecker,
    data: Mapping[str, Any],
    base_dir: Path | None,
    gpus: Mapping[str, GpuSpec],
) -> VllmConfig:
    """The ``[vllm]`` table as a :class:`~simsim.gpu.vllm.VllmConfig`, with the
    coefficients of a ``[backend] kind = "physics"`` table beside it, if any."""
    if "vllm" not in data:
        raise check.fail(
            "vllm",
            'missing table: engine = "vllm" needs [vllm] with at least model = "<Hugging '
            'Face id or path of a config.json>" (gpu = "H100" and tp = 1 by default)',
        )
    table = check.table(data, "vllm", "vllm")
    check.keys(table, VLLM_KEYS, "vllm")
    model = _model(check, table, "vllm", base_dir)
    gpu = _gpu(check, table, "vllm", gpus)
    tp = _tp(check, table, "vllm", model)
    settings: dict[str, Any] = {}
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if key in table:
            settings[key] = check.integer(table, key, "vllm", minimum=1)
    seqs = settings.get("max_num_seqs", 256)
    budget = settings.get("max_num_batched_tokens", 8192)
    if budget < seqs:
        raise check.fail(
            "vllm.max_num_batched_tokens",
            f"must be at least max_num_seqs ({seqs}), got {budget}: every running sequence "
            "decodes a token in each step",
        )
    if "gpu_mem_util" in table:
        util = check.number(table, "gpu_mem_util", "vllm")
        if not 0 < util <= 1:
            raise check.fail("vllm.gpu_mem_util", f"must be in (0, 1], got {util!r}")
        settings["gpu_mem_util"] = util
    if "enable_prefix_caching" in table:
        settings["enable_prefix_caching"] = check.boolean(
            table, "enable_prefix_caching", "vllm", default=True
        )
    coefficients = _vllm_coefficients(check, data)
    try:  # every setting is valid by now: what is left is whether the model fits
        return VllmConfig(model, gpu, tp, coefficients=coefficients, **settings)
    except DoesNotFitError as error:
        raise check.fail("vllm.tp", str(error)) from None


def vllm_batching(config: VllmConfig) -> BatchingSpec:
    """The :class:`~simsim.scenario.model.BatchingSpec` a vLLM server amounts to, for the
    checks that read a scenario's batching server (its KV cache, its prefix cache)."""
    return BatchingSpec(
        max_active_requests=config.max_num_seqs,
        max_batch_tokens=config.max_num_batched_tokens,
        policy="mixed",
        kv_cache=KvCacheConfig(config.block_size, config.memory().kv_blocks),
        prefix_cache=config.enable_prefix_caching,
        first_token_at_prefill=True,
    )


def parse_physics_backend(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    gpus: Mapping[str, GpuSpec],
) -> PhysicsBackendSpec:
    """A ``[backend] kind = "physics"`` table beside an engine other than ``vllm``: its
    ``model`` (required), ``gpu`` (``"H100"``), ``tp`` (1), ``precision``,
    ``kv_cache_dtype`` and coefficient overrides. The model must fit in the GPUs' whole
    memory at that tp."""
    check.keys(table, PHYSICS_KEYS, "backend")
    model = _model(check, table, "backend", base_dir)
    gpu = _gpu(check, table, "backend", gpus)
    tp = _tp(check, table, "backend", model)
    try:
        memory_plan(model, gpu, tp, gpu_mem_util=1.0)
    except DoesNotFitError as error:
        raise check.fail("backend.tp", str(error)) from None
    return PhysicsBackendSpec(model, gpu, tp, _coefficients(check, table))


def _vllm_coefficients(check: TomlChecker, data: Mapping[str, Any]) -> PhysicsCoefficients:
    """The coefficients a ``[backend]`` table beside ``[vllm]`` sets (the defaults
    without one); any other ``[backend]`` there is refused."""
    if "backend" not in data:
        return DEFAULT_COEFFICIENTS
    table = check.table(data, "backend", "backend")
    allowed = ", ".join(COEFFICIENT_KEYS)
    if table.get("kind") != "physics":
        raise check.fail(
            "backend",
            'engine = "vllm" prices its steps with the physics cost model of [vllm]\'s model '
            'and GPU; a [backend] table beside it may only adjust that model: kind = "physics" '
            f"and any of {allowed}",
        )
    for key in table:
        if key in _MODEL_KEYS:
            raise check.fail(
                f"backend.{key}",
                f'with engine = "vllm" the model, GPU, tp and precisions come from [vllm]; '
                f"here give only kind and coefficients ({allowed})",
            )
    check.keys(table, ("kind", *COEFFICIENT_KEYS), "backend")
    return _coefficients(check, table)


def _coefficients(check: TomlChecker, table: Mapping[str, Any]) -> PhysicsCoefficients:
    overrides = {
        key: check.number(table, key, "backend") for key in COEFFICIENT_KEYS if key in table
    }
    for key, value in overrides.items():
        if value < 0:
            raise check.fail(f"backend.{key}", f"must be >= 0, got {value!r}")
    return replace(DEFAULT_COEFFICIENTS, **overrides)


def _model(
    check: TomlChecker, table: Mapping[str, Any], where: str, base_dir: Path | None
) -> ModelSpec:
    """``model`` (a preset's Hugging Face id, or a ``config.json`` path relative to the
    scenario's folder) with the table's ``precision`` and ``kv_cache_dtype``."""
    name = check.string(table, "model", where)
    precision = (
        check.choice(table, "precision", where, _PRECISIONS, "bf16")
        if "precision" in table
        else None
    )
    kv_cache_dtype = (
        check.choice(table, "kv_cache_dtype", where, _KV_CACHE_DTYPES, "auto")
        if "kv_cache_dtype" in table
        else None
    )
    source = name  # a preset, or an unknown name load_model finds a did-you-mean for
    if name.lower() not in {preset.lower() for preset in MODELS}:
        path = Path(name).expanduser()
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        if path.exists():
            source = str(path)
        elif path.suffix == ".json":
            raise check.fail(
                f"{where}.model",
                f"no config.json at {path} (a relative path is read from the scenario "
                "file's folder)",
            )
    try:
        return load_model(source, precision=precision, kv_cache_dtype=kv_cache_dtype)
    except (TypeError, ValueError) as error:
        raise check.fail(f"{where}.model", str(error)) from None


def _gpu(
    check: TomlChecker, table: Mapping[str, Any], where: str, gpus: Mapping[str, GpuSpec]
) -> GpuSpec:
    """``gpu``: a ``[gpus.<name>]`` table's GPU, else a preset (``"H100"`` by default)."""
    name = check.string(table, "gpu", where, default="H100")
    if name in gpus:
        return gpus[name]
    by_lower = {own.lower(): spec for own, spec in gpus.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    try:
        return load_gpu(name)
    except ValueError as error:
        rule = str(error)
    if gpus:
        guess = closest(name.lower(), by_lower)
        if guess is not None:  # the file's own GPU, misspelt
            own = next(spelled for spelled in gpus if spelled.lower() == guess)
            rule = f"unknown GPU {name!r} (did you mean {own!r}?)"
        rule += f"; defined in [gpus]: {', '.join(gpus)}"
    raise check.fail(f"{where}.gpu", rule)


def _tp(check: TomlChecker, table: Mapping[str, Any], where: str, model: ModelSpec) -> int:
    tp = check.integer(table, "tp", where, default=1, minimum=1)
    try:
        return check_tensor_parallel(model, tp)
    except ValueError as error:
        raise check.fail(f"{where}.tp", str(error)) from None
