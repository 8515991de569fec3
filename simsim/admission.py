"""Admission control: turn requests away at their arrival, per class or per tenant.

An :class:`AdmissionControl` stands in front of a server (``admission=`` on
:class:`~simsim.SimulationEngine`, :class:`~simsim.FastSimulationEngine`,
:class:`~simsim.BatchingEngine` or :class:`~simsim.Cluster`). It groups requests by
their ``request_class`` (``key="class"``) or their ``tenant`` (``key="tenant"``) and
gives each group the :class:`Limit` named for it. At a request's arrival, and only
then, the group's limit decides:

1. **Rate.** With ``rate_per_s``, the group has a token bucket that holds at most
   ``burst`` tokens, starts full, and earns ``rate_per_s`` tokens per simulated
   second. An arriving request needs one whole token; with none, it is rejected as
   ``"rate_limited"``.
2. **Queue.** With ``max_queued``, if the group already has ``max_queued`` requests
   *queued* -- accepted and never admitted -- the request is rejected as
   ``"queue_full"``.
3. Otherwise it is accepted: it takes one token (with a rate) and counts as queued
   until its first admission or its cancellation, whichever comes first. A request
   preempted and waiting to be readmitted does not count again.

A rejected request takes no token and no queue place. The rate is checked first, so a
request both limits would refuse is ``"rate_limited"``.

Which limit applies: the limit named for the request's class (or tenant); for a name
not in *limits*, and for a request without one (``None``), the limit named ``"*"``,
given to each such name on its own (every unnamed tenant gets its own bucket and queue
count; all requests without a name share one). Without ``"*"``, names not in *limits*
are not limited, and ``Limit()`` (no rate, no queue limit) exempts a name from
``"*"``.

**Exact time.** The bucket is counted in whole units of ``1 / (d * 10**6)`` token,
where ``n / d`` is the rate in lowest terms, so that one microsecond earns exactly
``n`` units and nothing drifts over a long run. A float rate is read as the decimal
number it prints as (``0.1`` is exactly one token per ten seconds, not the binary
float slightly above it). The bucket is looked at only at arrivals, which fall on
whole microseconds, and it holds what it earned exactly: at 3 tokens per second, a
bucket emptied at 0 holds a whole token from 333,334 us (1,000,002 units), two from
666,667 us and three from exactly 1,000,000 us. A full bucket earns nothing: with
``burst=1`` it is full at 333,333.33 us, so a token taken at 333,334 us leaves it
empty, and the next whole token is there at 666,668 us.

**Order.** Arrivals are checked in the order they are processed (time, then
submission order). Admission happens at the end of a timestamp, after every arrival at
it, so requests arriving together all count as queued when the later ones are checked
(with ``max_queued=1``, of two requests arriving at once on an idle server the second
is rejected). A cancellation frees its queue place at its own place in that order.

A rejected request ends ``CANCELLED`` at its arrival time, with
``request.rejection`` set to the reason; the engine logs its ``REQUEST_ARRIVAL`` and
nothing else, and its completion and token events fire. A cluster checks once, at its
own arrival event, before routing: a rejected request is never routed.

An :class:`AdmissionControl` is only a description: every engine or cluster it is
given to keeps its own buckets and counts, so one object serves any number of runs.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from simsim.clock import check_count
from simsim.request import Request

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ADMISSION_KEYS",
    "ANY_OTHER",
    "QUEUE_FULL",
    "RATE_LIMITED",
    "REJECTION_REASONS",
    "AdmissionControl",
    "AdmissionGate",
    "Limit",
    "append_rejection",
    "check_admission",
]

RATE_LIMITED: Final = "rate_limited"
"""``request.rejection`` of a request whose group's token bucket was empty."""

QUEUE_FULL: Final = "queue_full"
"""``request.rejection`` of a request whose group had ``max_queued`` requests queued."""

REJECTION_REASONS: Final = (RATE_LIMITED, QUEUE_FULL)
"""Every value ``request.rejection`` takes besides ``None``."""

ANY_OTHER: Final = "*"
"""The *limits* key whose limit applies to every other name, and to no name."""

ADMISSION_KEYS: Final = {"class": "request_class", "tenant": "tenant"}
"""``AdmissionControl(key=...)`` values and the request attribute each groups by."""

_MICROSECONDS_PER_SECOND = 1_000_000


