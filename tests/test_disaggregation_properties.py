"""Property tests of :class:`simsim.DisaggregatedCluster` (issue 16, point 3).

Random workloads on a prefill pool and a decode pool of batching replicas (decode KV
caches small enough to preempt, prefix caches here and there), every router on both
pools, fresh and stale snapshots, and cancellations made from SimPy processes that
wait until some request is in a chosen phase: queued or prefilling on its prefill
replica, queued on its decode replica for the transfer, in the transfer, decoding after
it, or any request at a random time. For every run:

* every request ends ``FINISHED`` or ``CANCELLED``; it is routed once to the prefill
  pool at its arrival and at most once to the decode pool, when its prefill ends; each
  replica holds and logged exactly what was routed to it;
* a request's prefill ends before its transfer starts, the transfer ends before its
  first token, and a transfer lasts ``base_us + round(bytes * k / bandwidth)`` for a
  ``k`` between 1 and the transfers in flight into that replica when it started;
* a monitor process sampling every replica never sees more KV blocks in use than the
  cache holds, and at the end no block, transfer or queued hand-off is left over;
* completion and token events asked of the cluster before routing, or while the
  request is on its prefill replica, fire when the request ends and when its tokens
  come, across the hand-off;
* the same inputs twice, driven by ``run()`` and by ``run_next_timestamp()``, give
  identical frames;
* with ``prefix_affinity`` and fresh snapshots the prefill router sends a request to a
  replica whose prefix cache holds the longest prefix of its blocks.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cluster_properties import BLOCK, COSTS, property_settings, token_times

import simsim
from simsim.cluster import (
    ROUTERS,
    DisaggregatedCluster,
    KvTransferConfig,
    PrefixAffinityRouter,
    ReplicaSnapshot,
    make_router,
)

# 6 blocks of prompt at most (48 tokens) + 3 tokens, output up to 40: <= 12 blocks
MAX_BLOCKS = 12
PHASES = ("any", "prefill_queued", "prefilling", "transfer_queued", "transferring", "decoding")
TERMINAL = {"FINISHED", "CANCELLED"}
SimpyYield = Any  # what a SimPy process yields


@dataclass(frozen=True)
class Pool:
    """One replica's settings: slots, KV blocks, policy, prefix cache."""

    slots: int
    blocks: int
    mixed: bool
    prefix_cache: bool

    def build(self, env: simsim.Environment) -> simsim.BatchingEngine:
        return simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS),
            max_active_requests=self.slots,
            max_batch_tokens=48 if self.mixed else None,
            policy="mixed" if self.mixed else "prefill_first",
            kv_cache=simsim.KvCacheConfig(BLOCK, self.blocks),
            prefix_cache=self.prefix_cache,
            env=env,
        )


@dataclass(frozen=True)
class Setup:
    prefill: tuple[Pool, ...]
    decode: tuple[Pool, ...]
    prefill_router: str
    decode_router: str
    refresh_us: int
    transfer: KvTransferConfig


@dataclass(frozen=True)
class Workload:
    """Requests (arrival_us, prefix family, prompt blocks, extra tokens, output) and
    cancellations (phase, not before at_us, which of the candidates)."""

    requests: tuple[tuple[int, int, int, int, int], ...]
    cancels: tuple[tuple[str, int, int], ...]
    watch_from_us: int | None


pools = st.builds(
    Pool,
    st.integers(1, 4),
    st.integers(MAX_BLOCKS, 16),
    st.booleans(),
    st.booleans(),
)
# Room for every request in every slot: no preemption, so each pool's occupancy is exact.
roomy_pools = st.integers(1, 4).flatmap(
    lambda slots: st.builds(
        Pool, st.just(slots), st.just(slots * MAX_BLOCKS), st.booleans(), st.booleans()
    )
)


def setups_of(replicas: st.SearchStrategy[Pool]) -> st.SearchStrategy[Setup]:
    return st.builds(
        Setup,
        st.lists(replicas, min_size=1, max_size=3).map(tuple),
        st.lists(replicas, min_size=1, max_size=3).map(tuple),
        st.sampled_from(sorted(ROUTERS)),
        st.sampled_from(sorted(ROUTERS)),
        st.sampled_from((0, 0, 600, 4_000)),
        st.builds(
            KvTransferConfig,
            kv_bytes_per_token=st.integers(1, 5_000),
            bandwidth_bytes_per_s=st.integers(10_000_000, 2_000_000_000),
            base_us=st.integers(0, 1_500),
        ),
    )


