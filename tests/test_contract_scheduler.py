"""Contract section 6: the scheduler (``FcfsScheduler``, decisions, commits, statistics) and
how the engine uses any object that implements the same operations."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim

Q = simsim.QueuedRequest


def _stats_tuple(stats: simsim.SchedulerStats) -> tuple[int, int, int, int, int]:
    return (
        stats.enqueued,
        stats.admitted,
        stats.removed,
        stats.rejected_commits,
        stats.max_queue_length,
    )


def _drain(sched: simsim.FcfsScheduler) -> list[int]:
    order: list[int] = []
    while (decision := sched.decide(0)) is not None:
        order.append(sched.commit(decision).request_id)
    return order


# --------------------------------------------------------------------------- value types


def test_queued_request_is_immutable() -> None:
    item = Q(request_id=1, arrival_time_us=2, prompt_token_count=3, max_output_tokens=4)
    assert (item.request_id, item.arrival_time_us) == (1, 2)
    assert (item.prompt_token_count, item.max_output_tokens) == (3, 4)
    with pytest.raises(AttributeError):
        item.request_id = 9  # type: ignore[misc]
    assert item.request_id == 1


def test_queued_request_timestamp_must_be_an_int() -> None:
    # section 1: every public timestamp is an int; floats are rejected with TypeError
    with pytest.raises(TypeError):
        Q(request_id=1, arrival_time_us=0.5, prompt_token_count=1, max_output_tokens=1)  # type: ignore[arg-type]


def test_admission_decision_is_immutable() -> None:
    decision = simsim.AdmissionDecision(request_id=5, epoch=3)
    assert (decision.request_id, decision.epoch) == (5, 3)
    with pytest.raises(AttributeError):
        decision.epoch = 4  # type: ignore[misc]
    assert decision.epoch == 3


def test_scheduler_stats_is_an_immutable_snapshot() -> None:
    sched = simsim.FcfsScheduler()
    before = sched.stats
    assert _stats_tuple(before) == (0, 0, 0, 0, 0)
    with pytest.raises(AttributeError):
        before.enqueued = 7  # type: ignore[misc]
    sched.enqueue(Q(1, 0, 1, 1))
    # the earlier snapshot does not follow the scheduler
    assert _stats_tuple(before) == (0, 0, 0, 0, 0)
    assert _stats_tuple(sched.stats) == (1, 0, 0, 0, 1)


# --------------------------------------------------------------------------- basic operations


def test_empty_scheduler() -> None:
    sched = simsim.FcfsScheduler()
    assert len(sched) == 0
    assert sched.decide(0) is None
    assert sched.decide(1_000) is None
    assert isinstance(sched.epoch, int)


def test_len_counts_queued_items() -> None:
    sched = simsim.FcfsScheduler()
    sched.enqueue(Q(1, 0, 1, 1))
    sched.enqueue(Q(2, 0, 1, 1))
    assert len(sched) == 2
    sched.remove(1)
    assert len(sched) == 1
    decision = sched.decide(0)
    assert decision is not None
    sched.commit(decision)
    assert len(sched) == 0


def test_decide_returns_head_and_current_epoch() -> None:
    sched = simsim.FcfsScheduler()
    sched.enqueue(Q(4, 10, 1, 1))
    sched.enqueue(Q(2, 20, 1, 1))
    decision = sched.decide(20)
    assert decision == simsim.AdmissionDecision(request_id=4, epoch=sched.epoch)


def test_commit_returns_the_queued_item() -> None:
    sched = simsim.FcfsScheduler()
    item = Q(8, 10, 33, 2)
    sched.enqueue(item)
    decision = sched.decide(10)
    assert decision is not None
    assert sched.commit(decision) == item
    assert len(sched) == 0
    assert sched.decide(10) is None


# --------------------------------------------------------------------------- FCFS order


def test_fcfs_orders_by_arrival_time() -> None:
    sched = simsim.FcfsScheduler()
    # a high id arriving earlier goes before a low id arriving later
    sched.enqueue(Q(1, 500, 1, 1))
    sched.enqueue(Q(9, 100, 1, 1))
    sched.enqueue(Q(5, 300, 1, 1))
    assert _drain(sched) == [9, 5, 1]


def test_fcfs_breaks_arrival_ties_by_lowest_id_even_when_enqueued_descending() -> None:
    sched = simsim.FcfsScheduler()
    for rid in (7, 6, 5, 3, 2):  # simultaneous arrivals, enqueued in descending id order
        sched.enqueue(Q(rid, 40, 1, 1))
    sched.enqueue(Q(1, 41, 1, 1))
    sched.enqueue(Q(0, 39, 1, 1))
    # (39, 0), then (40, 2), (40, 3), (40, 5), (40, 6), (40, 7), then (41, 1)
    assert _drain(sched) == [0, 2, 3, 5, 6, 7, 1]


def test_fcfs_ignores_prompt_and_output_lengths() -> None:
    sched = simsim.FcfsScheduler()
    sched.enqueue(Q(1, 0, 10_000, 500))
    sched.enqueue(Q(2, 0, 1, 1))
    assert _drain(sched) == [1, 2]


def test_remove_takes_an_item_out_of_the_order() -> None:
    sched = simsim.FcfsScheduler()
    for rid in (3, 1, 2):
        sched.enqueue(Q(rid, 0, 1, 1))
    sched.remove(1)
    assert _drain(sched) == [2, 3]


# --------------------------------------------------------------------------- epoch


def test_epoch_changes_on_every_mutation() -> None:
    sched = simsim.FcfsScheduler()
    epochs = [sched.epoch]

    def changed() -> None:
        epochs.append(sched.epoch)
        assert epochs[-1] != epochs[-2]

    sched.enqueue(Q(1, 0, 1, 1))
    changed()
    sched.enqueue(Q(2, 0, 1, 1))
    changed()
    sched.enqueue(Q(3, 5, 1, 1))
    changed()
    sched.remove(2)
    changed()
    decision = sched.decide(5)
    assert decision is not None
    sched.commit(decision)
    changed()
    sched.remove(3)
    changed()
    assert all(isinstance(e, int) for e in epochs)


def test_decide_is_pure() -> None:
    sched = simsim.FcfsScheduler()
    sched.enqueue(Q(2, 0, 1, 1))
    sched.enqueue(Q(1, 0, 1, 1))
    epoch, length, stats = sched.epoch, len(sched), _stats_tuple(sched.stats)
    first = sched.decide(0)
    again = [sched.decide(t) for t in (0, 0, 7, 1_000_000)]
    assert first == simsim.AdmissionDecision(request_id=1, epoch=epoch)
    assert all(d == first for d in again)
    assert sched.epoch == epoch
    assert len(sched) == length
    assert _stats_tuple(sched.stats) == stats


def test_decide_on_empty_queue_is_pure_too() -> None:
    sched = simsim.FcfsScheduler()
    epoch = sched.epoch
    assert sched.decide(3) is None
    assert sched.epoch == epoch
    assert _stats_tuple(sched.stats) == (0, 0, 0, 0, 0)


# --------------------------------------------------------------------------- stale commits


def _loaded() -> simsim.FcfsScheduler:
    sched = simsim.FcfsScheduler()
    sched.enqueue(Q(10, 0, 1, 1))
    sched.enqueue(Q(11, 0, 1, 1))
    return sched


def test_stale_epoch_commit_is_rejected_and_changes_only_rejected_commits() -> None:
    sched = _loaded()
    old = sched.decide(0)
    assert old is not None and old.request_id == 10
    sched.enqueue(Q(12, 0, 1, 1))  # a mutation: the decision's epoch is no longer current
    epoch, length = sched.epoch, len(sched)
    enq, adm, rem, rej, mx = _stats_tuple(sched.stats)
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(old)
    assert sched.epoch == epoch
    assert len(sched) == length
    assert _stats_tuple(sched.stats) == (enq, adm, rem, rej + 1, mx)
    # the queue is intact: same head, and a fresh decision still commits
    fresh = sched.decide(0)
    assert fresh == simsim.AdmissionDecision(request_id=10, epoch=epoch)
    assert sched.commit(fresh).request_id == 10


def test_stale_epoch_even_when_the_head_is_the_same_request() -> None:
    sched = _loaded()
    old = sched.decide(0)
    assert old is not None
    sched.remove(11)  # head (10) unchanged, but the epoch moved on
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(old)
    assert len(sched) == 1
    assert sched.stats.rejected_commits == 1
    assert sched.stats.admitted == 0


def test_non_head_commit_is_rejected() -> None:
    sched = _loaded()
    epoch = sched.epoch
    bogus = simsim.AdmissionDecision(request_id=11, epoch=epoch)  # 11 is queued, not head
    with pytest.raises(simsim.StaleDecisionError) as info:
        sched.commit(bogus)
    assert sched.epoch == epoch
    assert len(sched) == 2
    assert _stats_tuple(sched.stats) == (2, 0, 0, 1, 2)
    assert _drain(sched) == [10, 11]
    assert "11" in str(info.value) or str(epoch) in str(info.value)


def test_commit_of_unknown_request_is_rejected() -> None:
    sched = _loaded()
    epoch = sched.epoch
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(simsim.AdmissionDecision(request_id=99, epoch=epoch))
    assert sched.epoch == epoch
    assert len(sched) == 2
    assert sched.stats.rejected_commits == 1


def test_commit_on_empty_queue_is_rejected() -> None:
    sched = simsim.FcfsScheduler()
    epoch = sched.epoch
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(simsim.AdmissionDecision(request_id=0, epoch=epoch))
    assert sched.epoch == epoch
    assert _stats_tuple(sched.stats) == (0, 0, 0, 1, 0)


def test_committed_decision_cannot_be_committed_twice() -> None:
    sched = _loaded()
    decision = sched.decide(0)
    assert decision is not None
    sched.commit(decision)
    epoch = sched.epoch
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(decision)
    assert sched.epoch == epoch
    assert len(sched) == 1
    assert _stats_tuple(sched.stats) == (2, 1, 0, 1, 2)


def test_stale_decision_error_is_a_simulation_error() -> None:
    assert issubclass(simsim.StaleDecisionError, simsim.SimulationError)


# --------------------------------------------------------------------------- stats


def test_stats_count_every_operation() -> None:
    sched = simsim.FcfsScheduler()
    for rid in (1, 2, 3):
        sched.enqueue(Q(rid, 0, 1, 1))  # queue length 3
    decision = sched.decide(0)
    assert decision is not None
    sched.commit(decision)  # admits 1 -> length 2
    sched.remove(3)  # length 1
    sched.enqueue(Q(4, 1, 1, 1))  # length 2; max stays 3
    with pytest.raises(simsim.StaleDecisionError):
        sched.commit(decision)
    stats = sched.stats
    assert isinstance(stats, simsim.SchedulerStats)
    assert _stats_tuple(stats) == (4, 1, 1, 1, 3)


# --------------------------------------------------------------------------- engine usage


class ShortestPromptFirst:
    """A user scheduler built from the contract's operations only; epoch counts mutations."""

    def __init__(self) -> None:
        self._items: dict[int, simsim.QueuedRequest] = {}
        self.epoch = 100
        self._counts = [0, 0, 0, 0, 0]
        self.decide_calls = 0

    def __len__(self) -> int:
        return len(self._items)

    def _head(self) -> simsim.QueuedRequest | None:
        if not self._items:
            return None
        return min(self._items.values(), key=lambda q: (q.prompt_token_count, q.request_id))

    def enqueue(self, item: simsim.QueuedRequest) -> None:
        self._items[item.request_id] = item
        self.epoch += 1
        self._counts[0] += 1
        self._counts[4] = max(self._counts[4], len(self._items))

    def remove(self, request_id: int) -> None:
        del self._items[request_id]
        self.epoch += 1
        self._counts[2] += 1

    def decide(self, now_us: int) -> simsim.AdmissionDecision | None:
        self.decide_calls += 1
        head = self._head()
        if head is None:
            return None
        return simsim.AdmissionDecision(request_id=head.request_id, epoch=self.epoch)

    def commit(self, decision: simsim.AdmissionDecision) -> simsim.QueuedRequest:
        head = self._head()
        if decision.epoch != self.epoch or head is None or head.request_id != decision.request_id:
            self._counts[3] += 1
            raise simsim.StaleDecisionError(f"stale decision for {decision.request_id}")
        del self._items[head.request_id]
        self.epoch += 1
        self._counts[1] += 1
        return head

    @property
    def stats(self) -> simsim.SchedulerStats:
        return simsim.SchedulerStats(*self._counts)


