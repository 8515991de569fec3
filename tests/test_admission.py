"""Admission control: token buckets and queue limits per class or tenant, at arrival."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pandas as pd
import pytest
from conftest import EASY_CONFIG
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.admission import AdmissionControl, Limit
from simsim.cluster.cluster import Cluster
from simsim.engines.base import EngineBase

#: prefill 100 us + 2 us a token, a decode step 10 us
COSTS = EASY_CONFIG

Server = EngineBase | Cluster


def single(admission: AdmissionControl | None = None) -> simsim.SimulationEngine:
    return simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), admission=admission)


def fast(admission: AdmissionControl | None = None) -> simsim.FastSimulationEngine:
    return simsim.FastSimulationEngine(simsim.SimulatedBackend(COSTS), admission=admission)


def batching(admission: AdmissionControl | None = None) -> simsim.BatchingEngine:
    # A small KV cache, so that requests get preempted and readmitted.
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=3,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=5),
        admission=admission,
    )


def cluster(admission: AdmissionControl | None = None) -> Cluster:
    env = simsim.Environment()
    backend = simsim.SimulatedBackend(COSTS)
    replicas = [
        simsim.SimulationEngine(backend, env=env),
        simsim.FastSimulationEngine(backend, env=env),
    ]
    return Cluster(replicas, "least_outstanding", admission=admission)


SERVERS: dict[str, Callable[[AdmissionControl | None], Server]] = {
    "single": single,
    "fast": fast,
    "batching": batching,
    "cluster": cluster,
}


def request(rid: int, at_us: int, *, name: str | None = None, key: str = "class") -> simsim.Request:
    attribute = "request_class" if key == "class" else "tenant"
    return simsim.Request(rid, at_us, 4, 1, **{attribute: name})


def outcomes(server: Server) -> list[str | None]:
    """Each request's rejection (``None``: accepted), in id order."""
    return [server.requests[rid].rejection for rid in sorted(server.requests)]


# --------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("arguments", "error", "names"),
    [
        ({"max_queued": 0}, ValueError, "max_queued"),
        ({"max_queued": 1.0}, TypeError, "max_queued"),
        ({"rate_per_s": -1}, ValueError, "rate_per_s"),
        ({"rate_per_s": float("nan")}, ValueError, "rate_per_s"),
        ({"rate_per_s": float("inf")}, ValueError, "rate_per_s"),
        ({"rate_per_s": True}, TypeError, "rate_per_s"),
        ({"rate_per_s": "3"}, TypeError, "rate_per_s"),
        ({"rate_per_s": 1, "burst": 0}, ValueError, "burst"),
        ({"burst": 2}, ValueError, "burst=2 without rate_per_s"),
    ],
)
def test_bad_limits_are_refused_naming_the_argument(
    arguments: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        Limit(**arguments)


def test_bad_controls_are_refused() -> None:
    with pytest.raises(ValueError, match="key='class_name'"):
        AdmissionControl({}, key="class_name")
    with pytest.raises(TypeError, match="non-empty str"):
        AdmissionControl({"": Limit(max_queued=1)})
    with pytest.raises(TypeError, match=r"limits\['chat'\] must be a simsim.Limit"):
        AdmissionControl({"chat": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="mapping"):
        AdmissionControl([("chat", Limit())])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="admission must be a simsim\\.AdmissionControl"):
        single(Limit(max_queued=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="admission must be a simsim\\.AdmissionControl"):
        simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), max_active_requests=2, admission="*")  # type: ignore[arg-type]


def test_a_replica_with_its_own_admission_control_is_refused() -> None:
    env = simsim.Environment()
    backend = simsim.SimulatedBackend(COSTS)
    control = AdmissionControl({"*": Limit(max_queued=1)})
    replicas = [
        simsim.SimulationEngine(backend, env=env),
        simsim.SimulationEngine(backend, env=env, admission=control),
    ]
    with pytest.raises(ValueError, match=r"replicas\[1\] has an admission control of its own"):
        Cluster(replicas, admission=control)
    assert replicas[0]._cluster is None  # nothing changed