setups = setups_of(pools)
workloads = st.builds(
    Workload,
    st.lists(
        st.tuples(
            st.integers(0, 12_000),
            st.integers(0, 3),
            st.integers(0, 6),
            st.integers(0, 3),
            st.integers(0, 40),
        ),
        min_size=1,
        max_size=20,
    ).map(tuple),
    st.lists(
        st.tuples(st.sampled_from(PHASES), st.integers(0, 30_000), st.integers(0, 5)),
        max_size=6,
    ).map(tuple),
    st.none() | st.integers(0, 20_000),
)


def requests_of(workload: Workload, hashes: bool = True) -> list[simsim.Request]:
    """Each request's prompt is whole blocks of its prefix family, plus a few tokens,
    named by block hashes when *hashes* (a cluster without prefix caches refuses them)."""
    made = []
    for rid, (arrival, family, blocks, extra, output) in enumerate(workload.requests):
        made.append(
            simsim.Request(
                rid,
                arrival,
                blocks * BLOCK + extra,
                output,
                block_hashes=[(family, j) for j in range(blocks)] if hashes else None,
            )
        )
    return made


# ---------------------------------------------------------------------- phases


def phase_of(cluster: DisaggregatedCluster, rid: int) -> str | None:
    """Where request *rid* is now (read from the engines' internals), or ``None``."""
    request = cluster.requests[rid]
    if request.is_terminal:
        return None
    holder = cluster.replica_of(rid)
    if holder is None:
        return None  # not arrived yet
    engine = cluster.replicas[holder]
    assert isinstance(engine, simsim.BatchingEngine)
    if engine in cluster.prefill_replicas:
        return "prefilling" if rid in engine._slot_of else "prefill_queued"
    if rid in engine._incoming:
        return "transfer_queued"
    slot = engine._slot_of.get(rid)
    if slot is not None and slot.arriving:
        return "transferring"
    return "decoding" if request.state is simsim.RequestState.DECODING else "elsewhere"


def canceller(
    cluster: DisaggregatedCluster, phase: str, at_us: int, which: int
) -> Generator[SimpyYield, None, None]:
    """From *at_us*, poll every 97 us (at most 400 times) for a request in *phase*;
    cancel the *which*-th candidate (modulo their count) and stop."""
    env = cluster.env
    yield env.timeout(at_us)
    for _ in range(400):
        ids = sorted(cluster.requests)
        if phase == "any":
            candidates = [rid for rid in ids if not cluster.requests[rid].is_terminal]
        else:
            candidates = [rid for rid in ids if phase_of(cluster, rid) == phase]
        if candidates:
            cluster.cancel_request(candidates[which % len(candidates)])
            return
        yield env.timeout(97)


def kv_monitor(
    cluster: DisaggregatedCluster, overflows: list[str]
) -> Generator[SimpyYield, None, None]:
    """Every 53 us while anything else is pending: no replica holds more blocks than it has."""
    env = cluster.env
    while True:
        for index, engine in enumerate(cluster.replicas):
            assert isinstance(engine, simsim.BatchingEngine)
            total = engine._kv_cache.total_blocks  # type: ignore[union-attr]
            if not 0 <= engine.kv_blocks_in_use <= total:
                overflows.append(f"{env.now} us: replica {index} {engine.kv_blocks_in_use}/{total}")
            if not 0.0 <= engine.kv_cache_usage <= 1.0:
                overflows.append(f"{env.now} us: replica {index} usage {engine.kv_cache_usage}")
        if env.peek() == float("inf"):
            return
        yield env.timeout(53)


# ---------------------------------------------------------------------- running


