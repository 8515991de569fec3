"""What every simsim server shares: requests, logs, cancellation, failure, stepping.

A server runs on a :class:`~simsim.clock.Environment` and keeps all of its pending
work in SimPy's own heap as :class:`LifecycleEvent` objects, one outstanding event per
request at most (arrivals submitted ahead of time wait, already numbered, in a
:class:`~simsim.engines.arrivals.PendingArrivals` until they are due). Admission
happens at *timestamp boundaries*: a :data:`BOUNDARY`-priority event, scheduled once
per timestamp when first needed, runs after every other event of that timestamp and
asks the scheduler for the next request. Concrete servers (the single slot, the
batching server) supply what happens on each event and at each boundary.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import simpy
from simpy.events import Event

from simsim.admission import (
    AdmissionControl,
    AdmissionGate,
    append_rejection,
    check_admission,
)
from simsim.backend import Backend, check_duration_us
from simsim.clock import Environment, check_count
from simsim.engines.arrivals import PendingArrivals
from simsim.engines.events import LifecycleEvent
from simsim.engines.server import (
    LoadFigures,
    ServerLoad,
    cancel_before_arrival,
    check_new_request,
    check_request_lifetime,
    reject_at_arrival,
    unused_block_hashes,
)
from simsim.errors import (
    EngineFailedError,
    InvalidTransitionError,
    StaleEventError,
    UnknownRequestError,
)
from simsim.records import (
    AdmissionLog,
    AdmissionRecord,
    EventLog,
    EventRecord,
    EventType,
    RecordView,
)
from simsim.request import Request, RequestSpec, RequestState, request_spec, submitted_request
from simsim.scheduler import (
    AdmissionDecision,
    FcfsScheduler,
    Scheduler,
    SchedulerStats,
)

if TYPE_CHECKING:
    import pandas as pd

    from simsim.engines.port import ReplicaPort

__all__ = [
    "EngineBase",
    "LifecycleEvent",
    "check_duration_us",
    "engine_work",
    "lifecycle_handler",
    "positive_int",
    "queued_request",
    "unused_block_hashes",
]

_ARRIVAL = EventType.REQUEST_ARRIVAL

_SCHEDULER_OPERATIONS = ("enqueue", "remove", "decide", "commit", "__len__", "epoch", "stats")


_Engine = TypeVar("_Engine", bound="EngineBase")


def engine_work(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark *method* as the engine's own work: an exception it raises fails the engine.

    The exception still propagates with its own type (contract section 8); the engine
    keeps it and answers :class:`~simsim.EngineFailedError` from then on.
    """

    @functools.wraps(method)
    def work(self: EngineBase, *args: Any) -> Any:
        try:
            return method(self, *args)
        except BaseException as error:
            self._fail(error)
            raise

    return work


def lifecycle_handler(
    handler: Callable[[_Engine, LifecycleEvent, Request], None],
) -> Callable[[_Engine, LifecycleEvent], None]:
    """Turn ``handler(engine, event, request)`` into a callback for a request's event.

    The callback first checks that *event* is the one its request waits for; if not,
    it is consumed under a cancellation's one-use authorization or is a stale-event
    error (:meth:`EngineBase._ignore_or_fail`). Like :func:`engine_work`, any exception
    fails the engine.
    """

    @functools.wraps(handler)
    def on_event(self: _Engine, event: LifecycleEvent) -> None:
        try:
            request = event.request
            if request._pending is not event:
                self._ignore_or_fail(event)
                return
            handler(self, event, request)
        except BaseException as error:
            self._fail(error)
            raise

    return on_event


