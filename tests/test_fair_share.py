"""FairShareScheduler: the virtual token counter's order, lifting, charging, fairness on
an engine, and the epoch and stats rules every scheduler keeps (contract section 6)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import EASY_CONFIG
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.schedulers.fair import FairShareScheduler

Q = simsim.QueuedRequest

COSTS = EASY_CONFIG  # prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds)


def _q(rid: int, arrival: int, tenant: str | None, prompt: int = 10, output: int = 5) -> Q:
    return Q(rid, arrival, prompt, output, tenant=tenant)


def _drain(sched: FairShareScheduler) -> list[int]:
    order = []
    while (decision := sched.decide(0)) is not None:
        order.append(sched.commit(decision).request_id)
    return order


# --------------------------------------------------------------------------- order


def test_the_least_served_tenant_goes_first_and_each_tenant_is_fcfs() -> None:
    sched = FairShareScheduler()  # charge = prompt + 2 * output
    for item in (
        _q(1, 0, "a", prompt=100, output=0),  # costs 100
        _q(2, 1, "a", prompt=100, output=0),
        _q(3, 2, "a", prompt=100, output=0),
        _q(4, 3, "b", prompt=10, output=20),  # costs 50
        _q(5, 4, "b", prompt=10, output=20),
        _q(6, 5, "b", prompt=10, output=20),
    ):
        sched.enqueue(item)
    # a and b start at 0: a's head arrived first. Then a=100, b=0 -> b, b=50 -> b,
    # b=100 ties a=100: a's head (arrival 1) arrived before b's (arrival 5) -> a.
    assert sched.queued_ids() == [1, 4, 5, 2, 6, 3]
    assert _drain(sched) == [1, 4, 5, 2, 6, 3]
    assert sched.counters == {"a": 300.0, "b": 150.0}


def test_a_request_without_a_tenant_belongs_to_the_empty_tenant() -> None:
    sched = FairShareScheduler(prompt_weight=1, output_weight=0)
    sched.enqueue(_q(1, 0, None, prompt=50))
    sched.enqueue(_q(2, 1, None, prompt=50))
    sched.enqueue(_q(3, 2, "x", prompt=10))
    assert _drain(sched) == [1, 3, 2]
    assert sched.counters == {"": 100.0, "x": 10.0}


def test_ties_between_tenants_go_to_the_earlier_head_then_the_lower_id() -> None:
    sched = FairShareScheduler()
    sched.enqueue(_q(9, 7, "late"))
    sched.enqueue(_q(8, 7, "early"))  # same arrival, lower id
    sched.enqueue(_q(5, 3, "late"))  # becomes late's head: arrival 3
    assert sched.queued_ids()[0] == 5
    sched.remove(5)
    assert sched.queued_ids()[0] == 8


def test_weights_price_prompt_and_output_tokens() -> None:
    sched = FairShareScheduler(prompt_weight=0.5, output_weight=3)
    sched.enqueue(_q(1, 0, "a", prompt=10, output=4))
    _drain(sched)
    assert sched.counters == {"a": 0.5 * 10 + 3 * 4}
    assert (sched.prompt_weight, sched.output_weight) == (0.5, 3.0)


def test_both_weights_zero_are_refused_as_a_weighted_routers_are() -> None:
    # Once silently first come, first served: nobody was ever charged.
    with pytest.raises(
        ValueError,
        match=r"^FairShareScheduler: prompt_weight=0 and output_weight=0.0: at least one weight "
        r"must be above 0 \(with both 0 no tenant is ever charged",
    ):
        FairShareScheduler(prompt_weight=0, output_weight=0.0)
    # One weight above 0 is enough.
    assert FairShareScheduler(prompt_weight=0, output_weight=1).output_weight == 1.0


# --------------------------------------------------------------------------- lifting


def test_a_newly_backlogged_tenant_is_lifted_to_the_least_backlogged_counter() -> None:
    sched = FairShareScheduler(prompt_weight=1, output_weight=0)
    for rid in range(4):
        sched.enqueue(_q(rid, rid, "busy", prompt=10))
    sched.enqueue(_q(10, 0, "other", prompt=10))
    # busy (head 0) and other both at 0: busy first, then other, busy, busy...
    assert [sched.commit(sched.decide(0)).request_id for _ in range(3)] == [0, 10, 1]  # type: ignore[arg-type]
    assert sched.counters == {"busy": 20.0, "other": 10.0}
    # "idle" never sent anything: it arrives at counter 0 and is lifted to 20, the
    # least counter among the backlogged tenants (busy only), so it cannot claim the
    # server for the 20 tokens it did not use.
    sched.enqueue(_q(20, 100, "idle", prompt=10))
    sched.enqueue(_q(21, 101, "idle", prompt=10))
    assert sched.counters["idle"] == 20.0
    assert _drain(sched) == [2, 20, 3, 21]


def test_lifting_never_lowers_a_counter() -> None:
    sched = FairShareScheduler(prompt_weight=1, output_weight=0)
    sched.enqueue(_q(1, 0, "rich", prompt=500))
    sched.enqueue(_q(2, 0, "poor", prompt=1))
    _drain(sched)
    sched.enqueue(_q(3, 10, "poor", prompt=1))
    sched.enqueue(_q(4, 11, "rich", prompt=1))  # rich keeps its 500, above poor's 1
    assert sched.counters == {"rich": 500.0, "poor": 1.0}
    assert _drain(sched) == [3, 4]


def test_with_nobody_backlogged_a_tenant_is_lifted_to_the_last_one_that_left() -> None:
    sched = FairShareScheduler(prompt_weight=1, output_weight=0)
    sched.enqueue(_q(1, 0, "a", prompt=70))
    _drain(sched)  # a leaves the backlog at 70
    sched.enqueue(_q(2, 5, "b", prompt=1))
    assert sched.counters["b"] == 70.0
    assert sched.backlogged_tenants() == ["b"]


def test_a_preempted_request_queued_again_is_not_charged_again() -> None:
    sched = FairShareScheduler()
    item = _q(1, 0, "a", prompt=10, output=5)
    sched.enqueue(item)
    _drain(sched)
    assert sched.counters == {"a": 20.0}
    sched.enqueue(item)  # the batching engine re-enqueues a preempted request
    assert _drain(sched) == [1]
    assert sched.counters == {"a": 20.0}


def test_a_removed_request_is_never_charged() -> None:
    sched = FairShareScheduler()
    sched.enqueue(_q(1, 0, "a"))
    sched.enqueue(_q(2, 1, "a"))
    sched.remove(2)
    sched.remove(1)
    assert len(sched) == 0 and sched.decide(0) is None
    assert sched.counters == {"a": 0.0}
    assert sched.backlogged_tenants() == []


# --------------------------------------------------------------------------- fairness


def test_two_tenants_with_equal_demand_get_equal_service() -> None:
    sched = FairShareScheduler()
    for rid in range(40):
        tenant = "a" if rid % 2 else "b"
        sched.enqueue(_q(rid, rid // 2, tenant, prompt=10 + rid % 7, output=3))
    largest = max(10 + rid % 7 + 2 * 3 for rid in range(40))
    served = {"a": 0.0, "b": 0.0}
    while (decision := sched.decide(0)) is not None:
        item = sched.commit(decision)
        served[item.tenant or ""] += item.prompt_token_count + 2 * item.max_output_tokens
        if len(sched.backlogged_tenants()) == 2:
            # While both stay backlogged, service differs by at most one request.
            assert abs(served["a"] - served["b"]) <= largest
    assert sched.counters == served


def _run(scheduler: simsim.Scheduler | None, requests: list[simsim.Request]) -> dict[int, int]:
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        scheduler,
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=12),
    )
    for request in requests:
        engine.submit(request)
    engine.run()
    frame = engine.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    return {int(r): int(t) for r, t in zip(frame["request_id"], frame["ttft_us"], strict=True)}


def _heavy_and_light() -> list[simsim.Request]:
    requests = [
        simsim.Request(rid, 0, prompt_token_count=64, max_output_tokens=32, tenant="heavy")
        for rid in range(40)
    ]
    requests += [
        simsim.Request(
            100 + k, 50 + 200 * k, prompt_token_count=16, max_output_tokens=4, tenant="light"
        )
        for k in range(10)
    ]
    return requests


def test_a_heavy_tenant_does_not_starve_a_light_one() -> None:
    fcfs = _run(None, _heavy_and_light())
    fair = _run(FairShareScheduler(), _heavy_and_light())
    light = range(100, 110)
    fcfs_light = sum(fcfs[r] for r in light) / len(light)
    fair_light = sum(fair[r] for r in light) / len(light)
    # Under FCFS a light request waits behind the whole burst; under fair share it is
    # admitted at the next free slot (within about one heavy request's service).
    assert fair_light * 5 < fcfs_light
    one_heavy_us = (
        COSTS.prefill_base_us + 64 * COSTS.prefill_per_token_us + 33 * COSTS.decode_base_us
    )
    assert max(fair[r] for r in light) <= 2 * one_heavy_us
    # The heavy tenant still gets every other slot: its requests all finish.
    assert len(fair) == len(fcfs) == 50


def test_preemption_on_the_batching_engine_keeps_the_counters_exact() -> None:
    # A cache too small for both requests' outputs: the later admission is preempted
    # and readmitted, and must not be charged twice.
    requests = [
        simsim.Request(0, 0, prompt_token_count=8, max_output_tokens=30, tenant="a"),
        simsim.Request(1, 0, prompt_token_count=8, max_output_tokens=30, tenant="b"),
    ]
    sched = FairShareScheduler()
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        sched,
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=12),
    )
    for request in requests:
        engine.submit(request)
    engine.run()
    assert "REQUEST_PREEMPTED" in set(engine.events_frame()["event_type"])
    assert sched.counters == {"a": 68.0, "b": 68.0}
    assert sched.stats.admitted == 3 and sched.stats.enqueued == 3


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prompt_weight": -1}, ValueError),
        ({"output_weight": float("nan")}, ValueError),
        ({"output_weight": float("inf")}, ValueError),
        ({"prompt_weight": True}, TypeError),
        ({"output_weight": "2"}, TypeError),
    ],
)
def test_bad_weights_are_refused_naming_the_weight(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        FairShareScheduler(**kwargs)  # type: ignore[arg-type]


def test_bad_operations_are_refused_and_change_nothing() -> None:
    sched = FairShareScheduler()
    sched.enqueue(_q(1, 0, "a"))
    before = (sched.epoch, sched.stats, sched.counters)
    with pytest.raises(ValueError, match="request 1 is already queued"):
        sched.enqueue(_q(1, 3, "b"))
    with pytest.raises(TypeError, match="QueuedRequest"):
        sched.enqueue(object())  # type: ignore[arg-type]
    with pytest.raises(simsim.UnknownRequestError, match="request 2"):
        sched.remove(2)
    with pytest.raises(TypeError, match="now_us"):
        sched.decide(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AdmissionDecision"):
        sched.commit(1)  # type: ignore[arg-type]
    assert (sched.epoch, sched.stats, sched.counters) == before
    assert sched.backlogged_tenants() == ["a"]


def test_it_is_a_scheduler() -> None:
    sched = FairShareScheduler()
    assert isinstance(sched, simsim.Scheduler)
    assert "FairShareScheduler(" in repr(sched)


# --------------------------------------------------------------------------- properties


@dataclass
class _Reference:
    """VTC written the slow, obvious way: lists scanned at every step."""

    prompt_weight: float
    output_weight: float
    queued: list[Q] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    charged: set[int] = field(default_factory=set)
    last_left: float | None = None

    def backlogged(self) -> set[str]:
        return {item.tenant or "" for item in self.queued}

    def enqueue(self, item: Q) -> None:
        tenant = item.tenant or ""
        backlogged = self.backlogged()
        if tenant not in backlogged:
            floors = [self.counters[t] for t in backlogged]
            floor = min(floors) if floors else self.last_left
            counter = self.counters.get(tenant, 0.0)
            self.counters[tenant] = counter if floor is None else max(counter, floor)
        self.queued.append(item)

    def head(self) -> Q | None:
        if not self.queued:
            return None
        heads = {}
        for item in sorted(self.queued, key=lambda q: (q.arrival_time_us, q.request_id)):
            heads.setdefault(item.tenant or "", item)
        return min(
            heads.values(),
            key=lambda q: (self.counters[q.tenant or ""], q.arrival_time_us, q.request_id),
        )

    def leave_if_empty(self, tenant: str) -> None:
        if tenant not in self.backlogged():
            self.last_left = self.counters[tenant]

    def remove(self, rid: int) -> None:
        item = next(q for q in self.queued if q.request_id == rid)
        self.queued.remove(item)
        self.leave_if_empty(item.tenant or "")

    def commit(self) -> Q:
        item = self.head()
        assert item is not None
        self.queued.remove(item)
        if item.request_id not in self.charged:
            self.charged.add(item.request_id)
            self.counters[item.tenant or ""] += (
                self.prompt_weight * item.prompt_token_count
                + self.output_weight * item.max_output_tokens
            )
        self.leave_if_empty(item.tenant or "")
        return item


_OPERATION = st.one_of(
    st.tuples(
        st.just("enqueue"),
        st.integers(0, 15),  # request id
        st.integers(0, 6),  # arrival
        st.sampled_from([None, "a", "b", "c"]),
        st.integers(0, 30),  # prompt
        st.integers(0, 10),  # output
    ),
    st.tuples(st.just("remove"), st.integers(0, 15)),
    st.tuples(st.just("commit"), st.booleans()),  # True: with a stale epoch
)


@settings(max_examples=examples(150), deadline=None)
@given(
    operations=st.lists(_OPERATION, max_size=60),
    weights=st.sampled_from([(1.0, 2.0), (1.0, 0.0), (0.0, 1.0), (0.5, 3.0)]),
)
def test_it_follows_the_reference_and_the_epoch_and_stats_rules(
    operations: list[tuple[object, ...]], weights: tuple[float, float]
) -> None:
    sched = FairShareScheduler(*weights)
    reference = _Reference(*weights)
    counts = {"enqueued": 0, "admitted": 0, "removed": 0, "rejected": 0, "longest": 0}
    for operation in operations:
        epoch, stats, counters = sched.epoch, sched.stats, sched.counters
        decision = sched.decide(0)
        assert (sched.epoch, sched.stats) == (epoch, stats)  # decide is pure
        expected = reference.head()
        assert (decision is None) == (expected is None)
        if decision is not None and expected is not None:
            assert (decision.request_id, decision.epoch) == (expected.request_id, epoch)
        kind = operation[0]
        if kind == "enqueue":
            _, rid, arrival, tenant, prompt, output = operation
            assert isinstance(rid, int) and isinstance(arrival, int)
            assert isinstance(prompt, int) and isinstance(output, int)
            assert tenant is None or isinstance(tenant, str)
            if any(q.request_id == rid for q in reference.queued):
                with pytest.raises(ValueError):
                    sched.enqueue(_q(rid, arrival, tenant, prompt, output))
                assert sched.epoch == epoch
                continue
            item = _q(rid, arrival, tenant, prompt, output)
            sched.enqueue(item)
            reference.enqueue(item)
            counts["enqueued"] += 1
        elif kind == "remove":
            rid = operation[1]
            assert isinstance(rid, int)
            if not any(q.request_id == rid for q in reference.queued):
                with pytest.raises(simsim.UnknownRequestError):
                    sched.remove(rid)
                assert sched.epoch == epoch
                continue
            sched.remove(rid)
            reference.remove(rid)
            counts["removed"] += 1
        else:
            stale = operation[1]
            if decision is None or stale:
                # an empty queue refuses any decision; an old epoch is refused even for the head
                bad = (
                    simsim.AdmissionDecision(0, epoch)
                    if decision is None
                    else simsim.AdmissionDecision(decision.request_id, epoch - 1)
                )
                with pytest.raises(simsim.StaleDecisionError):
                    sched.commit(bad)
                counts["rejected"] += 1
                assert (sched.epoch, sched.counters) == (epoch, counters)
                assert sched.stats.rejected_commits == counts["rejected"]
                continue
            assert sched.commit(decision) == reference.commit()
            counts["admitted"] += 1
        # every successful mutation moves the epoch; the counters follow the reference
        assert sched.epoch != epoch
        assert sched.counters == reference.counters
        assert len(sched) == len(reference.queued)
        counts["longest"] = max(counts["longest"], len(reference.queued))
        assert sched.backlogged_tenants() == sorted(reference.backlogged())
    assert sched.stats == simsim.SchedulerStats(
        enqueued=counts["enqueued"],
        admitted=counts["admitted"],
        removed=counts["removed"],
        rejected_commits=counts["rejected"],
        max_queue_length=counts["longest"],
    )
    # queued_ids() predicts the drain and does not change the scheduler
    predicted = sched.queued_ids()
    assert _drain(sched) == predicted


@settings(max_examples=examples(60), deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", None]), st.integers(0, 20)),
        min_size=1,
        max_size=25,
    ),
    order=st.randoms(use_true_random=False),
)
def test_the_order_does_not_depend_on_the_enqueue_order(
    items: list[tuple[int, str | None, int]], order: object
) -> None:
    # Simultaneous arrivals enqueued in any order are admitted in one order.
    queued = [
        _q(rid, arrival, tenant, prompt) for rid, (arrival, tenant, prompt) in enumerate(items)
    ]
    queued.sort(key=lambda q: q.arrival_time_us)
    shuffled = list(queued)
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    shuffled.sort(key=lambda q: q.arrival_time_us)  # arrivals keep their time order
    first, second = FairShareScheduler(), FairShareScheduler()
    for item in queued:
        first.enqueue(item)
    for item in shuffled:
        second.enqueue(item)
    assert _drain(first) == _drain(second)