class Recorder:
    """A prefill router wrapper that checks prefix affinity against the engines."""

    def __init__(self, inner: Any, cluster_box: list[DisaggregatedCluster], fresh: bool):
        self.inner = inner
        self.cluster_box = cluster_box
        self.fresh = fresh
        self.decisions = 0
        self.misses: list[str] = []

    def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        choice: int = self.inner.route(request, replicas)
        self.decisions += 1
        hashes = request.block_hashes or ()
        if self.fresh and hashes:
            engines = self.cluster_box[0].prefill_replicas
            held = [0 if engine._pool is None else engine._pool.match(hashes) for engine in engines]
            seen = [snapshot.cached_prefix_blocks(hashes) for snapshot in replicas]
            affinity = isinstance(self.inner, PrefixAffinityRouter)
            if seen != held or (affinity and held[choice] != max(held)):
                self.misses.append(f"request {request.request_id}: {held} {seen} -> {choice}")
        return choice


@dataclass
class Outcome:
    cluster: DisaggregatedCluster
    completed: dict[int, int]
    tokens: dict[tuple[int, int], int]
    overflows: list[str]
    recorder: Recorder


def run(setup: Setup, workload: Workload, stepping: bool = False) -> Outcome:
    env = simsim.Environment()
    box: list[DisaggregatedCluster] = []
    recorder = Recorder(make_router(setup.prefill_router), box, setup.refresh_us == 0)
    decode = list(setup.decode)
    if setup.decode_router == "prefix_affinity" and not any(p.prefix_cache for p in decode):
        decode[0] = replace(decode[0], prefix_cache=True)  # it is refused without one
    cluster = DisaggregatedCluster(
        [pool.build(env) for pool in setup.prefill],
        [pool.build(env) for pool in decode],
        setup.transfer,
        prefill_router=recorder,
        decode_router=setup.decode_router,
        refresh_interval_us=setup.refresh_us,
    )
    box.append(cluster)
    cached = any(pool.prefix_cache for pool in (*setup.prefill, *decode))
    for request in requests_of(workload, hashes=cached):
        cluster.submit(request)
    completed: dict[int, int] = {}
    tokens: dict[tuple[int, int], int] = {}

    def on_completion(rid: int) -> Generator[SimpyYield, None, None]:
        yield cluster.completion(rid)
        completed[rid] = env.now

    def on_token(rid: int, n: int) -> Generator[SimpyYield, None, None]:
        yield cluster.token(rid, n)
        tokens[rid, n] = env.now

    def watch_all() -> None:
        for rid, request in cluster.requests.items():
            if not request.is_terminal:
                env.process(on_completion(rid))
                for n in (1, 2):
                    if request.generated_token_count < n:
                        env.process(on_token(rid, n))

    def watch_later(at_us: int) -> Generator[SimpyYield, None, None]:
        yield env.timeout(at_us)
        watch_all()

    if workload.watch_from_us is None:
        watch_all()  # before any routing
    else:
        env.process(watch_later(workload.watch_from_us))
    for phase, at_us, which in workload.cancels:
        env.process(canceller(cluster, phase, at_us, which))
    overflows: list[str] = []
    env.process(kv_monitor(cluster, overflows))
    if stepping:
        while cluster.run_next_timestamp() is not None:
            pass
    else:
        cluster.run()
    return Outcome(cluster, completed, tokens, overflows, recorder)


def first_prefill_ends(events: pd.DataFrame) -> dict[int, int]:
    prefills = events[events["event_type"] == "PREFILL_COMPLETE"]
    ends: dict[int, int] = {}
    for rid, at in zip(prefills["request_id"], prefills["timestamp_us"], strict=True):
        ends.setdefault(int(rid), int(at))
    return ends


