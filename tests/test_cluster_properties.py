"""Property tests of :class:`simsim.Cluster` (issue 16, points 1, 2 and 6).

Random workloads (arrivals, prompt and output sizes, submissions before the run and
from SimPy processes, cancellations made from a SimPy process at random times: before a
request's arrival, while it is queued, while it runs) on clusters that mix
:class:`~simsim.SimulationEngine`, :class:`~simsim.FastSimulationEngine` and
:class:`~simsim.BatchingEngine` replicas (the batching ones with KV caches small enough
to preempt), behind every built-in router, with fresh and stale snapshots. For every run:

* every request is routed at most once, at its arrival time, and exactly once unless it
  was cancelled before it arrived; it ends ``FINISHED`` or ``CANCELLED``;
* each replica ran exactly the requests routed to it, and the ``replica`` column agrees;
* completion and token events asked of the cluster before routing fire when the request
  ends and when its tokens come, as the replica's own events would;
* the same inputs twice, driven by ``run()`` and by ``run_next_timestamp()``, give
  identical frames;
* a one-replica cluster equals its engine alone, for every router and refresh interval.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from helpers import property_settings
from hypothesis import given
from hypothesis import strategies as st

import simsim
from simsim.cluster import ROUTERS, Cluster
from simsim.engines.base import EngineBase

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=300,
    prefill_per_token_us=10,
    prefill_per_active_sequence_us=50,
    decode_base_us=1_000,
    decode_per_active_sequence_us=100,
)
BLOCK = 8
KINDS = ("single", "fast", "batching", "batching_mixed")
REFRESH_US = (0, 0, 700, 5_000)
TERMINAL = {"FINISHED", "CANCELLED"}


def build(kind: str, env: simsim.Environment) -> EngineBase:
    """A replica of *kind*; the batching ones hold 12 blocks of 8 tokens (preemption)."""
    backend = simsim.SimulatedBackend(COSTS)
    if kind == "single":
        return simsim.SimulationEngine(backend, env=env)
    if kind == "fast":
        return simsim.FastSimulationEngine(backend, env=env)
    if kind in ("batching", "batching_cached"):
        # batching_cached has a prefix cache, which requests without block hashes never
        # use (the run is the run without one), for prefix_affinity to route by.
        return simsim.BatchingEngine(
            backend,
            max_active_requests=3,
            kv_cache=simsim.KvCacheConfig(BLOCK, 12),
            prefix_cache=kind == "batching_cached",
            env=env,
        )
    return simsim.BatchingEngine(
        backend,
        max_active_requests=4,
        max_batch_tokens=40,
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(BLOCK, 12),
        env=env,
    )


@dataclass(frozen=True)
class Workload:
    """Requests as (arrival_us, prompt, output) and cancellations as (request, at_us)."""

    requests: tuple[tuple[int, int, int], ...]
    cancels: tuple[tuple[int, int], ...]

    def submit(
        self,
        target: Any,
        env: simsim.Environment,
        then: Callable[[int], None] = lambda rid: None,
    ) -> None:
        """Every third request is submitted from a SimPy process, halfway to its
        arrival; the others before the run. *then* is called after each submission."""

        def late(request: simsim.Request) -> Generator[simpy_event, None, None]:
            yield env.timeout(request.arrival_time_us // 2)
            target.submit(request)
            then(request.request_id)

        for rid, (arrival, prompt, output) in enumerate(self.requests):
            request = simsim.Request(rid, arrival, prompt, output)
            if rid % 3 == 2:
                env.process(late(request))
            else:
                target.submit(request)
                then(rid)

    def cancel_from_a_process(self, target: Any, env: simsim.Environment) -> None:
        """One SimPy process per cancellation: it waits, then cancels if still live."""

        def cancel(rid: int, at_us: int) -> Generator[simpy_event, None, None]:
            yield env.timeout(at_us)
            if rid in target.requests and not target.requests[rid].is_terminal:
                target.cancel_request(rid)

        for rid, at_us in self.cancels:
            if rid < len(self.requests):
                env.process(cancel(rid, at_us))


simpy_event = Any  # what a SimPy process yields

# Output limits stay small enough for a 12-block cache (prompt + output <= 96 tokens).
request_specs = st.tuples(st.integers(0, 30_000), st.integers(0, 60), st.integers(0, 30))
workloads = st.builds(
    Workload,
    st.lists(request_specs, min_size=1, max_size=24).map(tuple),
    st.lists(st.tuples(st.integers(0, 23), st.integers(0, 60_000)), max_size=8).map(tuple),
)


class Watcher:
    """Completion and token events asked of a cluster, and when each one fired."""

    def __init__(self, cluster: Cluster, env: simsim.Environment) -> None:
        self.cluster = cluster
        self.env = env
        self.completed: dict[int, int] = {}
        self.tokens: dict[tuple[int, int], int] = {}

    def watch(self, rid: int, tokens: list[int]) -> None:
        env = self.env

        def on_completion() -> Generator[simpy_event, None, None]:
            request = yield self.cluster.completion(rid)
            assert request.request_id == rid and request.is_terminal
            self.completed[rid] = env.now

        def on_token(n: int) -> Generator[simpy_event, None, None]:
            yield self.cluster.token(rid, n)
            self.tokens[rid, n] = env.now

        env.process(on_completion())
        for n in tokens:
            env.process(on_token(n))


def token_times(events: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(request, n) -> when its n-th DECODE_STEP_COMPLETE was logged."""
    times: dict[tuple[int, int], int] = {}
    counts: dict[int, int] = {}
    decodes = events[events["event_type"] == "DECODE_STEP_COMPLETE"]
    for rid, at in zip(decodes["request_id"], decodes["timestamp_us"], strict=True):
        counts[rid] = counts.get(rid, 0) + 1
        times[rid, counts[rid]] = int(at)
    return times


