"""The integer-microsecond clock: a drop-in ``simpy.Environment`` with strict time rules.

This module knows nothing of requests or servers. It guarantees three things to every
model that runs on it, simsim's engines and foreign SimPy processes alike:

* time is a plain ``int`` number of microseconds, from ``0`` (or ``initial_time``) up to
  ``2**63 - 1``; a float, ``bool``, ``Decimal`` or string delay is a ``TypeError``, a
  negative one a ``ValueError``, a time past the 64-bit range an ``OverflowError``;
* events run in SimPy's own heap order ``(time, priority, sequence)``, where the sequence
  is handed out when an event is scheduled, so equal times keep their scheduling order;
* a priority below both of SimPy's (:data:`BOUNDARY`) lets an engine act once every
  ordinary event of a timestamp has been processed, including events scheduled during it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from heapq import heappop, heappush
from itertools import count
from types import MethodType
from typing import Any

import simpy
from simpy.core import BoundClass, EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, Event, EventPriority

from simsim.checks import INT64_MAX, check_int, overflow

__all__ = [
    "BOUNDARY",
    "MAX_TIME_US",
    "NORMAL",
    "URGENT",
    "Environment",
    "ScheduledEvent",
    "check_count",
    "check_time_us",
    "ms_to_us",
    "seconds_to_us",
    "time_overflow",
]

MAX_TIME_US = INT64_MAX
"""The largest timestamp or duration simsim represents (signed 64-bit)."""

# Events processed per call of Environment._drain_some (see there).
_DRAIN_CHUNK = 64

BOUNDARY = EventPriority(2)
"""Heap priority of a timestamp-boundary event: it runs after every URGENT and NORMAL
event at the same time, including ones scheduled while that time is being processed."""


def check_time_us(value: object, name: str) -> int:
    """Return *value* as a plain ``int`` number of microseconds, or raise.

    ``bool``, ``float``, ``Decimal`` and strings raise ``TypeError``; NumPy integer
    scalars are accepted and converted. Negative values raise ``ValueError``, values
    past ``2**63 - 1`` raise ``OverflowError``. *name* is used in the message.
    """
    if type(value) is int:
        result = value
    else:
        if isinstance(value, bool):
            raise TypeError(f"{name} must be an int number of microseconds, got bool {value!r}")
        try:
            result = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            hint = ""
            if isinstance(value, float | Decimal | Fraction):
                hint = (
                    f"; convert seconds with simsim.seconds_to_us({value!r}) or "
                    f"milliseconds with simsim.ms_to_us({value!r})"
                )
            raise TypeError(
                f"{name} must be an int number of microseconds, "
                f"got {type(value).__name__} {value!r}{hint}"
            ) from None
        result = int(result)
    if result < 0:
        raise ValueError(f"{name} must be >= 0 microseconds, got {result}")
    if result > MAX_TIME_US:
        raise overflow(name, result)
    return result


def time_overflow(at_us: int, what: str) -> OverflowError:
    """The error for an event that would happen past ``2**63 - 1``; the caller raises it.

    Every path that computes a time checks ``at_us > MAX_TIME_US`` itself (a comparison
    is all a hot path can afford) and builds its message here, so that every overflow
    reads the same: *what* names the work, for example ``"request 7"``.
    """
    return OverflowError(f"{what}: an event at {at_us} us would be past the 64-bit limit 2**63 - 1")


check_count = check_int
"""Return *value* as a plain ``int`` that is at least *minimum*, or raise: the count check
of :mod:`simsim.checks` (token counts, ids and sizes), by its older name."""


def _scaled_to_us(value: object, scale: int, unit: str) -> int:
    given = value
    if isinstance(value, bool):
        raise TypeError(f"{unit} must be a real number, got bool {value!r}")
    if not isinstance(value, int | float | Decimal | Fraction):
        try:
            value = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{unit} must be a real number, got {type(value).__name__}") from None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{unit} must be finite, got {value!r}")
        # The shortest decimal that round-trips is the value the user wrote.
        value = Decimal(repr(value))
    exact = Decimal(value) if not isinstance(value, Fraction) else value
    scaled = exact * scale
    # Range first: rounding a huge Decimal would exceed its context's precision.
    if scaled > MAX_TIME_US + 1:
        raise OverflowError(
            f"{unit} = {given!r} is past the 64-bit limit of 2**63 - 1 microseconds "
            f"(about {MAX_TIME_US / scale:.4g} {unit})"
        )
    if scaled < -1:
        raise ValueError(f"{unit} must be >= 0, got {given!r}")
    if isinstance(scaled, Fraction):
        rounded = round(scaled)
    else:
        rounded = int(scaled.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    return check_time_us(rounded, f"{unit} in microseconds")


def seconds_to_us(seconds: float | int | Decimal | Fraction) -> int:
    """Convert seconds to whole microseconds: ``seconds_to_us(1.5) == 1_500_000``.

    The one rounding rule simsim uses everywhere: the decimal value as written (a float
    is read through its shortest ``repr``) is rounded to the nearest microsecond, ties
    to even. The result must be a valid time (non-negative, at most ``2**63 - 1``).
    """
    return _scaled_to_us(seconds, 1_000_000, "seconds")


def ms_to_us(milliseconds: float | int | Decimal | Fraction) -> int:
    """Convert milliseconds to whole microseconds with :func:`seconds_to_us`'s rule."""
    return _scaled_to_us(milliseconds, 1_000, "milliseconds")


