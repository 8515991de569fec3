"""The real-time driver: the only code in simsim that reads a wall clock.

A :class:`LiveDriver` owns an engine and keeps its simulated clock on the wall clock:
simulated time is the wall time since :meth:`LiveDriver.start`, in microseconds,
multiplied by ``speed``. It runs inside an asyncio event loop (the HTTP server's) and
never blocks it: it advances the simulation only up to the current simulated time ``t``,
one timestamp at a time and for at most :data:`SLICE_S` of wall time at once (a
simulation too busy for its speed falls behind instead; :meth:`LiveDriver.lag_s`), and
sets one loop timer for the next pending event.

What happens when, in simulated time:

* **A submission** first advances the simulation to now (every event before now is
  processed; events *at* now are not), then submits a :class:`~simsim.Request` arriving
  now. A cancellation does the same and then calls ``cancel_request``. Offline, the
  same calls in the same order (``env.run(until=t)``, then submit or cancel) give the
  same request table: :func:`replay` does exactly that.
* **Events at time T** are processed when the simulated clock reaches ``T + 1``: the
  timer is set for that microsecond, so a token generated at ``T`` reaches its client
  one simulated microsecond plus the loop's latency later.

Each submitted request gets a :class:`LiveRequest`: an asyncio queue of
:class:`TokenUpdate` items, one per output token at the microsecond its decode step
completes (from the engine's ``token(rid, n)`` events, waited on by one SimPy process
per request), then ``None`` when the request ends. With an admission control, whether a
request was accepted is known only once its arrival has been processed, one simulated
microsecond after it was submitted: its ``checked`` event is set then, and
:meth:`LiveDriver.refusal` says why it was turned away, if it was.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import simpy

from simsim.admission import ANY_OTHER, RATE_LIMITED
from simsim.checks import check_real
from simsim.engines.server import Server, is_server
from simsim.errors import EngineFailedError
from simsim.request import Request
from simsim.scenario.engine_kinds import cannot, kind_of

__all__ = [
    "SLICE_S",
    "DriverObserver",
    "LiveAction",
    "LiveDriver",
    "LiveRequest",
    "Refusal",
    "TokenUpdate",
    "replay",
]

SLICE_S = 0.005
"""The longest the simulation holds the event loop at a time, in wall seconds."""

MAX_LIFETIME_US = 2**56
"""The longest a served request's own work may take: about 2,283 simulated years, which
leaves the 64-bit clock room for any queueing and batching on top. The driver sets it as
the served server's ``max_request_lifetime_us``, which ``submit`` checks."""

_SOON = -1  # the timer's due time when it is a call_soon: the simulation is behind


class TokenUpdate(NamedTuple):
    """Output token *number* (from 1) of a request, generated at *time_us*."""

    number: int
    time_us: int


@dataclass(frozen=True, slots=True)
class LiveAction:
    """One thing the driver did to the engine, at simulated time *time_us*.

    ``"submit"`` carries the request's sizes and priority; ``"cancel"`` only its id.
    The list of a served session's actions, replayed with :func:`replay`, reproduces
    its run.
    """

    time_us: int
    kind: Literal["submit", "cancel"]
    request_id: int
    prompt_token_count: int = 0
    max_output_tokens: int = 0
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the engine's admission control turned a served request away.

    *reason* is the request's ``rejection`` (``"rate_limited"`` or ``"queue_full"``),
    *message* names the limit it ran into, and *retry_after_s* is how many wall
    seconds from now its group's token bucket holds a whole token again (``None`` when
    that is not known: a full queue, or a bucket that never refills).
    """

    reason: str
    message: str
    retry_after_s: float | None


class DriverObserver(Protocol):
    """Told of each request's life as the simulation produces it (the metrics listen)."""

    def request_submitted(self, request: Request) -> None:
        """*request* was just submitted (it arrives now)."""

    def token_generated(self, request: Request, update: TokenUpdate, gap_us: int | None) -> None:
        """*request* generated a token; *gap_us* is the time since its previous one."""

    def request_ended(self, request: Request) -> None:
        """*request* is terminal (``FINISHED`` or ``CANCELLED``)."""


