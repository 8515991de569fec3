"""GPUs: datasheet figures a cost model prices work with, and what a GPU-hour costs.

:class:`GpuSpec` holds one GPU's dense compute rates, HBM bandwidth and capacity, the
bandwidth its tensor-parallel all-reduce gets, its power and a public price per hour.
:data:`GPUS` names the presets (figures from the vendors' datasheets; the table in
``docs/gpu.md`` gives each source); :func:`load_gpu` finds one by name or alias, and
:meth:`GpuSpec.from_mapping` reads a user's own GPU from a scenario table.

Conventions, so every preset reads the same way:

* FLOP/s are dense (the datasheets' "with sparsity" figures are halved).
* Memory is the datasheet's GB read as GiB (``memory_gib``), as the vLLM reference's
  ``gpus.json`` does for the H100 (80 GiB); what a process can use is less, and
  ``gpu_mem_util`` (see :mod:`simsim.gpu.memory`) is applied to this figure.
* ``interconnect_bandwidth`` is per GPU and per direction: datasheets state NVLink and
  Infinity Fabric as bidirectional totals, so their figure is halved. A GPU without a
  GPU-to-GPU link (L40S, L4, and the H100 PCIe, whose NVLink bridge joins only pairs)
  all-reduces over PCIe: its x16 bidirectional figure, halved.
* ``price_per_hour`` is a public on-demand list price in USD per GPU-hour, a snapshot
  (sources in the comments below and in ``docs/gpu.md``); prices move, so override it
  (``dataclasses.replace(gpu, price_per_hour=...)`` or a scenario's GPU table).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from simsim.checks import check_real, closest

__all__ = ["GPUS", "GpuSpec", "load_gpu"]

_TERA = 1e12
_GIB = 2**30
_INTERCONNECTS = ("nvlink", "pcie", "infinity-fabric")
_PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU (see the module docstring for the conventions).

    ``bf16_flops`` and ``fp8_flops`` are dense FLOP/s (``fp8_flops`` is ``None`` where
    the GPU has no FP8 tensor cores); ``hbm_bandwidth`` and ``interconnect_bandwidth``
    are bytes/s (the latter per GPU, one direction, used by the tensor-parallel
    all-reduce); ``memory_bytes`` is the capacity; ``interconnect`` is ``"nvlink"``,
    ``"pcie"`` or ``"infinity-fabric"``; ``price_per_hour`` is USD per GPU-hour;
    ``tdp_watts`` the board power.
    """

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bandwidth: float
    memory_bytes: int
    interconnect_bandwidth: float
    interconnect: str
    price_per_hour: float
    tdp_watts: float

    def flops(self, precision: str) -> float:
        """Dense FLOP/s at *precision* (``"bf16"``, ``"fp16"``, ``"fp8"``). FP8 on a GPU
        without FP8 units (A100) runs at the BF16 rate: the weights are upcast and the
        matmuls run in 16 bits, as vLLM's weight-only FP8 (Marlin) kernels do there."""
        if precision not in _PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(_PRECISIONS)}, got {precision!r}"
            )
        if precision == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops

    @classmethod
    def from_mapping(cls, name: str, mapping: Mapping[str, object]) -> GpuSpec:
        """A user's GPU from a table with the keys of the reference ``gpus.json``:
        ``bf16_tflops``, ``hbm_tb_s``, ``memory_gib``, ``interconnect_gb_s`` (per GPU,
        one direction) required; ``fp8_tflops`` (absent: no FP8 units), ``interconnect``
        (default ``"nvlink"``), ``price_per_hour`` and ``tdp_watts`` (default 0: unknown)
        optional. Every value is checked (a finite number, > 0 where a rate); an
        unknown or missing key raises ``ValueError`` naming it."""
        allowed = {
            "bf16_tflops",
            "fp8_tflops",
            "hbm_tb_s",
            "memory_gib",
            "interconnect_gb_s",
            "interconnect",
            "price_per_hour",
            "tdp_watts",
        }
        for key in mapping:
            if key not in allowed:
                guess = closest(key, allowed)
                hint = f" (did you mean {guess!r}?)" if guess else ""
                raise ValueError(
                    f"GPU {name!r}: unknown key {key!r}{hint}; known: {', '.join(sorted(allowed))}"
                )
        for key in ("bf16_tflops", "hbm_tb_s", "memory_gib", "interconnect_gb_s"):
            if key not in mapping:
                raise ValueError(f"GPU {name!r}: missing {key!r}")

        def rate(key: str) -> float:
            return check_real(mapping[key], f"GPU {name!r} {key}", positive=True)

        fp8 = mapping.get("fp8_tflops")
        interconnect = mapping.get("interconnect", "nvlink")
        if interconnect not in _INTERCONNECTS:
            raise ValueError(
                f"GPU {name!r} interconnect must be one of {', '.join(_INTERCONNECTS)}, "
                f"got {interconnect!r}"
            )
        return cls(
            name=name,
            bf16_flops=rate("bf16_tflops") * _TERA,
            fp8_flops=None if fp8 is None else rate("fp8_tflops") * _TERA,
            hbm_bandwidth=rate("hbm_tb_s") * _TERA,
            memory_bytes=math.floor(rate("memory_gib") * _GIB),
            interconnect_bandwidth=rate("interconnect_gb_s") * 1e9,
            interconnect=str(interconnect),
            price_per_hour=check_real(
                mapping.get("price_per_hour", 0.0), f"GPU {name!r} price_per_hour"
            ),
            tdp_watts=check_real(mapping.get("tdp_watts", 0.0), f"GPU {name!r} tdp_watts"),
        )


