"""Shared fixtures: a cost model with easy numbers and engines built on it."""

from __future__ import annotations

import pytest

import simsim

#: prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds)
EASY_CONFIG = simsim.SimulatedBackendConfig(
    prefill_base_us=100,
    prefill_per_token_us=2,
    prefill_per_active_sequence_us=0,
    decode_base_us=10,
    decode_per_active_sequence_us=0,
)


@pytest.fixture
def backend() -> simsim.SimulatedBackend:
    return simsim.SimulatedBackend(EASY_CONFIG)


@pytest.fixture
def engine(backend: simsim.SimulatedBackend) -> simsim.SimulationEngine:
    return simsim.SimulationEngine(backend)