def test_engine_uses_a_user_scheduler() -> None:
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=100,
            prefill_per_token_us=2,
            prefill_per_active_sequence_us=0,
            decode_base_us=10,
            decode_per_active_sequence_us=0,
        )
    )
    sched = ShortestPromptFirst()
    eng = simsim.SimulationEngine(backend, sched)
    # id 0 arrives alone at 0 and runs: prefill 100 + 2*10 = 120, one token at 130 (done 130)
    eng.submit(simsim.Request(0, 0, 10, 1))
    # ids 1, 2, 3 arrive at 50 and wait; shortest prompt first: 3 (5), 2 (20), 1 (40)
    eng.submit(simsim.Request(1, 50, 40, 1))
    eng.submit(simsim.Request(2, 50, 20, 1))
    eng.submit(simsim.Request(3, 50, 5, 1))
    eng.run()
    admitted = [(a.timestamp_us, a.request_id, a.epoch) for a in eng.admission_log]
    # epochs: 100 +1 (enqueue 0) = 101 admitted at 0 -> commit makes 102;
    # enqueues of 1, 2, 3 at 50 -> 105.
    # 130: admit 3 with epoch 105 (-> 106); prefill 100 + 10 = 110 -> 240; token 250.
    # 250: admit 2 with epoch 106 (-> 107); prefill 100 + 40 = 140 -> 390; token 400.
    # 400: admit 1 with epoch 107 (-> 108); prefill 100 + 80 = 180 -> 580; token 590.
    assert admitted == [(0, 0, 101), (130, 3, 105), (250, 2, 106), (400, 1, 107)]
    assert eng.requests[1].finish_time_us == 590
    assert eng.scheduler_stats == simsim.SchedulerStats(4, 4, 0, 0, 3)
    assert sched.decide_calls > 0


