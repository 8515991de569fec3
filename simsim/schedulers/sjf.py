"""Shortest prompt first and shortest job first, each with optional linear aging.

Both order requests by a *job size* (a prompt length, or a predicted amount of work).
Without aging (``aging_per_s=0``) the order is ``(size, arrival_time_us, request_id)``:
a steady stream of small requests can then hold a large one back for ever. With
aging, a request's score falls by ``aging_per_s`` units of size per second it has
waited: ``size - aging_per_s * (now_us - arrival_time_us) / 1e6``, the smallest score
running first. The ``now_us`` term is the same for every queued request, so that order
equals the order of the time-invariant key

    virtual arrival = arrival_time_us + size * (1_000_000 / aging_per_s)   (float, us)

(the score divided by ``aging_per_s / 1e6``, plus a common constant): aging turns the
policy into first come, first served on virtual arrival times, and the queue stays a
heap with O(log n) operations. Ties fall to ``(arrival_time_us, request_id)``.

No starvation: a request R of size s arriving at a has virtual arrival
``v = a + s * 1e6 / aging_per_s``. Every size is >= 0, so a request arriving at or
after ``v`` has a virtual arrival >= ``v`` and, arriving later than R, goes after R. R is
therefore admitted before any request that arrives at or after ``v``: its queue delay is
at most ``s / aging_per_s`` seconds plus the time to serve the requests that arrived
before ``v`` (see docs/schedulers.md).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

from simsim.checks import check_real
from simsim.scheduler import QueuedRequest
from simsim.schedulers.base import HeapScheduler

__all__ = ["ShortestJobFirstScheduler", "ShortestPromptFirstScheduler", "SizeOrderedScheduler"]


class SizeOrderedScheduler(HeapScheduler):
    """Smallest job size first, with optional linear aging (see the module docstring).

    Subclasses implement :meth:`job_size`. *aging_per_s* is how many units of size a
    request is forgiven per second of waiting (a finite number >= 0; ``0`` turns aging
    off).
    """

    __slots__ = ("_aging_per_s", "_us_per_size")

    def __init__(self, aging_per_s: float = 0.0) -> None:
        aging = check_real(aging_per_s, f"{type(self).__name__}: aging_per_s", keep_int=True)
        super().__init__()
        self._aging_per_s = aging
        # Microseconds of virtual delay per unit of size (None: no aging).
        self._us_per_size = 1_000_000 / aging if aging else None
        # Without aging, integer sizes are packed keys (see HeapScheduler.integer_keys).
        self._integer_keys = not aging and self._integer_sizes()

    @property
    def aging_per_s(self) -> int | float:
        """Units of job size forgiven per second of waiting (``0``: no aging)."""
        return self._aging_per_s

    def _integer_sizes(self) -> bool:
        """Whether :meth:`job_size` always returns an ``int`` (called by ``__init__``)."""
        return False

    @abstractmethod
    def job_size(self, item: QueuedRequest) -> int | float:
        """The size *item* is ordered by: a finite number >= 0 (checked by the caller)."""

    def order_key(self, item: QueuedRequest) -> int | float:
        """The job size without aging; with aging, the virtual arrival
        ``arrival_time_us + size * (1_000_000 / aging_per_s)``."""
        size = self.job_size(item)
        if not (type(size) is int and size >= 0):
            size = check_real(size, f"request {item.request_id}: job size", keep_int=True)
        us_per_size = self._us_per_size
        if us_per_size is None:
            return size
        return item.arrival_time_us + size * us_per_size

    def _describe(self) -> str:
        return f"aging_per_s={self._aging_per_s!r}"


class ShortestPromptFirstScheduler(SizeOrderedScheduler):
    """Shortest prompt first: the job size is ``prompt_token_count``.

    Order ``(prompt_token_count, arrival_time_us, request_id)`` without aging; with
    ``aging_per_s > 0`` (prompt tokens forgiven per second of waiting), order
    ``(arrival_time_us + prompt_token_count * 1e6 / aging_per_s, arrival_time_us,
    request_id)``. A preempted request is ordered by its original prompt, so it goes
    back to its place.
    """

    __slots__ = ()

    def _integer_sizes(self) -> bool:
        return True

    def job_size(self, item: QueuedRequest) -> int:
        """``item.prompt_token_count``."""
        return item.prompt_token_count


class ShortestJobFirstScheduler(SizeOrderedScheduler):
    """Shortest (expected) job first.

    The job size is ``predict(item)`` when *predict* is given, else
    ``item.max_output_tokens`` (the output limit: an upper bound on the decode work),
    plus ``prompt_weight * item.prompt_token_count``. *predict* must be a pure function
    of the record returning a finite number >= 0 (it is called once per enqueue, and
    again when a preempted request is re-enqueued: the same answer keeps its place).
    Order as :class:`SizeOrderedScheduler` describes, with *aging_per_s* in units of
    that size per second.
    """

    __slots__ = ("_predict", "_prompt_weight")

    def __init__(
        self,
        aging_per_s: float = 0.0,
        prompt_weight: float = 0.0,
        predict: Callable[[QueuedRequest], float] | None = None,
    ) -> None:
        name = type(self).__name__
        weight = check_real(prompt_weight, f"{name}: prompt_weight", keep_int=True)
        if predict is not None and not callable(predict):
            raise TypeError(
                f"{name}: predict must be a function of a QueuedRequest returning its "
                f"job size, got {type(predict).__name__} {predict!r}"
            )
        self._prompt_weight = weight
        self._predict = predict
        super().__init__(aging_per_s)

    @property
    def prompt_weight(self) -> int | float:
        """The weight of a prompt token in the job size."""
        return self._prompt_weight

    @property
    def predict(self) -> Callable[[QueuedRequest], float] | None:
        """The job-size predictor, or ``None`` (the output limit is the size)."""
        return self._predict

    def _integer_sizes(self) -> bool:
        weight = self._prompt_weight
        return self._predict is None and (not weight or type(weight) is int)

    def job_size(self, item: QueuedRequest) -> int | float:
        """``predict(item)`` (or ``max_output_tokens``) ``+ prompt_weight * prompt_token_count``."""
        predict = self._predict
        if predict is None:
            size: int | float = item.max_output_tokens
        else:
            size = check_real(
                predict(item),
                f"request {item.request_id}: predict(...) (its job size)",
                keep_int=True,
            )
        if self._prompt_weight:
            size += self._prompt_weight * item.prompt_token_count
        return size

    def _describe(self) -> str:
        text = f"{super()._describe()}, prompt_weight={self._prompt_weight!r}"
        if self._predict is not None:
            text += f", predict={self._predict!r}"
        return text
