"""The exceptions simsim raises on top of Python's own.

Bad arguments raise plain ``ValueError``/``TypeError`` and 64-bit overflow raises
``OverflowError``; the classes here describe what went wrong in the simulation itself.
"""

from __future__ import annotations

__all__ = [
    "EngineFailedError",
    "InvalidTransitionError",
    "SimulationError",
    "StaleDecisionError",
    "StaleEventError",
    "UnknownRequestError",
]


class SimulationError(Exception):
    """Base class of every simulation-level error simsim raises."""


class InvalidTransitionError(SimulationError):
    """A request was asked to move between two lifecycle states that are not linked.

    Raised before anything changes: the request keeps its state and timestamps.
    """


class StaleDecisionError(SimulationError):
    """A scheduler was asked to commit a decision that no longer describes its queue."""


class StaleEventError(SimulationError):
    """An engine event came up that the request it names was not waiting for.

    Only the one event a cancellation authorized may be consumed silently; any other
    out-of-date event means the engine's bookkeeping is broken, so the engine fails.
    """


class EngineFailedError(SimulationError):
    """The engine failed earlier and refuses further work or result queries."""


class UnknownRequestError(SimulationError, KeyError):
    """No request with this id was submitted to the engine (or queued in the scheduler)."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a message reads better as it is.
        return str(self.args[0]) if self.args else ""