class LiveRequest:
    """A served request as the HTTP layer sees it: its tokens as they come, then its end.

    ``updates`` yields a :class:`TokenUpdate` per output token and then ``None``; after
    that, :attr:`request` (the engine's :class:`~simsim.Request`) is terminal and holds
    every simulated time of the request. ``checked`` is set once the engine's admission
    control has checked the request's arrival (at once on an engine without one, and
    when the driver stops or fails first): from then on ``request.rejection`` says
    whether it was turned away.
    """

    __slots__ = ("checked", "request", "updates")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.updates: asyncio.Queue[TokenUpdate | None] = asyncio.Queue()
        self.checked = asyncio.Event()

    @property
    def request_id(self) -> int:
        """The request's id in the engine (the driver numbers them 0, 1, 2, ...)."""
        return self.request.request_id


class LiveDriver:
    """Runs *engine* in real time, scaled by *speed*, inside the running asyncio loop.

    *engine* is any :class:`~simsim.Server`: one engine or a :class:`~simsim.Cluster`,
    which routes each submission as it would offline. *speed* is simulated seconds per
    wall second (10 runs ten times faster than real time). The server must be idle and
    fresh, on its own environment, and must give token events
    (:class:`~simsim.FastSimulationEngine` does not: use
    :class:`~simsim.SimulationEngine`, which gives the same request table). The driver
    sets its ``max_request_lifetime_us`` to :data:`MAX_LIFETIME_US`.
    """

    def __init__(
        self,
        engine: Server,
        *,
        speed: float = 1.0,
        observer: DriverObserver | None = None,
    ) -> None:
        kind = kind_of(engine)
        if kind is not None and not kind.streams_tokens:
            raise TypeError(cannot(kind.name, "streams_tokens"))
        if not is_server(engine):
            raise TypeError(
                f"engine must be a simsim server (an engine or a cluster), got "
                f"{type(engine).__name__}"
            )
        if engine.requests or engine.env.now != 0:
            raise ValueError("the engine must be fresh: no requests, its clock at 0 us")
        speed = check_real(speed, "speed", positive=True)
        self._engine = engine
        self._env = engine.env
        # A live server must not let one client's request stop the simulation for
        # everyone: the server refuses, at submit, work longer than this.
        engine.max_request_lifetime_us = MAX_LIFETIME_US
        self._speed = float(speed)
        self._us_per_second = self._speed * 1_000_000
        self.observer = observer
        """Told of each request's life as the simulation produces it; set before start."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = 0
        self._origin_s = 0.0
        self._unix_origin_s = 0.0
        self._timer: asyncio.Handle | None = None
        self._timer_due_us = 0
        self._behind = False
        self._next_id = 0
        self._unfinished: dict[int, LiveRequest] = {}
        # Requests whose arrival the admission control has yet to check, oldest first.
        self._unchecked: deque[LiveRequest] = deque()
        self._actions: list[LiveAction] = []
        self._failure: BaseException | None = None
        self._stopped = False
        self._preemptions = 0  # the last count read, for after a failure
        # Requests submitted at simulated time _arriving_at: their arrivals are
        # processed one microsecond later, so the server does not count them yet.
        self._arriving: list[Request] = []
        self._arriving_at = -1

    # ------------------------------------------------------------------ accessors

    @property
    def engine(self) -> Server:
        """The server being served (an engine or a cluster)."""
        return self._engine

    @property
    def speed(self) -> float:
        """Simulated seconds per wall second."""
        return self._speed

    @property
    def actions(self) -> tuple[LiveAction, ...]:
        """Every submission and cancellation so far, in the order they were made."""
        return tuple(self._actions)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the driver runs on (``None`` before :meth:`start`)."""
        return self._loop

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the engine, if one did."""
        return self._failure

    @property
    def started(self) -> bool:
        """Whether :meth:`start` has run (and :meth:`stop` has not)."""
        return self._loop is not None and not self._stopped

    def now_us(self) -> int:
        """The current simulated time: wall time since start times speed, in us."""
        if self._loop is None:
            return 0
        elapsed_s = self._loop.time() - self._origin_s
        return max(self._env.now, math.floor(elapsed_s * self._us_per_second))

    def lag_s(self) -> float:
        """How far the simulation is behind real time, in wall seconds (0 when it keeps up).

        A speed whose events the loop cannot process as fast as they come makes the
        simulation fall behind: requests then arrive at the simulation's current time,
        later than the wall clock says, and tokens reach clients late.
        """
        self._running_here()
        if not self._behind:
            return 0.0
        return max(0, self.now_us() - self._env.now) / self._us_per_second

    def unix_time(self, time_us: int) -> int:
        """The Unix time (whole seconds) of simulated time *time_us*: start + time / speed."""
        return math.floor(self._unix_origin_s + time_us / self._us_per_second)

    def counts(self) -> tuple[int, int]:
        """``(running, waiting)`` now, from the server's load
        (:class:`~simsim.ServerLoad`): requests holding a slot, and queued ones
        (preempted ones included), plus the requests submitted at this very simulated
        microsecond, whose arrival the server processes one microsecond later.

        It first advances the simulation to now, as :meth:`submit` does: the loop timer
        may not have run yet (it runs late when the loop is busy), and a 429 or a
        scrape must see the queue as it is at this simulated time, not as it was.
        ``(0, 0)`` once the server has failed.
        """
        self.catch_up()
        if self._failure is not None:
            return 0, 0
        load = self._engine.load()
        arriving = 0
        if self._arriving_at == self._env.now:
            arriving = sum(1 for request in self._arriving if not request.is_terminal)
        return load.running_count, load.queued_count + arriving

    def catch_up(self) -> None:
        """Process every event before the current simulated time, now.

        The loop timer does this as each event's time comes, but it runs late when the
        loop is busy; a reader that must see the simulation as of now (the 429 rule, a
        metrics scrape) calls this first. Only on the loop's thread while it runs.
        """
        if self._running_here():
            self._advance()
            self._schedule()

    def preemptions(self) -> int:
        """How many times a request has been preempted so far (batching with a KV
        cache): the server's load's ``preemption_count``."""
        self._running_here()
        if self._failure is None:  # a failed server answers no more: its last count
            self._preemptions = self._engine.load().preemption_count
        return self._preemptions

    @property
    def prefix_cache(self) -> bool:
        """Whether the served server has a prefix cache.

        Served requests carry no block hashes (the prompt is not hashed into KV
        blocks), so over HTTP the cache never serves a prompt token.
        """
        return self._engine.prefix_cache

    def refusal(self, live: LiveRequest) -> Refusal | None:
        """Why the admission control turned *live* away, or ``None`` if it did not.

        Ask once ``live.checked`` is set. The retry time is the one a client could act
        on now: the simulated time until its group's bucket refills, in wall seconds.
        """
        request = live.request
        reason = request.rejection
        admission = self._engine.admission
        if reason is None or admission is None:
            return None
        name = admission.group_of(request)
        key = name if name is not None and name in admission.limits else ANY_OTHER
        limit = admission.limits[key]
        retry_after_s = None
        if reason == RATE_LIMITED:
            refill_us = None
            if self._failure is None:
                refill_us = self._engine.rate_limit_refill_us(request.request_id)
            if refill_us is not None:
                retry_after_s = refill_us / self._us_per_second
            refills = (
                f"its next token comes in {refill_us} simulated us"
                if refill_us is not None
                else "it never refills"
            )
            message = (
                f"rate limit reached: the scenario's admission limit {key!r} has "
                f"rate_per_s = {limit.rate_per_s:g} (per simulated second) and burst = "
                f"{limit.burst}, and its token bucket is empty; {refills}"
            )
        else:
            message = (
                f"queue full: the scenario's admission limit {key!r} has max_queued = "
                f"{limit.max_queued}, and that many of its requests are queued; retry later"
            )
        return Refusal(reason, message, retry_after_s)

    def kv_cache_usage(self) -> float | None:
        """The server's load's ``kv_cache_usage``: the fraction of KV-cache blocks held
        by requests (of slots held, for a server without a KV cache; a cluster's
        replicas' mean); ``None`` once the server has failed."""
        self._running_here()
        if self._failure is not None:
            return None
        return self._engine.load().kv_cache_usage

    # ------------------------------------------------------------------ driving

    def start(self) -> None:
        """Start the clock now; call from inside the running event loop."""
        if self._loop is not None:
            raise RuntimeError("the driver has already been started")
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        self._origin_s = self._loop.time()
        self._unix_origin_s = time.time()

    def stop(self) -> None:
        """Advance to now one last time and stop.

        Unfinished requests stay as they are in the engine (the request table shows
        them unfinished at the stop time); their update queues end with ``None``.
        """
        if self._stopped:
            return
        self._advance()
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Streams of unfinished requests end now; their requests stay as they are.
        for live in self._unfinished.values():
            live.updates.put_nowait(None)
        self._release_unchecked()

    def submit(
        self, prompt_token_count: int, max_output_tokens: int, *, priority: int = 0
    ) -> LiveRequest:
        """Submit a request that arrives now; its id is the next number from 0.

        *priority* is the request's ``priority`` (a lower value runs first under the
        priority scheduler; other schedulers ignore it). Raises ``ValueError`` (or
        ``TypeError``) when the engine refuses the request, as ``submit`` does (for
        instance a prompt that can never fit the KV cache); nothing changes then.
        Raises :class:`~simsim.EngineFailedError` once the engine failed.
        """
        self._check_running()
        self._advance()
        if self._failure is not None:
            raise EngineFailedError(f"the simulation stopped: {self._failure}")
        now = self._env.now
        request = Request(
            self._next_id, now, prompt_token_count, max_output_tokens, priority=priority
        )
        self._engine.submit(request)
        self._next_id += 1
        if self._arriving_at != now:
            self._arriving.clear()
            self._arriving_at = now
        self._arriving.append(request)
        live = LiveRequest(request)
        self._unfinished[request.request_id] = live
        if self._engine.admission is None:
            live.checked.set()  # nothing can turn it away
        else:
            self._unchecked.append(live)
        self._actions.append(
            LiveAction(
                now,
                "submit",
                request.request_id,
                prompt_token_count,
                max_output_tokens,
                request.priority,
            )
        )
        self._env.process(self._watch(live))
        if self.observer is not None:
            self.observer.request_submitted(request)
        self._schedule()
        return live

    def cancel(self, request_id: int) -> bool:
        """Cancel the request now, if it is not terminal yet; ``True`` if it was cancelled."""
        if self._stopped or self._failure is not None:
            return False
        self._advance()
        live = self._unfinished.get(request_id)
        if live is None or live.request.is_terminal or self._failure is not None:
            return False
        self._engine.cancel_request(request_id)
        self._actions.append(LiveAction(self._env.now, "cancel", request_id))
        self._schedule()
        return True

    # ------------------------------------------------------------------ inside

    def _running_here(self) -> bool:
        """Whether the driver runs on this thread's loop now; raise from another thread.

        While the driver runs, the simulation belongs to its event loop's thread: read
        from elsewhere, its state could change under the reader's feet. Once stopped
        (or before it starts), any thread may read it.
        """
        if self._loop is None or self._stopped:
            return False
        if threading.get_ident() != self._thread_id:
            raise RuntimeError(
                "the live driver is running on another thread's event loop: read it from "
                "there (or from LiveServer.metrics_text()), or once the server has stopped"
            )
        return True

    def _check_running(self) -> None:
        if self._loop is None:
            raise RuntimeError("start() the driver inside the event loop first")
        if self._stopped:
            raise RuntimeError("the driver has been stopped")

    def _watch(self, live: LiveRequest) -> Generator[simpy.Event, Any, None]:
        """A SimPy process: passes each token of *live* to its queue, then the end."""
        engine, env, observer = self._engine, self._env, self.observer
        updates = live.updates
        rid = live.request_id
        number = 1
        previous_us: int | None = None
        while True:
            request = yield engine.token(rid, number)
            if request.generated_token_count < number:
                break
            now = env.now
            update = TokenUpdate(number, now)
            updates.put_nowait(update)
            if observer is not None:
                observer.token_generated(
                    request, update, None if previous_us is None else now - previous_us
                )
            previous_us = now
            number += 1
        self._unfinished.pop(rid, None)
        updates.put_nowait(None)
        if observer is not None:
            observer.request_ended(request)

    def _advance(self, minimum_us: int = 0) -> None:
        """Process every event before the current simulated time (at least *minimum_us*).

        One timestamp at a time, for at most :data:`SLICE_S` of wall time: a simulation
        with more events than the loop can process at this speed falls behind (see
        :meth:`lag_s`) instead of starving the HTTP server. It stops only between
        timestamps, so a submission made meanwhile arrives at a time whose events have
        all been processed or none, as with ``env.run(until=t)``.
        """
        loop = self._loop
        if self._stopped or self._failure is not None or loop is None:
            return
        target = max(self.now_us(), minimum_us)
        env = self._env
        deadline_s = loop.time() + SLICE_S
        try:
            while True:
                at = env.next_event_time()
                if at is None or at >= target:
                    if target > env.now:
                        env.run(until=target)
                    self._behind = False
                    break
                env.run(until=at + 1)
                if loop.time() >= deadline_s:
                    self._behind = True
                    break
        except Exception as error:  # the engine failed: every stream ends
            self._fail(error)
            return
        # Every arrival before now has been processed, and so checked.
        unchecked, now = self._unchecked, env.now
        while unchecked and unchecked[0].request.arrival_time_us < now:
            unchecked.popleft().checked.set()

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        for live in self._unfinished.values():
            live.updates.put_nowait(None)
        self._unfinished.clear()
        self._release_unchecked()

    def _release_unchecked(self) -> None:
        """The driver stops before some arrivals were checked: nobody waits on them."""
        while self._unchecked:
            self._unchecked.popleft().checked.set()

    def _schedule(self) -> None:
        """Set the loop timer for the microsecond after the next pending event.

        Behind real time, the next slice runs as soon as the loop has served
        everything else that is ready.
        """
        loop = self._loop
        if self._stopped or self._failure is not None or loop is None:
            return
        if self._behind:
            if self._timer is None or self._timer_due_us != _SOON:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer_due_us = _SOON
                self._timer = loop.call_soon(self._tick)
            return
        at = self._env.next_event_time()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        due = at + 1
        if self._timer is not None:
            if self._timer_due_us == due:
                return
            self._timer.cancel()
        self._timer_due_us = due
        self._timer = loop.call_at(self._origin_s + due / self._us_per_second, self._tick)

    def _tick(self) -> None:
        # The loop may run a timer up to its clock's resolution early: the timer's own
        # microsecond has come, whatever the float arithmetic says.
        self._timer = None
        self._advance(self._timer_due_us)
        self._schedule()


def replay(actions: Iterable[LiveAction], engine: Server, *, until_us: int | None = None) -> None:
    """Apply a served session's *actions* to a fresh *engine*, offline.

    Each action is preceded by ``env.run(until=its time)`` as the driver did; then the
    engine runs to *until_us* (``env.run(until=until_us)``, the driver's last time) or,
    without it, until nothing is pending. The engine's request table is then the
    served run's.
    """
    env = engine.env
    for action in actions:
        if action.time_us > env.now:
            env.run(until=action.time_us)
        if action.kind == "submit":
            engine.submit(
                Request(
                    action.request_id,
                    action.time_us,
                    action.prompt_token_count,
                    action.max_output_tokens,
                    priority=action.priority,
                )
            )
        else:
            engine.cancel_request(action.request_id)
    if until_us is None:
        engine.run()
    elif until_us > env.now:
        env.run(until=until_us)