@dataclass(frozen=True, slots=True)
class Limit:
    """What one group of requests may do: a queue limit and/or a token-bucket rate.

    ``Limit(max_queued=None, rate_per_s=None, burst=1)``:

    - *max_queued*: a positive int; an arrival is rejected (``"queue_full"``) while the
      group has that many requests accepted and never admitted. ``None``: no limit.
    - *rate_per_s*: a non-negative finite number of requests per simulated second the
      group's bucket earns (``0``: it never refills, so at most *burst* requests are
      ever accepted). ``None``: no rate limit.
    - *burst*: a positive int, the bucket's capacity (it starts full); only with a rate.

    ``Limit()`` limits nothing (use it to exempt a name from the ``"*"`` limit).
    Immutable; bad values raise ``TypeError`` or ``ValueError`` naming the argument.
    """

    max_queued: int | None = None
    rate_per_s: float | None = None
    burst: int = 1
    # The rate as an exact rational, counted with (see the module's docs).
    _rate: Fraction | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        max_queued = self.max_queued
        if max_queued is not None:
            max_queued = check_count(max_queued, "max_queued", minimum=1)
        capacity = check_count(self.burst, "burst", minimum=1)
        shown: float | None = None
        rate: Fraction | None = None
        if self.rate_per_s is not None:
            shown, rate = _exact_rate(self.rate_per_s)
        elif capacity != 1:
            raise ValueError(
                f"burst={capacity} without rate_per_s: burst is the token bucket's "
                "capacity, so it needs a rate (or leave it at 1)"
            )
        object.__setattr__(self, "max_queued", max_queued)
        object.__setattr__(self, "rate_per_s", shown)
        object.__setattr__(self, "burst", capacity)
        object.__setattr__(self, "_rate", rate)

    @property
    def limits_anything(self) -> bool:
        """``False`` for ``Limit()``, which accepts every request."""
        return self.max_queued is not None or self._rate is not None


def _exact_rate(value: object) -> tuple[float, Fraction]:
    """*value* as a rate: the float (or int) to show, and the exact rational to count with."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"rate_per_s must be a number of requests per second, got {value!r}")
    if isinstance(value, numbers.Integral):
        shown: float = operator.index(value)
        exact = Fraction(operator.index(value))
    elif isinstance(value, Fraction):
        shown, exact = float(value), value
    else:
        shown = float(value)
        if not math.isfinite(shown):
            raise ValueError(f"rate_per_s must be finite, got {value!r}")
        # The decimal number the float prints as: what the user wrote.
        exact = Fraction(repr(shown))
    if exact < 0:
        raise ValueError(f"rate_per_s must be >= 0 requests per second, got {value!r}")
    return shown, exact


class AdmissionControl:
    """Queue limits and token-bucket rate limits per request class or tenant.

    ``AdmissionControl(limits, *, key="class")``: *limits* maps a class (or tenant)
    name to its :class:`Limit`; the name ``"*"`` gives the limit of every name not
    listed and of requests without one (each such name gets its own bucket and queue
    count). *key* is ``"class"`` (group by ``request.request_class``) or ``"tenant"``
    (by ``request.tenant``). The module's docs give the exact rules. Immutable; an
    engine or cluster given one keeps its own state, so one object serves many runs.
    """

    __slots__ = ("_key", "_limits")
    _key: str
    _limits: Mapping[str, Limit]

    def __init__(self, limits: Mapping[str, Limit], *, key: str = "class") -> None:
        if not isinstance(limits, Mapping):
            raise TypeError(
                f"limits must be a mapping of class or tenant name to Limit, got {limits!r}"
            )
        if not isinstance(key, str) or key not in ADMISSION_KEYS:
            raise ValueError(
                f"key={key!r}: an admission control groups requests by "
                f"{' or '.join(repr(k) for k in ADMISSION_KEYS)}"
            )
        checked: dict[str, Limit] = {}
        for name, limit in limits.items():
            if type(name) is not str or not name:
                raise TypeError(f"limits: every name must be a non-empty str, got {name!r}")
            if not isinstance(limit, Limit):
                raise TypeError(f"limits[{name!r}] must be a simsim.Limit, got {limit!r}")
            checked[name] = limit
        object.__setattr__(self, "_limits", MappingProxyType(checked))
        object.__setattr__(self, "_key", key)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"AdmissionControl is immutable; cannot set {name}")

    @property
    def limits(self) -> Mapping[str, Limit]:
        """The limits by name (read-only), ``"*"`` included if given."""
        return self._limits

    @property
    def key(self) -> str:
        """``"class"`` or ``"tenant"``: what requests are grouped by."""
        return self._key

    def group_of(self, request: Request) -> str | None:
        """The class or tenant name *request* is grouped under (``None``: it has none)."""
        name: str | None = getattr(request, ADMISSION_KEYS[self._key])
        return name

    def limit_for(self, name: str | None) -> Limit | None:
        """The limit that applies to the class or tenant *name* (``None``: no name), or
        ``None`` when nothing limits it."""
        limit = self._limits.get(name) if name is not None else None
        if limit is None:
            limit = self._limits.get(ANY_OTHER)
        return limit if limit is not None and limit.limits_anything else None

    def gate(self) -> AdmissionGate:
        """A new :class:`AdmissionGate`: this control's state for one engine or cluster."""
        return AdmissionGate(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdmissionControl):
            return NotImplemented
        return (self._key, dict(self._limits)) == (other._key, dict(other._limits))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AdmissionControl({dict(self._limits)!r}, key={self._key!r})"