def test_limits_and_controls_are_immutable_values() -> None:
    limit = Limit(max_queued=3, rate_per_s=0.5, burst=2)
    assert limit == Limit(max_queued=3, rate_per_s=0.5, burst=2)
    assert hash(limit) == hash(Limit(max_queued=3, rate_per_s=0.5, burst=2))
    with pytest.raises(AttributeError):
        limit.burst = 4  # type: ignore[misc]
    control = AdmissionControl({"chat": limit}, key="tenant")
    assert control == AdmissionControl({"chat": limit}, key="tenant")
    with pytest.raises(TypeError):
        control.limits["bulk"] = Limit()  # type: ignore[index]
    assert "rate_per_s=0.5" in repr(control) and "key='tenant'" in repr(control)


def test_which_limit_applies_to_a_name() -> None:
    chat = Limit(max_queued=1)
    default = Limit(rate_per_s=2)
    control = AdmissionControl({"chat": chat, "vip": Limit(), "*": default})
    assert control.limit_for("chat") == chat
    assert control.limit_for("vip") is None  # Limit() exempts a name from "*"
    assert control.limit_for("bulk") == default
    assert control.limit_for(None) == default
    assert AdmissionControl({"chat": chat}).limit_for("bulk") is None
    assert control.group_of(simsim.Request(0, 0, 1, 1, request_class="chat")) == "chat"
    by_tenant = AdmissionControl({}, key="tenant")
    assert by_tenant.group_of(simsim.Request(0, 0, 1, 1, request_class="c", tenant="t")) == "t"


# --------------------------------------------------------------------- token buckets


@pytest.mark.parametrize("kind", SERVERS)
def test_a_bucket_earns_tokens_at_whole_microseconds_without_drift(kind: str) -> None:
    # 3 tokens a second, burst 3, emptied at 0: the bucket earns exactly 3 units a
    # microsecond, 10**6 units a token, so it holds a whole token at 333,334 us
    # (1,000,002 units), again at 666,667 us (2 left + 999,999) and at exactly
    # 1,000,000 us (1 left + 999,999); a microsecond earlier it is always short.
    server = SERVERS[kind](AdmissionControl({"*": Limit(rate_per_s=3, burst=3)}))
    times = [0, 0, 0, 333_333, 333_334, 666_666, 666_667, 999_999, 1_000_000]
    for rid, at in enumerate(times):
        server.submit(request(rid, at))
    server.run()
    r = "rate_limited"
    assert outcomes(server) == [None, None, None, r, None, r, None, r, None]


@pytest.mark.parametrize("kind", ["single", "batching"])
def test_a_full_bucket_earns_nothing(kind: str) -> None:
    # Burst 1 at 3 a second: full again at 333,333.33 us, so the token taken at
    # 333,334 us leaves it empty from then on (the 2 units past full were never kept):
    # the next whole token comes at 666,668 us, not 666,667 us.
    server = SERVERS[kind](AdmissionControl({"*": Limit(rate_per_s=3)}))
    for rid, at in enumerate([0, 333_334, 666_667, 666_668]):
        server.submit(request(rid, at))
    server.run()
    assert outcomes(server) == [None, None, "rate_limited", None]


def test_a_decimal_rate_is_exact_over_a_long_run() -> None:
    # 0.1 per second: exactly one token every 10 s. The float 0.1 is slightly above
    # 1/10, and summing it drifts; the bucket must do neither.
    server = fast(AdmissionControl({"*": Limit(rate_per_s=0.1)}))
    count = 400
    for k in range(count):
        server.submit(request(2 * k, k * 10_000_000 - 1 if k else 0))
        server.submit(request(2 * k + 1, k * 10_000_000))
    server.run()
    # 10 s after the last token, minus a microsecond, the bucket is one unit short.
    expected = [None, "rate_limited"] + ["rate_limited", None] * (count - 1)
    assert outcomes(server) == expected


