"""What a server is to its users: the :class:`Server` protocol, its load, its intake rules.

An engine (:class:`~simsim.engines.base.EngineBase`) and a cluster
(:class:`~simsim.Cluster`) are both servers: a SimPy model, the run recipe and the live
driver drive either one through :class:`Server` alone. Every server publishes one
:class:`ServerLoad` snapshot, which routers, the live driver and its metrics all read.
The rules a new request must pass at ``submit`` and the way an arrival is turned away
live here once, for engines and clusters alike.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

from simsim.errors import StaleEventError
from simsim.request import Request, RequestSpec, RequestState
from simsim.wording import counted

if TYPE_CHECKING:
    import pandas as pd
    from simpy.events import Event

    from simsim.admission import AdmissionControl
    from simsim.backend import Backend
    from simsim.clock import Environment
    from simsim.engines.events import LifecycleEvent

__all__ = [
    "LoadFigures",
    "Server",
    "ServerLoad",
    "cancel_before_arrival",
    "check_new_request",
    "check_request_lifetime",
    "is_server",
    "reject_at_arrival",
    "take_arrival",
    "unused_block_hashes",
]


class ServerLoad(NamedTuple):
    """A server's load at one simulated time, as routers, the live driver and metrics
    read it.

    ``queued_count``: requests that have arrived and wait for a slot (preempted ones,
    and on a decode replica the handed-over ones waiting for their KV transfer,
    included). ``running_count``: requests holding a slot. ``kv_cache_usage``: the
    fraction of KV-cache blocks held by requests, from 0 to 1 (cached prefix blocks
    nobody holds do not count); a server without a KV cache reports the fraction of its
    slots held, so the figure always means "how full is this server's memory for
    running requests". ``preemption_count``: preemptions so far (only a batching server
    with a KV cache preempts). A cluster's load sums its replicas' counts and averages
    their usage.
    """

    queued_count: int
    running_count: int
    kv_cache_usage: float
    preemption_count: int


LoadFigures = tuple[int, int, float, int]
"""A :class:`ServerLoad`'s figures in its field order, as a plain tuple: what the replica
port hands a router, which reads every replica's at each decision (a plain tuple costs a
third of a named one to make)."""


class Server(Protocol):
    """The public surface every simsim server has: an engine or a cluster of engines.

    A SimPy model submits requests, cancels them and waits on their events through
    these names only, so it runs unchanged on one engine or on a
    :class:`~simsim.Cluster`; ``simsim serve`` serves either one. To ask whether an
    object is one, call :func:`is_server` (``isinstance`` with a protocol would read the
    properties of a failed server, which raise).
    """

    @property
    def env(self) -> Environment:
        """The environment the server schedules on."""
        ...

    @property
    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        ...

    @property
    def failed(self) -> bool:
        """``True`` once the server has failed for good."""
        ...

    @property
    def has_pending_events(self) -> bool:
        """``True`` while the environment's heap holds any event."""
        ...

    @property
    def admission(self) -> AdmissionControl | None:
        """The admission control that checks each arrival, or ``None``."""
        ...

    @property
    def requests(self) -> Mapping[int, Request]:
        """A read-only mapping from request id to every submitted request."""
        ...

    @property
    def prefix_cache(self) -> bool:
        """Whether some part of the server shares cached prompt prefixes."""
        ...

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The most tokens one request may hold in the KV cache (``None``: no KV cache
        limits it)."""
        ...

    @property
    def admitted_count(self) -> int:
        """Admissions so far where requests enter the server (a readmission counts)."""
        ...

    @property
    def max_request_lifetime_us(self) -> int | None:
        """The longest a request's own work may take, checked at ``submit``."""
        ...

    @max_request_lifetime_us.setter
    def max_request_lifetime_us(self, value: int | None) -> None: ...

    def load(self) -> ServerLoad:
        """The server's load now."""
        ...

    def submit(self, request: Request | RequestSpec) -> Request:
        """Hand a pristine request (or a spec, made into a new request) to the server; it
        arrives at its arrival time."""
        ...

    def cancel_request(self, request_id: int) -> None:
        """Cancel a request that has not finished."""
        ...

    def completion(self, request_id: int) -> Event:
        """A SimPy event that succeeds with the request once it is terminal."""
        ...

    def token(self, request_id: int, n: int) -> Event:
        """A SimPy event for the request's *n*-th output token."""
        ...

    def first_token(self, request_id: int) -> Event:
        """``token(request_id, 1)``."""
        ...

    def rate_limit_refill_us(self, request_id: int) -> int | None:
        """How long until the request's group's token bucket holds a whole token."""
        ...

    def run(self) -> None:
        """Process events until nothing at all is pending."""
        ...

    def run_next_timestamp(self) -> int | None:
        """Process the events of the earliest pending time; return it."""
        ...

    def requests_frame(self) -> pd.DataFrame:
        """One row per request, in id order."""
        ...

    def events_frame(self) -> pd.DataFrame:
        """One row per processed lifecycle event."""
        ...

    def admissions_frame(self) -> pd.DataFrame:
        """One row per admission."""
        ...


_US_PER_YEAR = 365.25 * 24 * 3600 * 1_000_000

