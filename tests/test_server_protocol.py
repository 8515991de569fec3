"""One contract for a server (issue 25, points 1 and 10): the Server protocol, the load
snapshot every server publishes, the replica port, shared submit checks, and the
request lifetime limit checked at submit."""

from __future__ import annotations

import pytest
from conftest import EASY_CONFIG

import simsim
from simsim.engines.server import is_server


def _backend() -> simsim.SimulatedBackend:
    return simsim.SimulatedBackend(EASY_CONFIG)


def _batching(env: simsim.Environment, blocks: int = 8) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        _backend(),
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=blocks),
        env=env,
    )


def test_engines_and_clusters_are_servers() -> None:
    env = simsim.Environment()
    cluster = simsim.Cluster([simsim.SimulationEngine(_backend(), env=env) for _ in "ab"])
    for server in (simsim.SimulationEngine(_backend()), _batching(simsim.Environment()), cluster):
        assert is_server(server)
    assert not is_server(object())
    assert simsim.Server.__name__ == "Server" and "Server" in simsim.__all__


def test_the_load_snapshot_is_what_routers_and_the_driver_read() -> None:
    engine = _batching(simsim.Environment(), blocks=8)
    assert engine.load() == simsim.ServerLoad(0, 0, 0.0, 0)
    for rid in range(3):
        engine.submit(simsim.Request(rid, 0, 6, 4))
    engine.run_next_timestamp()
    load = engine.load()
    assert (load.queued_count, load.running_count) == (1, 2)
    # Two requests of 6 prompt tokens and their first output token: 2 blocks each.
    assert load.kv_cache_usage == engine.kv_cache_usage == 4 / 8
    engine.run()
    assert engine.load().preemption_count == sum(
        record.event_type is simsim.EventType.REQUEST_PREEMPTED for record in engine.event_log
    )


def test_without_a_kv_cache_usage_is_the_fraction_of_slots_held() -> None:
    engine = simsim.BatchingEngine(_backend(), max_active_requests=4)
    engine.submit(simsim.Request(0, 0, 6, 4))
    engine.run_next_timestamp()
    assert engine.load().kv_cache_usage == 1 / 4
    assert engine.kv_capacity_tokens is None


def test_preemptions_are_counted_in_the_load() -> None:
    engine = _batching(simsim.Environment(), blocks=6)
    for rid in range(2):
        engine.submit(simsim.Request(rid, 0, 8, 8))
    engine.run()
    preempted = sum(r.event_type is simsim.EventType.REQUEST_PREEMPTED for r in engine.event_log)
    assert preempted > 0 and engine.load().preemption_count == preempted


def test_a_clusters_load_sums_its_replicas() -> None:
    env = simsim.Environment()
    cluster = simsim.Cluster([_batching(env), _batching(env)], "round_robin")
    for rid in range(3):
        cluster.submit(simsim.Request(rid, 0, 6, 4))
    env.run(until=1)
    load = cluster.load()
    assert (load.queued_count, load.running_count) == (0, 3)
    assert load.kv_cache_usage == pytest.approx((4 / 8 + 2 / 8) / 2)
    assert cluster.admitted_count == 3
    assert cluster.kv_capacity_tokens == 32


@pytest.mark.parametrize("kind", ["engine", "cluster"])
def test_the_lifetime_limit_is_checked_at_submit(kind: str) -> None:
    env = simsim.Environment()
    server: simsim.Server
    if kind == "engine":
        server = simsim.SimulationEngine(_backend(), env=env)
    else:
        server = simsim.Cluster([simsim.SimulationEngine(_backend(), env=env) for _ in "ab"])
    assert server.max_request_lifetime_us is None  # by default, nothing changes offline
    server.submit(simsim.Request(0, 0, 10, 10**9))
    server.max_request_lifetime_us = 10_000
    # prefill 100 + 2 * 10 us, then 10 us per token: 1,000 tokens take 10,120 us.
    with pytest.raises(ValueError, match=r"at least 10120 us .*max_request_lifetime_us = 10000"):
        server.submit(simsim.Request(1, 0, 10, 1_000))
    server.submit(simsim.Request(2, 0, 10, 980))
    assert sorted(server.requests) == [0, 2]
    with pytest.raises(ValueError, match="max_request_lifetime_us"):
        server.max_request_lifetime_us = 0


def test_a_cluster_checks_a_submission_as_an_engine_does() -> None:
    env = simsim.Environment()
    cluster = simsim.Cluster([simsim.SimulationEngine(_backend(), env=env)])
    used = simsim.Request(0, 0, 1, 1)
    used.transition_to(simsim.RequestState.PREFILLING, 0)
    with pytest.raises(ValueError, match=r"request 0 is not pristine \(state PREFILLING, 0 tokens"):
        cluster.submit(used)
    with pytest.raises(TypeError, match=r"submit takes a simsim\.Request"):
        cluster.submit("request")  # type: ignore[arg-type]


def test_the_replica_port_joins_an_engine_to_one_cluster() -> None:
    env = simsim.Environment()
    engine = simsim.SimulationEngine(_backend(), env=env)
    port = engine.replica_port
    assert port.engine is engine and port.cluster is None
    cluster = simsim.Cluster([engine])
    assert port.cluster is cluster and engine.replica_port.cluster is cluster
    with pytest.raises(ValueError, match="already a replica"):
        port.join(object(), lambda: None, None)
    with pytest.raises(TypeError, match="SimulationEngine cannot take part in disaggregation"):
        port.hand_off_to(lambda request, now: None)
    assert port.admission_rule() is None and port.prefix_lookup() is None


def test_the_driver_counts_come_from_the_load_plus_this_microseconds_submissions() -> None:
    import asyncio

    from simsim.live import LiveDriver

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        engine = simsim.SimulationEngine(_backend())
        driver = LiveDriver(engine, speed=1e-9)  # the clock all but stands still
        driver.start()
        driver.submit(10, 10)
        driver.submit(10, 10)
        first = driver.counts()  # both submitted this microsecond, not arrived yet
        driver.cancel(1)
        second = driver.counts()
        driver.stop()
        return first, second

    first, second = asyncio.run(scenario())
    assert first == (0, 2)
    assert second == (0, 1)
