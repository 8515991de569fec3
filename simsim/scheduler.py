"""Admission policies: who runs next, decided from request metadata only.

A scheduler holds :class:`QueuedRequest` records (immutable copies of a request's
size and arrival), never the engine's :class:`~simsim.request.Request` objects. An
engine talks to it through seven operations: ``enqueue``, ``remove``, ``decide``,
``commit``, ``len``, ``epoch`` and ``stats``. Deciding and committing are separate so
that a decision can be checked before anything changes: every mutation of the queue
bumps the ``epoch``, and a decision made under another epoch, or naming a request that
is not the head, is refused with :class:`~simsim.errors.StaleDecisionError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Protocol, runtime_checkable

from simsim.clock import check_count, check_time_us
from simsim.errors import StaleDecisionError, UnknownRequestError
from simsim.request import RequestSpec

__all__ = [
    "AdmissionDecision",
    "FcfsScheduler",
    "QueuedRequest",
    "Scheduler",
    "SchedulerStats",
]


QueuedRequest = RequestSpec
"""What a scheduler may know of a request: its id, arrival time and size, its block
hashes and its optional metadata (keyword-only, as on :class:`~simsim.request.Request`:
class, tenant, priority, deadline, tags). Immutable; the same type as
:class:`~simsim.request.RequestSpec`, so an engine hands its scheduler the spec a request
was submitted with, or made once at its first arrival."""


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """A scheduler's proposal: admit *request_id*, valid only while the epoch is *epoch*."""

    request_id: int
    epoch: int

    # Written out, as RequestSpec's: one is made per admission.
    def __init__(self, request_id: int, epoch: int) -> None:
        _set_decision_request_id(self, request_id)
        _set_decision_epoch(self, epoch)


_set_decision_request_id = vars(AdmissionDecision)["request_id"].__set__
_set_decision_epoch = vars(AdmissionDecision)["epoch"].__set__


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of a scheduler's counters."""

    enqueued: int
    admitted: int
    removed: int
    rejected_commits: int
    max_queue_length: int


@runtime_checkable
class Scheduler(Protocol):
    """The interface an engine needs from an admission policy.

    Any object with these members and the same rules is a scheduler: ``decide`` is
    pure; ``commit`` admits only the decision's request when it is the current head
    under the current epoch and raises :class:`StaleDecisionError` otherwise, changing
    nothing but the ``rejected_commits`` counter; every queue mutation changes
    ``epoch``.
    """

    def enqueue(self, item: QueuedRequest) -> None:
        """Add an arrived (or preempted) request to the queue."""
        ...

    def remove(self, request_id: int) -> None:
        """Take a queued request out (it was cancelled)."""
        ...

    def decide(self, now_us: int) -> AdmissionDecision | None:
        """Propose the next admission without changing anything; ``None`` when empty."""
        ...

    def commit(self, decision: AdmissionDecision) -> QueuedRequest:
        """Admit the decision's request and return its record."""
        ...

    def __len__(self) -> int:
        """The number of queued requests."""
        ...

    @property
    def epoch(self) -> int:
        """A number that changes on every mutation of the queue."""
        ...

    @property
    def stats(self) -> SchedulerStats:
        """A snapshot of the scheduler's counters."""
        ...


class _QueueCounters:
    """The epoch, statistics and stale-decision rule every built-in scheduler shares
    (:class:`FcfsScheduler`, :class:`simsim.schedulers.HeapScheduler`,
    :class:`simsim.schedulers.FairShareScheduler`); ``_live`` maps each queued request id
    to its record."""

    __slots__ = (
        "_admitted",
        "_enqueued",
        "_epoch",
        "_live",
        "_max_queue_length",
        "_rejected_commits",
        "_removed",
    )

    def __init__(self) -> None:
        self._live: dict[int, QueuedRequest] = {}
        self._epoch = 0
        self._enqueued = 0
        self._admitted = 0
        self._removed = 0
        self._rejected_commits = 0
        self._max_queue_length = 0

    def __len__(self) -> int:
        return len(self._live)

    @property
    def epoch(self) -> int:
        """Bumped by every ``enqueue``, ``remove`` and successful ``commit``."""
        return self._epoch

    @property
    def stats(self) -> SchedulerStats:
        """Counters since construction (a frozen snapshot)."""
        return SchedulerStats(
            enqueued=self._enqueued,
            admitted=self._admitted,
            removed=self._removed,
            rejected_commits=self._rejected_commits,
            max_queue_length=self._max_queue_length,
        )

    def _refuse(self, decision: AdmissionDecision, head: int | None) -> StaleDecisionError:
        """Count a refused commit of *decision* (another epoch, or not the head *head*)
        and return the error to raise; nothing else changes."""
        self._rejected_commits += 1
        if decision.epoch != self._epoch:
            return StaleDecisionError(
                f"decision for request {decision.request_id} was made at epoch "
                f"{decision.epoch}, the queue is at epoch {self._epoch}"
            )
        return StaleDecisionError(
            f"request {decision.request_id} is not the head of the queue (head: {head})"
        )


