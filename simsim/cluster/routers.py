"""Routing policies: which replica of a cluster takes an arriving request.

A router sees the replicas only through :class:`ReplicaSnapshot` objects, which the
cluster refreshes at most once every ``refresh_interval_us`` (``0``: before every
decision), the way a real router reads load that is a little old. It answers the index
of the replica, ``0 <= index < len(replicas)``. Every built-in router breaks ties the
same way: fewer outstanding requests first, then, among replicas still tied, the first
one at or after the replica following its previous choice, in cyclic order (so equally
loaded replicas take turns instead of the first one taking every tie). A run is
deterministic; the two routers that draw at random use their own seeded generator.

Write your own by giving any object a ``route(request, replicas) -> int`` method
(:class:`Router`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from simsim.checks import check_real
from simsim.clock import check_count
from simsim.registry import Registry

if TYPE_CHECKING:
    from simsim.request import Request

__all__ = [
    "ROUTERS",
    "SCORERS",
    "LeastKvCacheRouter",
    "LeastOutstandingRouter",
    "PowerOfTwoRouter",
    "PrefixAffinityRouter",
    "RandomRouter",
    "ReplicaSnapshot",
    "RoundRobinRouter",
    "Router",
    "WeightedRouter",
    "make_router",
    "register_router",
]


class ReplicaSnapshot(NamedTuple):
    """What a router knows of one replica, as of :attr:`taken_at_us`.

    ``replica`` is its position in the sequence the router is given (the answer that
    chooses it).
    ``outstanding = queued + running``: requests routed to the replica that are not
    finished or cancelled (a request routed there arrives at once). ``kv_cache_usage``
    is the fraction of KV-cache blocks held, from 0 to 1 (a replica without a KV cache
    reports the fraction of its slots held). ``prefix_lookup`` answers
    :meth:`cached_prefix_blocks` (``None``: the replica has no prefix cache).
    """

    replica: int
    taken_at_us: int
    queued: int
    running: int
    max_active_requests: int
    kv_cache_usage: float
    prefix_lookup: Callable[[Sequence[Hashable]], int] | None = None

    @property
    def outstanding(self) -> int:
        """Requests on the replica that are not terminal: ``queued + running``."""
        return self.queued + self.running

    def cached_prefix_blocks(self, block_hashes: Sequence[Hashable] | None) -> int:
        """How many of *block_hashes*, from the first, name blocks the replica's prefix
        cache held when the snapshot was taken (``0`` without a prefix cache)."""
        if not block_hashes or self.prefix_lookup is None:
            return 0
        return self.prefix_lookup(block_hashes)


@runtime_checkable
class Router(Protocol):
    """Chooses the replica for each arriving request."""

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The position of the replica that takes *request* (``replicas[i].replica == i``)."""
        ...


class _TakingTurns:
    """The tie-break every built-in router ends with (see the module's docs)."""

    _after = 0  # the position after the previous choice: ties go there first

    def _least_loaded(self, candidates: Sequence[ReplicaSnapshot], count: int) -> int:
        """Fewest outstanding among *candidates*; ties to the first at or after
        :attr:`_after` in cyclic order over *count* replicas. Records the choice."""
        start = self._after
        best = candidates[0]
        best_key = (best.outstanding, (best.replica - start) % count)
        for snapshot in candidates:
            key = (snapshot.outstanding, (snapshot.replica - start) % count)
            if key < best_key:
                best, best_key = snapshot, key
        self._after = (best.replica + 1) % count
        return best.replica


class RoundRobinRouter:
    """Replica ``k mod n`` takes the ``k``-th routed request (``k`` from 0)."""

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The next replica in turn."""
        index = self._next % len(replicas)
        self._next = index + 1
        return index

    def __repr__(self) -> str:
        return "RoundRobinRouter()"


class RandomRouter:
    """A uniformly random replica, drawn from ``random.Random(seed)``."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_count(seed, "seed")
        self._random = random.Random(self.seed)

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """``randrange(n)``."""
        return self._random.randrange(len(replicas))

    def __repr__(self) -> str:
        return f"RandomRouter(seed={self.seed})"