def test_a_fractional_rate_counts_exactly() -> None:
    # 1/3 token a second: counted in units of 1/(3 * 10**6) token, one microsecond
    # earns exactly one unit, so a token takes exactly 3,000,000 us.
    server = single(AdmissionControl({"*": Limit(rate_per_s=Fraction(1, 3))}))
    for rid, at in enumerate([0, 2_999_999, 3_000_000, 6_000_000, 9_000_000]):
        server.submit(request(rid, at))
    server.run()
    assert outcomes(server) == [None, "rate_limited", None, None, None]


@pytest.mark.parametrize("kind", SERVERS)
def test_a_full_bucket_takes_a_burst_then_refills(kind: str) -> None:
    server = SERVERS[kind](AdmissionControl({"*": Limit(rate_per_s=1, burst=3)}))
    times = [0] * 5 + [1_000_000] * 2 + [3_000_000] * 3 + [10_000_000] * 4
    for rid, at in enumerate(times):
        server.submit(request(rid, at))
    server.run()
    r = "rate_limited"
    assert outcomes(server) == [
        *(None, None, None, r, r),  # the full bucket's 3 tokens, then empty
        *(None, r),  # one token earned in a second
        *(None, None, r),  # two more in two seconds
        *(None, None, None, r),  # full again (capped at 3) after 7 s
    ]


def test_rate_zero_accepts_only_the_burst() -> None:
    server = single(AdmissionControl({"*": Limit(rate_per_s=0, burst=2)}))
    for rid in range(4):
        server.submit(request(rid, rid * 10**9))
    server.run()
    assert outcomes(server) == [None, None, "rate_limited", "rate_limited"]


# --------------------------------------------------------------------- queue limits


@pytest.mark.parametrize("kind", ["single", "fast", "batching"])
def test_a_cancellation_frees_a_queue_place(kind: str) -> None:
    server = SERVERS[kind](AdmissionControl({"*": Limit(max_queued=2)}))
    assert isinstance(server, EngineBase)
    # Everyone gets in line behind request 0 (on the batching server, for the end of
    # the iteration request 0 started at 0).
    times = [0, 10, 10, 20, 40, 50]
    for rid, at in enumerate(times):
        server.submit(request(rid, at))
    while server.now_us < 20:
        server.run_next_timestamp()
    server.cancel_request(1)  # queued since 10: its place is free after 20
    server.run()
    assert outcomes(server) == [None, None, None, "queue_full", None, "queue_full"]
    assert server.requests[1].state is simsim.RequestState.CANCELLED
    assert server.requests[1].rejection is None  # cancelled, not rejected


def test_requests_arriving_together_all_count_as_queued() -> None:
    # Admission runs at the end of the timestamp, after every arrival at it.
    server = single(AdmissionControl({"*": Limit(max_queued=1)}))
    for rid in range(2):
        server.submit(request(rid, 100))
    server.run()
    assert outcomes(server) == [None, "queue_full"]


def test_an_admitted_request_stops_counting() -> None:
    # Request 0 is admitted at 0; at 10 the queue is empty again.
    server = single(AdmissionControl({"*": Limit(max_queued=1)}))
    for rid, at in enumerate([0, 10, 20, 20_000]):
        server.submit(request(rid, at))
    server.run()
    assert outcomes(server) == [None, None, "queue_full", None]


def test_a_preempted_request_does_not_count_again() -> None:
    # Two requests that outgrow the KV cache as they decode: request 1, admitted last,
    # is preempted and waits again. It was admitted once, so it is not queued: request
    # 2 gets in, and its readmission frees nothing more (two requests arriving together
    # at the end still find room for one only).
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=4),
        admission=AdmissionControl({"*": Limit(max_queued=1)}),
    )
    engine.submit(simsim.Request(0, 0, 4, 8))
    engine.submit(simsim.Request(1, 1, 4, 8))
    preempted_at = None
    while engine.run_next_timestamp() is not None:
        if preempted_at is None and engine.requests[1].state is simsim.RequestState.PREEMPTED:
            preempted_at = engine.now_us
            engine.submit(simsim.Request(2, preempted_at + 1, 4, 1))
    assert preempted_at is not None
    end = engine.now_us
    engine.submit(simsim.Request(3, end + 10, 4, 1))
    engine.submit(simsim.Request(4, end + 10, 4, 1))
    engine.run()
    assert engine.admissions_frame()["request_id"].tolist().count(1) == 2
    assert [engine.requests[rid].rejection for rid in range(5)] == [None] * 4 + ["queue_full"]