class _Group:
    """One group's running state: its queued count and its token bucket."""

    __slots__ = ("cap", "gain", "last_us", "level", "max_queued", "queued", "unit")

    def __init__(self, limit: Limit) -> None:
        self.max_queued = limit.max_queued
        self.queued = 0
        rate: Fraction | None = limit._rate
        # Tokens are counted in units of 1 / (denominator * 10**6) token: one
        # microsecond earns exactly `gain` units, one token is `unit` units.
        if rate is None:
            self.unit = self.gain = 0
        else:
            self.unit = rate.denominator * _MICROSECONDS_PER_SECOND
            self.gain = rate.numerator
        self.cap = self.level = self.unit * limit.burst
        self.last_us = 0

    def arrive(self, now: int) -> str | None:
        unit = self.unit
        if unit:
            level = self.level
            if level < self.cap:
                level = min(self.cap, level + self.gain * (now - self.last_us))
                self.level = level
            self.last_us = now
            if level < unit:
                return RATE_LIMITED
        if self.max_queued is not None and self.queued >= self.max_queued:
            return QUEUE_FULL
        self.level -= unit
        self.queued += 1
        return None

    def refill_us(self, now: int) -> int | None:
        """Microseconds from *now* until the bucket holds a whole token (0: it holds one
        now); ``None`` without a rate, or at a rate of 0 with the bucket short of one."""
        unit = self.unit
        if not unit:
            return None
        level = min(self.cap, self.level + self.gain * (now - self.last_us))
        if level >= unit:
            return 0
        if not self.gain:
            return None
        return -((level - unit) // self.gain)  # ceil((unit - level) / gain)


_UNSEEN: Final[_Group] = object.__new__(_Group)  # a marker: never a real group


class AdmissionGate:
    """The running state of one :class:`AdmissionControl` in one engine or cluster.

    Engines call :meth:`arrive` at each arrival and :meth:`left_queue` when an
    accepted request stops counting as queued (its first admission, or its
    cancellation before it); a cluster checks at its arrival and its replicas share
    its gate for the second. Not for users: build an :class:`AdmissionControl`.
    """

    __slots__ = ("_attribute", "_control", "_groups")

    def __init__(self, control: AdmissionControl) -> None:
        self._control = control
        self._attribute = ADMISSION_KEYS[control.key]
        # name -> its group's state, or None when nothing limits that name
        self._groups: dict[str | None, _Group | None] = {}

    def _group(self, request: Request) -> _Group | None:
        name = getattr(request, self._attribute)
        group = self._groups.get(name, _UNSEEN)
        if group is _UNSEEN:
            limit = self._control.limit_for(name)
            group = self._groups[name] = None if limit is None else _Group(limit)
        return group

    def arrive(self, request: Request, now_us: int) -> str | None:
        """Check *request*, arriving at *now_us*: the rejection reason, or ``None`` if it
        is accepted (it then takes a token and counts as queued)."""
        group = self._group(request)
        return None if group is None else group.arrive(now_us)

    def left_queue(self, request: Request) -> None:
        """The accepted *request* no longer counts as queued (admitted or cancelled)."""
        group = self._group(request)
        if group is not None:
            group.queued -= 1

    def refill_us(self, request: Request, now_us: int) -> int | None:
        """How long after *now_us* the token bucket of *request*'s group next holds a
        whole token, in microseconds: ``0`` if it holds one now; ``None`` when the group
        has no rate limit, or a rate of 0 and no token left (it never refills). Reads
        the bucket without changing it; *now_us* must not be before the last arrival."""
        group = self._group(request)
        return None if group is None else group.refill_us(now_us)

    def queued(self, name: str | None) -> int:
        """How many requests of the group *name* count as queued now."""
        group = self._groups.get(name)
        return 0 if not isinstance(group, _Group) else group.queued


def check_admission(admission: object) -> AdmissionControl | None:
    """*admission* if it is an :class:`AdmissionControl` or ``None``; else ``TypeError``."""
    if admission is not None and not isinstance(admission, AdmissionControl):
        raise TypeError(f"admission must be a simsim.AdmissionControl or None, got {admission!r}")
    return admission


def append_rejection(frame: pd.DataFrame, requests: Mapping[int, Request]) -> None:
    """Append the ``rejection`` column (pandas ``string``, ``<NA>`` for a request that
    was not rejected) to a requests frame of *requests*, in the frame's row order."""
    import pandas as pd

    ids: Sequence[int] = frame["request_id"].tolist()
    frame["rejection"] = pd.array([requests[rid].rejection for rid in ids], dtype="string")