def check_routes(cluster: DisaggregatedCluster, frame: pd.DataFrame, events: pd.DataFrame) -> None:
    prefill_pool = set(range(len(cluster.prefill_replicas)))
    routes = cluster.routes_frame()
    front = routes[routes["replica"].isin(prefill_pool)]
    back = routes[~routes["replica"].isin(prefill_pool)]
    assert front["request_id"].is_unique and back["request_id"].is_unique
    assert set(back["request_id"]) <= set(front["request_id"])
    byid = frame.set_index("request_id")
    arrivals = byid.loc[front["request_id"], "arrival_time_us"]
    assert (front["timestamp_us"].to_numpy() == arrivals.to_numpy()).all()
    unrouted = byid[~byid.index.isin(front["request_id"])]
    assert (unrouted["state"] == "CANCELLED").all()
    assert (unrouted["finish_time_us"] <= unrouted["arrival_time_us"]).all()
    prefill_ends = first_prefill_ends(events)
    for rid, at in zip(back["request_id"], back["timestamp_us"], strict=True):
        assert at == prefill_ends[rid], rid
    # a request with output left, whose prefill ended on the prefill replica, was handed
    # over at that moment (unless it was cancelled at that very time)
    to_prefill = dict(zip(front["request_id"], front["replica"], strict=True))
    to_decode = dict(zip(back["request_id"], back["replica"], strict=True))
    for rid, row in byid.iterrows():
        assert row["prefill_replica"] is pd.NA or row["prefill_replica"] == to_prefill[rid]
        assert row["decode_replica"] is pd.NA or row["decode_replica"] == to_decode[rid]
        if rid in to_decode:
            assert row["prefill_replica"] == to_prefill[rid]
            assert row["decode_replica"] == to_decode[rid]
        elif rid in to_prefill:
            assert row["prefill_replica"] == to_prefill[rid]
            assert row["decode_replica"] is pd.NA
            if row["max_output_tokens"] > 0:
                assert row["generated_token_count"] == 0
    # each replica holds and logged exactly what was routed to it
    for index, engine in enumerate(cluster.replicas):
        if index in prefill_pool:
            mine = {rid for rid, at in to_prefill.items() if at == index}
            kept = mine - set(to_decode)
        else:
            mine = kept = {rid for rid, at in to_decode.items() if at == index}
        assert set(engine.requests) == kept, index
        logged = set(events.loc[events["replica"] == index, "request_id"])
        # a decode replica logs no arrival: one cancelled before its transfer ended logs nothing
        assert logged == mine if index in prefill_pool else logged <= mine, index
        if index in prefill_pool:
            kinds = set(events.loc[events["replica"] == index, "event_type"])
            assert kinds <= {"REQUEST_ARRIVAL", "PREFILL_COMPLETE", "REQUEST_COMPLETE"}


def check_transfers(
    cluster: DisaggregatedCluster, frame: pd.DataFrame, events: pd.DataFrame
) -> None:
    config = cluster.transfer
    prefill_ends = first_prefill_ends(events)
    done = frame[frame["transfer_end_us"].notna()]
    for row in done.itertuples():
        assert prefill_ends[row.request_id] <= row.transfer_start_us <= row.transfer_end_us
        assert row.transfer_us == row.transfer_end_us - row.transfer_start_us
        if row.first_token_time_us is not pd.NA:
            assert row.transfer_end_us <= row.first_token_time_us
    # a request that decoded on its decode replica got its KV cache there first, or
    # recomputed it after a preemption
    decoded = frame[frame["decode_replica"].notna() & (frame["generated_token_count"] > 0)]
    preempted = set(events.loc[events["event_type"] == "REQUEST_PREEMPTED", "request_id"])
    for row in decoded.itertuples():
        assert row.transfer_end_us is not pd.NA or row.request_id in preempted
    transfers = cluster.transfers_frame()
    assert transfers["request_id"].is_unique or preempted
    prompts = frame.set_index("request_id")["prompt_token_count"]
    planned_end = transfers["start_us"] + transfers["duration_us"]
    for position, row in enumerate(transfers.itertuples()):
        earlier = transfers.iloc[:position]
        overlapping = (
            (earlier["decode_replica"] == row.decode_replica)
            & (planned_end.iloc[:position] >= row.start_us)
        ).sum()
        possible = [
            config.transfer_us(int(prompts[row.request_id]), k) for k in range(1, overlapping + 2)
        ]
        assert row.duration_us in possible, (row, possible)
        assert row.decode_replica >= len(cluster.prefill_replicas)


def check_leftovers(outcome: Outcome) -> None:
    cluster = outcome.cluster
    assert outcome.overflows == []
    for engine in cluster.replicas:
        assert isinstance(engine, simsim.BatchingEngine)
        assert engine.kv_blocks_in_use == 0
        assert engine.queued_count == 0 and engine.running_count == 0
        assert engine._incoming == set()
    for engine in cluster.decode_replicas:
        assert engine._link._in_flight == 0  # type: ignore[union-attr]


