"""A small built-in scenario that shows the single-slot server at work."""

from __future__ import annotations

from simsim.backend import SimulatedBackend, SimulatedBackendConfig
from simsim.engines import SimulationEngine
from simsim.request import Request

__all__ = ["DEMO_CONFIG", "build_demo_engine"]

DEMO_CONFIG = SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=0,
    decode_base_us=8_000,
    decode_per_active_sequence_us=0,
)
"""Costs of the demo: a 2 ms + 50 us/token prefill and an 8 ms decode step."""


def build_demo_engine() -> SimulationEngine:
    """Eight requests arriving every 20 ms, the fifth cancelled at 150 ms (not yet run)."""
    engine = SimulationEngine(SimulatedBackend(DEMO_CONFIG))
    sizes = [(128, 8), (512, 4), (64, 16), (256, 0), (1024, 8), (32, 2), (300, 6), (96, 12)]
    for request_id, (prompt, output) in enumerate(sizes):
        engine.submit(Request(request_id, request_id * 20_000, prompt, output))
    return engine