# --------------------------------------------------------------------- keys


@pytest.mark.parametrize("key", ["class", "tenant"])
def test_each_name_has_its_own_limit_and_star_gives_each_other_name_its_own(key: str) -> None:
    control = AdmissionControl(
        {"chat": Limit(max_queued=1), "vip": Limit(), "*": Limit(rate_per_s=0, burst=1)},
        key=key,
    )
    server = single(control)
    names = ["chat", "chat", "bulk", "bulk", "batch", None, None, "vip", "vip", "vip"]
    for rid, name in enumerate(names):
        server.submit(request(rid, 0, name=name, key=key))
    # The other attribute never matters.
    other = "tenant" if key == "class" else "request_class"
    server.submit(simsim.Request(10, 0, 4, 1, **{other: "chat"}))  # no name: "*"
    server.run()
    r, q = "rate_limited", "queue_full"
    assert outcomes(server) == [None, q, None, r, None, None, r, None, None, None, r]
    frame = server.requests_frame()
    assert frame["rejection"].dtype == "string"
    assert frame["rejection"].isna().tolist() == [o is None for o in outcomes(server)]


def test_names_without_a_limit_and_without_star_are_never_limited() -> None:
    server = single(AdmissionControl({"chat": Limit(rate_per_s=0, burst=1)}))
    for rid, name in enumerate(["chat", "chat", "bulk", "bulk", None, None]):
        server.submit(request(rid, 0, name=name))
    server.run()
    assert outcomes(server) == [None, "rate_limited", None, None, None, None]


# --------------------------------------------------------------------- rejected requests


@pytest.mark.parametrize("kind", SERVERS)
def test_a_rejected_request_is_cancelled_at_arrival_and_only_its_arrival_is_logged(
    kind: str,
) -> None:
    server = SERVERS[kind](AdmissionControl({"*": Limit(rate_per_s=0, burst=1)}))
    env = server.env
    seen: list[tuple[int, int, str]] = []

    def watch(rid: int) -> Any:
        done = server.completion(rid)
        # The fast single slot has no token events.
        first = None if kind in ("fast", "cluster") else server.first_token(rid)
        request = yield done
        seen.append((rid, env.now, request.state.name))
        if first is not None:
            assert first.triggered

    server.submit(request(0, 0))
    server.submit(request(1, 500))
    for rid in (0, 1):
        env.process(watch(rid))
    server.run()
    rejected = server.requests[1]
    assert rejected.state is simsim.RequestState.CANCELLED
    assert rejected.rejection == "rate_limited"
    assert (rejected.finish_time_us, rejected.admit_time_us) == (500, None)
    assert rejected.generated_token_count == 0
    assert (1, 500, "CANCELLED") in seen and (0, 118, "FINISHED") in seen
    events = server.events_frame()
    mine = events[events["request_id"] == 1]
    assert mine["event_type"].tolist() == ["REQUEST_ARRIVAL"]
    assert mine["timestamp_us"].tolist() == [500]
    assert 1 not in server.admissions_frame()["request_id"].tolist()
    with pytest.raises(simsim.InvalidTransitionError, match="already CANCELLED"):
        server.cancel_request(1)
    if isinstance(server, Cluster):
        assert server.replica_of(1) is None
        assert 1 not in server.routes_frame()["request_id"].tolist()
        assert pd.isna(server.requests_frame()["replica"][1])
        assert mine["replica"].isna().all()
        assert events["replica"].dtype == "Int64"
    else:
        assert server.scheduler_stats.enqueued == 1  # the scheduler never saw it


