"""EarliestDeadlineFirstScheduler: the queued request whose deadline comes first."""

from __future__ import annotations

from simsim.clock import MAX_TIME_US, check_time_us
from simsim.scheduler import QueuedRequest
from simsim.schedulers.base import HeapScheduler

__all__ = ["NO_DEADLINE_KEY", "EarliestDeadlineFirstScheduler"]

NO_DEADLINE_KEY = MAX_TIME_US + 1
"""The order key of a request without a deadline: after every possible ``deadline_us``."""


class EarliestDeadlineFirstScheduler(HeapScheduler):
    """Earliest deadline first: order by ``(deadline_us, arrival_time_us, request_id)``,
    requests without a deadline (``deadline_us=None``) after all those with one.

    ``deadline_us`` is an absolute simulated time, like every ``_us`` timestamp. A
    deadline already in the past still orders its request (first: it is the earliest);
    nothing is dropped or reordered because a deadline was missed, so the order is the
    same whatever the clock says. Among requests without a deadline the order is first
    come, first served.
    """

    __slots__ = ()
    integer_keys = True

    def order_key(self, item: QueuedRequest) -> int:
        """``item.deadline_us``, or :data:`NO_DEADLINE_KEY` (``2**63``) when it is ``None``."""
        deadline = item.deadline_us
        if deadline is None:
            return NO_DEADLINE_KEY
        if type(deadline) is int and 0 <= deadline <= MAX_TIME_US:
            return deadline
        return check_time_us(deadline, f"request {item.request_id}: deadline_us")