def test_engine_scheduler_defaults_to_fcfs(engine: simsim.SimulationEngine) -> None:
    # simultaneous arrivals submitted in descending id order are admitted lowest id first
    for rid in (5, 4, 3):
        engine.submit(simsim.Request(rid, 0, 0, 0))
    engine.run()
    # each: prefill 100, zero output -> admissions at 0, 100, 200
    admitted = [(a.timestamp_us, a.request_id) for a in engine.admission_log]
    assert admitted == [(0, 3), (100, 4), (200, 5)]
    # arrivals are logged in processing (= submission) order, not id order
    arrivals = [
        r.request_id for r in engine.event_log if r.event_type is simsim.EventType.REQUEST_ARRIVAL
    ]
    assert arrivals == [5, 4, 3]


def test_engine_cancel_while_queued_calls_remove(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 1))
    engine.submit(simsim.Request(1, 0, 10, 1))
    assert engine.run_next_timestamp() == 0  # 0 admitted, 1 queued
    engine.cancel_request(1)
    stats = engine.scheduler_stats
    assert isinstance(stats, simsim.SchedulerStats)
    assert _stats_tuple(stats) == (2, 1, 1, 0, 2)


class _SpyFcfs(simsim.FcfsScheduler):
    """The stock FCFS scheduler, remembering every decision it committed."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: list[simsim.AdmissionDecision] = []

    def commit(self, decision: simsim.AdmissionDecision) -> simsim.QueuedRequest:
        item = super().commit(decision)
        self.committed.append(decision)
        return item


def test_engine_admission_records_carry_the_committed_decision() -> None:
    sched = _SpyFcfs()
    eng = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(prefill_base_us=5)), sched
    )
    for rid in (2, 0, 1):
        eng.submit(simsim.Request(rid, 0, 1, 0))
    # each request: prefill 5, no output -> admissions at 0 (id 0), 5 (id 1), 10 (id 2)
    eng.run()
    assert [(a.timestamp_us, a.request_id) for a in eng.admission_log] == [
        (0, 0),
        (5, 1),
        (10, 2),
    ]
    assert [(a.request_id, a.epoch) for a in eng.admission_log] == [
        (d.request_id, d.epoch) for d in sched.committed
    ]
    assert sched.stats.rejected_commits == 0


def test_dataclass_like_values_compare_by_value() -> None:
    assert Q(1, 2, 3, 4) == Q(1, 2, 3, 4)
    assert simsim.AdmissionDecision(1, 2) == simsim.AdmissionDecision(1, 2)
    if dataclasses.is_dataclass(Q):
        assert dataclasses.replace(Q(1, 2, 3, 4), request_id=5) == Q(5, 2, 3, 4)


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=12).flatmap(
        lambda arrivals: st.permutations(list(enumerate(arrivals)))
    )
)
def test_fcfs_order_is_arrival_then_id_for_any_enqueue_order(
    items: list[tuple[int, int]],
) -> None:
    sched = simsim.FcfsScheduler()
    for rid, arrival in items:
        sched.enqueue(Q(rid, arrival, 1, 1))
    assert len(sched) == len(items)
    expected = [rid for rid, _ in sorted(items, key=lambda p: (p[1], p[0]))]
    assert _drain(sched) == expected
    assert sched.stats == simsim.SchedulerStats(len(items), len(items), 0, 0, len(items))