def test_a_cluster_checks_once_and_counts_queued_requests_on_every_replica() -> None:
    server = cluster(AdmissionControl({"*": Limit(max_queued=2)}))
    # Three at 0: the third finds two queued (admission comes at the end of 0). At 10
    # both are running on their replicas and the queue is empty again.
    for rid, at in enumerate([0, 0, 0, 10, 10, 10, 20]):
        server.submit(request(rid, at))
    server.run()
    q = "queue_full"
    assert outcomes(server) == [None, None, q, None, None, q, q]
    assert server.replicas[0].admission is None  # the replicas only keep the counts


def test_summarize_counts_rejections() -> None:
    server = single(AdmissionControl({"*": Limit(max_queued=1)}))
    for rid in range(4):
        server.submit(request(rid, 0))
    server.run()
    summary = simsim.summarize(server.requests_frame())["value"]
    assert summary["count_CANCELLED"] == 3
    assert summary["count_rejected"] == 3
    assert summary["count_rejected_queue_full"] == 3
    assert summary["count_rejected_rate_limited"] == 0
    assert summary["rejected_share"] == 0.75
    assert "count_rejected" not in simsim.summarize(single().requests_frame())["value"]


# --------------------------------------------------------------------- no request lost


LIMITS = st.builds(
    lambda max_queued, rate, burst: Limit(max_queued, rate, burst if rate is not None else 1),
    st.sampled_from([None, 1, 2, 3]),
    st.sampled_from([None, 0, 0.5, 3, 40.0, 1000]),
    st.integers(1, 3),
)

NAMES = [None, "a", "b", "c"]


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 25))
    gaps = draw(
        st.lists(
            st.sampled_from([0, 0, 1, 40, 300, 30_000, 400_000]), min_size=count, max_size=count
        )
    )
    names = draw(st.lists(st.sampled_from(NAMES), min_size=count, max_size=count))
    sizes = draw(
        st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4)), min_size=count, max_size=count)
    )
    cancels = draw(
        st.lists(st.sampled_from([None, None, None, 0, 50, 300]), min_size=count, max_size=count)
    )
    keyed = draw(st.dictionaries(st.sampled_from(["a", "b", "*"]), LIMITS, max_size=3))
    times = [sum(gaps[: i + 1]) for i in range(count)]
    return {
        "times": times,
        "names": names,
        "sizes": sizes,
        "cancels": cancels,
        "control": AdmissionControl(keyed, key=draw(st.sampled_from(["class", "tenant"]))),
    }


def drive(server: Server, workload: dict[str, Any]) -> list[Any]:
    """Submit the workload, run it to the end with its cancellations between
    timestamps, and return every request's completion event."""
    key = workload["control"].key if server.admission is not None else "class"
    for rid, at in enumerate(workload["times"]):
        prompt, output = workload["sizes"][rid]
        name = workload["names"][rid]
        attribute = "request_class" if key == "class" else "tenant"
        server.submit(simsim.Request(rid, at, prompt, output, **{attribute: name}))
    completions = [server.completion(rid) for rid in range(len(workload["times"]))]
    # Cancel request i once the clock has passed its arrival plus its delay.
    due = {
        rid: workload["times"][rid] + delay
        for rid, delay in enumerate(workload["cancels"])
        if delay is not None
    }
    while server.run_next_timestamp() is not None:
        now = server.now_us
        for rid, at in list(due.items()):
            if at <= now:
                del due[rid]
                if not server.requests[rid].is_terminal:
                    server.cancel_request(rid)
    return completions


