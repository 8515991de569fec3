"""PriorityScheduler: strict priority, lower value first (as vLLM's priority policy)."""

from __future__ import annotations

import operator

from simsim.scheduler import QueuedRequest
from simsim.schedulers.base import HeapScheduler

__all__ = ["PriorityScheduler"]


class PriorityScheduler(HeapScheduler):
    """Strict priority: order by ``(priority, arrival_time_us, request_id)``.

    A LOWER ``priority`` value runs first (``0`` before ``1``; negative values are
    allowed and run before ``0``), the convention of vLLM's ``--scheduling-policy
    priority``. Requests of equal priority are served first come, first served. The
    policy is non-preemptive: a running request keeps its slot when a more urgent one
    arrives (the batching engine preempts only for KV-cache memory, and a request it
    preempts goes back to its place by priority and arrival).
    """

    __slots__ = ()
    integer_keys = True

    def order_key(self, item: QueuedRequest) -> int:
        """``item.priority`` (an int; a bool or non-integer is refused with ``TypeError``)."""
        priority = item.priority
        if type(priority) is int:
            return priority
        if isinstance(priority, bool) or not hasattr(type(priority), "__index__"):
            raise TypeError(f"request {item.request_id}: priority must be an int, got {priority!r}")
        return int(operator.index(priority))