def check_watched(outcome: Outcome, frame: pd.DataFrame, events: pd.DataFrame) -> None:
    byid = frame.set_index("request_id")
    watched = {rid for rid, _ in outcome.tokens} | set(outcome.completed)
    for rid in watched:
        assert rid in outcome.completed, rid
        assert outcome.completed[rid] == byid.loc[rid, "finish_time_us"], rid
    logged = token_times(events)
    for (rid, n), at in outcome.tokens.items():
        if byid.loc[rid, "generated_token_count"] >= n:
            assert at == logged[rid, n], (rid, n)
        else:
            assert at == byid.loc[rid, "finish_time_us"], (rid, n)


@property_settings(60)
@given(setup=setups, workload=workloads)
def test_disaggregated_runs_keep_every_invariant(setup: Setup, workload: Workload) -> None:
    outcome = run(setup, workload)
    cluster = outcome.cluster
    frame = cluster.requests_frame()
    events = cluster.events_frame()
    assert set(frame["state"]) <= TERMINAL
    finished = frame[frame["state"] == "FINISHED"]
    assert (finished["generated_token_count"] == finished["max_output_tokens"]).all()
    check_routes(cluster, frame, events)
    check_transfers(cluster, frame, events)
    check_leftovers(outcome)
    check_watched(outcome, frame, events)
    assert outcome.recorder.misses == []
    again = run(setup, workload, stepping=True).cluster  # driven timestamp by timestamp
    for name in ("requests_frame", "routes_frame", "events_frame", "transfers_frame"):
        assert getattr(cluster, name)().equals(getattr(again, name)()), name


@property_settings(15)
@given(workload=workloads, refresh_us=st.sampled_from((0, 2_000)))
def test_prefix_affinity_sends_shared_prefixes_to_the_replica_that_holds_them(
    workload: Workload, refresh_us: int
) -> None:
    setup = Setup(
        prefill=(Pool(2, 40, False, True), Pool(2, 40, False, True), Pool(2, 40, False, True)),
        decode=(Pool(4, 20, False, False),),
        prefill_router="prefix_affinity",
        decode_router="least_kv_cache",
        refresh_us=refresh_us,
        transfer=KvTransferConfig(kv_bytes_per_token=100, bandwidth_bytes_per_s=10**9),
    )
    outcome = run(setup, Workload(workload.requests, (), None))
    assert isinstance(outcome.recorder.inner, PrefixAffinityRouter)
    assert outcome.recorder.decisions == len(workload.requests)
    assert outcome.recorder.misses == []
    frame = outcome.cluster.requests_frame()
    assert set(frame["state"]) == {"FINISHED"}
    check_leftovers(outcome)


@property_settings(25)
@given(setup=setups_of(roomy_pools), workload=workloads)
def test_each_pools_occupancy_stays_within_its_slots(setup: Setup, workload: Workload) -> None:
    """Issue 24, point 4: the wait for a decode slot is queueing, so utilisation stays
    within [0, 1] per pool and for the cluster, and queued plus held is the time in the
    system (Little's law, exactly: the four intervals of a request's path tile it)."""
    cluster = run(setup, workload).cluster
    frame = cluster.requests_frame()
    assert "REQUEST_PREEMPTED" not in set(cluster.events_frame()["event_type"])
    slots = tuple(sum(pool.slots for pool in side) for side in (setup.prefill, setup.decode))
    summary = simsim.summarize(frame, slots=slots)["value"]
    start = int(frame["arrival_time_us"].min())
    end = int(frame["finish_time_us"].max())
    if end <= start:  # everything cancelled at once: no window to average over
        assert pd.isna(summary["utilization"])
        return
    for prefix in ("", "prefill_", "decode_"):
        assert 0 <= summary[f"{prefix}utilization"] <= 1, prefix
    series = simsim.results.occupancy_series(frame)
    assert series["prefill_occupancy"].max() <= slots[0]
    assert series["decode_occupancy"].max() <= slots[1]
    stays = (frame["finish_time_us"] - frame["arrival_time_us"]).clip(lower=0).sum()
    in_system = summary["mean_queue_length"] + summary["mean_active_requests"]
    assert in_system == pytest.approx(float(stays) / (end - start), rel=1e-9, abs=1e-12)