class _HeapQueue(_QueueCounters):
    """The queue, epoch, counters and commit rules that :class:`FcfsScheduler` and every
    :class:`simsim.schedulers.HeapScheduler` share; a subclass writes ``enqueue``.

    The heap holds entries ``(order, request_id, enqueue number, record)``: the least
    ``(order, request_id)`` is the head. ``order`` sorts as a tuple ending in the
    request's arrival time (the arrival itself for FCFS, a pair or a packed int for a
    HeapScheduler), so ties fall to ``(arrival_time_us, request_id)``; the enqueue number is unique,
    so comparisons never reach the record. Removal is lazy: a removed request's entry
    stays until it reaches the top, and the heap's top is always live.
    """

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        super().__init__()
        # Entries of removed requests stay in the heap until they reach the top, and are
        # recognised by identity with their id's record in _live.
        self._heap: list[tuple[Any, int, int, QueuedRequest]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(queued={len(self._live)}, epoch={self._epoch})"

    def queued_ids(self) -> list[int]:
        """The queued request ids in admission order (for inspection and tests)."""
        live = self._live
        return [entry[1] for entry in sorted(e for e in self._heap if live.get(e[1]) is e[3])]

    def _push(self, order: Any, item: QueuedRequest) -> None:
        """Queue *item* (already checked to be a record) under *order*."""
        rid = item.request_id
        live = self._live
        if rid in live:
            raise ValueError(f"request {rid} is already queued")
        # The enqueue counter breaks ties with a stale entry of the same id.
        heappush(self._heap, (order, rid, self._enqueued, item))
        live[rid] = item
        self._epoch += 1
        self._enqueued += 1
        if len(live) > self._max_queue_length:
            self._max_queue_length = len(live)

    def remove(self, request_id: int) -> None:
        """Take a queued request out; raises :class:`UnknownRequestError` if it is not queued."""
        rid = check_count(request_id, "request_id")
        if self._live.pop(rid, None) is None:
            raise UnknownRequestError(f"request {rid} is not queued in this scheduler")
        self._drop_dead_head()
        self._epoch += 1
        self._removed += 1

    def decide(self, now_us: int) -> AdmissionDecision | None:
        """The head of the queue under the current epoch, or ``None`` when empty."""
        if type(now_us) is not int or now_us < 0:
            check_time_us(now_us, "now_us")
        heap = self._heap
        if not heap:
            return None
        return AdmissionDecision(heap[0][1], self._epoch)

    def commit(self, decision: AdmissionDecision) -> QueuedRequest:
        """Admit the head named by *decision* and return its record.

        A decision from another epoch, or naming a request that is not the head, raises
        :class:`StaleDecisionError` and leaves the queue and epoch unchanged.
        """
        heap = self._heap
        if not isinstance(decision, AdmissionDecision):
            raise TypeError(f"commit takes an AdmissionDecision, got {type(decision).__name__}")
        if decision.epoch != self._epoch or not heap or heap[0][1] != decision.request_id:
            raise self._refuse(decision, heap[0][1] if heap else None)
        _, rid, _, item = heappop(heap)
        live = self._live
        del live[rid]
        if heap and live.get(heap[0][1]) is not heap[0][3]:
            self._drop_dead_head()
        self._epoch += 1
        self._admitted += 1
        return item

    def _drop_dead_head(self) -> None:
        # Keep the invariant "the heap's top is live" so decide() stays a pure read.
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][1]) is not heap[0][3]:
            heappop(heap)


class FcfsScheduler(_HeapQueue):
    """First come, first served: order by ``(arrival_time_us, request_id)``.

    Among simultaneous arrivals the lowest request id goes first, whatever order they
    were submitted in. A preempted request re-enqueued with its original arrival time
    goes back to its place near the front.
    """

    __slots__ = ()

    def enqueue(self, item: QueuedRequest) -> None:
        """Queue *item*; its id must not be queued already."""
        if not isinstance(item, QueuedRequest):
            raise TypeError(f"enqueue takes a QueuedRequest, got {type(item).__name__}")
        # _push written out: this runs once per arrival of every FCFS run.
        rid = item.request_id
        live = self._live
        if rid in live:
            raise ValueError(f"request {rid} is already queued")
        heappush(self._heap, (item.arrival_time_us, rid, self._enqueued, item))
        live[rid] = item
        self._epoch += 1
        self._enqueued += 1
        if len(live) > self._max_queue_length:
            self._max_queue_length = len(live)