class EngineBase(ABC):
    """Shared machinery of simsim's servers; use a concrete engine instead.

    A server provides :attr:`max_active_requests` and three hooks (a subclass that
    lacks one cannot be built): :meth:`_is_idle`, :meth:`_admit` and
    :meth:`_cancel_active`; it may refine :meth:`_check_admissible` and
    :meth:`_fill_free_slot`. Its event callbacks are written with
    :func:`lifecycle_handler` (a request's event) or :func:`engine_work` (any other).

    An engine is a :class:`~simsim.engines.server.Server`; a cluster drives it as a
    replica through :attr:`replica_port` only (which reads the hooks :meth:`_load`,
    :meth:`_admission_rule` and :meth:`_prefix_lookup`).
    """

    # Set on the instance only when a limit is given: an engine keeps few instance
    # attributes, so CPython reads them from its inline values on the hot paths (three
    # more made the full engine about 6 % slower in benchmarks/solvers.py, 1e4 requests:
    # 0.69 s instead of 0.65 s, best of 5).
    _max_lifetime_us: int | None = None

    def __init__(
        self,
        backend: Backend,
        scheduler: Scheduler | None,
        env: Environment | None,
        admission: AdmissionControl | None = None,
    ) -> None:
        for method in ("prefill_us", "decode_step_us"):
            if not callable(getattr(backend, method, None)):
                raise TypeError(
                    f"backend {backend!r} has no {method}() method; "
                    "it must implement simsim.Backend"
                )
        if scheduler is None:
            scheduler = FcfsScheduler()
        else:
            missing = [name for name in _SCHEDULER_OPERATIONS if not hasattr(scheduler, name)]
            if missing:
                raise TypeError(
                    f"scheduler {scheduler!r} lacks {', '.join(missing)}; "
                    "it must implement simsim.Scheduler"
                )
        if env is None:
            env = Environment()
        elif not isinstance(env, Environment):
            kind = "a plain simpy.Environment" if isinstance(env, simpy.Environment) else repr(env)
            raise TypeError(
                f"env must be a simsim.Environment (integer-microsecond clock), got {kind}"
            )
        admission = check_admission(admission)
        self._backend = backend
        # A StepCostBackend's step_us prices all work when the backend's class defines
        # one (looked up on the class: an object that answers every attribute, such as
        # a test double, does not opt in by accident).
        price_step = (
            getattr(backend, "step_us", None) if hasattr(type(backend), "step_us") else None
        )
        self._price_step: Callable[[Sequence[tuple[int, int]], Sequence[int]], int] | None = (
            price_step if callable(price_step) else None
        )
        self._scheduler = scheduler
        self._env = env
        self._requests: dict[int, Request] = {}
        self._event_log = EventLog()
        self._admission_log = AdmissionLog()
        self._failure: BaseException | None = None
        # The simsim.Cluster this engine is a replica of: requests come through it only;
        # it asks to be told when the engine fails.
        self._cluster: object | None = None
        self._on_fail: Callable[[], None] | None = None
        # Admission control: what the user gave, and its running state here (a replica
        # of a cluster gets the cluster's gate, which it only keeps the queue counts of).
        self._admission = admission
        self._gate: AdmissionGate | None = None if admission is None else admission.gate()
        self._processed_event_count = 0
        self._ignored_cancelled_event_count = 0
        # request id -> the one event a cancellation allowed to be consumed silently
        # (arrivals.HELD for an arrival not in the heap yet: see PendingArrivals)
        self._authorized: dict[int, object] = {}
        self._completions: dict[int, Event] = {}
        # request id -> {token number -> the event token(rid, n) returned}; empty unless
        # someone waits on a token, so the decode path pays one truth test.
        self._token_waiters: dict[int, dict[int, Event]] = {}
        # Token events triggered and not yet processed: news for watchers, not work, so
        # they never decide whether a freed slot is filled now or at the boundary.
        self._token_notices: set[Event] = set()
        self._boundary_pending = False
        # Set when this timestamp's admission has run: run_next_timestamp() pauses there.
        self._admission_ran = False
        # Callback tuples shared by all of this engine's events of a kind.
        self._arrival_callbacks = (self._on_arrival,)
        self._arrivals = PendingArrivals(env, self._arrival_callbacks, self._authorized)

    # ------------------------------------------------------------------ accessors

    @property
    def env(self) -> Environment:
        """The environment this engine schedules on."""
        return self._env

    @property
    def backend(self) -> Backend:
        """The cost model."""
        return self._backend

    @property
    def scheduler(self) -> Scheduler:
        """The admission policy."""
        return self._scheduler

    @property
    def admission(self) -> AdmissionControl | None:
        """The admission control that checks each arrival, or ``None``."""
        return self._admission

    def rate_limit_refill_us(self, request_id: int) -> int | None:
        """How long from now until the token bucket of *request_id*'s class (or tenant)
        holds a whole token, in microseconds: ``0`` if it holds one now.

        ``None`` without an admission control, without a rate limit for that group, or
        at a rate of 0 with the bucket empty (it never refills). A request turned away
        as ``"rate_limited"`` would be accepted after that long, unless another arrival
        of its group takes the token first. Reads the bucket without changing it.
        """
        request = self._submitted(request_id)
        gate = self._gate
        return None if gate is None else gate.refill_us(request, self._env.now)

    def _submitted(self, request_id: int) -> Request:
        """The request *request_id* of this live engine; :class:`UnknownRequestError`
        for an id never submitted (and :class:`EngineFailedError` once failed)."""
        self._check_alive()
        rid = check_count(request_id, "request_id")
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequestError(f"request {rid} was never submitted to this engine")
        return request

    @property
    @abstractmethod
    def max_active_requests(self) -> int:
        """How many requests may hold a slot at once (``1`` on the single slot)."""

    @property
    def failed(self) -> bool:
        """``True`` once an error in the engine's own work has failed it for good."""
        return self._failure is not None

    @property
    def processed_event_count(self) -> int:
        """The engine's own events processed so far, meaningful and ignored alike."""
        return self._processed_event_count

    @property
    def ignored_cancelled_event_count(self) -> int:
        """Events consumed without effect because a cancellation authorized them."""
        return self._ignored_cancelled_event_count

    @property
    def has_pending_events(self) -> bool:
        """``True`` while the environment's heap holds any event (foreign ones included)."""
        return self._env.next_event_time() is not None

    @property
    def queued_count(self) -> int:
        """Requests that have arrived and wait in the scheduler's queue (preempted ones
        included)."""
        self._check_alive()
        return len(self._scheduler)

    @property
    def running_count(self) -> int:
        """Requests holding a slot now."""
        self._check_alive()
        return self._running_count()

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV-cache blocks in use, from 0 to 1; a server without a KV
        cache answers the fraction of its slots held."""
        self._check_alive()
        return self._running_count() / self.max_active_requests

    def load(self) -> ServerLoad:
        """The engine's load now (:class:`~simsim.engines.server.ServerLoad`): what a
        cluster's router, the live driver and its metrics read."""
        self._check_alive()
        return ServerLoad(*self._load())

    def _load(self) -> LoadFigures:
        """:meth:`load`'s figures as a plain tuple, without the check (the replica
        port's, for a router)."""
        running = self._running_count()
        return len(self._scheduler), running, running / self.max_active_requests, 0

    @property
    def prefix_cache(self) -> bool:
        """Whether requests share cached prompt prefixes (only a batching server's
        prefix cache does)."""
        return self._shares_prefixes()

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The most tokens one request may hold in the KV cache: ``None`` for a server
        without one."""
        return None

    @property
    def admitted_count(self) -> int:
        """How many admissions the engine has made (a readmission after a preemption
        counts again): the length of :attr:`admission_log`."""
        self._check_alive()
        return len(self._admission_log)

    @property
    def max_request_lifetime_us(self) -> int | None:
        """The longest a request's own work may take, checked at :meth:`submit`
        (``None``, the default: no limit beyond the 64-bit clock).

        A request whose prefill plus one decode step per output token (priced by the
        backend for a batch of one) would take longer is refused with ``ValueError``.
        Offline, such a request would fail the engine when its finish passed the 64-bit
        clock; the live driver sets a limit so one client cannot stop the simulation.
        """
        return self._max_lifetime_us

    @max_request_lifetime_us.setter
    def max_request_lifetime_us(self, value: int | None) -> None:
        self._max_lifetime_us = (
            None if value is None else check_count(value, "max_request_lifetime_us", minimum=1)
        )

    @property
    def replica_port(self) -> ReplicaPort:
        """The door a cluster drives this engine through as one of its replicas
        (:class:`~simsim.engines.port.ReplicaPort`, a new one at each read: it keeps no
        state of its own); user code has no need of it."""
        from simsim.engines.port import ReplicaPort

        return ReplicaPort(self)

    def _running_count(self) -> int:
        """How many requests hold a slot now (hook: this default counts the requests
        prefilling or decoding; the built-in servers answer from their slots)."""
        active = (RequestState.PREFILLING, RequestState.DECODING)
        return sum(1 for request in self._requests.values() if request.state in active)

    @property
    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        self._check_alive()
        return self._env.now

    @property
    def requests(self) -> Mapping[int, Request]:
        """A read-only mapping from request id to every submitted :class:`Request`."""
        self._check_alive()
        return MappingProxyType(self._requests)

    @property
    def event_log(self) -> RecordView[EventRecord]:
        """The processed lifecycle events in processing order (a snapshot)."""
        self._check_alive()
        return self._event_log.view()

    @property
    def admission_log(self) -> RecordView[AdmissionRecord]:
        """Every admission in order: time, request id, scheduler epoch (a snapshot)."""
        self._check_alive()
        return self._admission_log.view()

    @property
    def scheduler_stats(self) -> SchedulerStats:
        """The scheduler's counters."""
        self._check_alive()
        return self._scheduler.stats

    # ------------------------------------------------------------------ frames

    def requests_frame(self) -> pd.DataFrame:
        """One row per request in id order; see :func:`simsim.results.requests_frame`.
        With an admission control, ``rejection`` is appended (see
        :mod:`simsim.admission`)."""
        self._check_alive()
        from simsim.results import requests_frame

        frame = requests_frame(self._requests)
        if self._admission is not None:
            append_rejection(frame, self._requests)
        return frame

    def events_frame(self) -> pd.DataFrame:
        """One row per :attr:`event_log` entry, same order."""
        self._check_alive()
        from simsim.results import events_frame

        return events_frame(self._event_log)

    def admissions_frame(self) -> pd.DataFrame:
        """One row per :attr:`admission_log` entry: ``timestamp_us, request_id, epoch``."""
        self._check_alive()
        from simsim.results import admissions_frame

        return admissions_frame(self._admission_log)

    # ------------------------------------------------------------------ driving

    def submit(self, request: Request | RequestSpec) -> Request:
        """Hand a pristine *request* to the engine and schedule its arrival.

        The request must be ``WAITING`` with no tokens and no timestamps, its id new to
        this engine, and its arrival no earlier than ``now_us``; otherwise ``ValueError``
        (``TypeError`` for a non-:class:`Request`) and nothing changes. Returns the same
        object, which the engine updates from now on (a :class:`RequestSpec` becomes a
        new such request).
        """
        if type(request) is not Request:  # a spec (or anything else: checked below)
            request = submitted_request(request)
        if self._failure is not None:
            self._check_alive()
        if self._cluster is not None:
            raise ValueError(
                f"this engine is a replica of {self._cluster!r}: submit requests to the "
                "cluster, which routes them"
            )
        # Hot path: env._now, not env.now (once per request; the property calls on the
        # per-request paths cost the fast engine about 2 %: docs/performance.md, "Hot paths").
        request = check_new_request(
            request, self._requests, self._env._now, "engine", self._shares_prefixes
        )
        rid = request.request_id
        if self._max_lifetime_us is not None:
            check_request_lifetime(request, self._backend, self._max_lifetime_us)
        self._check_admissible(request)
        # Its arrival is numbered now, as if it entered SimPy's heap now.
        self._arrivals.add(request)
        self._requests[rid] = request
        return request

    def run_next_timestamp(self) -> int | None:
        """Process every event at the earliest pending time T, then one admission.

        Returns T, or ``None`` when nothing is pending. Events the admission itself
        schedules at T (zero-cost work) are left for the next call.
        """
        self._check_alive()
        env = self._env
        at = env.next_event_time()
        if at is None:
            return None
        self._admission_ran = False
        while env.next_event_time() == at:
            env.step()
            if self._admission_ran:
                break
        return at

    def run(self) -> None:
        """Process events until nothing at all is pending.

        The same events in the same order as calling :meth:`run_next_timestamp` until
        it returns ``None`` (that method only decides where to pause), without the
        per-timestamp bookkeeping.
        """
        self._check_alive()
        self._env.drain()

    def cancel_request(self, request_id: int) -> None:
        """Cancel a request that has not finished; it becomes ``CANCELLED`` at ``now_us``.

        A request that has not arrived yet, or is queued, simply leaves; an active one
        frees its place at once and its outstanding event will be ignored when it comes
        up. Raises :class:`UnknownRequestError` for an unknown id and
        :class:`InvalidTransitionError` for a request that is already terminal; nothing
        changes then.
        """
        request = self._submitted(request_id)
        rid = request.request_id
        state = request.state
        if request.is_terminal:
            raise InvalidTransitionError(
                f"request {rid} is already {state.name}; only a WAITING, PREFILLING, "
                "DECODING or PREEMPTED request can be cancelled"
            )
        now = self._env.now
        pending = request._pending
        if state is RequestState.WAITING and pending is not None:
            # Not arrived yet: its arrival event will come up and be ignored (for an
            # arrival still held back, the event it gets when it enters the heap).
            cancel_before_arrival(request, now, self._authorized)
        elif state is RequestState.WAITING or state is RequestState.PREEMPTED:
            self._scheduler.remove(rid)
            request.transition_to(RequestState.CANCELLED, now)
            if self._gate is not None and state is RequestState.WAITING:
                self._gate.left_queue(request)  # never admitted: its queue place is free
        else:
            self._cancel_active(request, now)
        self._notify_terminal(request)

    def completion(self, request_id: int) -> Event:
        """A SimPy event that succeeds with the :class:`Request` once it is terminal.

        ``yield engine.completion(rid)`` inside a process waits for the request to
        finish or be cancelled; for a request that is already terminal the event is
        already triggered and the process resumes at once.
        """
        request = self._submitted(request_id)
        rid = request.request_id
        event = self._completions.get(rid)
        if event is None:
            # Born processed for a terminal request: a yield resumes at once.
            env = self._env
            event = env.processed_event(request) if request.is_terminal else Event(env)
            self._completions[rid] = event
        return event

    def token(self, request_id: int, n: int) -> Event:
        """A SimPy event for the request's *n*-th output token (``n >= 1``).

        It succeeds with the :class:`Request` when the decode step that generates token
        *n* completes, or, if the request ends with fewer than *n* tokens (it finished
        at a smaller ``max_output_tokens`` or was cancelled), when it becomes terminal.
        Tell the two apart with ``request.generated_token_count >= n``. For a token the
        request already has, or a request already terminal, the event is born processed
        and a ``yield`` resumes at once. Asking twice for the same token gives the same
        event. Waiting changes nothing in the simulation: the request table, and the
        event log's times, types and order, are those of a run nobody watched (the
        waiters' own events take sequence numbers, so the log's ``sequence`` column
        differs).
        """
        self._check_alive()
        rid = check_count(request_id, "request_id")
        number = check_count(n, "n", minimum=1)
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequestError(f"request {rid} was never submitted to this engine")
        self._check_token_events(request)
        if request.generated_token_count >= number or request.is_terminal:
            return self._env.processed_event(request)
        waiters = self._token_waiters.setdefault(rid, {})
        waiting = waiters.get(number)
        if waiting is None:
            waiting = waiters[number] = Event(self._env)
        return waiting

    def first_token(self, request_id: int) -> Event:
        """``token(request_id, 1)``: the event of the request's first output token."""
        return self.token(request_id, 1)

    def _check_token_events(self, request: Request) -> None:  # noqa: B027 (optional hook)
        """Refuse token events this server cannot give (hook; every token is an event)."""

    # ------------------------------------------------------------------ for subclasses

    def _check_admissible(self, request: Request) -> None:  # noqa: B027 (optional hook)
        """Refuse at submit a request this server could never run (hook; accepts all)."""

    def _shares_prefixes(self) -> bool:
        """Whether a prefix cache uses requests' ``block_hashes`` (hook; no)."""
        return False

    def _admission_rule(self) -> Hashable:
        """A key equal for engines whose :meth:`_check_admissible` refuses the same
        requests (hook; this engine alone)."""
        return self

    def _prefix_lookup(self, frozen: bool) -> Callable[[Sequence[Hashable]], int] | None:
        """How many of some block hashes, from the first, the prefix cache holds: as it
        is at each call, or *frozen* as it is now (hook; ``None``: no prefix cache)."""
        return None

    @lifecycle_handler
    def _on_arrival(self, event: LifecycleEvent, request: Request) -> None:
        """The request joins the scheduler's queue (unless the admission control rejects
        it); an idle server fills its slot."""
        # First: whatever follows, the next held arrival must be in the heap (an
        # ignored arrival does the same in _ignore_or_fail).
        self._arrivals.popped()
        request._pending = None
        if self._gate is not None:
            reason = self._gate.arrive(request, self._env.now)
            if reason is not None:
                self._reject(request, reason, event.sequence)
                return
        self._enqueue_arrival(request, event.sequence)

    def _reject(self, request: Request, reason: str, sequence: int) -> None:
        """The admission control turned *request* away as it arrived now: it ends
        ``CANCELLED`` with its reason, and only its arrival is logged."""
        now = self._env.now
        reject_at_arrival(request, reason, now)
        self._processed_event_count += 1
        self._event_log.append(now, sequence, _ARRIVAL, request.request_id)
        self._notify_terminal(request)

    def _enqueue_arrival(self, request: Request, sequence: int) -> None:
        """*request* has arrived now: queue it, log it under *sequence*, fill a free slot."""
        rid = request.request_id
        self._scheduler.enqueue(queued_request(request))
        self._processed_event_count += 1
        # Hot path: env._now, once per request (see submit).
        self._event_log.append(self._env._now, sequence, _ARRIVAL, rid)
        if self._is_idle():
            self._fill_free_slot()

    @engine_work
    def _accept_routed(self, request: Request, sequence: int) -> None:
        """A cluster routes *request* here as it arrives, inside the event *sequence*.

        The request arrives at once, as if that event were this engine's own arrival
        event (so a one-replica cluster runs exactly as the engine alone). The cluster
        has already checked at its ``submit`` what this engine's ``submit`` checks.
        """
        self._check_alive()
        self._requests[request.request_id] = request
        self._enqueue_arrival(request, sequence)

    @abstractmethod
    def _is_idle(self) -> bool:
        """Whether the server could start work now (no request or iteration running)."""

    @abstractmethod
    def _admit(self) -> None:
        """Start work at the current time: admit the scheduler's head(s), if any fit."""

    @abstractmethod
    def _cancel_active(self, request: Request, now: int) -> None:
        """Cancel *request*, which holds a slot; free it and fill it if someone waits."""

    def _fill_free_slot(self) -> None:
        """Work can start and someone may be queued: start it at the end of this timestamp."""
        self._request_boundary()

    def _note_admission_ran(self) -> None:
        """This timestamp's admission has run: :meth:`run_next_timestamp` pauses after
        the event being processed, as it does after a boundary."""
        self._admission_ran = True

    @engine_work
    def _on_boundary(self, event: Event) -> None:
        self._boundary_pending = False
        self._admission_ran = True
        if self._is_idle():
            self._admit()

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise EngineFailedError(
                f"the engine failed earlier ({type(self._failure).__name__}: {self._failure}) "
                "and answers only failed, processed_event_count, has_pending_events and "
                "ignored_cancelled_event_count"
            ) from self._failure

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
            if self._on_fail is not None:
                self._on_fail()

    def _authorize(self, request: Request, pending: object) -> None:
        # Exactly this one event may later be consumed without effect.
        self._authorized[request.request_id] = pending
        request._pending = request._event = None

    def _ignore_or_fail(self, event: LifecycleEvent) -> None:
        """Consume an event its request no longer waits for, if (and only if) authorized."""
        if event.event_type is _ARRIVAL:
            self._arrivals.popped()  # the next held arrival must be in the heap
        request = event.request
        rid = request.request_id
        if self._authorized.get(rid) is event and request.state is RequestState.CANCELLED:
            del self._authorized[rid]
            self._ignored_cancelled_event_count += 1
            self._processed_event_count += 1
            return
        self._raise_stale(event)

    def _raise_stale(self, event: LifecycleEvent) -> NoReturn:
        request = event.request
        raise StaleEventError(
            f"request {request.request_id} ({request.state.name}) was not waiting for "
            f"{event.event_type.name} (sequence {event.sequence}) at {self._env.now} us"
        )

    def _request_boundary(self) -> None:
        """Make sure an admission boundary runs at the end of the current timestamp."""
        if not self._boundary_pending:
            self._boundary_pending = True
            self._env.boundary_event(self._on_boundary)

    def _admit_now_or_at_boundary(self) -> None:
        """Fill a slot freed by a cancellation, now or at the end of this timestamp.

        From inside the simulation, or when work is still pending at the current time,
        the slot is filled at the timestamp's boundary; otherwise (between timestamps,
        nothing left at ``now``) the head is admitted at once without moving the clock.
        """
        env = self._env
        if env.processing or self._boundary_pending or self._work_due_now():
            self._request_boundary()
            return
        self._admit_between_timestamps()

    def _work_due_now(self) -> bool:
        """Whether any event is still pending at ``now`` (a server that keeps its work
        in fewer events than the full model answers for the events it skips).

        Token events (:meth:`token`) do not count: watching a request must not change
        when a slot freed between timestamps is filled.
        """
        env = self._env
        if not env.event_due_now():
            return False
        notices = self._token_notices
        return not notices or any(event not in notices for event in env.events_due_now())

    @engine_work
    def _admit_between_timestamps(self) -> None:
        self._admit()

    def _proposed(self, decision: AdmissionDecision) -> Request:
        """The request a scheduler decision names; it must be queued (waiting or preempted)."""
        rid = decision.request_id
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequestError(f"scheduler proposed request {rid}, unknown to this engine")
        state = request.state
        if state is not RequestState.WAITING and state is not RequestState.PREEMPTED:
            raise InvalidTransitionError(
                f"scheduler proposed request {rid}, which is {state.name}, not WAITING or PREEMPTED"
            )
        return request

    def _commit(self, decision: AdmissionDecision) -> None:
        """Commit *decision*; the scheduler must admit the request it names."""
        committed = self._scheduler.commit(decision)
        if committed.request_id != decision.request_id:
            raise InvalidTransitionError(
                f"scheduler committed request {committed.request_id} for a decision on "
                f"{decision.request_id}"
            )

    def _notify_token(self, request: Request) -> None:
        """The request has just generated a token: its waiter, if any, succeeds now."""
        waiters = self._token_waiters.get(request.request_id)
        if waiters:
            event = waiters.pop(request.generated_token_count, None)
            if event is not None:
                self._send_token_notice(event, request)

    def _notify_terminal(self, request: Request) -> None:
        completions = self._completions
        if completions:
            event = completions.get(request.request_id)
            if event is not None and not event.triggered:
                event.succeed(request)
        if self._token_waiters:
            waiters = self._token_waiters.pop(request.request_id, None)
            if waiters:
                # Tokens that will never come, in token order.
                for number in sorted(waiters):
                    self._send_token_notice(waiters[number], request)

    def _send_token_notice(self, event: Event, request: Request) -> None:
        self._token_notices.add(event)
        event.callbacks.append(self._token_notices.discard)
        event.succeed(request)


queued_request = request_spec
"""What the scheduler may know of a request: :func:`simsim.request.request_spec`."""


def positive_int(value: object, name: str) -> int:
    """*value* as a positive ``int``; a wrong type raises an error that is both a
    ``TypeError`` and a ``ValueError`` (the contract promises ``ValueError``)."""
    try:
        return check_count(value, name, minimum=1)
    except TypeError as error:
        raise _ArgumentTypeError(str(error)) from None


class _ArgumentTypeError(TypeError, ValueError):
    """A wrong type where a positive int is required: catchable as either."""
