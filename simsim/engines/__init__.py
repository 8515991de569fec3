"""The servers: each one a sibling built on the shared machinery in :mod:`.base`."""

from simsim.engines.single_slot import SimulationEngine

__all__ = ["SimulationEngine"]
