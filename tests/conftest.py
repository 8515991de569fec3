"""Shared fixtures: a cost model with easy numbers and engines built on it.

With ``SIMSIM_EXHAUSTIVE=1`` in the environment the suite makes its long runs (see
``tests/helpers.py``): property tests that set no example count of their own draw ten
times Hypothesis's default too.
"""

from __future__ import annotations

import pytest
from helpers import EXHAUSTIVE, examples
from hypothesis import settings

import simsim

if EXHAUSTIVE:
    settings.register_profile("simsim-exhaustive", max_examples=examples(100))
    settings.load_profile("simsim-exhaustive")

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