def routable(kinds: list[str], router: str) -> list[str]:
    """*kinds*, with a replica that has a prefix cache when *router* routes by them
    (``prefix_affinity`` over replicas without one is refused): the batching ones get
    one, or, with none, the first replica becomes one that has it."""
    if router != "prefix_affinity":
        return kinds
    cached = ["batching_cached" if kind == "batching" else kind for kind in kinds]
    return cached if "batching_cached" in cached else ["batching_cached", *cached[1:]]


def run_cluster(
    kinds: list[str],
    router: str,
    refresh_us: int,
    workload: Workload,
    watch: bool,
    stepping: bool = False,
) -> tuple[Cluster, Watcher]:
    env = simsim.Environment()
    kinds = routable(kinds, router)
    cluster = Cluster([build(kind, env) for kind in kinds], router, refresh_interval_us=refresh_us)
    watcher = Watcher(cluster, env)
    # Token events exist on every server but the fast one; asked before routing, the
    # cluster cannot know yet which server the request will be on.
    tokens = [1, 2] if "fast" not in kinds else []
    workload.submit(cluster, env, lambda rid: watcher.watch(rid, tokens) if watch else None)
    workload.cancel_from_a_process(cluster, env)
    if stepping:
        while cluster.run_next_timestamp() is not None:
            pass
    else:
        cluster.run()
    return cluster, watcher


