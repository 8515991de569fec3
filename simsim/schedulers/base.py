"""HeapScheduler: the base of the built-in ordered schedulers, and of your own.

A heap-ordered scheduler admits the queued request with the least *order key*, a
value computed once per enqueue from the :class:`~simsim.QueuedRequest` alone (never
from the clock), with ties broken by ``(arrival_time_us, request_id)``. The queue,
the epoch, the statistics and the rules for stale decisions are
:class:`~simsim.FcfsScheduler`'s own code (both extend one private base): every
``enqueue``, ``remove`` and successful ``commit`` bumps the epoch; a decision from
another epoch, or naming a request that is not the head, raises
:class:`~simsim.errors.StaleDecisionError` and changes nothing but the
``rejected_commits`` counter.

Removal is lazy, as in FCFS: a removed request's heap entry stays until it reaches the
top, so ``enqueue``, ``remove`` and ``commit`` cost O(log n) (amortized) and ``decide``
O(1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from simsim.scheduler import QueuedRequest, _HeapQueue

__all__ = ["HeapScheduler"]


class HeapScheduler(_HeapQueue, ABC):
    """A scheduler that admits requests in increasing ``(order_key(item),
    arrival_time_us, request_id)`` order.

    Subclasses implement :meth:`order_key`; everything else (the seven operations an
    engine uses, ``queued_ids()``, ``repr``) is shared with FCFS. The key is computed
    once, when the request is enqueued, so it must depend on the record only: a
    preempted request re-enqueued with the same record goes back to the same place.
    """

    __slots__ = ("_integer_keys",)

    integer_keys: ClassVar[bool] = False
    """Set ``True`` on a subclass whose :meth:`order_key` always returns an ``int``: the
    key and the arrival time are then packed into one int per heap entry, which halves
    the cost of a heap comparison. A key of another type is then refused with
    ``TypeError``."""

    def __init__(self) -> None:
        super().__init__()
        self._integer_keys = type(self).integer_keys

    @abstractmethod
    def order_key(self, item: QueuedRequest) -> Any:
        """The value *item* is ordered by (smaller runs first); ties fall to
        ``(arrival_time_us, request_id)``.

        Called once per enqueue, before anything changes: raise ``TypeError`` or
        ``ValueError`` (naming the request) to refuse the record. The keys of all
        requests must be comparable with each other (numbers, or tuples of numbers).
        """

    def _describe(self) -> str:
        """The constructor options ``repr`` shows (empty when there are none)."""
        return ""

    def __repr__(self) -> str:
        options = self._describe()
        options = f"{options}, " if options else ""
        return f"{type(self).__name__}({options}queued={len(self._live)}, epoch={self._epoch})"

    def enqueue(self, item: QueuedRequest) -> None:
        """Queue *item*; its id must not be queued already, its order key must be valid."""
        if not isinstance(item, QueuedRequest):
            raise TypeError(f"enqueue takes a QueuedRequest, got {type(item).__name__}")
        key = self.order_key(item)
        if not self._integer_keys:
            self._push((key, item.arrival_time_us), item)
        elif type(key) is int:
            # key * 2**64 + arrival (arrival < 2**63): the order of (key, arrival) as one int
            self._push(key << 64 | item.arrival_time_us, item)
        else:
            raise TypeError(
                f"{type(self).__name__}.order_key returned {type(key).__name__} {key!r} for "
                f"request {item.request_id}; this scheduler's keys must be ints"
            )
