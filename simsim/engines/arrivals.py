"""Submitted arrivals that are not due yet, kept out of SimPy's heap until they are.

An engine numbers every submitted request's ``REQUEST_ARRIVAL`` at ``submit``: its heap
key ``(arrival time, NORMAL, sequence)`` is the one it would have if it were pushed into
SimPy's heap then. Pushing them all would make the heap as deep as the number of
requests submitted ahead of time, and every push and pop of every event in the model
would pay for that depth (and the garbage collector would walk an event and a heap entry
per waiting request). :class:`PendingArrivals` holds them back instead, as plain
numbers, and lets into the heap only what keeps the order exact:

* every held arrival's key is greater than the key of one of this engine's arrivals
  in the heap, so the heap's first entry is the one it would be with every arrival in
  it: events pop in the same ``(time, priority, sequence)`` order, ``env.peek()``,
  ``run(until=...)`` and ``run_next_timestamp()`` see the same times, and foreign
  events interleave exactly as before;
* when the last of this engine's arrivals in the heap is popped, the earliest held one
  gets its :class:`~simsim.engines.events.LifecycleEvent` and goes in, with the key it
  was given at ``submit``.

Until then a held request's ``_pending`` is :data:`HELD`; a cancellation meanwhile
authorizes :data:`HELD` for that request, and the event made at release takes over the
authorization. The usual case, arrivals submitted in time order, costs two array
appends and a list append at ``submit``, and one push into a heap of a few entries at
release; an arrival submitted out of order waits in a small heap of its own.
"""

from __future__ import annotations

from array import array
from heapq import heappop, heappush
from typing import Any, Final

from simsim.clock import Environment
from simsim.engines.events import LifecycleEvent
from simsim.records import EventType
from simsim.request import Request

__all__ = ["HELD", "PendingArrivals"]

_ARRIVAL = EventType.REQUEST_ARRIVAL

# Released slots at the front of the in-order run worth copying the rest to drop.
_COMPACT_AFTER = 4096


class _Held:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<arrival held back until due>"


HELD: Final = _Held()
"""``request._pending`` of a submitted request whose arrival is not in the heap yet."""


class PendingArrivals:
    """One engine's submitted arrivals that SimPy has not popped yet.

    :meth:`add` takes a request at ``submit``; the engine calls :meth:`popped` first
    thing whenever SimPy pops one of its arrival events. *callbacks* is the engine's
    arrival callback tuple and *authorized* its map of request id to the one event a
    cancellation allows it to consume without effect.
    """

    __slots__ = (
        "_authorized",
        "_callbacks",
        "_env",
        "_head",
        "_in_heap",
        "_last_held_us",
        "_late",
        "_latest_in_heap_us",
        "_requests",
        "_sequences",
        "_times",
    )

    def __init__(
        self, env: Environment, callbacks: tuple[Any, ...], authorized: dict[int, Any]
    ) -> None:
        self._env = env
        self._callbacks = callbacks
        self._authorized = authorized
        # How many of these arrivals are in SimPy's heap, and a bound on their times:
        # an arrival at or after it sorts after all of them (its sequence is newer).
        self._in_heap = 0
        self._latest_in_heap_us = -1
        # Held arrivals submitted in time order, from index _head on, sorted by
        # (time, sequence); released slots are set to None.
        self._times: array[int] = array("q")
        self._sequences: array[int] = array("q")
        # (None once released: Any, as the live part never holds None.)
        self._requests: list[Any] = []
        self._head = 0
        self._last_held_us = -1  # the run's last time; -1 while the run is empty
        # Held arrivals submitted before the run's last time: (time, sequence, request).
        self._late: list[tuple[int, int, Request]] = []

    def __len__(self) -> int:
        """Arrivals held back (those already in the heap not counted)."""
        return len(self._times) - self._head + len(self._late)

    def add(self, request: Request) -> None:
        """Number *request*'s arrival now and put it into the heap, or hold it back."""
        env = self._env
        sequence = env.next_sequence()
        at = request.arrival_time_us
        if self._in_heap and at >= self._latest_in_heap_us:
            request._pending = request._event = HELD
            if at >= self._last_held_us:
                self._times.append(at)
                self._sequences.append(sequence)
                self._requests.append(request)
                self._last_held_us = at
            else:
                heappush(self._late, (at, sequence, request))
            return
        event = LifecycleEvent(env, self._callbacks, request, _ARRIVAL, sequence)
        request._pending = request._event = event
        env.schedule_numbered(event, at, sequence)
        self._in_heap += 1
        if at > self._latest_in_heap_us:
            self._latest_in_heap_us = at

    def popped(self) -> None:
        """One of these arrivals left the heap; after the last one, the next goes in."""
        self._in_heap -= 1
        if self._in_heap:
            return
        self._latest_in_heap_us = -1
        head = self._head
        times = self._times
        late = self._late
        if head < len(times):
            at = times[head]
            sequence = self._sequences[head]
            if late and (late[0][0], late[0][1]) < (at, sequence):
                at, sequence, request = heappop(late)
            else:
                requests = self._requests
                request = requests[head]
                requests[head] = None
                head += 1
                if head == len(times):
                    del times[:]
                    del self._sequences[:]
                    requests.clear()
                    head = 0
                    self._last_held_us = -1
                elif head >= _COMPACT_AFTER and 2 * head >= len(times):
                    # Submissions keep running ahead of the arrivals: drop what is used.
                    del times[:head]
                    del self._sequences[:head]
                    del requests[:head]
                    head = 0
                self._head = head
        elif late:
            at, sequence, request = heappop(late)
        else:
            return
        env = self._env
        event = LifecycleEvent(env, self._callbacks, request, _ARRIVAL, sequence)
        if request._pending is HELD:
            request._pending = request._event = event
        else:
            # Cancelled while held: the authorization it got is this event's.
            rid = request.request_id
            if self._authorized.get(rid) is HELD:
                self._authorized[rid] = event
        env.schedule_numbered(event, at, sequence)
        self._in_heap = 1
        self._latest_in_heap_us = at