def expected_rejections(frame: pd.DataFrame, control: AdmissionControl) -> list[str | None]:
    """The rejections the rules give, worked out again from the request table alone.

    The bucket as a virtual schedule (GCRA) in exact fractions; a request counts as
    queued at a later arrival at t until it leaves at L (its first admission, or its
    cancellation if it never was admitted) with L >= t: whatever leaves at t does so
    after every arrival at t (admission at the timestamp's end, cancellations between
    timestamps).
    """
    column = "request_class" if control.key == "class" else "tenant"
    limits = dict(control.limits)
    tat: dict[str | None, Fraction] = {}
    accepted: dict[str | None, list[Any]] = {}
    result: list[str | None] = []
    for row in frame.sort_values(["arrival_time_us", "request_id"]).itertuples():
        name = (
            None if column not in frame or pd.isna(getattr(row, column)) else getattr(row, column)
        )
        arrival = row.arrival_time_us
        finish = None if pd.isna(row.finish_time_us) else row.finish_time_us
        if finish is not None and finish < arrival:
            result.append(None)  # cancelled before it arrived
            continue
        limit = limits.get(name) if name is not None else None
        if limit is None:
            limit = limits.get("*")
        group = name
        reason = None
        if limit is not None and limit.rate_per_s is not None:
            rate = Fraction(str(limit.rate_per_s))
            earliest = tat.get(group, Fraction(0))
            if rate == 0:
                spent = len(accepted.get(group, []))
                if spent >= limit.burst:
                    reason = "rate_limited"
            elif arrival < earliest - (limit.burst - 1) * Fraction(10**6) / rate:
                reason = "rate_limited"
        if reason is None and limit is not None and limit.max_queued is not None:
            queued = 0
            for other in accepted.get(group, []):
                admit = None if pd.isna(other.admit_time_us) else other.admit_time_us
                left = admit
                if left is None and other.state == "CANCELLED":
                    left = other.finish_time_us
                if left is None or left >= arrival:
                    queued += 1
            if queued >= limit.max_queued:
                reason = "queue_full"
        if reason is None and limit is not None:
            accepted.setdefault(group, []).append(row)
            if limit.rate_per_s is not None and limit.rate_per_s != 0:
                rate = Fraction(str(limit.rate_per_s))
                tat[group] = (
                    max(Fraction(arrival), tat.get(group, Fraction(0))) + Fraction(10**6) / rate
                )
        result.append(reason)
    order = frame.sort_values(["arrival_time_us", "request_id"])["request_id"].tolist()
    by_id = dict(zip(order, result, strict=True))
    return [by_id[rid] for rid in frame["request_id"]]


@pytest.mark.parametrize("kind", SERVERS)
@settings(max_examples=examples(40), deadline=None)
@given(workload=workloads())
def test_no_request_is_lost_and_exactly_the_rules_reject(
    kind: str, workload: dict[str, Any]
) -> None:
    server = SERVERS[kind](workload["control"])
    completions = drive(server, workload)
    frame = server.requests_frame()
    assert len(frame) == len(workload["times"])
    assert set(frame["state"]) <= {"FINISHED", "CANCELLED"}
    assert all(event.triggered for event in completions)
    rejected = frame[frame["rejection"].notna()]
    assert (rejected["state"] == "CANCELLED").all()
    assert (rejected["finish_time_us"] == rejected["arrival_time_us"]).all()
    assert rejected["admit_time_us"].isna().all()
    assert (rejected["generated_token_count"] == 0).all()
    actual = [None if pd.isna(value) else value for value in frame["rejection"]]
    assert actual == expected_rejections(frame, workload["control"])


def _same_run(
    make: Callable[[AdmissionControl | None], Server], workload: dict[str, Any]
) -> tuple[Any, Any]:
    server = make(workload["control"])
    drive(server, workload)
    events = server.events_frame()
    if "replica" in events:
        events = events.assign(replica=events["replica"].astype("int64"))
    return server.requests_frame(), events


@pytest.mark.parametrize("kind", SERVERS)
@settings(max_examples=examples(15), deadline=None)
@given(workload=workloads())
def test_without_admission_control_or_with_one_that_accepts_all_the_run_is_the_same(
    kind: str, workload: dict[str, Any]
) -> None:
    make = SERVERS[kind]
    plain = dict(workload, control=AdmissionControl({}))
    with_control = _same_run(make, plain)
    without = _same_run(lambda _: make(None), plain)
    assert with_control[0]["rejection"].isna().all()
    assert "rejection" not in without[0]
    pd.testing.assert_frame_equal(with_control[0].drop(columns="rejection"), without[0])
    pd.testing.assert_frame_equal(with_control[1], without[1])