_SERVER_NAMES = ("submit", "cancel_request", "token", "completion", "load", "requests", "env")


def is_server(candidate: object) -> bool:
    """Whether *candidate*'s class has :class:`Server`'s main names (read from the
    class, so no property of a failed server is evaluated)."""
    kind = type(candidate)
    return all(hasattr(kind, name) for name in _SERVER_NAMES)


def check_new_request(
    request: object,
    known: Container[int],
    now_us: int,
    owner: str,
    shares_prefixes: Callable[[], bool],
) -> Request:
    """*request*, checked as a new submission to *owner* ("engine", "cluster").

    It must be a :class:`Request` (``TypeError``), pristine (``WAITING``, no tokens, no
    timestamps), with an id not in *known*, not submitted elsewhere, arriving no earlier
    than *now_us*, and with no ``block_hashes`` unless the server *shares_prefixes*
    (asked only then: this runs once per submitted request) (``ValueError``). Nothing
    changes when it fails.
    """
    if not isinstance(request, Request):
        raise TypeError(
            f"submit takes a simsim.Request or simsim.RequestSpec, got {type(request).__name__}"
        )
    fresh = request.is_fresh()
    if not fresh:
        request.validate()
    rid = request.request_id
    if rid in known:
        raise ValueError(f"request {rid} was already submitted to this {owner}")
    if request._pending is not None or request._event is not None:
        raise ValueError(f"request {rid} is already submitted to another engine")
    if not fresh and not request.is_pristine:
        raise ValueError(
            f"request {rid} is not pristine (state {request.state.name}, "
            f"{counted(request.generated_token_count, 'token')}, "
            f"admit={request.admit_time_us}, "
            f"prefill_end={request.prefill_end_time_us}, "
            f"first_token={request.first_token_time_us}, finish={request.finish_time_us}); "
            "submit a new WAITING request with no tokens and no timestamps"
        )
    if request.arrival_time_us < now_us:
        raise ValueError(
            f"request {rid} arrives at {request.arrival_time_us} us, before the current "
            f"time {now_us} us"
        )
    if request.block_hashes is not None and not shares_prefixes():
        why = (
            "this server has no prefix cache"
            if owner == "engine"
            else "no replica of this cluster has a prefix cache"
        )
        raise ValueError(unused_block_hashes(rid, why))
    return request


def check_request_lifetime(request: Request, backend: Backend, limit_us: int) -> None:
    """Refuse *request* (``ValueError``) if its own work alone on *backend* (a prefill,
    then one decode step per output token, each priced for a batch of one) would take
    more than *limit_us*. A backend that answers a non-``int`` is left to the engine's
    own checks."""
    prefill = backend.prefill_us(request.prompt_token_count, 1)
    step = backend.decode_step_us(1)
    if type(prefill) is not int or type(step) is not int:
        return
    least_us = prefill + request.max_output_tokens * step
    if least_us > limit_us:
        raise ValueError(
            f"a request of {request.prompt_token_count} prompt tokens and "
            f"{request.max_output_tokens} output tokens would run for at least "
            f"{least_us} us (its prefill and one decode step per token), more than the "
            f"server simulates for one request (max_request_lifetime_us = {limit_us} us, "
            f"about {limit_us / _US_PER_YEAR:,.0f} years)"
        )


def unused_block_hashes(request_id: int, why: str) -> str:
    """The refusal of request *request_id*'s ``block_hashes`` where nothing uses them
    (*why*: "this server has no prefix cache", say): they would be silently ignored."""
    return (
        f"request {request_id} has block_hashes, but {why} to use them; they would be "
        "ignored (a BatchingEngine with a kv_cache and prefix_cache=True shares the blocks "
        "they name): leave them out, or give the server a prefix cache"
    )


def reject_at_arrival(request: Request, reason: str, now_us: int) -> None:
    """The admission control turned *request* away as it arrived at *now_us*: it ends
    ``CANCELLED`` with *reason* as its ``rejection`` (the caller logs its arrival)."""
    request.transition_to(RequestState.CANCELLED, now_us)
    request.rejection = reason
    request._event = None


def cancel_before_arrival(request: Request, now_us: int, authorized: dict[int, object]) -> None:
    """Cancel *request*, whose arrival has not been processed: it becomes ``CANCELLED``
    at *now_us*, and its pending arrival alone is authorized (in *authorized*) to be
    consumed later without effect."""
    pending = request._pending
    request.transition_to(RequestState.CANCELLED, now_us)
    authorized[request.request_id] = pending
    request._pending = request._event = None


def take_arrival(event: LifecycleEvent, authorized: dict[int, object]) -> Request | None:
    """The request whose arrival *event* is, now marked arrived; ``None`` for an arrival
    a cancellation authorized to be consumed without effect (the authorization is spent).
    Any other event its request does not wait for raises :class:`~simsim.errors.StaleEventError`."""
    request = event.request
    if request._pending is not event:
        rid = request.request_id
        if authorized.get(rid) is event and request.state is RequestState.CANCELLED:
            del authorized[rid]
            return None
        raise StaleEventError(
            f"request {rid} ({request.state.name}) was not waiting for its arrival "
            f"(sequence {event.sequence}) at {event.env.now} us"
        )
    request._pending = None
    return request
