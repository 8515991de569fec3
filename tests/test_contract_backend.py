"""Contract section 5: the cost model (``Backend``, ``SimulatedBackendConfig``,
``SimulatedBackend``) and how the single-slot engine calls it."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

import simsim

MAX_US = 2**63 - 1

CONFIG_FIELDS = [
    "prefill_base_us",
    "prefill_per_token_us",
    "prefill_per_active_sequence_us",
    "decode_base_us",
    "decode_per_active_sequence_us",
]


def _config(**overrides: Any) -> simsim.SimulatedBackendConfig:
    values: dict[str, Any] = dict.fromkeys(CONFIG_FIELDS, 0)
    values.update(overrides)
    return simsim.SimulatedBackendConfig(**values)


# --------------------------------------------------------------------------- config


def test_config_keeps_its_fields() -> None:
    cfg = simsim.SimulatedBackendConfig(
        prefill_base_us=1,
        prefill_per_token_us=2,
        prefill_per_active_sequence_us=3,
        decode_base_us=4,
        decode_per_active_sequence_us=5,
    )
    assert [getattr(cfg, f) for f in CONFIG_FIELDS] == [1, 2, 3, 4, 5]


def test_config_accepts_zero_everywhere() -> None:
    cfg = _config()
    assert all(getattr(cfg, f) == 0 for f in CONFIG_FIELDS)


def test_config_accepts_numpy_ints() -> None:
    cfg = _config(prefill_base_us=np.int64(7), decode_base_us=np.int32(3))
    backend = simsim.SimulatedBackend(cfg)
    assert backend.prefill_us(0, 1) == 7
    assert backend.decode_step_us(1) == 3
    assert type(backend.prefill_us(0, 1)) is int
    assert type(backend.decode_step_us(1)) is int


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_config_is_immutable(field: str) -> None:
    cfg = _config()
    with pytest.raises(AttributeError):
        setattr(cfg, field, 5)
    assert getattr(cfg, field) == 0


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_config_rejects_negative(field: str) -> None:
    with pytest.raises(ValueError):
        _config(**{field: -1})


@pytest.mark.parametrize("field", CONFIG_FIELDS)
@pytest.mark.parametrize("bad", [1.0, 0.5, True, False, Decimal(2), "3", None])
def test_config_rejects_non_int(field: str, bad: Any) -> None:
    with pytest.raises(TypeError):
        _config(**{field: bad})


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_config_rejects_values_past_64_bits(field: str) -> None:
    with pytest.raises((OverflowError, ValueError)):
        _config(**{field: MAX_US + 1})


def test_config_accepts_the_64_bit_maximum() -> None:
    assert _config(prefill_base_us=MAX_US).prefill_base_us == MAX_US


def test_config_error_names_the_value_at_fault() -> None:
    with pytest.raises(ValueError) as info:
        _config(decode_base_us=-37)
    message = str(info.value)
    assert "-37" in message or "decode_base_us" in message


# --------------------------------------------------------------------------- formula


def test_prefill_formula_by_hand() -> None:
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=1_000,
            prefill_per_token_us=3,
            prefill_per_active_sequence_us=7,
            decode_base_us=50,
            decode_per_active_sequence_us=4,
        )
    )
    # 1000 + 3 * 10 + 7 * 2 = 1044
    assert backend.prefill_us(10, 2) == 1_044
    # 1000 + 0 + 0 = 1000
    assert backend.prefill_us(0, 0) == 1_000
    # 1000 + 3 * 128 + 7 * 1 = 1391
    assert backend.prefill_us(128, 1) == 1_391
    assert type(backend.prefill_us(10, 2)) is int


def test_decode_formula_by_hand() -> None:
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=1_000,
            prefill_per_token_us=3,
            prefill_per_active_sequence_us=7,
            decode_base_us=50,
            decode_per_active_sequence_us=4,
        )
    )
    assert backend.decode_step_us(0) == 50  # 50 + 4 * 0
    assert backend.decode_step_us(1) == 54  # 50 + 4 * 1
    assert backend.decode_step_us(3) == 62  # 50 + 4 * 3
    assert type(backend.decode_step_us(3)) is int


def test_backend_methods_accept_numpy_arguments_and_return_plain_int() -> None:
    backend = simsim.SimulatedBackend(_config(prefill_per_token_us=5, decode_base_us=9))
    got = backend.prefill_us(np.int64(4), np.int64(1))  # 0 + 5 * 4 + 0 = 20
    assert got == 20
    assert type(got) is int
    step = backend.decode_step_us(np.int16(2))  # 9 + 0
    assert step == 9
    assert type(step) is int


@pytest.mark.parametrize("bad", [-1, -100])
def test_prefill_rejects_negative_arguments(bad: int) -> None:
    backend = simsim.SimulatedBackend(_config(prefill_base_us=1))
    with pytest.raises(ValueError):
        backend.prefill_us(bad, 1)
    with pytest.raises(ValueError):
        backend.prefill_us(1, bad)


def test_decode_rejects_negative_argument() -> None:
    backend = simsim.SimulatedBackend(_config(decode_base_us=1))
    with pytest.raises(ValueError):
        backend.decode_step_us(-1)


@pytest.mark.parametrize("bad", [1.0, True, Decimal(1), "1", None])
def test_backend_methods_reject_non_int_arguments(bad: Any) -> None:
    backend = simsim.SimulatedBackend(_config(prefill_base_us=1, decode_base_us=1))
    with pytest.raises(TypeError):
        backend.prefill_us(bad, 1)
    with pytest.raises(TypeError):
        backend.prefill_us(1, bad)
    with pytest.raises(TypeError):
        backend.decode_step_us(bad)


def test_prefill_result_exactly_at_the_limit_is_fine() -> None:
    # (2**63 - 11) + 5 * 2 + 1 * 1 = 2**63 - 1
    backend = simsim.SimulatedBackend(
        _config(
            prefill_base_us=MAX_US - 11, prefill_per_token_us=5, prefill_per_active_sequence_us=1
        )
    )
    assert backend.prefill_us(2, 1) == MAX_US


def test_prefill_result_past_the_limit_raises_overflow_error() -> None:
    # 2**62 * 2 = 2**63: one past the limit
    backend = simsim.SimulatedBackend(_config(prefill_per_token_us=2**62))
    with pytest.raises(OverflowError):
        backend.prefill_us(2, 1)
    # (2**63 - 1) + 1 * 1 = 2**63
    backend = simsim.SimulatedBackend(
        _config(prefill_base_us=MAX_US, prefill_per_active_sequence_us=1)
    )
    assert backend.prefill_us(0, 0) == MAX_US
    with pytest.raises(OverflowError):
        backend.prefill_us(0, 1)


def test_decode_result_past_the_limit_raises_overflow_error() -> None:
    backend = simsim.SimulatedBackend(
        _config(decode_base_us=MAX_US - 3, decode_per_active_sequence_us=1)
    )
    assert backend.decode_step_us(3) == MAX_US  # 2**63 - 4 + 3
    with pytest.raises(OverflowError):
        backend.decode_step_us(4)  # 2**63 - 4 + 4 = 2**63


def test_simulated_backend_is_deterministic() -> None:
    backend = simsim.SimulatedBackend(_config(prefill_base_us=3, prefill_per_token_us=2))
    assert [backend.prefill_us(5, 1) for _ in range(5)] == [13] * 5


# --------------------------------------------------------------------------- protocol


class _RecordingBackend:
    """A user backend (no inheritance): fixed costs, remembers every call."""

    def __init__(self, prefill: int, decode: int) -> None:
        self.prefill = prefill
        self.decode = decode
        self.calls: list[tuple[str, int, int | None]] = []

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        self.calls.append(("prefill", prompt_token_count, active_batch_size))
        return self.prefill

    def decode_step_us(self, active_sequence_count: int) -> int:
        self.calls.append(("decode", active_sequence_count, None))
        return self.decode


def test_backend_protocol_has_the_two_methods() -> None:
    assert hasattr(simsim.Backend, "prefill_us")
    assert hasattr(simsim.Backend, "decode_step_us")
    assert callable(simsim.SimulatedBackend(_config()).prefill_us)


def test_any_object_with_the_two_methods_is_a_backend() -> None:
    backend = _RecordingBackend(prefill=40, decode=15)
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 10, 6, 2))
    engine.run()
    req = engine.requests[0]
    # admitted at 10; prefill 40 -> 50; decode 15 -> 65, 80
    assert (req.admit_time_us, req.prefill_end_time_us) == (10, 50)
    assert (req.first_token_time_us, req.finish_time_us) == (65, 80)


def test_single_slot_engine_always_passes_an_active_count_of_one() -> None:
    backend = _RecordingBackend(prefill=5, decode=2)
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 0, 7, 2))
    engine.submit(simsim.Request(1, 0, 3, 1))
    engine.submit(simsim.Request(2, 1, 0, 0))
    engine.run()
    prefills = [c for c in backend.calls if c[0] == "prefill"]
    decodes = [c for c in backend.calls if c[0] == "decode"]
    assert prefills == [("prefill", 7, 1), ("prefill", 3, 1), ("prefill", 0, 1)]
    assert decodes  # at least one decode step was costed
    assert all(c[1] == 1 for c in decodes)


def test_engine_with_simulated_backend_uses_the_formula() -> None:
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=1_000,
            prefill_per_token_us=3,
            prefill_per_active_sequence_us=7,
            decode_base_us=50,
            decode_per_active_sequence_us=4,
        )
    )
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 0, 10, 2))
    engine.run()
    req = engine.requests[0]
    # prefill with active count 1: 1000 + 3 * 10 + 7 * 1 = 1037
    # decode step with active count 1: 50 + 4 * 1 = 54 -> 1091, 1145
    assert req.prefill_end_time_us == 1_037
    assert req.first_token_time_us == 1_091
    assert req.finish_time_us == 1_145


def test_numpy_durations_from_a_user_backend_are_accepted() -> None:
    class NumpyBackend:
        def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
            return np.int64(30)  # type: ignore[return-value]

        def decode_step_us(self, active_sequence_count: int) -> int:
            return np.int32(7)  # type: ignore[return-value]

    engine = simsim.SimulationEngine(NumpyBackend())
    engine.submit(simsim.Request(0, 0, 1, 2))
    engine.run()
    req = engine.requests[0]
    # prefill 0 -> 30, decode 37, 44
    assert (req.prefill_end_time_us, req.first_token_time_us, req.finish_time_us) == (30, 37, 44)
    for value in (req.prefill_end_time_us, req.first_token_time_us, req.finish_time_us):
        assert type(value) is int
    assert engine.now_us == 44
    assert type(engine.now_us) is int
    assert all(type(r.timestamp_us) is int for r in engine.event_log)


def test_config_is_a_frozen_value() -> None:
    cfg = _config(decode_base_us=4)
    assert cfg == _config(decode_base_us=4)
    if dataclasses.is_dataclass(cfg):
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.decode_base_us = 5  # type: ignore[misc]
    assert cfg.decode_base_us == 4
