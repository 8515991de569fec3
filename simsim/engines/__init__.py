"""The servers: each one a sibling built on the shared machinery in :mod:`.base`."""

from simsim.engines.batching import BatchingEngine, KvCacheConfig
from simsim.engines.fast_single_slot import FastSimulationEngine
from simsim.engines.single_slot import SimulationEngine

__all__ = [
    "BatchingEngine",
    "FastSimulationEngine",
    "KvCacheConfig",
    "SimulationEngine",
]
