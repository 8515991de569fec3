"""GPU presets (issue 26, point 2): datasheet figures, aliases, user GPUs, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simsim.gpu import GPUS, GpuSpec, load_gpu

REFERENCE = json.loads((Path(__file__).parent / "data" / "vllm_reference_gpus.json").read_text())


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_gpus_have_exactly_the_reference_figures(name: str) -> None:
    gpu = load_gpu(name)
    figures = REFERENCE[name]
    assert gpu.bf16_flops == figures["bf16_tflops"] * 1e12
    fp8 = figures["fp8_tflops"]
    assert gpu.fp8_flops == (None if fp8 is None else fp8 * 1e12)
    assert gpu.hbm_bandwidth == figures["hbm_tb_s"] * 1e12
    assert gpu.memory_bytes == figures["memory_gib"] * 2**30
    if figures["nvlink_gb_s"] is None:
        assert gpu.interconnect == "pcie"
    else:
        assert gpu.interconnect == "nvlink"
        assert gpu.interconnect_bandwidth == figures["nvlink_gb_s"] / 2 * 1e9  # one way


def test_the_issue_presets_exist() -> None:
    for name in ("H100-SXM", "H100-PCIe", "H200", "B200", "A100-SXM-80GB", "A100-SXM-40GB"):
        assert name in GPUS
    assert {"L40S", "L4", "MI300X"} <= set(GPUS)
    for name in GPUS:
        gpu = load_gpu(name)
        assert gpu.price_per_hour > 0 and gpu.tdp_watts > 0 and gpu.memory_bytes > 0


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("H100", "H100-SXM"),
        ("h100", "H100-SXM"),
        ("A100", "A100-SXM-80GB"),
        ("A100-80GB", "A100-SXM-80GB"),
        ("a100-40gb", "A100-SXM-40GB"),
        ("L40S", "L40S"),
        ("l40s", "L40S"),
        ("mi300x", "MI300X"),
    ],
)
def test_aliases(alias: str, name: str) -> None:
    assert load_gpu(alias).name == name


def test_a_spec_is_returned_as_given() -> None:
    gpu = load_gpu("H200")
    assert load_gpu(gpu) is gpu


def test_fp8_falls_back_to_bf16_without_fp8_units() -> None:
    a100, h100 = load_gpu("A100"), load_gpu("H100")
    assert a100.flops("fp8") == a100.flops("bf16") == 312e12
    assert h100.flops("fp8") == 2 * h100.flops("bf16") == 1979e12
    assert h100.flops("fp16") == h100.bf16_flops
    with pytest.raises(ValueError, match="precision must be one of bf16, fp16, fp8, got 'int8'"):
        h100.flops("int8")


def test_unknown_gpu_guesses() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 'H1000' \(did you mean 'H100-SXM'\?\)"):
        load_gpu("H1000")
    with pytest.raises(ValueError, match=r"did you mean 'MI300X'"):
        load_gpu("MI300")
    with pytest.raises(TypeError, match="a GPU must be a name or a GpuSpec"):
        load_gpu(3)  # type: ignore[arg-type]


def test_user_defined_gpu_from_a_table() -> None:
    gpu = GpuSpec.from_mapping(
        "my-gpu",
        {
            "bf16_tflops": 100,
            "hbm_tb_s": 1.5,
            "memory_gib": 32,
            "interconnect_gb_s": 50,
            "interconnect": "pcie",
            "price_per_hour": 1.25,
        },
    )
    assert gpu.name == "my-gpu" and gpu.fp8_flops is None
    assert gpu.bf16_flops == 100e12 and gpu.hbm_bandwidth == 1.5e12
    assert gpu.memory_bytes == 32 * 2**30 and gpu.interconnect_bandwidth == 50e9
    assert gpu.flops("fp8") == 100e12 and gpu.price_per_hour == 1.25 and gpu.tdp_watts == 0


@pytest.mark.parametrize(
    ("table", "error", "message"),
    [
        (
            {"bf16_tflops": 1, "hbm_tb_s": 1, "memory_gib": 1},
            ValueError,
            "missing 'interconnect_gb_s'",
        ),
        (
            {"bf16_tflops": 0, "hbm_tb_s": 1, "memory_gib": 1, "interconnect_gb_s": 1},
            ValueError,
            "GPU 'g' bf16_tflops must be a finite number > 0, got 0",
        ),
        (
            {"bf16_tflops": "fast", "hbm_tb_s": 1, "memory_gib": 1, "interconnect_gb_s": 1},
            TypeError,
            "GPU 'g' bf16_tflops must be a number",
        ),
        (
            {"bf16_tflop": 1, "hbm_tb_s": 1, "memory_gib": 1, "interconnect_gb_s": 1},
            ValueError,
            "unknown key 'bf16_tflop' \\(did you mean 'bf16_tflops'\\?\\)",
        ),
        (
            {
                "bf16_tflops": 1,
                "hbm_tb_s": 1,
                "memory_gib": 1,
                "interconnect_gb_s": 1,
                "interconnect": "ethernet",
            },
            ValueError,
            "interconnect must be one of nvlink, pcie, infinity-fabric",
        ),
        (
            {
                "bf16_tflops": 1,
                "hbm_tb_s": 1,
                "memory_gib": 1,
                "interconnect_gb_s": 1,
                "price_per_hour": -2,
            },
            ValueError,
            "GPU 'g' price_per_hour must be a finite number >= 0",
        ),
    ],
)
def test_user_gpu_errors_name_the_key_and_rule(
    table: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        GpuSpec.from_mapping("g", table)