def check_invariants(cluster: Cluster, workload: Workload) -> None:
    frame = cluster.requests_frame()
    routes = cluster.routes_frame()
    count = len(workload.requests)
    assert list(frame["request_id"]) == list(range(count))
    assert set(frame["state"]) <= TERMINAL
    # routed at most once, at its arrival time, in arrival order
    assert routes["request_id"].is_unique
    arrivals = frame.set_index("request_id")["arrival_time_us"]
    assert (routes["timestamp_us"].to_numpy() == arrivals[routes["request_id"]].to_numpy()).all()
    assert routes["timestamp_us"].is_monotonic_increasing
    # never routed: only requests cancelled before (or at) their arrival, untouched
    unrouted = frame[~frame["request_id"].isin(routes["request_id"])]
    assert (unrouted["state"] == "CANCELLED").all()
    assert (unrouted["finish_time_us"] <= unrouted["arrival_time_us"]).all()
    assert unrouted["admit_time_us"].isna().all()
    assert (
        frame["replica"].isna().tolist()
        == frame["request_id"].isin(unrouted["request_id"]).tolist()
    )
    # the replica column, each replica's own requests and its event log agree with the routes
    routed_to = dict(zip(routes["request_id"], routes["replica"], strict=True))
    for rid, replica in zip(frame["request_id"], frame["replica"], strict=True):
        if rid in routed_to:
            assert replica == routed_to[rid]
            assert cluster.replica_of(rid) == routed_to[rid]
        else:
            assert cluster.replica_of(rid) is None
    events = cluster.events_frame()
    for index, engine in enumerate(cluster.replicas):
        mine = {rid for rid, replica in routed_to.items() if replica == index}
        assert set(engine.requests) == mine
        assert set(events.loc[events["replica"] == index, "request_id"]) == mine
        arrived = events[(events["replica"] == index) & (events["event_type"] == "REQUEST_ARRIVAL")]
        assert sorted(arrived["request_id"]) == sorted(mine)
        assert engine.queued_count == 0 and engine.running_count == 0
        if isinstance(engine, simsim.BatchingEngine):
            assert engine.kv_blocks_in_use == 0
    # the events frame is in (time, sequence) order with unique sequences
    assert events["sequence"].is_unique
    assert list(zip(events["timestamp_us"], events["sequence"], strict=True)) == sorted(
        zip(events["timestamp_us"], events["sequence"], strict=True)
    )
    finished = frame[frame["state"] == "FINISHED"]
    assert (finished["generated_token_count"] == finished["max_output_tokens"]).all()


def check_watched(cluster: Cluster, watcher: Watcher) -> None:
    frame = cluster.requests_frame().set_index("request_id")
    assert set(watcher.completed) == set(frame.index)
    for rid, at in watcher.completed.items():
        assert at == frame.loc[rid, "finish_time_us"], rid
    logged = token_times(cluster.events_frame())
    for (rid, n), at in watcher.tokens.items():
        if frame.loc[rid, "generated_token_count"] >= n:
            assert at == logged[rid, n], (rid, n)
        else:  # the token never came: the event fires when the request ends
            assert at == frame.loc[rid, "finish_time_us"], (rid, n)


@property_settings(60)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
    router=st.sampled_from(sorted(ROUTERS)),
    refresh_us=st.sampled_from(REFRESH_US),
    workload=workloads,
    watch=st.booleans(),
)
def test_every_request_is_routed_once_and_runs_where_it_was_routed(
    kinds: list[str], router: str, refresh_us: int, workload: Workload, watch: bool
) -> None:
    cluster, watcher = run_cluster(kinds, router, refresh_us, workload, watch)
    check_invariants(cluster, workload)
    if watch:
        check_watched(cluster, watcher)
    # the same inputs again, driven timestamp by timestamp: identical frames
    again, _ = run_cluster(kinds, router, refresh_us, workload, watch, stepping=True)
    for name in ("requests_frame", "routes_frame", "events_frame", "admissions_frame"):
        assert getattr(cluster, name)().equals(getattr(again, name)()), name


@property_settings(25)
@given(
    kind=st.sampled_from(KINDS),
    router=st.sampled_from(sorted(ROUTERS)),
    refresh_us=st.sampled_from(REFRESH_US),
    workload=workloads,
)
def test_a_one_replica_cluster_equals_its_engine_for_every_router(
    kind: str, router: str, refresh_us: int, workload: Workload
) -> None:
    (kind,) = routable([kind], router)
    env_alone = simsim.Environment()
    alone = build(kind, env_alone)
    workload.submit(alone, env_alone)
    workload.cancel_from_a_process(alone, env_alone)
    alone.run()
    cluster, _ = run_cluster([kind], router, refresh_us, workload, watch=False)
    assert cluster.requests_frame().drop(columns="replica").equals(alone.requests_frame())
    assert cluster.events_frame().drop(columns="replica").equals(alone.events_frame())
    assert cluster.admissions_frame().drop(columns="replica").equals(alone.admissions_frame())
    if isinstance(alone, simsim.BatchingEngine):
        iterations = cluster.iterations_frame().drop(columns="replica")
        assert iterations.equals(alone.iterations_frame())