class Environment(simpy.Environment):
    """A ``simpy.Environment`` whose clock is an integer number of microseconds.

    Use it wherever a ``simpy.Environment`` goes. ``timeout``, ``run(until=...)``,
    ``event().succeed()`` and every other path into the heap check their times: a delay
    must be a non-negative ``int`` (NumPy integers are converted), and no event may be
    scheduled past ``2**63 - 1``. To wait 1.5 seconds write ``env.timeout(1_500_000)``.

    Events at equal times run in ``(time, priority, sequence)`` order, exactly as in
    SimPy: ``URGENT`` before ``NORMAL``, then in the order they were scheduled.
    """

    def __init__(self, initial_time: int = 0) -> None:
        start = check_time_us(initial_time, "initial_time")
        super().__init__(start)
        self._now: int = start
        self._processing = False
        self._stepping = False
        # Heap keys for the run() machinery (negative, so never equal to a sequence).
        self._aside = count(-1, -1)
        # The time at which run(until=...) last stopped, before any event of that time;
        # -1 once another event has been processed since.
        self._stopped_at = -1
        # simpy.Environment binds its event factories only for names in the class's own
        # __dict__, which a subclass does not share; bind them here so that
        # env.timeout(...) costs what it costs on a plain environment.
        for name, attribute in vars(simpy.Environment).items():
            if type(attribute) is BoundClass:
                setattr(self, name, MethodType(attribute.cls, self))

    @property
    def now(self) -> int:
        """The current simulated time in microseconds (always a plain ``int``)."""
        return self._now

    @property
    def processing(self) -> bool:
        """``True`` while an event's callbacks run, ``False`` between events.

        Engines read it to tell a call made from inside the simulation (a process or
        callback at the current time) from one made by the driver between steps.
        """
        return self._processing

    @property
    def stopped_before_now(self) -> bool:
        """``True`` right after ``run(until=...)`` stopped: no event of ``now`` has run yet.

        Engines that compute progress instead of stepping through it read this to tell
        "every event at now is done" (after a step) from "none is" (after a stop).
        """
        return self._stopped_at == self._now

    def schedule(
        self,
        event: Event,
        priority: EventPriority = NORMAL,
        delay: Any = 0,
    ) -> None:
        """Schedule *event* with *priority* after *delay* microseconds.

        Raises ``TypeError`` for a non-int delay, ``ValueError`` for a negative one and
        ``OverflowError`` when ``now + delay`` passes ``2**63 - 1``.
        """
        if type(delay) is not int:
            delay = check_time_us(delay, "delay")
        elif delay < 0:
            raise ValueError(f"delay must be >= 0 microseconds, got {delay}")
        at = self._now + delay
        if at > MAX_TIME_US:
            raise OverflowError(
                f"an event at now={self._now} + delay={delay} would be scheduled at {at}, "
                "past the 64-bit limit 2**63 - 1"
            )
        heappush(self._queue, (at, priority, next(self._eid), event))

    def schedule_at(self, event: Event, at_us: int, priority: EventPriority = NORMAL) -> int:
        """Schedule *event* at the absolute time *at_us* and return its sequence number.

        The trusted fast path for engines: *at_us* must already be an ``int`` no earlier
        than ``now``; only the 64-bit limit is checked here.
        """
        if at_us > MAX_TIME_US:
            raise time_overflow(at_us, "schedule_at")
        sequence = next(self._eid)
        heappush(self._queue, (at_us, priority, sequence, event))
        return sequence

    def processed_event(self, value: Any) -> Event:
        """An event that has already succeeded with *value* and been processed.

        Nothing enters the heap: a process that yields it resumes at once with *value*,
        and callbacks can no longer be added to it (as for any processed event).
        """
        event = Event(self)
        event._ok = True
        event._value = value
        event.callbacks = None  # type: ignore[assignment]
        return event

    def boundary_event(self, callback: Callable[[Event], None]) -> Event:
        """Schedule *callback* at the end of the current timestamp and return its event.

        The event succeeds with ``None`` at ``now`` with :data:`BOUNDARY` priority, so
        *callback* runs after every URGENT and NORMAL event of this timestamp, including
        those scheduled while it is being processed.
        """
        event = Event(self)
        event._ok = True
        event._value = None
        event.callbacks.append(callback)
        heappush(self._queue, (self._now, BOUNDARY, next(self._eid), event))
        return event

    def next_sequence(self) -> int:
        """Take a sequence number now, for an event that enters the heap later.

        The event keeps the place in the ``(time, priority, sequence)`` order that it
        would have had if it had been scheduled now; :meth:`schedule_numbered` puts it in.
        """
        return next(self._eid)

    def schedule_numbered(
        self, event: Any, at_us: int, sequence: int, priority: EventPriority = NORMAL
    ) -> None:
        """Put *event* into the heap at *at_us* under a *sequence* taken earlier.

        For engines that number work when it is submitted but schedule it later (see
        :meth:`next_sequence` and :meth:`reserve_sequences`). *at_us* must be an ``int``
        no earlier than ``now``; only the 64-bit limit is checked.
        """
        if at_us > MAX_TIME_US:
            raise time_overflow(at_us, "schedule_numbered")
        heappush(self._queue, (at_us, priority, sequence, event))

    def next_event_time(self) -> int | None:
        """The time of the earliest pending event, or ``None`` when nothing is pending.

        Unlike SimPy's ``peek()``, never a float: no ``Infinity`` for an empty heap.
        """
        queue = self._queue
        return queue[0][0] if queue else None  # type: ignore[return-value]

    def event_due_now(self) -> bool:
        """``True`` while some event is still pending at the current time."""
        queue = self._queue
        return bool(queue) and queue[0][0] == self._now

    def events_due_now(self) -> list[Any]:
        """Every event still pending at the current time, in no particular order.

        They are the heap's entries at ``now``, which (no entry being earlier) form a
        subtree from its root; finding them costs their number, not the heap's size.
        """
        queue, now = self._queue, self._now
        found = []
        stack = [0]
        while stack:
            index = stack.pop()
            if index < len(queue) and queue[index][0] == now:
                found.append(queue[index][3])
                stack.extend((2 * index + 1, 2 * index + 2))
        return found

    def reserve_sequences(self, count_: int) -> int:
        """Set aside *count_* consecutive sequence numbers and return the first.

        For records written later but ordered as of now: every event scheduled after
        this call gets a higher number than any of the reserved ones.
        """
        first = next(self._eid)
        if count_ > 1:
            self._eid = count(first + count_)
        return first

    def step(self) -> None:
        """Process the next event (SimPy's ``step``, with :attr:`processing` kept)."""
        try:
            self._now, _, _, event = heappop(self._queue)  # type: ignore[assignment]
        except IndexError:
            raise EmptySchedule from None
        self._stepping = True
        try:
            self._process(event)
        finally:
            self._stepping = False

    @property
    def stepping(self) -> bool:
        """``True`` while :meth:`step` processes an event: someone (a user, or an engine's
        ``run_next_timestamp()``) is going through the heap one event at a time and may
        look at the model after each. Engines that would advance through several steps
        of their own work in one event do not while stepping."""
        return self._stepping

    def drain(self) -> None:
        """Process events until the heap is empty: ``step()`` in a loop, without the
        per-call overhead (this is where a long run spends its time)."""
        queue = self._queue
        drain_some = self._drain_some
        while queue:
            drain_some(queue, _DRAIN_CHUNK)

    def _drain_some(self, queue: list[tuple[Any, EventPriority, int, Event]], count: int) -> None:
        # The loop lives in a function called once per *count* events, not once per
        # run: CPython 3.11 specializes a function's bytecode only from its 8th call on,
        # so this loop runs specialized early in the first run of a process too.
        process = self._process
        while queue and count:
            count -= 1
            self._now, _, _, event = heappop(queue)
            callbacks = event.callbacks
            if len(callbacks) == 1 and event._ok:
                # The common case, inlined: one callback on a successful event.
                event.callbacks = None  # type: ignore[assignment]
                self._stopped_at = -1
                self._processing = True
                try:
                    callbacks[0](event)
                finally:
                    self._processing = False
            else:
                process(event)

    def _process(self, event: Event) -> None:
        callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
        self._stopped_at = -1
        self._processing = True
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            # As SimPy does, keep any remaining callbacks for when the run resumes; but
            # an event with none left is simply processed, so no stale entry stays in
            # the heap, and its key comes from the side counter (see run()).
            remaining = callbacks[callbacks.index(callback) + 1 :]
            if remaining:
                event.callbacks = remaining
                heappush(self._queue, (self._now, EventPriority(-1), next(self._aside), event))
            raise
        finally:
            self._processing = False

        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc

    def run(self, until: Any = None) -> Any:
        """Run until *until* (an ``int`` time or an event), or until the heap is empty.

        A float or ``bool`` time raises ``TypeError``; NumPy integers are converted.
        Unlike plain SimPy, the stop event takes its heap key from a separate counter,
        so driving a model with ``run(until=...)`` numbers every other event exactly as
        stepping through it would; and it leaves nothing behind in the heap.
        """
        if until is not None:
            if not isinstance(until, Event):
                at = check_time_us(until, "until")
                if at <= self._now:
                    raise ValueError(
                        f"until ({at}) must be greater than the current time {self._now}"
                    )
                until = Event(self)
                until._ok = True
                until._value = None
                # Before every other event at that time: the run stops as time reaches it.
                heappush(self._queue, (at, URGENT, next(self._aside), until))
            elif until.callbacks is None:
                return until.value
            until.callbacks.append(StopSimulation.callback)
        try:
            self.drain()
            raise EmptySchedule
        except StopSimulation as stop:
            self._stopped_at = self._now
            return stop.args[0]
        except EmptySchedule:
            if until is not None:
                assert not until.triggered
                raise RuntimeError(
                    f'No scheduled events left but "until" event was not triggered: {until}'
                ) from None
        return None


class ScheduledEvent(Event):
    """An event that is triggered (succeeded with ``None``) and scheduled when built.

    ``ScheduledEvent(env, callback, at_us)`` puts itself in *env*'s heap at the absolute
    time *at_us* (an ``int`` no earlier than ``now``; past ``2**63 - 1`` is an
    ``OverflowError``) with NORMAL priority and keeps its heap sequence number as
    :attr:`sequence`. An engine subclasses it for work whose end is known when it starts
    (an iteration, a transfer): one object, one heap entry, no process.
    """

    def __init__(
        self,
        env: Environment,
        callback: Callable[[Event], None],
        at_us: int,
        sequence: int | None = None,
    ) -> None:
        self.env = env
        self.callbacks = [callback]
        self._ok = True
        self._value = None
        if sequence is None:
            self.sequence = env.schedule_at(self, at_us)
        else:  # a number set aside earlier (Environment.reserve_sequences)
            env.schedule_numbered(self, at_us, sequence)
            self.sequence = sequence
