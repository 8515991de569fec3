"""The engine's own event: one request's next piece of work, in SimPy's heap."""

from __future__ import annotations

from heapq import heappush
from typing import TYPE_CHECKING, Any

from simpy.events import NORMAL

from simsim.clock import MAX_TIME_US, Environment, time_overflow
from simsim.records import EventType

if TYPE_CHECKING:
    from simsim.request import Request

__all__ = ["LifecycleEvent"]


class LifecycleEvent:
    """An engine's own event in SimPy's heap, bound to one request and one event type.

    It is created already triggered and already numbered: *sequence* is its heap
    sequence number, which also becomes the sequence of its log record; whoever creates
    it pushes it into the heap (an arrival through
    :class:`~simsim.engines.arrivals.PendingArrivals`). It has just what SimPy's event
    loop reads (``callbacks``, ``_ok``, ``_value``) and no ``__dict__``: a lean object
    keeps Python's garbage collector cheap. Its *callbacks* is a tuple the engine shares
    between all its events of a kind. Only engines see these events; user code never
    yields them.
    """

    __slots__ = ("_ok", "_value", "callbacks", "env", "event_type", "request", "sequence")

    def __init__(
        self,
        env: Environment,
        callbacks: tuple[Any, ...],
        request: Request,
        event_type: EventType,
        sequence: int,
    ) -> None:
        self.env = env
        self.callbacks: tuple[Any, ...] | None = callbacks
        self._ok = True
        self._value = None
        self.request = request
        self.event_type = event_type
        self.sequence = sequence

    def requeue(self, callbacks: tuple[Any, ...], event_type: EventType, at_us: int) -> int:
        """Schedule this processed event again as the request's next one.

        Reusing the object keeps a request's chain of steps to one allocation. Returns
        the sequence number it had, which is the one its log record carries.
        """
        if at_us > MAX_TIME_US:
            raise time_overflow(at_us, f"request {self.request.request_id}")
        env = self.env
        processed = self.sequence
        self.sequence = sequence = next(env._eid)
        heappush(env._queue, (at_us, NORMAL, sequence, self))  # type: ignore[misc]
        self.callbacks = callbacks
        self.event_type = event_type
        return processed

    def requeue_numbered(
        self, callbacks: tuple[Any, ...], event_type: EventType, at_us: int, sequence: int
    ) -> int:
        """:meth:`requeue` under a *sequence* set aside earlier
        (:meth:`~simsim.clock.Environment.reserve_sequences`)."""
        if at_us > MAX_TIME_US:
            raise time_overflow(at_us, f"request {self.request.request_id}")
        processed = self.sequence
        self.sequence = sequence
        heappush(self.env._queue, (at_us, NORMAL, sequence, self))  # type: ignore[misc]
        self.callbacks = callbacks
        self.event_type = event_type
        return processed

    def __repr__(self) -> str:
        return f"<{self.event_type.name}(request {self.request.request_id}) #{self.sequence}>"
