"""A cluster: replicas of a server on one environment, and a router in front of them.

:class:`Cluster` has an engine's surface (``submit``, ``cancel_request``,
``completion``, ``token``, ``run``, ``requests`` and the frames), so a SimPy model
drives it exactly as it drives one engine. A submitted request waits, held back like an
engine's own arrivals, until its arrival time; then its arrival event routes it: the
router reads the replicas' :class:`~simsim.cluster.routers.ReplicaSnapshot` objects and
names one replica, and the request arrives there inside that same event, as it would
on that engine alone. Every request is routed once, at its arrival time, in the order
of the arrival events (time, then submission order), so a run is deterministic.

With an :class:`~simsim.AdmissionControl` (``admission=``), the arrival event checks
the request first: a rejected request ends ``CANCELLED`` there and is never routed
(:mod:`simsim.admission`); the replicas share the cluster's running counts.

Snapshots are taken at a routing decision when the last ones are at least
``refresh_interval_us`` old (``0``: at every decision). Between two refreshes the
router sees the load as it was, even the requests it has routed since.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NoReturn, overload

from simpy.events import Event

from simsim.admission import (
    AdmissionControl,
    AdmissionGate,
    append_rejection,
    check_admission,
)
from simsim.clock import Environment, check_count
from simsim.cluster.routers import (
    PrefixAffinityRouter,
    ReplicaSnapshot,
    Router,
    WeightedRouter,
    make_router,
)
from simsim.engines.arrivals import PendingArrivals
from simsim.engines.base import EngineBase
from simsim.engines.events import LifecycleEvent
from simsim.engines.port import PrefixLookup, ReplicaPort
from simsim.engines.server import (
    LoadFigures,
    ServerLoad,
    cancel_before_arrival,
    check_new_request,
    check_request_lifetime,
    reject_at_arrival,
    take_arrival,
)
from simsim.errors import (
    EngineFailedError,
    InvalidTransitionError,
    StaleEventError,
    UnknownRequestError,
)
from simsim.records import EventLog, EventType
from simsim.request import Request, RequestSpec, submitted_request
from simsim.wording import counted

if TYPE_CHECKING:
    import pandas as pd

    from simsim.engines.server import Server

__all__ = ["Cluster"]

_UNROUTED = -1

# Each merged frame's method on a replica, and the log it has one row per entry of.
_LOGS = {
    "events_frame": "event_log",
    "admissions_frame": "admission_log",
    "iterations_frame": "iteration_log",
}


_Probe = tuple[Callable[[], LoadFigures], int, PrefixLookup | None]


def _probe(engine: EngineBase) -> _Probe:
    """How a snapshot reads *engine*: its load, its slot count, its prefix cache."""
    port = engine.replica_port
    return port.load, engine.max_active_requests, port.prefix_lookup()


def check_prefix_router(router: Router, replicas: Sequence[EngineBase], pool: str) -> None:
    """Refuse a router that routes by prefixes alone in front of *replicas* none of which
    has a prefix cache: a :class:`~simsim.cluster.routers.PrefixAffinityRouter`, or a
    :class:`~simsim.cluster.routers.WeightedRouter` whose only weight is ``prefix``. It
    would route by nothing (every request to the least loaded) while claiming to follow
    prefixes. (A weighted router that also weighs load only loses a constant term.)
    Checked before the cluster changes anything."""
    if isinstance(router, PrefixAffinityRouter):
        what = "sends a request where its prefix is cached"
    elif isinstance(router, WeightedRouter) and not any(
        weight for name, weight in router.weights.items() if name != "prefix"
    ):
        what = "scores replicas only by the cached prefix of a request"
    else:
        return
    if any(engine.prefix_cache for engine in replicas):
        return
    raise ValueError(
        f"router {router!r} {what}, and none of the {len(replicas)} {pool} has a prefix "
        "cache (BatchingEngine(..., kv_cache=..., prefix_cache=True)): it would send every "
        "request to the least loaded; use 'least_outstanding' for that, or give the "
        "replicas a prefix cache"
    )


class _FreshSnapshots(Sequence[ReplicaSnapshot]):
    """The replicas' snapshots for one decision, each taken when the router first reads
    it (a router that reads two replicas pays for two)."""

    __slots__ = ("_probes", "_taken", "_time_us")

    def __init__(self, probes: list[_Probe], now: int) -> None:
        self._probes = probes
        self._time_us = now
        self._taken: list[ReplicaSnapshot | None] = [None] * len(probes)

    def __len__(self) -> int:
        return len(self._probes)

    @overload
    def __getitem__(self, position: int) -> ReplicaSnapshot: ...

    @overload
    def __getitem__(self, position: slice) -> Sequence[ReplicaSnapshot]: ...

    def __getitem__(self, position: int | slice) -> ReplicaSnapshot | Sequence[ReplicaSnapshot]:
        if isinstance(position, slice):
            return [self[i] for i in range(len(self._probes))[position]]
        if position < 0:
            position += len(self._probes)
        return self._taken[position] or self._take(position)

    def __iter__(self) -> Iterator[ReplicaSnapshot]:
        taken = self._taken
        for position in range(len(taken)):
            yield taken[position] or self._take(position)

    def _take(self, position: int) -> ReplicaSnapshot:
        """Read the replica at *position* now and keep its snapshot for this decision."""
        load, slots, lookup = self._probes[position]
        queued, running, usage, _ = load()
        snapshot = ReplicaSnapshot(position, self._time_us, queued, running, slots, usage, lookup)
        self._taken[position] = snapshot
        return snapshot


class _RouterView:
    """A router, the replicas it chooses among, and the snapshots it last saw."""

    __slots__ = ("pool", "probes", "router", "snapshot_time", "snapshots")

    def __init__(self, router: Router, pool: tuple[int, ...]) -> None:
        self.router = router
        self.pool = pool  # indices in Cluster.replicas
        self.probes: list[_Probe] = []
        self.snapshots: Sequence[ReplicaSnapshot] = ()
        self.snapshot_time = 0


class Cluster:
    """Replicas of any simsim server behind one router, on one environment.

    ``Cluster(replicas, router="round_robin", *, refresh_interval_us=0,
    admission=None)``: *replicas* are engines (``SimulationEngine``,
    ``FastSimulationEngine``, ``BatchingEngine``, in any mix) built on the same
    :class:`~simsim.Environment`, with nothing submitted yet and no admission control
    of their own; submit through the cluster only. An
    :class:`~simsim.AdmissionControl` as *admission* checks each request once, at its
    arrival, before routing. *router* is a
    :class:`~simsim.cluster.routers.Router` or the name of a built-in one (see
    :data:`~simsim.cluster.routers.ROUTERS`). Request ids are unique across the
    cluster. A request is checked at ``submit`` against every replica it could be
    routed to, so routing never refuses it.
    """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {counted(len(self._replicas), 'replica')}>"

    def __init__(
        self,
        replicas: Sequence[EngineBase],
        router: Router | str = "round_robin",
        *,
        refresh_interval_us: int = 0,
        admission: AdmissionControl | None = None,
    ) -> None:
        engines = self._check_replicas(replicas, "replicas")
        front = make_router(router)
        check_prefix_router(front, engines, "replicas")
        view = _RouterView(front, tuple(range(len(engines))))
        self._setup(engines, view, refresh_interval_us, admission)

    @staticmethod
    def _check_replicas(replicas: Sequence[EngineBase], name: str) -> tuple[EngineBase, ...]:
        if isinstance(replicas, EngineBase) or not isinstance(replicas, Sequence):
            raise TypeError(f"{name} must be a sequence of engines, got {replicas!r}")
        engines = tuple(replicas)
        if not engines:
            raise ValueError(f"{name} is empty: a cluster needs at least one replica")
        for index, engine in enumerate(engines):
            if not isinstance(engine, EngineBase):
                raise TypeError(
                    f"{name}[{index}] is {engine!r}, not a simsim engine "
                    "(SimulationEngine, FastSimulationEngine or BatchingEngine)"
                )
            if engine.env is not engines[0].env:
                raise ValueError(
                    f"{name}[{index}] runs on another environment than {name}[0]; build every "
                    "replica with the same env=simsim.Environment()"
                )
            if engine.requests:
                raise ValueError(
                    f"{name}[{index}] already has "
                    f"{counted(len(engine.requests), 'submitted request')}; "
                    "a replica must be new, and requests submitted through the cluster only"
                )
            cluster = engine.replica_port.cluster
            if cluster is not None:
                raise ValueError(
                    f"{name}[{index}] is already a replica of {cluster!r}; "
                    "an engine serves one cluster"
                )
            if engine.admission is not None:
                raise ValueError(
                    f"{name}[{index}] has an admission control of its own; a replica's is "
                    "never consulted, so give admission= to the cluster, which checks each "
                    "request once before routing"
                )
        seen: set[int] = set()
        for index, engine in enumerate(engines):
            if id(engine) in seen:
                raise ValueError(
                    f"{name}[{index}] is listed twice; every replica is its own engine"
                )
            seen.add(id(engine))
        return engines

    def _setup(
        self,
        replicas: tuple[EngineBase, ...],
        front: _RouterView,
        refresh_interval_us: int,
        admission: AdmissionControl | None = None,
    ) -> None:
        admission = check_admission(admission)
        refresh_us = check_count(refresh_interval_us, "refresh_interval_us")
        self._replicas = replicas
        self._ports: tuple[ReplicaPort, ...] = tuple(engine.replica_port for engine in replicas)
        self._env = replicas[0].env
        self._replica_failed = False  # set by a replica's failure: see _check_alive
        # Checked here at each arrival; the replicas keep its queue counts (admission
        # and cancellation of a request that never was admitted).
        self._admission = admission
        self._gate: AdmissionGate | None = None if admission is None else admission.gate()
        for port in self._ports:
            port.join(self, self._note_replica_failure, self._gate)
        self._front = front  # routes arrivals
        front.probes = [_probe(replicas[index]) for index in front.pool]
        # What submit checks: each replica's own rule, once per distinct rule (replicas
        # of one kind with one KV cache refuse the same requests).
        self._admission_checks: list[tuple[int, Callable[[Request], None]]] = []
        rules: set[Hashable] = set()
        for index, port in enumerate(self._ports):
            rule = port.admission_rule()
            if rule is not None and rule not in rules:
                rules.add(rule)
                self._admission_checks.append((index, port.check_admissible))
        # Hashes are used wherever a request meets a prefix cache, on any replica.
        self._shares_prefixes = any(engine.prefix_cache for engine in replicas)
        self._max_lifetime_us: int | None = None
        # Each distinct backend once: the lifetime limit prices a request on each.
        self._backends = tuple({id(engine.backend): engine.backend for engine in replicas}.values())
        self._refresh_us = refresh_us
        self._rejected = EventLog()  # the arrivals of rejected requests
        self._requests: dict[int, Request] = {}
        # request id -> index of the replica that holds it now (routed requests only)
        self._holder: dict[int, int] = {}
        self._authorized: dict[int, object] = {}
        self._arrivals = PendingArrivals(self._env, (self._on_arrival,), self._authorized)
        self._completions: dict[int, Event] = {}  # for requests not routed yet
        self._token_waiters: dict[int, dict[int, Event]] = {}
        self._route_times: array[int] = array("q")
        self._route_ids: array[int] = array("q")
        self._route_replicas: array[int] = array("q")
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ accessors

    @property
    def env(self) -> Environment:
        """The environment every replica schedules on."""
        return self._env

    @property
    def replicas(self) -> tuple[EngineBase, ...]:
        """The replicas, in index order."""
        return self._replicas

    @property
    def router(self) -> Router:
        """The routing policy (for a disaggregated cluster, the prefill pool's)."""
        return self._front.router

    @property
    def admission(self) -> AdmissionControl | None:
        """The admission control that checks each arrival before routing, or ``None``."""
        return self._admission

    @property
    def refresh_interval_us(self) -> int:
        """How old the router's snapshots may get before a decision refreshes them."""
        return self._refresh_us

    @property
    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        return self._env.now

    @property
    def failed(self) -> bool:
        """``True`` once routing or a replica has failed for good."""
        return self._failure is not None or self._replica_failed

    @property
    def has_pending_events(self) -> bool:
        """``True`` while the environment's heap holds any event."""
        return self._env.next_event_time() is not None

    @property
    def requests(self) -> Mapping[int, Request]:
        """A read-only mapping from request id to every submitted :class:`Request`."""
        self._check_alive()
        self._bring_up_to_date()
        return MappingProxyType(self._requests)

    def rate_limit_refill_us(self, request_id: int) -> int | None:
        """How long from now until the token bucket of *request_id*'s class (or tenant)
        holds a whole token, in microseconds, as :meth:`EngineBase.rate_limit_refill_us
        <simsim.engines.base.EngineBase.rate_limit_refill_us>` says for an engine: the
        cluster's admission control is the one that checks its arrivals."""
        self._check_alive()
        request = self._requests[self._known(request_id)]
        gate = self._gate
        return None if gate is None else gate.refill_us(request, self._env.now)

    def load(self) -> ServerLoad:
        """The cluster's load now: its replicas' queued, running and preemption counts
        summed, and their KV-cache usage averaged (each replica weighs the same)."""
        self._check_alive()
        queued = running = preempted = 0
        usage = 0.0
        for port in self._ports:
            queued_here, running_here, usage_here, preempted_here = port.load()
            queued += queued_here
            running += running_here
            usage += usage_here
            preempted += preempted_here
        return ServerLoad(queued, running, usage / len(self._ports), preempted)

    @property
    def prefix_cache(self) -> bool:
        """Whether any replica has a prefix cache (requests may then carry
        ``block_hashes``)."""
        return self._shares_prefixes

    def _prefixes_shared(self) -> bool:
        """:attr:`prefix_cache`, asked by the submit checks only of a request with
        ``block_hashes``."""
        return self._shares_prefixes

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The most tokens one request may hold in the KV cache of every replica that
        has one (the smallest cache), or ``None`` when no replica has a KV cache."""
        capacities = [
            tokens
            for tokens in (e.kv_capacity_tokens for e in self._replicas)
            if tokens is not None
        ]
        return min(capacities) if capacities else None

    @property
    def admitted_count(self) -> int:
        """Admissions so far on the replicas requests are routed to first (for a
        disaggregated cluster, the prefill replicas); a readmission counts again."""
        self._check_alive()
        return sum(self._replicas[index].admitted_count for index in self._front.pool)

    @property
    def max_request_lifetime_us(self) -> int | None:
        """The longest a request's own work may take on any replica, checked at
        :meth:`submit` against each replica's backend (``None``: no limit); see
        :attr:`EngineBase.max_request_lifetime_us
        <simsim.engines.base.EngineBase.max_request_lifetime_us>`."""
        return self._max_lifetime_us

    @max_request_lifetime_us.setter
    def max_request_lifetime_us(self, value: int | None) -> None:
        self._max_lifetime_us = (
            None if value is None else check_count(value, "max_request_lifetime_us", minimum=1)
        )

    def replica_of(self, request_id: int) -> int | None:
        """The index of the replica that holds the request now (for a disaggregated
        cluster, the decode replica once handed over), or ``None`` before routing."""
        self._check_alive()
        rid = self._known(request_id)
        return self._holder.get(rid)

    # ------------------------------------------------------------------ driving

    def submit(self, request: Request | RequestSpec) -> Request:
        """Hand a pristine *request* to the cluster; it is routed at its arrival time.

        The same checks as an engine's ``submit`` (id new to the cluster), plus every
        replica the request could be routed to must be able to run it; ``ValueError``
        (``TypeError`` for a non-:class:`Request`) and nothing changes otherwise.
        Returns the same object (a :class:`RequestSpec` becomes a new such request).
        """
        request = submitted_request(request)
        self._check_alive()
        request = check_new_request(
            request, self._requests, self._env.now, "cluster", self._prefixes_shared
        )
        rid = request.request_id
        limit_us = self._max_lifetime_us
        if limit_us is not None:
            for backend in self._backends:
                check_request_lifetime(request, backend, limit_us)
        for index, check in self._admission_checks:
            try:
                check(request)
            except ValueError as error:
                raise ValueError(f"replica {index}: {error}") from None
        self._arrivals.add(request)
        self._requests[rid] = request
        return request

    def cancel_request(self, request_id: int) -> None:
        """Cancel a request that has not finished, wherever it is; as on an engine."""
        self._check_alive()
        rid = self._known(request_id)
        holder = self._holder.get(rid)
        if holder is not None:
            self._replicas[holder].cancel_request(rid)
            return
        request = self._requests[rid]
        if request.is_terminal:
            raise InvalidTransitionError(
                f"request {rid} is already {request.state.name}; only a WAITING, PREFILLING, "
                "DECODING or PREEMPTED request can be cancelled"
            )
        # Not arrived yet: its arrival event will come up and be ignored.
        cancel_before_arrival(request, self._env.now, self._authorized)
        self._notify_unrouted(request)

    def _notify_unrouted(self, request: Request) -> None:
        """*request*, never routed, is terminal: its completion and token events fire."""
        rid = request.request_id
        event = self._completions.get(rid)
        if event is not None and not event.triggered:
            event.succeed(request)
        for _, waiting in sorted(self._token_waiters.pop(rid, {}).items()):
            waiting.succeed(request)

    def completion(self, request_id: int) -> Event:
        """A SimPy event that succeeds with the :class:`Request` once it is terminal."""
        self._check_alive()
        rid = self._known(request_id)
        holder = self._holder.get(rid)
        if holder is not None:
            return self._replicas[holder].completion(rid)
        event = self._completions.get(rid)
        if event is None:
            request = self._requests[rid]
            terminal = request.is_terminal
            event = self._env.processed_event(request) if terminal else Event(self._env)
            self._completions[rid] = event
        return event

    def token(self, request_id: int, n: int) -> Event:
        """A SimPy event for the request's *n*-th output token, as on an engine."""
        self._check_alive()
        rid = self._known(request_id)
        holder = self._holder.get(rid)
        if holder is not None:
            return self._replicas[holder].token(rid, n)
        number = check_count(n, "n", minimum=1)
        request = self._requests[rid]
        for index in self._front.pool:  # whichever it is routed to must give token events
            self._ports[index].check_token_events(request)
        if request.is_terminal:
            return self._env.processed_event(request)
        waiters = self._token_waiters.setdefault(rid, {})
        waiting = waiters.get(number)
        if waiting is None:
            waiting = waiters[number] = Event(self._env)
        return waiting

    def first_token(self, request_id: int) -> Event:
        """``token(request_id, 1)``."""
        return self.token(request_id, 1)

    def run(self) -> None:
        """Process events until nothing at all is pending."""
        self._check_alive()
        self._env.drain()

    def run_next_timestamp(self) -> int | None:
        """Process every event at the earliest pending time T (every replica's); returns
        T, or ``None`` when nothing is pending."""
        self._check_alive()
        env = self._env
        at = env.next_event_time()
        if at is None:
            return None
        while env.next_event_time() == at:
            env.step()
        return at

    # ------------------------------------------------------------------ routing

    def _on_arrival(self, event: LifecycleEvent) -> None:
        self._arrivals.popped()
        try:
            arrived = take_arrival(event, self._authorized)
        except StaleEventError as error:
            self._fail_with(error)
        if arrived is None:
            return  # cancelled before it arrived
        request = arrived
        if self._gate is not None:
            reason = self._gate.arrive(request, self._env.now)
            if reason is not None:
                self._reject(request, reason, event.sequence)
                return
        index = self._route(request, self._front)
        self._hand_to(request, index)
        self._ports[index].accept_routed(request, event.sequence)

    def _reject(self, request: Request, reason: str, sequence: int) -> None:
        """The admission control turned *request* away as it arrived: it ends
        ``CANCELLED`` with its reason, unrouted; only its arrival is logged."""
        now = self._env.now
        reject_at_arrival(request, reason, now)
        self._rejected.append(now, sequence, EventType.REQUEST_ARRIVAL, request.request_id)
        self._notify_unrouted(request)

    def _route(self, request: Request, view: _RouterView) -> int:
        """Ask *view*'s router; returns the chosen replica's index in :attr:`replicas`."""
        now = self._env.now
        snapshots = view.snapshots
        pool = view.pool
        if not snapshots or self._refresh_us == 0 or now >= view.snapshot_time + self._refresh_us:
            snapshots = view.snapshots = self._take_snapshots(view, now)
            view.snapshot_time = now
        try:
            choice = view.router.route(request, snapshots)
        except BaseException as error:
            if self._failure is None:
                self._failure = error
            raise
        if type(choice) is not int and not isinstance(choice, bool):
            index = getattr(type(choice), "__index__", None)
            choice = index(choice) if index is not None else choice  # NumPy integers
        if type(choice) is not int or not 0 <= choice < len(pool):
            self._fail_with(
                ValueError(
                    f"router {view.router!r} answered {choice!r} for request "
                    f"{request.request_id}; it must be an int index from 0 to {len(pool) - 1}"
                )
            )
        index = pool[choice]
        self._route_times.append(now)
        self._route_ids.append(request.request_id)
        self._route_replicas.append(index)
        return index

    def _take_snapshots(self, view: _RouterView, now: int) -> Sequence[ReplicaSnapshot]:
        if self._refresh_us == 0:
            # Read within this decision only: each snapshot is taken when first read.
            return _FreshSnapshots(view.probes, now)
        snapshots = []
        for position, (load, slots, lookup) in enumerate(view.probes):
            queued, running, usage, _ = load()
            if lookup is not None:  # the cache as it is now, not as it will be
                lookup = self._ports[view.pool[position]].frozen_prefix_lookup()
            snapshots.append(ReplicaSnapshot(position, now, queued, running, slots, usage, lookup))
        return tuple(snapshots)

    def _hand_to(self, request: Request, index: int) -> None:
        """*request* is about to be on replica *index*: move its waiters there."""
        rid = request.request_id
        previous = self._holder.get(rid)
        self._holder[rid] = index
        if previous is None:
            waiters = (self._completions.pop(rid, None), self._token_waiters.pop(rid, None))
        else:
            waiters = self._ports[previous].take_waiters(rid)
        self._ports[index].give_waiters(rid, waiters)

    # ------------------------------------------------------------------ frames

    def requests_frame(self) -> pd.DataFrame:
        """One row per submitted request, in id order, with the engine columns and
        ``replica`` (the index it was routed to; ``<NA>`` if it never was);
        ``rejection`` is appended with an admission control, and
        ``cached_prompt_tokens`` when any replica has a prefix cache."""
        import pandas as pd

        frame = self._base_frame()
        frame["replica"] = pd.array(
            [self._holder.get(rid) for rid in frame["request_id"]], dtype="Int64"
        )
        return frame

    def _base_frame(self) -> pd.DataFrame:
        self._check_alive()
        self._bring_up_to_date()
        import pandas as pd

        from simsim.results import requests_frame

        frame = requests_frame(self._requests)
        if self._admission is not None:
            append_rejection(frame, self._requests)
        if self._shares_prefixes:
            counts = [self._requests[rid].cached_prompt_token_count for rid in frame["request_id"]]
            frame["cached_prompt_tokens"] = pd.array(counts, dtype="int64")
        return frame

    def routes_frame(self) -> pd.DataFrame:
        """One row per routing decision, in order: ``timestamp_us, request_id, replica``."""
        self._check_alive()
        import pandas as pd

        return pd.DataFrame(
            {
                "timestamp_us": pd.array(self._route_times, dtype="int64"),
                "request_id": pd.array(self._route_ids, dtype="int64"),
                "replica": pd.array(self._route_replicas, dtype="int64"),
            }
        )

    def events_frame(self) -> pd.DataFrame:
        """Every replica's event log in one frame with a ``replica`` column, ordered by
        ``(timestamp_us, sequence)`` (sequence numbers are the environment's, unique).

        With an admission control, the arrivals of rejected requests are there too, with
        ``replica`` ``<NA>`` (the column is then ``Int64``)."""
        order = ["timestamp_us", "sequence"]
        frame = self._merged("events_frame", order)
        if self._admission is None:
            return frame
        import pandas as pd

        from simsim.results import events_frame

        rejected = events_frame(self._rejected)
        rejected["replica"] = pd.array([None] * len(rejected), dtype="Int64")
        frame["replica"] = frame["replica"].astype("Int64")
        merged = pd.concat([frame, rejected], ignore_index=True)
        ordered: pd.DataFrame = merged.sort_values(order, kind="stable", ignore_index=True)
        return ordered

    def admissions_frame(self) -> pd.DataFrame:
        """Every replica's admissions with a ``replica`` column, in time order."""
        return self._merged("admissions_frame", ["timestamp_us"])

    def iterations_frame(self) -> pd.DataFrame:
        """Every batching replica's iterations with a ``replica`` column, by start time."""
        return self._merged("iterations_frame", ["start_us"], batching_only=True)

    def _merged(self, method: str, order: list[str], batching_only: bool = False) -> pd.DataFrame:
        self._check_alive()
        import pandas as pd

        # A frame per replica cost seconds with thousands of idle ones. An idle replica
        # adds no row, only its columns, which are those of every replica of its kind:
        # the first replica of each kind stands for the idle ones, in replica order, so
        # the columns come out in the same order with the same dtypes (pandas widens a
        # column that some frame lacks, even an empty one) and the rows are the same.
        log = _LOGS[method]
        kinds: set[tuple[type, bool]] = set()
        frames = []
        for index, engine in self._indexed(batching_only):
            kind = (type(engine), engine.prefix_cache)
            if kind in kinds and not len(getattr(engine, log)):
                continue
            kinds.add(kind)
            frame = getattr(engine, method)()
            frame["replica"] = pd.array([index] * len(frame), dtype="int64")
            frames.append(frame)
        if not frames:
            raise ValueError(f"{method}: no replica of this cluster is a BatchingEngine")
        merged = pd.concat(frames, ignore_index=True)
        ordered: pd.DataFrame = merged.sort_values(order, kind="stable", ignore_index=True)
        return ordered

    def _indexed(self, batching_only: bool) -> Iterator[tuple[int, EngineBase]]:
        for index, engine in enumerate(self._replicas):
            if not batching_only or hasattr(engine, "iterations_frame"):
                yield index, engine

    # ------------------------------------------------------------------ internals

    def _known(self, request_id: int) -> int:
        rid = check_count(request_id, "request_id")
        if rid not in self._requests:
            raise UnknownRequestError(f"request {rid} was never submitted to this cluster")
        return rid

    def _bring_up_to_date(self) -> None:
        for engine in self._replicas:
            engine.requests  # noqa: B018 (FastSimulationEngine works out progress here)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise EngineFailedError(
                f"the cluster failed earlier ({type(self._failure).__name__}: {self._failure})"
            ) from self._failure
        if not self._replica_failed:
            return  # told by the replicas: no scan of every replica per call
        for index, engine in enumerate(self._replicas):
            if engine.failed:
                try:
                    engine.requests  # noqa: B018 (raises the replica's EngineFailedError)
                except EngineFailedError as error:
                    raise EngineFailedError(f"replica {index} failed: {error}") from error

    def _note_replica_failure(self) -> None:
        self._replica_failed = True

    def _fail_with(self, error: BaseException) -> NoReturn:
        if self._failure is None:
            self._failure = error
        raise error


if TYPE_CHECKING:

    def _both_are_servers(cluster: Cluster, engine: EngineBase) -> tuple[Server, Server]:
        # mypy checks here that a cluster and an engine both have Server's surface.
        return cluster, engine
