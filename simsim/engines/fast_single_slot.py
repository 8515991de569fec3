"""The single slot with its work collapsed: one event from admission to finish.

:class:`FastSimulationEngine` runs the same model as
:class:`~simsim.engines.single_slot.SimulationEngine` and produces the same request
table, but it does not put one event per prefill and per output token into the heap.
At admission it prices the prefill and one decode step and schedules a single event at
``admit + prefill + tokens * step``, which finishes the request (a zero-cost prefill
gets an event of its own first, as the full engine leaves such work for the next
step). Progress in between
(the prefill's end, the tokens so far) is worked out when someone can look at it: at
the end of every :meth:`~FastSimulationEngine.run_next_timestamp` and
:meth:`~FastSimulationEngine.run`, on :attr:`~FastSimulationEngine.requests` and the
result frames, and when the request is cancelled. When nothing else happens at a
timestamp, the free slot is filled directly instead of through a boundary event.

Cancellations between timestamps give the full engine's request table and admission
log, also right after ``env.run(until=T)``: whether the freed slot is filled at once or
at the boundary depends on what is pending at ``T``, and the engine answers that for
the full engine's events, the ones it skips included (see
:meth:`FastSimulationEngine._work_due_now`).

What differs from the full engine, by design:

* the event log holds only ``REQUEST_ARRIVAL`` and ``REQUEST_COMPLETE`` records (the
  request table is the product; sequence numbers differ from the full engine's);
* the backend must price work from its arguments alone: one decode step is priced once
  per request, not once per token (so a backend with ``step_us``, whose decode steps
  grow with the context, is refused with ``TypeError``);
* a cancellation from *inside* the simulation at the very microsecond a skipped step
  ends wins the tie: the step has not happened. The full engine agrees when the
  cancelling event was scheduled before that step's event was (as a timeout set up
  earlier, like a scenario's cancellations and patience, always is) and counts the
  step when it was scheduled after. The last step is a real event here, scheduled at
  admission: a cancelling event scheduled later finds the request ``FINISHED`` while
  the full engine cancels it (``docs/semantics.md`` has both examples);
* a ``Request`` object a SimPy process holds is brought up to date only through the
  engine (``engine.requests``, stepping with ``run_next_timestamp()``), not while
  ``env.run()`` is driving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from simsim.admission import AdmissionControl
from simsim.backend import Backend
from simsim.clock import Environment
from simsim.engines.base import LifecycleEvent, check_duration_us, lifecycle_handler
from simsim.engines.single_slot import SimulationEngine
from simsim.records import EventType
from simsim.request import Request, RequestState
from simsim.scheduler import Scheduler

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FastSimulationEngine"]

_PREFILLING = RequestState.PREFILLING
_DECODING = RequestState.DECODING
_PREFILL = EventType.PREFILL_COMPLETE
_COMPLETE = EventType.REQUEST_COMPLETE


class FastSimulationEngine(SimulationEngine):
    """A single-slot engine that skips per-token events; same request table, far fewer events.

    Same constructor and methods as :class:`~simsim.SimulationEngine`. Use it for big
    runs and sweeps where the per-token event log is not needed.
    """

    def __init__(
        self,
        backend: Backend,
        scheduler: Scheduler | None = None,
        *,
        max_active_requests: int = 1,
        env: Environment | None = None,
        admission: AdmissionControl | None = None,
    ) -> None:
        super().__init__(
            backend,
            scheduler,
            max_active_requests=max_active_requests,
            env=env,
            admission=admission,
        )
        if self._price_step is not None:
            raise TypeError(
                f"backend {backend!r} prices each step from its context (it has step_us); "
                "FastSimulationEngine prices one decode step per request, so use "
                "SimulationEngine for it"
            )
        # Of the active request: when its prefill ends and what one decode step costs.
        self._prefill_end_us = 0
        self._step_us = 0
        self._done_callbacks = (self._on_work_done,)
        # Cancelled requests: the work events left in the heap (the full engine has
        # none at their times) and the times of the full engine's events instead.
        self._dead: set[LifecycleEvent] = set()
        self._ghosts: list[int] = []

    # ------------------------------------------------------------------ observation

    def _catch_up(self) -> None:
        """Bring the active request's prefill and tokens up to the current time.

        Between timestamps, work ending at or before ``now`` has happened (every event
        at ``now`` is done), unless ``run(until=now)`` has just stopped the clock before
        any event of ``now``. From inside the simulation (a process or callback at
        ``now``, reading ``requests`` or cancelling), skipped work ending at ``now`` has
        not happened yet: the event being processed wins the tie.
        """
        request = self._active
        if request is None:
            return
        env = self._env
        before_now = env.stopped_before_now or env.processing
        now = env.now - 1 if before_now else env.now
        prefill_end = self._prefill_end_us
        if now < prefill_end or request._pending.event_type is _PREFILL:
            return
        if request.state is _PREFILLING:
            request.prefill_end_time_us = prefill_end
            if request.max_output_tokens == 0:
                return
            request.transition_to(_DECODING, prefill_end)
        step = self._step_us
        limit = request.max_output_tokens
        done = limit if step == 0 else min(limit, (now - prefill_end) // step)
        if done > request.generated_token_count:
            request.generated_token_count = done
            if request.first_token_time_us is None:
                request.first_token_time_us = prefill_end + step

    @property
    def requests(self) -> Mapping[int, Request]:
        """As on the full engine, with the active request's progress up to date."""
        self._check_alive()
        self._catch_up()
        return super().requests

    def requests_frame(self) -> pd.DataFrame:
        """As on the full engine, with the active request's progress up to date."""
        self._check_alive()
        self._catch_up()
        return super().requests_frame()

    def run_next_timestamp(self) -> int | None:
        """As on the full engine; the active request's progress is up to date after it."""
        at = super().run_next_timestamp()
        self._catch_up()
        return at

    def run(self) -> None:
        """As on the full engine."""
        super().run()
        self._catch_up()

    # ------------------------------------------------------------------ events

    def _plan_work(
        self, request: Request, now: int, prefill_us: int
    ) -> tuple[tuple[Callable[[LifecycleEvent], None]], EventType, int]:
        if prefill_us == 0:
            # A zero-cost prefill at the admission's own time is work the full engine
            # leaves for the next step; a real event keeps that visible here too.
            return self._prefill_callbacks, _PREFILL, now
        # _plan_decode(request, now + prefill_us), inlined: this runs once per admission.
        prefill_end = now + prefill_us
        tokens = request.max_output_tokens
        step = 0
        if tokens > 0:
            step = self._backend.decode_step_us(1)
            if type(step) is not int or step < 0:
                step = check_duration_us(step, "decode_step_us", request.request_id)
        self._prefill_end_us = prefill_end
        self._step_us = step
        return self._done_callbacks, _COMPLETE, prefill_end + step * tokens

    def _plan_decode(
        self, request: Request, prefill_end: int
    ) -> tuple[tuple[Callable[[LifecycleEvent], None]], EventType, int]:
        tokens = request.max_output_tokens
        step = self._decode_step_us(request) if tokens > 0 else 0
        self._prefill_end_us = prefill_end
        self._step_us = step
        return self._done_callbacks, _COMPLETE, prefill_end + step * tokens

    @lifecycle_handler
    def _on_prefill_complete(self, event: LifecycleEvent, request: Request) -> None:
        # Only zero-cost prefills have an event of their own (see _plan_work).
        if request.state is not _PREFILLING:
            self._raise_stale(event)
        callback, event_type, at = self._plan_decode(request, self._env.now)
        event.requeue(callback, event_type, at)
        self._processed_event_count += 1

    def _on_work_done(self, event: LifecycleEvent) -> None:
        """The request's last piece of work ended: it has everything and completes.

        The full engine's prefill, decode and completion handlers in one: this runs once
        per request and is most of the fast engine's time, so it writes out what
        @lifecycle_handler does and reads ``env._now`` (with the decorator the fast
        engine took about 1.5% longer in benchmarks/solvers.py at 1e5 requests;
        docs/performance.md, "Hot paths").
        """
        try:
            request = event.request
            if request._pending is not event:
                self._dead.discard(event)
                self._ignore_or_fail(event)
                return
            now = self._env._now
            limit = request.max_output_tokens
            if request.state is _PREFILLING:
                request.prefill_end_time_us = self._prefill_end_us
                if limit > 0:
                    request.transition_to(_DECODING, now)
            if limit > 0:
                request.generated_token_count = limit
                if request.first_token_time_us is None:
                    request.first_token_time_us = self._prefill_end_us + self._step_us
            self._finish(request, event.sequence)
        except BaseException as error:
            self._fail(error)
            raise

    def _check_token_events(self, request: Request) -> None:
        raise NotImplementedError(
            f"request {request.request_id}: FastSimulationEngine does not generate tokens "
            "one decode step at a time, so it has no token events; use SimulationEngine "
            "(the same request table) to wait on tokens"
        )

    def _fill_free_slot(self) -> None:
        # Called last in this engine's own event callbacks. If nothing else is due at
        # this time, the boundary would be the very next event: admit now instead,
        # and let run_next_timestamp() pause here exactly as after a boundary.
        if self._boundary_pending or self._env.event_due_now():
            self._request_boundary()
            return
        self._note_admission_ran()
        self._admit()

    def _cancel_active(self, request: Request, now: int) -> None:
        self._catch_up()
        pending = request._pending
        if pending is not None and pending.event_type is _COMPLETE:
            # Its one work event stays in the heap, at the work's end; the full engine's
            # outstanding event for it (its next prefill or decode step) is elsewhere.
            self._dead.add(pending)
            self._ghosts.append(self._full_engine_event_us(request))
        super()._cancel_active(request, now)

    def _full_engine_event_us(self, request: Request) -> int:
        """When the full engine's outstanding event for the active *request* comes up.

        Called after :meth:`_catch_up`: a request still prefilling waits for its
        ``PREFILL_COMPLETE``, a decoding one for its next token's step.
        """
        prefill_end = self._prefill_end_us
        if request.state is _PREFILLING:
            return prefill_end
        return prefill_end + (request.generated_token_count + 1) * self._step_us

    def _work_due_now(self) -> bool:
        """What the full engine would answer: is any of *its* events pending at ``now``?

        The heap's own events at ``now``, less the work events of cancelled requests
        (the full engine has no such event), plus the events the full engine still has
        for cancelled requests (their next step) at ``now``: those are pending only
        right after ``run(until=now)`` stopped the clock, before any event of ``now``.
        """
        env = self._env
        now = env.now
        stopped = env.stopped_before_now
        # Keep the full engine's events that have not come up yet.
        self._ghosts = [at for at in self._ghosts if at > now or (at == now and stopped)]
        if now in self._ghosts:
            return True
        dead = self._dead
        return any(event not in dead for event in env.events_due_now())
