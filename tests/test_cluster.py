"""simsim.cluster: replicas behind a router, one engine's surface, exact routing."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Generator, Sequence

import pandas as pd
import pytest
import simpy
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.cluster import (
    ROUTERS,
    Cluster,
    LeastKvCacheRouter,
    LeastOutstandingRouter,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    RandomRouter,
    ReplicaSnapshot,
    RoundRobinRouter,
    WeightedRouter,
    make_router,
)
from simsim.engines.base import EngineBase

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=100,
)


def batching(
    env: simsim.Environment, *, slots: int = 4, blocks: int = 64, prefix_cache: bool = False
) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=slots,
        kv_cache=simsim.KvCacheConfig(16, blocks),
        prefix_cache=prefix_cache,
        env=env,
    )


def single(env: simsim.Environment) -> simsim.SimulationEngine:
    return simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env)


def poisson(count: int, seed: int = 1, gap_us: int = 20_000) -> list[simsim.Request]:
    rng = random.Random(seed)
    now = 0
    requests = []
    for rid in range(count):
        now += round(rng.expovariate(1 / gap_us))
        requests.append(
            simsim.Request(
                rid,
                arrival_time_us=now,
                prompt_token_count=rng.randint(16, 512),
                max_output_tokens=rng.randint(1, 32),
            )
        )
    return requests


def snapshot(index: int, queued: int = 0, running: int = 0, usage: float = 0.0) -> ReplicaSnapshot:
    return ReplicaSnapshot(index, 0, queued, running, 4, usage)


# ---------------------------------------------------------------------- one replica


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 60),
    kind=st.sampled_from(["single", "fast", "batching"]),
    cancel=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 400_000)), max_size=5),
)
def test_a_one_replica_cluster_runs_exactly_as_its_engine_alone(
    seed: int, count: int, kind: str, cancel: list[tuple[int, int]]
) -> None:
    def build(env: simsim.Environment) -> simsim.SimulationEngine | simsim.BatchingEngine:
        if kind == "single":
            return single(env)
        if kind == "fast":
            return simsim.FastSimulationEngine(simsim.SimulatedBackend(COSTS), env=env)
        return batching(env, blocks=48)

    def drive(target: object, env: simsim.Environment) -> None:
        for request in poisson(count, seed):
            target.submit(request)  # type: ignore[attr-defined]
        for rid, at in cancel:
            if rid < count:

                def stop(_: object, rid: int = rid) -> None:
                    if not target.requests[rid].is_terminal:  # type: ignore[attr-defined]
                        target.cancel_request(rid)  # type: ignore[attr-defined]

                env.timeout(at).callbacks.append(stop)
        env.drain()

    env_alone = simsim.Environment()
    alone = build(env_alone)
    drive(alone, env_alone)
    env = simsim.Environment()
    cluster = Cluster([build(env)], "least_outstanding")
    drive(cluster, env)
    routed = cluster.requests_frame()
    # only a request cancelled before it arrived is never routed
    never = (routed["state"] == "CANCELLED") & (
        routed["finish_time_us"] < routed["arrival_time_us"]
    )
    assert routed["replica"].isna().tolist() == never.tolist()
    assert routed.drop(columns="replica").equals(alone.requests_frame())
    assert cluster.events_frame().drop(columns="replica").equals(alone.events_frame())
    assert cluster.admissions_frame().drop(columns="replica").equals(alone.admissions_frame())


# ---------------------------------------------------------------------- routing


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_every_request_is_routed_exactly_once_and_runs(name: str) -> None:
    env = simsim.Environment()
    # prefix_affinity routes by prefix caches (refused without); no request names blocks.
    cached = name == "prefix_affinity"
    cluster = Cluster(
        [batching(env, prefix_cache=cached) for _ in range(3)], name, refresh_interval_us=10_000
    )
    for request in poisson(200, seed=3):
        cluster.submit(request)
    cluster.run()
    routes = cluster.routes_frame()
    assert sorted(routes["request_id"]) == list(range(200))
    frame = cluster.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    assert list(frame["replica"]) == [
        dict(zip(routes["request_id"], routes["replica"], strict=True))[rid] for rid in range(200)
    ]
    # routed at the arrival time
    arrivals = dict(zip(frame["request_id"], frame["arrival_time_us"], strict=True))
    assert all(
        arrivals[rid] == t
        for rid, t in zip(routes["request_id"], routes["timestamp_us"], strict=True)
    )
    # each replica ran exactly the requests routed to it
    for index, engine in enumerate(cluster.replicas):
        assert sorted(engine.requests) == sorted(frame.loc[frame["replica"] == index, "request_id"])


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_routing_is_deterministic(name: str) -> None:
    def once() -> list[int]:
        env = simsim.Environment()
        cached = name == "prefix_affinity"
        cluster = Cluster([batching(env, prefix_cache=cached) for _ in range(4)], name)
        for request in poisson(150, seed=9):
            cluster.submit(request)
        cluster.run()
        return list(cluster.routes_frame()["replica"])

    assert once() == once()


def test_round_robin_takes_turns() -> None:
    router = RoundRobinRouter()
    replicas = [snapshot(i) for i in range(3)]
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    assert [router.route(request, replicas) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_and_its_tie_break() -> None:
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    router = LeastOutstandingRouter()
    assert router.route(request, [snapshot(0, 2, 1), snapshot(1, 0, 2), snapshot(2, 1, 1)]) == 1
    # all tied at 2: the turn goes to the replica after the previous choice (1)
    assert router.route(request, [snapshot(0, 1, 1), snapshot(1, 0, 2), snapshot(2, 2, 0)]) == 2


def test_least_kv_cache_breaks_ties_by_load_then_index() -> None:
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    router = LeastKvCacheRouter()
    replicas = [snapshot(0, 3, 1, 0.25), snapshot(1, 1, 1, 0.25), snapshot(2, 0, 0, 0.5)]
    assert router.route(request, replicas) == 1


def test_seeded_routers_repeat_with_their_seed() -> None:
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    replicas = [snapshot(i, queued=i) for i in range(5)]
    for kind in (RandomRouter, PowerOfTwoRouter):
        first = kind(seed=4)
        second = kind(seed=4)
        picks = [first.route(request, replicas) for _ in range(50)]
        assert picks == [second.route(request, replicas) for _ in range(50)]
        assert len(set(picks)) > 1


def test_power_of_two_picks_the_less_loaded_of_its_two_draws() -> None:
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    replicas = [snapshot(i, queued=10 - i) for i in range(5)]
    router = PowerOfTwoRouter(seed=1)
    draws = random.Random(1)
    for _ in range(30):
        first, second = draws.sample(range(5), 2)
        assert router.route(request, replicas) == max(first, second)


def test_prefix_affinity_follows_the_longest_cached_prefix() -> None:
    request = simsim.Request(
        0, arrival_time_us=0, prompt_token_count=64, max_output_tokens=1, block_hashes=(1, 2, 3)
    )

    def holding(index: int, keys: set[int], queued: int) -> ReplicaSnapshot:
        def lookup(hashes: object) -> int:
            count = 0
            for key in hashes:  # type: ignore[attr-defined]
                if key not in keys:
                    break
                count += 1
            return count

        return ReplicaSnapshot(index, 0, queued, 0, 4, 0.0, lookup)

    router = PrefixAffinityRouter()
    assert (
        router.route(request, [holding(0, {1}, 0), holding(1, {1, 2}, 5), holding(2, set(), 0)])
        == 1
    )
    assert router.route(request, [holding(0, {1, 2}, 3), holding(1, {1, 2}, 2)]) == 1


def test_weighted_router_sums_normalised_scores() -> None:
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    replicas = [snapshot(0, 4, 0, 0.1), snapshot(1, 0, 0, 0.9), snapshot(2, 2, 0, 0.3)]
    # queue scores 0, 1, 0.5; kv scores 0.9, 0.1, 0.7: sums 0.9, 1.1, 1.2
    assert WeightedRouter({"queue": 1.0}).route(request, replicas) == 1
    assert WeightedRouter({"kv_cache": 1.0}).route(request, replicas) == 0
    assert WeightedRouter({"queue": 1.0, "kv_cache": 1.0}).route(request, replicas) == 2
    with pytest.raises(ValueError, match="unknown scorer 'load'"):
        WeightedRouter({"load": 1.0})
    with pytest.raises(ValueError, match="at least one weight"):
        WeightedRouter({"queue": 0.0})


def test_make_router_names_the_choices() -> None:
    assert isinstance(make_router("power_of_two", seed=2), PowerOfTwoRouter)
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        make_router("nearest")
    with pytest.raises(TypeError, match="no route"):
        make_router(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("refresh_us", "routes", "ttft_us"),
    [(0, [0, 1, 0, 0], 6_160), (1_000_000, [0, 1, 0, 1], 507_320)],
)
def test_a_stale_snapshot_keeps_the_load_it_saw(
    refresh_us: int, routes: list[int], ttft_us: int
) -> None:
    # docs/cluster.md's example: a long request on replica 1, then a short one at 0.5 s
    env = simsim.Environment()
    costs = simsim.SimulatedBackendConfig(1_000, 20, 0, 5_000, 0)
    cluster = Cluster(
        [simsim.SimulationEngine(simsim.SimulatedBackend(costs), env=env) for _ in range(2)],
        "least_outstanding",
        refresh_interval_us=refresh_us,
    )
    for rid, (at, tokens) in enumerate([(0, 2), (0, 200), (0, 2), (500_000, 2)]):
        cluster.submit(simsim.Request(rid, at, 8, tokens))
    cluster.run()
    assert list(cluster.routes_frame()["replica"]) == routes
    assert cluster.requests_frame()["ttft_us"].tolist()[3] == ttft_us


def test_ties_take_turns() -> None:
    router = LeastOutstandingRouter()
    request = simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1)
    idle = [snapshot(i) for i in range(3)]
    assert [router.route(request, idle) for _ in range(4)] == [0, 1, 2, 0]
    # a unique least loaded replica wins, and the turn moves on from it
    assert router.route(request, [snapshot(0, 1), snapshot(1, 1), snapshot(2, 0)]) == 2
    assert router.route(request, idle) == 0


def test_a_router_answering_out_of_range_fails_the_cluster() -> None:
    class Wrong:
        def route(self, request: object, replicas: object) -> int:
            return 7

    env = simsim.Environment()
    cluster = Cluster([single(env)], Wrong())
    cluster.submit(simsim.Request(0, arrival_time_us=5, prompt_token_count=8, max_output_tokens=2))
    with pytest.raises(ValueError, match="answered 7 for request 0"):
        cluster.run()
    assert cluster.failed
    with pytest.raises(simsim.EngineFailedError):
        cluster.requests_frame()


# ---------------------------------------------------------------------- the surface


def test_bad_clusters_are_refused() -> None:
    env = simsim.Environment()
    engine = single(env)
    with pytest.raises(ValueError, match="at least one replica"):
        Cluster([])
    with pytest.raises(ValueError, match="another environment"):
        Cluster([engine, single(simsim.Environment())])
    with pytest.raises(ValueError, match="listed twice"):
        Cluster([engine, engine])
    used = single(env)
    used.submit(simsim.Request(0, arrival_time_us=0, prompt_token_count=1, max_output_tokens=1))
    with pytest.raises(ValueError, match="already has 1 submitted"):
        Cluster([used])


def test_submit_checks_ids_and_every_replica() -> None:
    env = simsim.Environment()
    cluster = Cluster([batching(env, blocks=64), batching(env, blocks=4)])
    cluster.submit(simsim.Request(0, arrival_time_us=0, prompt_token_count=8, max_output_tokens=1))
    with pytest.raises(ValueError, match="already submitted to this cluster"):
        cluster.submit(
            simsim.Request(0, arrival_time_us=0, prompt_token_count=8, max_output_tokens=1)
        )
    with pytest.raises(ValueError, match="replica 1: request 1 needs 7 KV blocks"):
        cluster.submit(
            simsim.Request(1, arrival_time_us=0, prompt_token_count=100, max_output_tokens=1)
        )
    assert list(cluster.requests) == [0]


def test_cancel_before_routing_never_routes() -> None:
    env = simsim.Environment()
    cluster = Cluster([single(env) for _ in range(2)])
    cluster.submit(
        simsim.Request(0, arrival_time_us=100, prompt_token_count=8, max_output_tokens=2)
    )
    cluster.submit(
        simsim.Request(1, arrival_time_us=100, prompt_token_count=8, max_output_tokens=2)
    )
    done = cluster.completion(0)
    cluster.cancel_request(0)
    assert done.triggered
    cluster.run()
    frame = cluster.requests_frame()
    assert list(frame["state"]) == ["CANCELLED", "FINISHED"]
    assert frame["replica"].isna().tolist() == [True, False]
    assert list(cluster.routes_frame()["request_id"]) == [1]
    assert cluster.replica_of(1) == 0  # round robin's first turn
    with pytest.raises(simsim.InvalidTransitionError):
        cluster.cancel_request(0)
    with pytest.raises(simsim.UnknownRequestError):
        cluster.cancel_request(9)


def test_simpy_processes_wait_on_the_cluster_as_on_an_engine() -> None:
    env = simsim.Environment()
    cluster = Cluster([batching(env) for _ in range(2)], "least_outstanding")
    seen: list[tuple[str, int, int]] = []

    def client(rid: int) -> Generator[simpy.Event, object, None]:
        yield env.timeout(rid * 1_000)
        cluster.submit(
            simsim.Request(rid, arrival_time_us=env.now, prompt_token_count=32, max_output_tokens=4)
        )
        first = yield cluster.first_token(rid)
        seen.append(("first", rid, env.now))
        assert first.first_token_time_us == env.now  # type: ignore[attr-defined]
        done = yield cluster.completion(rid)
        seen.append(("done", rid, env.now))
        assert done.finish_time_us == env.now  # type: ignore[attr-defined]

    for rid in range(6):
        env.process(client(rid))
    env.run()
    frame = cluster.requests_frame().set_index("request_id")
    assert len(seen) == 12
    for what, rid, at in seen:
        assert at == frame.loc[rid, "first_token_time_us" if what == "first" else "finish_time_us"]


def test_waiters_made_before_routing_follow_the_request() -> None:
    env = simsim.Environment()
    cluster = Cluster([single(env) for _ in range(2)])
    for rid in range(2):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=50, prompt_token_count=8, max_output_tokens=3)
        )
    events = {rid: (cluster.token(rid, 2), cluster.completion(rid)) for rid in range(2)}
    cluster.run()
    for rid, (token, done) in events.items():
        request = cluster.requests[rid]
        assert token.processed and token.value is request
        assert done.processed and done.value is request
    assert sorted(cluster.routes_frame()["replica"]) == [0, 1]


def cached(env: simsim.Environment) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(16, 64),
        prefix_cache=True,
        env=env,
    )


def shared(rid: int, at: int) -> simsim.Request:
    return simsim.Request(
        rid, arrival_time_us=at, prompt_token_count=64, max_output_tokens=2, block_hashes=(1, 2, 3)
    )


def test_prefix_affinity_sends_a_shared_prompt_where_it_is_cached() -> None:
    env = simsim.Environment()
    cluster = Cluster([cached(env) for _ in range(3)], "prefix_affinity")
    cluster.submit(
        simsim.Request(0, arrival_time_us=0, prompt_token_count=64, max_output_tokens=50)
    )
    cluster.submit(shared(1, 0))  # the least loaded replica is 1: replica 0 holds request 0
    for rid in range(2, 6):
        cluster.submit(shared(rid, 100_000 * rid))
    cluster.run()
    frame = cluster.requests_frame()
    assert list(frame["replica"]) == [0, 1, 1, 1, 1, 1]
    assert list(frame["cached_prompt_tokens"]) == [0, 0, 48, 48, 48, 48]


def test_prefix_affinity_over_replicas_without_a_prefix_cache_is_refused() -> None:
    # Once silently the least-loaded router: it had no cache to follow.
    env = simsim.Environment()
    replicas = [batching(env), single(env)]
    with pytest.raises(
        ValueError,
        match=r"^router PrefixAffinityRouter\(\) sends a request where its prefix is cached, and "
        r"none of the 2 replicas has a prefix cache \(BatchingEngine\(\.\.\., kv_cache=\.\.\., "
        r"prefix_cache=True\)\): it would send every request to the least loaded",
    ):
        Cluster(replicas, "prefix_affinity")
    # Refused before anything changed: the replicas can still serve another cluster.
    assert Cluster(replicas, "least_outstanding").replicas == tuple(replicas)
    # One replica with a cache is enough to route by.
    env = simsim.Environment()
    Cluster([batching(env), cached(env)], PrefixAffinityRouter())


def test_a_weighted_router_of_prefixes_alone_needs_a_prefix_cache() -> None:
    env = simsim.Environment()
    replicas = [batching(env), single(env)]
    with pytest.raises(
        ValueError,
        match=r"^router WeightedRouter\(weights=\{'prefix': 1\.0, 'queue': 0\.0\}\) scores "
        r"replicas only by the cached prefix of a request, and none of the 2 replicas has",
    ):
        Cluster(replicas, WeightedRouter({"prefix": 1.0, "queue": 0.0}))
    # Weighing load too, the prefix term is a constant: the router still routes by load.
    Cluster(replicas, WeightedRouter())
    env = simsim.Environment()
    Cluster([batching(env), cached(env)], WeightedRouter({"prefix": 1.0}))


def test_a_disaggregated_decode_pool_without_prefix_caches_refuses_prefix_affinity() -> None:
    env = simsim.Environment()
    transfer = simsim.KvTransferConfig(kv_bytes_per_token=1, bandwidth_bytes_per_s=10**6)
    with pytest.raises(ValueError, match="none of the 2 decode replicas has a prefix cache"):
        simsim.DisaggregatedCluster(
            [cached(env)],
            [batching(env), batching(env)],
            transfer,
            prefill_router="prefix_affinity",
            decode_router="prefix_affinity",
        )


def test_block_hashes_need_a_replica_with_a_prefix_cache() -> None:
    env = simsim.Environment()
    cluster = Cluster([batching(env), single(env)], "round_robin")
    with pytest.raises(
        ValueError,
        match=r"^request 7 has block_hashes, but no replica of this cluster has a prefix cache "
        r"to use them; they would be ignored",
    ):
        cluster.submit(shared(7, 0))
    assert dict(cluster.requests) == {}
    # Where one replica shares prefixes, requests routed there use their hashes.
    env = simsim.Environment()
    mixed = Cluster([batching(env), cached(env)], "round_robin")
    assert mixed.submit(shared(7, 0)).block_hashes == (1, 2, 3)


@pytest.mark.parametrize(("refresh_us", "seen"), [(0, [0, 3, 3]), (250_000, [0, 0, 3])])
def test_a_stale_snapshot_of_a_prefix_cache_keeps_the_blocks_it_saw(
    refresh_us: int, seen: list[int]
) -> None:
    class Spy(PrefixAffinityRouter):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
            self.seen.append(replicas[0].cached_prefix_blocks(request.block_hashes))
            return super().route(request, replicas)

    env = simsim.Environment()
    spy = Spy()
    cluster = Cluster([cached(env) for _ in range(2)], spy, refresh_interval_us=refresh_us)
    cluster.submit(shared(0, 0))  # to replica 0; finished and cached long before 100 ms
    cluster.submit(shared(1, 100_000))  # a stale view still shows the empty cluster of 0
    cluster.submit(shared(2, 300_000))  # refreshed
    cluster.run()
    assert spy.seen == seen
    assert list(cluster.routes_frame()["timestamp_us"]) == [0, 100_000, 300_000]


# ---------------------------------------------------------------------- misuse


def test_token_events_are_refused_before_routing_when_a_replica_has_none() -> None:
    env = simsim.Environment()
    cluster = Cluster([simsim.FastSimulationEngine(simsim.SimulatedBackend(COSTS), env=env)])
    cluster.submit(simsim.Request(0, arrival_time_us=0, prompt_token_count=10, max_output_tokens=3))
    with pytest.raises(NotImplementedError, match="no token events"):
        cluster.token(0, 1)
    done = cluster.completion(0)
    cluster.run()
    assert done.processed


def test_a_replica_takes_requests_only_through_its_cluster() -> None:
    env = simsim.Environment()
    engine = single(env)
    cluster = Cluster([engine])
    with pytest.raises(ValueError, match="is a replica of <Cluster of 1 replica>: submit"):
        engine.submit(
            simsim.Request(0, arrival_time_us=0, prompt_token_count=10, max_output_tokens=2)
        )
    with pytest.raises(ValueError, match="replicas\\[0\\] is already a replica of"):
        Cluster([engine])
    cluster.submit(simsim.Request(0, arrival_time_us=5, prompt_token_count=10, max_output_tokens=2))
    cluster.run()
    assert list(engine.requests) == [0] and engine.requests[0].arrival_time_us == 5


def test_a_router_class_is_refused_for_an_instance() -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError, match="RoundRobinRouter is a class; pass an instance"):
        Cluster([single(env)], RoundRobinRouter)  # type: ignore[arg-type]


def test_a_router_may_answer_a_numpy_integer() -> None:
    import numpy as np

    class ArgMin:
        def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
            return np.argmin([s.outstanding for s in replicas])  # type: ignore[return-value]

    env = simsim.Environment()
    cluster = Cluster([single(env) for _ in range(2)], ArgMin())
    for rid in range(3):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2)
        )
    cluster.run()
    assert list(cluster.routes_frame()["replica"]) == [0, 1, 0]


def test_a_failed_replica_fails_the_cluster_and_is_named() -> None:
    class Broken(simsim.SimulatedBackend):
        def decode_step_us(self, active_sequence_count: int) -> int:
            return -1

    env = simsim.Environment()
    good = single(env)
    bad = simsim.SimulationEngine(Broken(COSTS), env=env)
    cluster = Cluster([good, bad])
    for rid in range(2):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2)
        )
    assert not cluster.failed
    with pytest.raises(ValueError, match="negative duration"):
        cluster.run()
    assert cluster.failed and bad.failed and not good.failed
    with pytest.raises(simsim.EngineFailedError, match="replica 1 failed"):
        cluster.submit(
            simsim.Request(2, arrival_time_us=10**6, prompt_token_count=8, max_output_tokens=2)
        )


# ---------------------------------------------------------------- merged frames

# Each merged frame: the cluster's method, its order, whether only batching replicas count.
MERGED = (
    ("events_frame", ["timestamp_us", "sequence"], False),
    ("admissions_frame", ["timestamp_us"], False),
    ("iterations_frame", ["start_us"], True),
)

REPLICA_KINDS: dict[str, Callable[[simsim.Environment], EngineBase]] = {
    "single": single,
    "batching": batching,
    "cached": functools.partial(batching, prefix_cache=True),
}


def every_replicas_frame(
    cluster: Cluster, method: str, order: list[str], batching_only: bool
) -> pd.DataFrame:
    """A merged frame as the cluster first built it: each replica's frame, concatenated."""
    frames = []
    for index, engine in enumerate(cluster.replicas):
        if batching_only and not isinstance(engine, simsim.BatchingEngine):
            continue
        frame = getattr(engine, method)()
        frame["replica"] = pd.array([index] * len(frame), dtype="int64")
        frames.append(frame)
    merged = pd.concat(frames, ignore_index=True)
    return merged.sort_values(order, kind="stable", ignore_index=True)