class LeastOutstandingRouter(_TakingTurns):
    """Join the shortest queue: ``argmin outstanding``, ties taking turns."""

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The replica with the fewest outstanding requests."""
        return self._least_loaded(replicas, len(replicas))

    def __repr__(self) -> str:
        return "LeastOutstandingRouter()"


class LeastKvCacheRouter(_TakingTurns):
    """``argmin kv_cache_usage``, ties to fewer outstanding, then taking turns."""

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The replica with the emptiest KV cache."""
        low = min(snapshot.kv_cache_usage for snapshot in replicas)
        return self._least_loaded([s for s in replicas if s.kv_cache_usage == low], len(replicas))

    def __repr__(self) -> str:
        return "LeastKvCacheRouter()"


class PowerOfTwoRouter(_TakingTurns):
    """Two distinct replicas drawn at random (``random.Random(seed).sample``); the one
    with fewer outstanding requests takes the request, ties taking turns."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_count(seed, "seed")
        self._random = random.Random(self.seed)

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The less loaded of two random replicas."""
        if len(replicas) == 1:
            return 0
        first, second = self._random.sample(range(len(replicas)), 2)
        return self._least_loaded([replicas[first], replicas[second]], len(replicas))

    def __repr__(self) -> str:
        return f"PowerOfTwoRouter(seed={self.seed})"


class PrefixAffinityRouter(_TakingTurns):
    """The replica whose prefix cache holds the longest prefix of the request's
    ``block_hashes`` (``argmax cached_prefix_blocks``), ties to fewer outstanding, then
    taking turns; a request without hashes goes to the least loaded replica."""

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The replica with the longest cached prefix."""
        hashes = request.block_hashes
        if not hashes:
            return self._least_loaded(replicas, len(replicas))
        matched = [snapshot.cached_prefix_blocks(hashes) for snapshot in replicas]
        best = max(matched)
        tied = [s for s, m in zip(replicas, matched, strict=True) if m == best]
        return self._least_loaded(tied, len(replicas))

    def __repr__(self) -> str:
        return "PrefixAffinityRouter()"


def _queue_scores(replicas: Sequence[ReplicaSnapshot], request: Request) -> list[float]:
    queued = [snapshot.queued for snapshot in replicas]
    low, high = min(queued), max(queued)
    if high == low:
        return [1.0] * len(replicas)
    return [(high - q) / (high - low) for q in queued]


def _kv_cache_scores(replicas: Sequence[ReplicaSnapshot], request: Request) -> list[float]:
    return [1.0 - snapshot.kv_cache_usage for snapshot in replicas]


def _running_scores(replicas: Sequence[ReplicaSnapshot], request: Request) -> list[float]:
    return [1.0 - snapshot.running / snapshot.max_active_requests for snapshot in replicas]


def _prefix_scores(replicas: Sequence[ReplicaSnapshot], request: Request) -> list[float]:
    hashes = request.block_hashes
    if not hashes:
        return [0.0] * len(replicas)
    return [snapshot.cached_prefix_blocks(hashes) / len(hashes) for snapshot in replicas]


SCORERS: Mapping[str, Callable[[Sequence[ReplicaSnapshot], Request], list[float]]] = {
    "queue": _queue_scores,
    "kv_cache": _kv_cache_scores,
    "running": _running_scores,
    "prefix": _prefix_scores,
}
"""The scorers :class:`WeightedRouter` combines; each gives every replica a score
from 0 (worst) to 1 (best):

* ``queue``: ``(max q - q_i) / (max q - min q)`` over the queued counts, 1 for every
  replica when they are all equal;
