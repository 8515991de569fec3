"""Submitting a generated workload: its requests, then its patience deadlines."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import simpy

from simsim.clock import Environment
from simsim.request import Request, RequestSpec

__all__ = ["GeneratedWorkload", "PatienceDeadline", "WorkloadEngine", "submit_with_deadlines"]


class WorkloadEngine(Protocol):
    """What a workload needs from a server: ``SimulationEngine`` and its siblings fit."""

    @property
    def env(self) -> Environment:
        """The environment the server runs on."""
        ...

    @property
    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        ...

    @property
    def requests(self) -> Mapping[int, Request]:
        """Every submitted request by id."""
        ...

    def submit(self, request: Request | RequestSpec) -> Request:
        """Hand a pristine request (or a spec of one) to the server."""
        ...

    def cancel_request(self, request_id: int) -> None:
        """Cancel a request that is not terminal."""
        ...

    def completion(self, request_id: int) -> simpy.Event:
        """An event that succeeds with the request once it is terminal."""
        ...


def submit_with_deadlines(
    engine: WorkloadEngine,
    requests: Iterable[RequestSpec | Request],
    deadlines: Iterable[tuple[int, int]],
    *,
    submit: Callable[[RequestSpec | Request], object] | None = None,
) -> None:
    """Submit *requests* to *engine* in order, then schedule the *deadlines*.

    Each deadline, a ``(time_us, request_id)`` pair taken in the order given, becomes a
    timeout on ``engine.env`` whose callback cancels the request if it is not terminal
    by then. Because the requests are submitted first, at a shared microsecond T the
    arrivals at T come first, then the deadlines, then everything the run itself
    schedules at T: a request that completes exactly at its deadline is cancelled (it
    must finish strictly before it). *submit* replaces ``engine.submit`` (to report a
    refusal in the caller's words, say). The one way workloads and scenarios submit.
    """
    submit_one = engine.submit if submit is None else submit
    for request in requests:
        submit_one(request)
    env = engine.env
    for time_us, request_id in deadlines:
        timer = env.timeout(time_us - env.now)
        timer.callbacks.append(_canceller(engine, request_id))


def _canceller(engine: WorkloadEngine, request_id: int) -> Callable[[simpy.Event], None]:
    def cancel_if_still_running(_event: simpy.Event) -> None:
        if not engine.requests[request_id].is_terminal:
            engine.cancel_request(request_id)

    return cancel_if_still_running


class PatienceDeadline(NamedTuple):
    """A client's deadline: cancel *request_id* at *time_us* if it has not finished."""

    time_us: int
    request_id: int


@dataclass(frozen=True, slots=True)
class GeneratedWorkload:
    """The output of :meth:`OpenLoopWorkload.generate`: requests and patience deadlines.

    ``requests`` are :class:`RequestSpec` values in id order (which is also arrival
    order); ``cancellations`` are the patience deadlines, ``(time_us, request_id)`` sorted
    by time then id (empty without a patience distribution). An engine makes its own
    :class:`Request` of each spec, so one generated workload can feed any number of
    engines (read the results from ``engine.requests``).
    """

    requests: tuple[RequestSpec, ...]
    cancellations: tuple[PatienceDeadline, ...] = ()

    def submit_to(self, engine: WorkloadEngine) -> None:
        """Submit every request to *engine* and schedule the patience deadlines
        (see :func:`submit_with_deadlines`).

        Everything is checked before anything is submitted: ``ValueError`` for an id the
        engine already knows or an arrival before ``engine.now_us``.
        """
        now = engine.now_us
        known = engine.requests
        for request in self.requests:
            if request.request_id in known:
                raise ValueError(
                    f"request {request.request_id} was already submitted to this engine"
                )
            if request.arrival_time_us < now:
                raise ValueError(
                    f"request {request.request_id} arrives at {request.arrival_time_us} us, "
                    f"before the engine's current time {now} us"
                )
        submit_with_deadlines(engine, self.requests, self.cancellations)