def assert_merged_as_before(cluster: Cluster) -> None:
    for method, order, batching_only in MERGED:
        if batching_only and not any(
            isinstance(engine, simsim.BatchingEngine) for engine in cluster.replicas
        ):
            continue
        pd.testing.assert_frame_equal(
            getattr(cluster, method)(),
            every_replicas_frame(cluster, method, order, batching_only),
            check_exact=True,
            obj=method,
        )


@settings(max_examples=examples(40), deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(REPLICA_KINDS)), min_size=1, max_size=8),
    count=st.integers(min_value=0, max_value=4),
)
def test_merged_frames_are_every_replicas_frames_concatenated(kinds: list[str], count: int) -> None:
    # Replicas of mixed kinds, idle or not: a kind whose frames have a column the others
    # lack (kv_blocks_cached) widens it in the merged frame even when its replicas are idle.
    env = simsim.Environment()
    cluster = Cluster([REPLICA_KINDS[kind](env) for kind in kinds], "round_robin")
    for request in poisson(count):
        cluster.submit(request)
    cluster.run()
    assert_merged_as_before(cluster)


@pytest.mark.parametrize("count", [0, 3])
def test_merging_asks_for_the_frames_of_replicas_with_rows_only(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    # 300 replicas, at most 3 of them busy: one frame per busy replica, and one idle
    # replica of each kind (the first) for the columns, not a frame per replica.
    env = simsim.Environment()
    replicas = [batching(env) for _ in range(200)] + [
        batching(env, prefix_cache=True) for _ in range(100)
    ]
    cluster = Cluster(replicas, "round_robin")
    for request in poisson(count):
        cluster.submit(request)
    cluster.run()
    asked: list[tuple[str, int]] = []
    for method, _, _ in MERGED:
        original = getattr(simsim.BatchingEngine, method)

        def spy(
            engine: simsim.BatchingEngine,
            method: str = method,
            original: Callable[[simsim.BatchingEngine], pd.DataFrame] = original,
        ) -> pd.DataFrame:
            asked.append((method, replicas.index(engine)))
            return original(engine)

        monkeypatch.setattr(simsim.BatchingEngine, method, spy)
    for method, _, _ in MERGED:
        getattr(cluster, method)()
    busy = [0, 1, 2] if count else [0]
    assert asked == [(method, index) for method, _, _ in MERGED for index in [*busy, 200]]
    monkeypatch.undo()
    assert_merged_as_before(cluster)
