"""The single-slot server: one request at a time, whole-prompt prefill, one token per step.

Life of a request on this server, as events in SimPy's heap::

    REQUEST_ARRIVAL ──> (queued) ──boundary──> PREFILL_COMPLETE ──> DECODE_STEP_COMPLETE (n times)
                                   admission                        ──> REQUEST_COMPLETE

The arrival enqueues the request's metadata with the scheduler. At the end of a
timestamp, if the slot is free, the boundary admits the scheduler's head and schedules
its prefill ``prefill_us(prompt, 1)`` later. Each decode step is scheduled
``decode_step_us(1)`` after the previous event; the event that ends the work schedules
``REQUEST_COMPLETE`` with zero delay, and processing it frees the slot. A backend with
``step_us`` (:class:`~simsim.StepCostBackend`) prices the prefill as
``step_us(((prompt, 0),), ())`` and the step that makes token *t* as
``step_us((), (prompt + t - 1,))``: the context it decodes over.

Decode steps that all end before the heap's next event are a *stretch*: one event for
the last of them, the ones before written out (tokens, records with the sequence numbers
their own events would have had, counts) when it comes up; nothing can look in
between. ``stretches=False`` keeps one event per step (``docs/performance.md``,
"Stretches").
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from simsim.admission import AdmissionControl
from simsim.backend import Backend, FittedBackend
from simsim.clock import MAX_TIME_US, Environment, time_overflow
from simsim.engines.base import (
    EngineBase,
    LifecycleEvent,
    check_duration_us,
    lifecycle_handler,
    positive_int,
)
from simsim.engines.stretches import (
    MAX_STRETCH,
    MIN_STRETCH,
    decode_steps_pricer,
    same_steps,
    stretch_ends,
)
from simsim.errors import InvalidTransitionError
from simsim.records import EventType
from simsim.request import Request, RequestState
from simsim.scheduler import Scheduler
from simsim.wording import counted

__all__ = ["SimulationEngine"]

_PREFILLING = RequestState.PREFILLING
_DECODING = RequestState.DECODING
_FINISHED = RequestState.FINISHED
_CANCELLED = RequestState.CANCELLED

_PREFILL = EventType.PREFILL_COMPLETE
_DECODE = EventType.DECODE_STEP_COMPLETE
_COMPLETE = EventType.REQUEST_COMPLETE


class SimulationEngine(EngineBase):
    """A serving engine with exactly one slot, driven by SimPy's event heap.

    ``SimulationEngine(backend, scheduler=None, *, max_active_requests=1, env=None,
    admission=None, stretches=True)``: *scheduler* defaults to a new
    :class:`~simsim.FcfsScheduler`, *env* to a new :class:`~simsim.Environment`. Share
    an environment with other SimPy processes by passing it as *env*.
    ``max_active_requests`` must be ``1`` on this server. An
    :class:`~simsim.AdmissionControl` as *admission* checks every arrival
    (:mod:`simsim.admission`). With *stretches* (the default), decode steps that all end
    before the heap's next event are one event, written out when it comes up with the
    same records and counts; ``stretches=False`` runs one event per step (the
    reference; ``docs/performance.md``, "Stretches").
    """

    def __init__(
        self,
        backend: Backend,
        scheduler: Scheduler | None = None,
        *,
        max_active_requests: int = 1,
        env: Environment | None = None,
        admission: AdmissionControl | None = None,
        stretches: bool = True,
    ) -> None:
        slots = positive_int(max_active_requests, "max_active_requests")
        if type(stretches) is not bool:
            raise TypeError(f"stretches must be True or False, got {stretches!r}")
        if slots != 1:
            raise ValueError(
                f"max_active_requests={slots}: the single-slot SimulationEngine runs exactly "
                "one request at a time (use BatchingEngine for more)"
            )
        super().__init__(backend, scheduler, env, admission)
        self._active: Request | None = None
        self._prefill_callbacks = (self._on_prefill_complete,)
        self._decode_callbacks = (self._on_decode_step,)
        self._complete_callbacks = (self._on_request_complete,)
        # The first decode step's cost bounds every later one from below (the overflow
        # check at the prefill's end relies on it), unless a backend's own step_us may
        # price later steps cheaper.
        own_step = getattr(type(backend), "step_us", None)
        self._steps_grow = self._price_step is None or own_step is FittedBackend.step_us
        # How decode steps that nothing can interrupt are priced as one stretch (see
        # _next_steps); None: one event per step.
        self._decode_steps = decode_steps_pricer(backend) if stretches else None
        # The active request's stretch: its first token's number, the steps before the
        # event's, and their ends (None: no stretch).
        self._stretch: tuple[int, int, npt.NDArray[np.int64]] | None = None

    @property
    def max_active_requests(self) -> int:
        """Always ``1`` on this server."""
        return 1

    @property
    def active_request_id(self) -> int | None:
        """The id of the request holding the slot, or ``None`` when it is free."""
        self._check_alive()
        return None if self._active is None else self._active.request_id

    # ------------------------------------------------------------------ events

    def _is_idle(self) -> bool:
        return self._active is None

    def _running_count(self) -> int:
        return 0 if self._active is None else 1

    @lifecycle_handler
    def _on_prefill_complete(self, event: LifecycleEvent, request: Request) -> None:
        now = self._env.now
        if request.state is not _PREFILLING:
            self._raise_stale(event)
        tokens = request.max_output_tokens
        if tokens > 0:
            cost = self._first_step_us(request)
            if self._steps_grow and now + cost * tokens > MAX_TIME_US:
                # Refuse now rather than step towards an overflow token by token.
                raise OverflowError(
                    f"request {request.request_id}: {counted(tokens, 'output token')} "
                    f"(max_output_tokens) at {cost} us per decode step from {now} us "
                    f"would finish at {now + cost * tokens} us, past the 64-bit limit "
                    "2**63 - 1"
                )
            if self._decode_steps is None:
                processed = event.requeue(self._decode_callbacks, _DECODE, now + cost)
            else:
                processed = self._next_steps(event, request, now, cost, 0)
            request.transition_to(_DECODING, now)
        else:
            processed = event.requeue(self._complete_callbacks, _COMPLETE, now)
        request.prefill_end_time_us = now
        self._processed_event_count += 1
        self._event_log.append(now, processed, _PREFILL, request.request_id)

    def _on_decode_step(self, event: LifecycleEvent) -> None:
        # The hot path: one call per generated token, kept flat on purpose. It writes
        # out what @lifecycle_handler and EventLog.append do, and reads env._now: with
        # the decorator and append, the full engine took 5-10% longer against raw SimPy
        # in benchmarks/solvers.py (1e4 requests; docs/performance.md, "Hot paths").
        try:
            request = event.request
            if request._pending is not event:
                self._ignore_or_fail(event)
                return
            now = self._env._now
            if request.state is not _DECODING:
                self._raise_stale(event)
            if self._stretch is not None:
                self._end_stretch(request)
            tokens = request.generated_token_count + 1
            limit = request.max_output_tokens
            if tokens < limit:
                if self._price_step is None:
                    cost = self._decode_step_us(request)
                else:  # the next token decodes over the prompt and the tokens so far
                    cost = self._context_step_us(request, request.prompt_token_count + tokens)
                if self._decode_steps is None:
                    processed = event.requeue(self._decode_callbacks, _DECODE, now + cost)
                else:
                    processed = self._next_steps(event, request, now, cost, tokens)
            elif tokens == limit:
                processed = event.requeue(self._complete_callbacks, _COMPLETE, now)
            else:
                raise InvalidTransitionError(
                    f"request {request.request_id}: token {tokens} is past "
                    f"max_output_tokens {limit}"
                )
            request.generated_token_count = tokens
            if request.first_token_time_us is None:
                request.first_token_time_us = now
            self._processed_event_count += 1
            log = self._event_log
            log.timestamps.append(now)
            log.sequences.append(processed)
            log.types.append(_DECODE)
            log.request_ids.append(request.request_id)
            if self._token_waiters:
                self._notify_token(request)
        except BaseException as error:
            self._fail(error)
            raise

    def _next_steps(
        self, event: LifecycleEvent, request: Request, now: int, cost: int, tokens: int
    ) -> int:
        """Schedule *request*'s next decode step (the one after its token *tokens*,
        *cost* long), or, when nothing can happen before several of them end, a stretch:
        one event for the last step that ends before the heap's next event, the steps
        before it written out when it comes up (:meth:`_end_stretch`), with the
        sequence numbers each would have taken. Not while the engine is stepped through
        (:attr:`~simsim.Environment.stepping`), and never past a token someone waits
        for. Returns the number of the event being processed (for its record)."""
        env = self._env
        limit = request.max_output_tokens - tokens
        waiters = self._token_waiters.get(request.request_id) if self._token_waiters else None
        if waiters:
            limit = min(limit, min(waiters) - tokens)
        limit = min(limit, MAX_STRETCH)
        horizon = env.next_event_time()
        if (
            limit < MIN_STRETCH
            or env.stepping
            or (horizon is not None and (horizon - now) // max(cost, 1) < MIN_STRETCH)
        ):
            return event.requeue(self._decode_callbacks, _DECODE, now + cost)
        assert self._decode_steps is not None
        context = request.prompt_token_count + tokens
        ends = stretch_ends(self._decode_steps, 1, now + cost, cost, context, limit, horizon)
        size = 0 if ends is None else len(ends)
        if ends is not None and horizon is not None:
            size = int(np.searchsorted(ends, horizon))  # the steps that end before it
        if ends is None or size < MIN_STRETCH:
            return event.requeue(self._decode_callbacks, _DECODE, now + cost)
        first = env.reserve_sequences(size)
        self._stretch = (first, size - 1, ends[: size - 1])
        return event.requeue_numbered(
            self._decode_callbacks, _DECODE, int(ends[size - 1]), first + size - 1
        )

    def _end_stretch(self, request: Request) -> None:
        """The stretch's event came up: write out the steps before it, as their own
        events would have (tokens, records, counts)."""
        assert self._stretch is not None
        first, done, ends = self._stretch
        self._stretch = None
        request.generated_token_count += done
        if request.first_token_time_us is None:
            request.first_token_time_us = int(ends[0])
        self._processed_event_count += done
        log = self._event_log
        if self._decode_steps is same_steps:
            step = int(ends[1] - ends[0]) if done > 1 else 0
            log.add_token_run(int(ends[0]), step, first, 1, done, request.request_id)
        else:
            times = array("q")
            times.frombytes(ends.tobytes())
            log.add_tokens(times, array("q", range(first, first + done)), [request.request_id])

    def _decode_step_us(self, request: Request) -> int:
        """One decode step of *request*, priced by ``decode_step_us(1)``."""
        cost = self._backend.decode_step_us(1)
        if type(cost) is not int or cost < 0:
            cost = check_duration_us(cost, "decode_step_us", request.request_id)
        return cost

    def _context_step_us(self, request: Request, context: int) -> int:
        """One decode step of *request* over *context* cached tokens, priced by ``step_us``."""
        assert self._price_step is not None
        cost = self._price_step((), (context,))
        if type(cost) is not int or cost < 0:
            cost = check_duration_us(cost, "step_us", request.request_id)
        return cost

    def _first_step_us(self, request: Request) -> int:
        """The first decode step of *request*: over its prompt alone."""
        if self._price_step is None:
            return self._decode_step_us(request)
        return self._context_step_us(request, request.prompt_token_count)

    @lifecycle_handler
    def _on_request_complete(self, event: LifecycleEvent, request: Request) -> None:
        self._finish(request, event.sequence)

    def _finish(self, request: Request, sequence: int) -> None:
        """The active request completes now: it leaves, and the slot is free."""
        now = self._env._now  # hot path: once per request (see EngineBase.submit)
        request.transition_to(_FINISHED, now)
        # Drop the request <-> event cycle: finished requests stay light for the GC.
        request._pending = request._event = None
        self._active = None
        self._processed_event_count += 1
        self._event_log.append(now, sequence, _COMPLETE, request.request_id)
        if self._completions or self._token_waiters:
            self._notify_terminal(request)
        if len(self._scheduler):
            self._fill_free_slot()

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        """Admit the scheduler's head into the free slot, at the current time."""
        scheduler = self._scheduler
        now = self._env._now  # hot path: once per request (see EngineBase.submit)
        decision = scheduler.decide(now)
        if decision is None:
            return
        request = self._proposed(decision)
        rid = request.request_id
        if self._price_step is None:
            prefill_us = self._backend.prefill_us(request.prompt_token_count, 1)
            if type(prefill_us) is not int or prefill_us < 0:
                prefill_us = check_duration_us(prefill_us, "prefill_us", rid)
        else:
            prefill_us = self._price_step(((request.prompt_token_count, 0),), ())
            if type(prefill_us) is not int or prefill_us < 0:
                prefill_us = check_duration_us(prefill_us, "step_us", rid)
        # Everything is priced and checked before the scheduler or the request changes.
        callback, event_type, at = self._plan_work(request, now, prefill_us)
        if at > MAX_TIME_US:
            raise time_overflow(at, f"request {rid}")
        self._commit(decision)
        request.transition_to(_PREFILLING, now)
        if self._gate is not None:
            self._gate.left_queue(request)  # admitted: it stops counting as queued
        event = request._event
        event.requeue(callback, event_type, at)
        request._pending = event
        self._active = request
        self._admission_log.append(now, rid, decision.epoch)

    def _plan_work(
        self, request: Request, now: int, prefill_us: int
    ) -> tuple[tuple[Callable[[LifecycleEvent], None]], EventType, int]:
        """The first event of an admitted request's work: its prefill completion."""
        return self._prefill_callbacks, _PREFILL, now + prefill_us

    def _cancel_active(self, request: Request, now: int) -> None:
        pending = request._pending
        if pending is None or request is not self._active:
            raise InvalidTransitionError(
                f"request {request.request_id} is {request.state.name} but does not hold the slot"
            )
        request.transition_to(_CANCELLED, now)
        self._authorize(request, pending)
        self._active = None
        if len(self._scheduler):
            self._admit_now_or_at_boundary()
