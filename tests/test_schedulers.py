"""The built-in schedulers of simsim.schedulers (issue 17): each one's order and
tie-break on hand-made queues, option checks, the registry, the FCFS rules they share,
and aging's no-starvation bound on both engines (docs/schedulers.md)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import EASY_CONFIG

import simsim
from simsim.schedulers import (
    SCHEDULERS,
    EarliestDeadlineFirstScheduler,
    HeapScheduler,
    PriorityScheduler,
    ShortestJobFirstScheduler,
    ShortestPromptFirstScheduler,
    make_scheduler,
)

Q = simsim.QueuedRequest


def _drain(sched: simsim.Scheduler) -> list[int]:
    order: list[int] = []
    while (decision := sched.decide(0)) is not None:
        order.append(sched.commit(decision).request_id)
    return order


def _state(sched: HeapScheduler) -> tuple[Any, ...]:
    return (len(sched), sched.epoch, sched.stats, sched.queued_ids())


# --------------------------------------------------------------------------- orders


def test_priority_lower_value_first_then_arrival_then_id() -> None:
    sched = PriorityScheduler()
    sched.enqueue(Q(0, 0, 1, 1, priority=1))
    sched.enqueue(Q(5, 30, 1, 1, priority=0))
    sched.enqueue(Q(4, 30, 1, 1, priority=0))  # same priority and arrival: lower id first
    sched.enqueue(Q(3, 10, 1, 1, priority=0))
    sched.enqueue(Q(9, 99, 1, 1, priority=-2))  # negative runs before 0
    sched.enqueue(Q(1, 5, 1, 1))  # default priority 0
    assert sched.queued_ids() == [9, 1, 3, 4, 5, 0]
    assert _drain(sched) == [9, 1, 3, 4, 5, 0]


def test_shortest_prompt_first_without_aging() -> None:
    sched = ShortestPromptFirstScheduler()
    sched.enqueue(Q(0, 0, 50, 1))
    sched.enqueue(Q(7, 20, 10, 900))  # output length does not count
    sched.enqueue(Q(6, 20, 10, 1))  # tie on prompt and arrival: lower id
    sched.enqueue(Q(2, 5, 10, 1))  # tie on prompt: earlier arrival
    sched.enqueue(Q(3, 40, 0, 1))
    assert _drain(sched) == [3, 2, 6, 7, 0]


def test_shortest_prompt_first_with_aging_orders_by_virtual_arrival() -> None:
    # aging 1000 prompt tokens per second: a token is worth 1000 us of waiting
    sched = ShortestPromptFirstScheduler(aging_per_s=1000)
    sched.enqueue(Q(0, 0, 5, 1))  # virtual arrival 5000
    sched.enqueue(Q(1, 4_500, 1, 1))  # 5500
    sched.enqueue(Q(2, 1_000, 4, 1))  # 5000: ties with 0, arrived later
    sched.enqueue(Q(3, 5_000, 0, 1))  # 5000: ties, arrived last
    sched.enqueue(Q(4, 4_999, 0, 1))  # 4999
    assert _drain(sched) == [4, 0, 2, 3, 1]


def test_shortest_job_first_sizes() -> None:
    by_output = ShortestJobFirstScheduler()
    for item in (Q(0, 0, 1, 30), Q(1, 0, 900, 10), Q(2, 1, 1, 10)):
        by_output.enqueue(item)
    assert _drain(by_output) == [1, 2, 0]
    weighted = ShortestJobFirstScheduler(prompt_weight=0.5)  # 30.5, 460, 10.5
    for item in (Q(0, 0, 1, 30), Q(1, 0, 900, 10), Q(2, 1, 1, 10)):
        weighted.enqueue(item)
    assert _drain(weighted) == [2, 0, 1]


def test_shortest_job_first_with_a_predictor_and_aging() -> None:
    def predict(item: simsim.QueuedRequest) -> float:
        assert item.tags is not None
        return float(item.tags["expected_tokens"])

    sched = ShortestJobFirstScheduler(aging_per_s=10, prompt_weight=1, predict=predict)
    # virtual arrival = arrival + (expected + prompt) * 100_000 us
    sched.enqueue(Q(0, 0, 2, 99, tags={"expected_tokens": 1}))  # 300_000
    sched.enqueue(Q(1, 250_000, 0, 1, tags={"expected_tokens": 0.25}))  # 275_000
    sched.enqueue(Q(2, 100_000, 1, 1, tags={"expected_tokens": 1}))  # 300_000
    assert _drain(sched) == [1, 0, 2]


def test_edf_earliest_deadline_first_none_last() -> None:
    sched = EarliestDeadlineFirstScheduler()
    sched.enqueue(Q(0, 0, 1, 1))  # no deadline
    sched.enqueue(Q(1, 9, 1, 1, deadline_us=500))
    sched.enqueue(Q(2, 3, 1, 1, deadline_us=500))  # tie on deadline: earlier arrival
    sched.enqueue(Q(3, 50, 1, 1, deadline_us=20))  # already past when queued: still first
    sched.enqueue(Q(4, 0, 1, 1))  # no deadline, same arrival as 0: id order
    sched.enqueue(Q(5, 1, 1, 1, deadline_us=simsim.clock.MAX_TIME_US))
    assert _drain(sched) == [3, 2, 1, 5, 0, 4]


def test_fcfs_is_in_the_registry_unchanged() -> None:
    sched = make_scheduler("fcfs")
    assert type(sched) is simsim.FcfsScheduler
    assert repr(sched) == "FcfsScheduler(queued=0, epoch=0)"
    for item in (Q(1, 5, 1, 1), Q(0, 5, 9, 9), Q(2, 1, 50, 50)):
        sched.enqueue(item)
    assert sched.queued_ids() == [2, 0, 1]  # type: ignore[attr-defined]
    assert _drain(sched) == [2, 0, 1]


# --------------------------------------------------------------------------- shared rules


@pytest.mark.parametrize("name", ["priority", "shortest_prompt", "shortest_job", "edf"])
def test_shared_epoch_stats_and_stale_decision_rules(name: str) -> None:
    sched = make_scheduler(name)
    assert isinstance(sched, simsim.Scheduler)
    assert sched.decide(0) is None
    sched.enqueue(Q(1, 0, 5, 5))
    old = sched.decide(0)
    assert old == simsim.AdmissionDecision(1, sched.epoch)
    sched.enqueue(Q(2, 0, 5, 5))  # a mutation makes the decision stale
    with pytest.raises(simsim.StaleDecisionError, match="epoch"):
        sched.commit(old)  # type: ignore[arg-type]
    not_head = simsim.AdmissionDecision(2, sched.epoch)
    with pytest.raises(simsim.StaleDecisionError, match="not the head"):
        sched.commit(not_head)
    with pytest.raises(ValueError, match="request 2 is already queued"):
        sched.enqueue(Q(2, 0, 5, 5))
    sched.remove(2)
    with pytest.raises(simsim.UnknownRequestError, match="request 2 is not queued"):
        sched.remove(2)
    head = sched.decide(7)
    assert head is not None
    assert sched.commit(head) == Q(1, 0, 5, 5)
    stats = sched.stats
    assert (stats.enqueued, stats.admitted, stats.removed) == (2, 1, 1)
    assert (stats.rejected_commits, stats.max_queue_length) == (2, 2)
    assert sched.epoch == 4 and len(sched) == 0
    with pytest.raises(TypeError, match="QueuedRequest"):
        sched.enqueue((3, 0, 1, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sched",
    [
        PriorityScheduler(),
        ShortestPromptFirstScheduler(aging_per_s=3.5),
        ShortestJobFirstScheduler(aging_per_s=1, prompt_weight=2),
        EarliestDeadlineFirstScheduler(),
    ],
    ids=repr,
)
def test_a_preempted_request_re_enqueued_goes_back_to_its_place(sched: HeapScheduler) -> None:
    items = [
        Q(0, 0, 8, 8, priority=0, deadline_us=100),
        Q(1, 10, 9, 9, priority=1, deadline_us=200),
        Q(2, 20, 10, 10, priority=2, deadline_us=300),
    ]
    for item in items:
        sched.enqueue(item)
    first = sched.decide(20)
    assert first is not None
    admitted = sched.commit(first)
    assert admitted.request_id == 0
    sched.enqueue(Q(3, 30, 11, 11, priority=3, deadline_us=400))
    sched.enqueue(admitted)  # preempted: the same record comes back
    assert sched.queued_ids() == [0, 1, 2, 3]


def test_a_user_scheduler_needs_only_an_order_key() -> None:
    class LongestPromptFirst(HeapScheduler):
        def order_key(self, item: simsim.QueuedRequest) -> int:
            return -item.prompt_token_count

    sched = LongestPromptFirst()
    for item in (Q(0, 0, 5, 1), Q(1, 0, 50, 1), Q(2, 0, 50, 1)):
        sched.enqueue(item)
    assert repr(sched) == "LongestPromptFirst(queued=3, epoch=3)"
    engine = simsim.SimulationEngine(simsim.SimulatedBackend(EASY_CONFIG), LongestPromptFirst())
    for rid, prompt in ((0, 5), (1, 50), (2, 50), (3, 7)):
        engine.submit(simsim.Request(rid, 0, prompt, 1))
    engine.run()
    assert [a.request_id for a in engine.admission_log] == [1, 2, 3, 0]
    assert _drain(sched) == [1, 2, 0]


def test_repr_shows_the_options() -> None:
    assert repr(PriorityScheduler()) == "PriorityScheduler(queued=0, epoch=0)"
    assert repr(ShortestPromptFirstScheduler(aging_per_s=2)) == (
        "ShortestPromptFirstScheduler(aging_per_s=2, queued=0, epoch=0)"
    )
    assert repr(ShortestJobFirstScheduler(prompt_weight=0.5)) == (
        "ShortestJobFirstScheduler(aging_per_s=0.0, prompt_weight=0.5, queued=0, epoch=0)"
    )


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, "1", None])
@pytest.mark.parametrize(
    ("factory", "option"),
    [
        (ShortestPromptFirstScheduler, "aging_per_s"),
        (ShortestJobFirstScheduler, "aging_per_s"),
        (ShortestJobFirstScheduler, "prompt_weight"),
    ],
)
def test_bad_numeric_options_are_refused(factory: Any, option: str, value: object) -> None:
    error = TypeError if isinstance(value, bool | str | type(None)) else ValueError
    rule = "a number" if error is TypeError else "a finite number >= 0"
    with pytest.raises(error, match=f"{factory.__name__}: {option} must be {rule}"):
        factory(**{option: value})


def test_a_predictor_must_be_callable() -> None:
    with pytest.raises(TypeError, match="predict must be a function"):
        ShortestJobFirstScheduler(predict=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "error"),
    [(-1, ValueError), (math.nan, ValueError), (math.inf, ValueError), (True, TypeError)],
)
def test_a_bad_predicted_size_changes_nothing(answer: object, error: type[Exception]) -> None:
    sched = ShortestJobFirstScheduler(predict=lambda item: answer)  # type: ignore[arg-type,return-value]
    before = _state(sched)
    with pytest.raises(error, match=r"request 4: predict\(...\) \(its job size\)"):
        sched.enqueue(Q(4, 0, 1, 1))
    assert _state(sched) == before


def test_bad_metadata_in_a_hand_built_record_changes_nothing() -> None:
    priority = PriorityScheduler()
    priority.enqueue(Q(0, 0, 1, 1))
    before = _state(priority)
    with pytest.raises(TypeError, match="request 1: priority must be an int, got 'high'"):
        priority.enqueue(Q(1, 0, 1, 1, priority="high"))  # type: ignore[arg-type]
    assert _state(priority) == before
    edf = EarliestDeadlineFirstScheduler()
    before = _state(edf)
    with pytest.raises(TypeError, match="request 1: deadline_us must be an int"):
        edf.enqueue(Q(1, 0, 1, 1, deadline_us=2.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request 2: deadline_us"):
        edf.enqueue(Q(2, 0, 1, 1, deadline_us=-1))
    assert _state(edf) == before


def test_numpy_metadata_is_accepted() -> None:
    np = pytest.importorskip("numpy")
    priority = PriorityScheduler()
    priority.enqueue(Q(0, 0, 1, 1, priority=np.int64(3)))
    priority.enqueue(Q(1, 0, 1, 1, priority=2))
    assert _drain(priority) == [1, 0]
    sjf = ShortestJobFirstScheduler(predict=lambda item: np.float32(item.request_id))
    sjf.enqueue(Q(1, 0, 1, 1))
    sjf.enqueue(Q(0, 0, 1, 1))
    assert _drain(sjf) == [0, 1]


# --------------------------------------------------------------------------- registry


def test_registry_names_and_types() -> None:
    assert set(SCHEDULERS) >= {"fcfs", "priority", "shortest_prompt", "shortest_job", "edf"}
    built = {name: type(make_scheduler(name)) for name in SCHEDULERS}
    assert built["priority"] is PriorityScheduler
    assert built["shortest_prompt"] is ShortestPromptFirstScheduler
    assert built["shortest_job"] is ShortestJobFirstScheduler
    assert built["edf"] is EarliestDeadlineFirstScheduler
    sched = make_scheduler("shortest_job", aging_per_s=2, prompt_weight=0.25)
    assert isinstance(sched, ShortestJobFirstScheduler)
    assert (sched.aging_per_s, sched.prompt_weight, sched.predict) == (2, 0.25, None)


def test_make_scheduler_errors_name_the_policy_and_option() -> None:
    with pytest.raises(
        ValueError, match=r"unknown scheduler policy 'prio' \(did you mean 'priority'\?\); known"
    ):
        make_scheduler("prio")
    with pytest.raises(ValueError, match="known policies: edf, fair, fcfs, priority"):
        make_scheduler("lifo")
    with pytest.raises(TypeError, match="policy name must be a str"):
        make_scheduler(3)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match="'priority' has no option 'aging_per_s'; it takes no options"
    ):
        make_scheduler("priority", aging_per_s=1)
    with pytest.raises(
        TypeError,
        match="'shortest_prompt' has no option 'prompt_weight'; its options are aging_per_s",
    ):
        make_scheduler("shortest_prompt", prompt_weight=1)
    with pytest.raises(ValueError, match="aging_per_s must be a finite number"):
        make_scheduler("shortest_prompt", aging_per_s=-3)


# --------------------------------------------------------------------------- no starvation

SMALL_PROMPT, LARGE_PROMPT = 1, 500
AGING_PER_S = 250_000  # prompt tokens per second: the large request's window is 2000 us
LARGE_ID, LARGE_ARRIVAL_US = 1000, 150


def _stream_engine(
    kind: str, aging_per_s: float
) -> simsim.SimulationEngine | simsim.BatchingEngine:
    """Small requests every 50 us (more than the server can take) and one large request.

    Single slot: a small request takes 100 + 2 + 10 = 112 us, so the queue grows all the
    time; two batching slots serve two small requests per ~214 us (a prefill iteration
    then a decode iteration), also slower than they come.
    """
    backend = simsim.SimulatedBackend(EASY_CONFIG)
    sched = ShortestPromptFirstScheduler(aging_per_s=aging_per_s)
    engine: simsim.SimulationEngine | simsim.BatchingEngine
    if kind == "single":
        engine = simsim.SimulationEngine(backend, sched)
    else:
        engine = simsim.BatchingEngine(backend, sched, max_active_requests=2)
    for rid in range(120):
        engine.submit(simsim.Request(rid, rid * 50, SMALL_PROMPT, 1))
    engine.submit(simsim.Request(LARGE_ID, LARGE_ARRIVAL_US, LARGE_PROMPT, 1))
    engine.run()
    return engine


@pytest.mark.parametrize("kind", ["single", "batching"])
def test_without_aging_a_large_request_starves_behind_a_stream(kind: str) -> None:
    engine = _stream_engine(kind, 0)
    order = [a.request_id for a in engine.admission_log]
    assert order[-1] == LARGE_ID  # admitted only when the stream has ended
    large = engine.requests[LARGE_ID]
    assert large.admit_time_us is not None
    assert large.admit_time_us > max(r.arrival_time_us for r in engine.requests.values())


@pytest.mark.parametrize("kind", ["single", "batching"])
def test_with_aging_a_large_request_is_admitted_within_the_documented_bound(kind: str) -> None:
    engine = _stream_engine(kind, AGING_PER_S)
    # docs/schedulers.md: v = arrival + size * 1e6 / aging_per_s; R is admitted before
    # every request arriving at or after v, and only requests arriving before v overtake it
    v = LARGE_ARRIVAL_US + LARGE_PROMPT * (1_000_000 / AGING_PER_S)
    assert v == 2150
    order = [a.request_id for a in engine.admission_log]
    place = order.index(LARGE_ID)
    assert all(engine.requests[rid].arrival_time_us < v for rid in order[:place])
    assert all(engine.requests[rid].arrival_time_us >= v for rid in order[place + 1 :])
    assert place < len(order) - 1  # it did not wait for the stream's end
    # and so, single slot: queue delay <= the window + the work that arrived before v
    large = engine.requests[LARGE_ID]
    assert large.admit_time_us is not None
    if kind == "single":
        ahead = sum(1 for r in engine.requests.values() if r.arrival_time_us < v) - 1
        assert large.admit_time_us <= v + ahead * 112


def test_integer_keys_are_packed_and_checked() -> None:
    class ByTag(HeapScheduler):
        integer_keys = True

        def order_key(self, item: simsim.QueuedRequest) -> Any:
            assert item.tags is not None
            return item.tags["rank"]

    sched = ByTag()
    # huge and negative ranks keep their order (key * 2**64 + arrival)
    sched.enqueue(Q(0, 7, 1, 1, tags={"rank": 2**70}))
    sched.enqueue(Q(1, 9, 1, 1, tags={"rank": -(2**70)}))
    sched.enqueue(Q(2, simsim.clock.MAX_TIME_US, 1, 1, tags={"rank": -5}))
    sched.enqueue(Q(3, 0, 1, 1, tags={"rank": -4}))
    before = _state(sched)
    with pytest.raises(
        TypeError, match=r"ByTag.order_key returned float 1.5 for request 4; .* ints"
    ):
        sched.enqueue(Q(4, 0, 1, 1, tags={"rank": 1.5}))
    assert _state(sched) == before
    assert _drain(sched) == [1, 2, 3, 0]