def _gpu(
    name: str,
    bf16_tflops: float,
    fp8_tflops: float | None,
    hbm_tb_s: float,
    memory_gib: float,
    link_bidirectional_gb_s: float,
    interconnect: str,
    price_per_hour: float,
    tdp_watts: float,
) -> GpuSpec:
    return GpuSpec(
        name=name,
        bf16_flops=bf16_tflops * _TERA,
        fp8_flops=None if fp8_tflops is None else fp8_tflops * _TERA,
        hbm_bandwidth=hbm_tb_s * _TERA,
        memory_bytes=int(memory_gib * _GIB),
        interconnect_bandwidth=link_bidirectional_gb_s / 2 * 1e9,
        interconnect=interconnect,
        price_per_hour=price_per_hour,
        tdp_watts=tdp_watts,
    )


# Datasheets: NVIDIA H100, H200, HGX B200, A100, L40S and L4 datasheets; AMD Instinct
# MI300X datasheet. The H100-SXM, A100-SXM-80GB and L40S rows are the vLLM reference's
# gpus.json figures exactly. Prices (USD per GPU-hour, on-demand list prices, 2026):
# Modal's pricing page for H100, H200, B200, A100 80GB/40GB, L40S and L4; Lambda's for
# the H100 PCIe; Vultr's for the MI300X, as third-party listings quoted them (the H200,
# B200 and A100 40GB prices are unconfirmed). Override them for your own contract.
_PRESETS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        # name, BF16 TF, FP8 TF, HBM TB/s, GiB, link GB/s (both ways), link, $/h, W
        _gpu("H100-SXM", 989.5, 1979.0, 3.35, 80, 900, "nvlink", 3.95, 700),
        _gpu("H100-PCIe", 756.5, 1513.0, 2.0, 80, 128, "pcie", 2.86, 350),
        _gpu("H200", 989.5, 1979.0, 4.8, 141, 900, "nvlink", 4.54, 700),
        _gpu("B200", 2250.0, 4500.0, 8.0, 180, 1800, "nvlink", 6.25, 1000),
        _gpu("A100-SXM-80GB", 312.0, None, 2.039, 80, 600, "nvlink", 2.50, 400),
        _gpu("A100-SXM-40GB", 312.0, None, 1.555, 40, 600, "nvlink", 2.10, 400),
        _gpu("L40S", 362.05, 733.0, 0.864, 48, 64, "pcie", 1.95, 350),
        _gpu("L4", 121.0, 242.5, 0.3, 24, 64, "pcie", 0.80, 72),
        _gpu("MI300X", 1307.4, 2614.9, 5.3, 192, 896, "infinity-fabric", 1.85, 750),
    )
}

_ALIASES = {
    "h100": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h200-sxm": "H200",
    "a100": "A100-SXM-80GB",
    "a100-80gb": "A100-SXM-80GB",
    "a100-40gb": "A100-SXM-40GB",
}

GPUS: tuple[str, ...] = tuple(_PRESETS)
"""The GPU presets' names; ``load_gpu`` also takes ``H100``, ``A100``, ``A100-80GB``,
``A100-40GB`` (and any case)."""


def load_gpu(name_or_spec: str | GpuSpec) -> GpuSpec:
    """A preset by name or alias, case-insensitive (``"H100"`` is the H100-SXM, ``"A100"``
    the 80 GB SXM), or a :class:`GpuSpec` as given. An unknown name raises ``ValueError``
    with a did-you-mean."""
    if isinstance(name_or_spec, GpuSpec):
        return name_or_spec
    if not isinstance(name_or_spec, str):
        raise TypeError(
            f"a GPU must be a name or a GpuSpec, got {type(name_or_spec).__name__} {name_or_spec!r}"
        )
    names = {name.lower(): name for name in _PRESETS} | _ALIASES
    key = name_or_spec.lower()
    if key in names:
        return _PRESETS[names[key]]
    guess = closest(key, names)
    hint = f" (did you mean {names[guess]!r}?)" if guess else ""
    raise ValueError(
        f"unknown GPU {name_or_spec!r}{hint}; known GPUs: {', '.join(GPUS)} "
        "(or define one in a scenario's GPU table)"
    )