* ``kv_cache``: ``1 - kv_cache_usage_i``;
* ``running``: ``1 - running_i / max_active_requests_i``;
* ``prefix``: ``cached_prefix_blocks_i / len(block_hashes)``, 0 without hashes.
"""


class WeightedRouter(_TakingTurns):
    """A weighted sum of normalised scorers, the scheme of llm-d's inference scheduler.

    ``score_i = sum(weight_s * scorer_s(i))`` over the scorers named in *weights*
    (keys of :data:`SCORERS`, weights finite and >= 0, at least one above 0); the
    replica with the highest score takes the request, ties to fewer outstanding, then
    taking turns.
    """

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        if weights is None:
            weights = {"queue": 1.0, "kv_cache": 1.0, "prefix": 1.0}
        if not isinstance(weights, Mapping):
            raise TypeError(f"weights must be a mapping of scorer name to weight, got {weights!r}")
        checked: dict[str, float] = {}
        for name, weight in weights.items():
            if name not in SCORERS:
                raise ValueError(f"unknown scorer {name!r}; choose among {sorted(SCORERS)}")
            checked[name] = check_real(weight, f"the weight of scorer {name!r}")
        if not any(checked.values()):
            raise ValueError(f"weights {dict(weights)!r}: at least one weight must be above 0")
        self.weights: Mapping[str, float] = checked

    def route(self, request: Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        """The replica with the highest weighted score."""
        totals = [0.0] * len(replicas)
        for name, weight in self.weights.items():
            if weight:
                for i, score in enumerate(SCORERS[name](replicas, request)):
                    totals[i] += weight * score
        best = max(totals)
        tied = [s for s, t in zip(replicas, totals, strict=True) if t == best]
        return self._least_loaded(tied, len(replicas))

    def __repr__(self) -> str:
        return f"WeightedRouter(weights={dict(self.weights)!r})"


ROUTERS: Registry[Callable[..., Router]] = Registry("router")
"""The routers by the names scenario files use; :func:`register_router` adds a user's own.
A router whose factory takes a ``seed`` is seeded from the scenario's seed."""

for _name, _factory in (
    ("round_robin", RoundRobinRouter),
    ("random", RandomRouter),
    ("least_outstanding", LeastOutstandingRouter),
    ("least_kv_cache", LeastKvCacheRouter),
    ("power_of_two", PowerOfTwoRouter),
    ("prefix_affinity", PrefixAffinityRouter),
    ("weighted", WeightedRouter),
):
    ROUTERS.register(_name, _factory)


def register_router(
    name: str, factory: Callable[..., Router], *, replace: bool = False
) -> Callable[..., Router]:
    """Make *factory* the router *name*, for scenario files' ``router`` keys and
    :func:`make_router`; returns *factory*.

    *factory* is called with no arguments, or with ``seed=`` when its signature takes a
    ``seed`` (the scenario's seed, or the pool's ``seed`` key); what it returns must have
    a ``route(request, replicas) -> int`` method (:class:`Router`). A name already taken
    raises ``ValueError`` unless *replace* is true.
    """
    return ROUTERS.register(name, factory, replace=replace)


def make_router(router: Router | str, **options: Any) -> Router:
    """A router: *router* itself if it is one, else the built-in of that name built
    with *options* (``seed`` for ``random`` and ``power_of_two``, ``weights`` for
    ``weighted``)."""
    if isinstance(router, str):
        factory = ROUTERS.lookup(router)
        try:
            return factory(**options)
        except TypeError as error:
            raise TypeError(f"router {router!r}: {error}") from None
    if options:
        raise TypeError(f"options {sorted(options)} apply only to a router given by name")
    if isinstance(router, type):
        raise TypeError(
            f"router {router.__name__} is a class; pass an instance, e.g. {router.__name__}()"
        )
    if not callable(getattr(router, "route", None)):
        raise TypeError(
            f"router {router!r} has no route(request, replicas) method; "
            "it must implement simsim.cluster.Router"
        )
    return router
