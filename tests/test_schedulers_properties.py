"""Property tests of the schedulers of simsim.schedulers (issue 17).

* **Rules.** Random operation sequences on each scheduler against a plain model (a list
  sorted by an order key written here from docs/schedulers.md, independently of the
  implementation): the queue order, the epoch (it changes on every mutation and only
  then), the statistics, and ``StaleDecisionError`` for a stale or non-head commit.
* **Order on the engines.** Random workloads with random metadata on
  :class:`simsim.SimulationEngine`, :class:`simsim.FastSimulationEngine` and
  :class:`simsim.BatchingEngine` (small KV caches, so requests get preempted and come
  back): every admission takes, among the requests queued at that moment, the one with
  the least documented key; with aging, no request arriving at or after another's
  virtual arrival is first admitted before it.
* **Determinism.** The same inputs twice give the same tables and logs.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from helpers import examples, request_table
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim import EventType, RequestState
from simsim.engines.base import queued_request
from simsim.schedulers import make_scheduler

Key = tuple[Any, ...]


def _settings(quick: int) -> settings:
    return settings(max_examples=examples(quick), deadline=None, derandomize=True)


# ---------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Policy:
    """A scheduler policy and its options, with the order key docs/schedulers.md gives."""

    name: str
    aging_per_s: float = 0
    prompt_weight: float = 0

    def options(self) -> dict[str, float]:
        options: dict[str, float] = {}
        if self.name in ("shortest_prompt", "shortest_job"):
            options["aging_per_s"] = self.aging_per_s
        if self.name == "shortest_job":
            options["prompt_weight"] = self.prompt_weight
        return options

    def build(self) -> simsim.Scheduler:
        return make_scheduler(self.name, **self.options())

    def size(self, item: simsim.QueuedRequest) -> float:
        if self.name == "shortest_prompt":
            return item.prompt_token_count
        size: float = item.max_output_tokens
        if self.prompt_weight:
            size += self.prompt_weight * item.prompt_token_count
        return size

    def virtual_arrival(self, item: simsim.QueuedRequest) -> float:
        """With aging: arrival + size * (1e6 / aging_per_s), in microseconds."""
        return item.arrival_time_us + self.size(item) * (1_000_000 / self.aging_per_s)

    def key(self, item: simsim.QueuedRequest) -> Key:
        tie = (item.arrival_time_us, item.request_id)
        if self.name == "fcfs":
            return tie
        if self.name == "priority":
            return (item.priority, *tie)
        if self.name == "edf":
            return (math.inf if item.deadline_us is None else item.deadline_us, *tie)
        if self.aging_per_s:
            return (self.virtual_arrival(item), *tie)
        return (self.size(item), *tie)


policies = st.one_of(
    st.sampled_from([Policy("fcfs"), Policy("priority"), Policy("edf")]),
    st.builds(
        Policy,
        st.just("shortest_prompt"),
        st.sampled_from([0, 0, 1_000, 2_500.0, 1e6 / 3, 50_000]),
    ),
    st.builds(
        Policy,
        st.just("shortest_job"),
        st.sampled_from([0, 0, 1_000, 2_500.0, 1e6 / 3, 50_000]),
        st.sampled_from([0, 0.5, 1, 2]),
    ),
)


@st.composite
def metadata(draw: Any) -> dict[str, Any]:
    """Priorities and deadlines from small pools, so that ties are common."""
    return {
        "priority": draw(st.sampled_from([0, 0, 1, 2, -1])),
        "deadline_us": draw(st.one_of(st.none(), st.sampled_from([50, 400, 900]))),
    }


# ---------------------------------------------------------------------------- rules


@st.composite
def operations(draw: Any) -> list[tuple[str, int]]:
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["enqueue", "enqueue", "remove", "commit", "stale", "not_head"]),
                st.integers(0, 15),
            ),
            max_size=40,
        )
    )


@_settings(150)
@given(policy=policies, ops=operations(), data=st.data())
def test_every_scheduler_follows_the_shared_rules(
    policy: Policy, ops: list[tuple[str, int]], data: Any
) -> None:
    sched = policy.build()
    model: dict[int, simsim.QueuedRequest] = {}
    counts = Counter[str]()
    high = 0
    old_decision: simsim.AdmissionDecision | None = None
    for op, rid in ops:
        epoch = sched.epoch
        head = min(model.values(), key=policy.key) if model else None
        decision = sched.decide(data.draw(st.integers(0, 10**6), label="now_us"))
        assert (decision is None) == (head is None)
        if decision is not None and head is not None:
            assert decision == simsim.AdmissionDecision(head.request_id, epoch)
        mutated = False
        if op == "enqueue" and rid not in model:
            arrival = data.draw(st.sampled_from([0, 7, 7, 500]), label="arrival")
            prompt, output = data.draw(st.tuples(st.integers(0, 9), st.integers(0, 9)))
            item = simsim.QueuedRequest(rid, arrival, prompt, output, **data.draw(metadata()))
            sched.enqueue(item)
            model[rid] = item
            counts["enqueued"] += 1
            high = max(high, len(model))
            mutated = True
        elif op == "remove":
            if rid in model:
                sched.remove(rid)
                del model[rid]
                counts["removed"] += 1
                mutated = True
            else:
                try:
                    sched.remove(rid)
                except simsim.UnknownRequestError:
                    pass
                else:
                    raise AssertionError(f"removing request {rid}, not queued, succeeded")
        elif op == "commit" and decision is not None and head is not None:
            assert sched.commit(decision) == head
            del model[head.request_id]
            counts["admitted"] += 1
            mutated = True
        elif op in ("stale", "not_head"):
            if op == "stale" and old_decision is not None and old_decision.epoch != epoch:
                bad = old_decision
            elif op == "not_head" and any(r != getattr(head, "request_id", None) for r in model):
                bad = simsim.AdmissionDecision(
                    next(r for r in model if r != getattr(head, "request_id", None)), epoch
                )
            else:
                bad = None
            if bad is not None:
                try:
                    sched.commit(bad)
                except simsim.StaleDecisionError:
                    counts["rejected_commits"] += 1
                else:
                    raise AssertionError(f"{bad} was committed")
        old_decision = decision if decision is not None else old_decision
        assert (sched.epoch != epoch) == mutated
        assert len(sched) == len(model)
        assert sched.queued_ids() == [  # type: ignore[attr-defined]
            item.request_id for item in sorted(model.values(), key=policy.key)
        ]
        stats = sched.stats
        assert (stats.enqueued, stats.admitted, stats.removed, stats.rejected_commits) == (
            counts["enqueued"],
            counts["admitted"],
            counts["removed"],
            counts["rejected_commits"],
        )
        assert stats.max_queue_length == high


# ---------------------------------------------------------------------------- engines


@dataclass(frozen=True)
class Workload:
    policy: Policy
    engine: str
    requests: tuple[tuple[int, int, int, int, int, int | None], ...]  # id, arrival, sizes, meta
    max_active: int
    kv_blocks: int | None
    batching_policy: str

    def build(self) -> simsim.SimulationEngine | simsim.BatchingEngine:
        # positive costs: one iteration start per timestamp (see _check_admission_order)
        backend = simsim.SimulatedBackend(
            simsim.SimulatedBackendConfig(
                prefill_base_us=20,
                prefill_per_token_us=3,
                prefill_per_active_sequence_us=1,
                decode_base_us=7,
                decode_per_active_sequence_us=2,
            )
        )
        sched = self.policy.build()
        engine: simsim.SimulationEngine | simsim.BatchingEngine
        if self.engine == "single":
            engine = simsim.SimulationEngine(backend, sched)
        elif self.engine == "fast":
            engine = simsim.FastSimulationEngine(backend, sched)
        else:
            engine = simsim.BatchingEngine(
                backend,
                sched,
                max_active_requests=self.max_active,
                max_batch_tokens=64 if self.batching_policy == "mixed" else None,
                policy=self.batching_policy,
                kv_cache=(
                    simsim.KvCacheConfig(block_size_tokens=4, total_blocks=self.kv_blocks)
                    if self.kv_blocks is not None
                    else None
                ),
            )
        for rid, arrival, prompt, output, priority, deadline in self.requests:
            engine.submit(
                simsim.Request(
                    rid, arrival, prompt, output, priority=priority, deadline_us=deadline
                )
            )
        return engine


@st.composite
def workloads(draw: Any) -> Workload:
    n = draw(st.integers(1, 14))
    ids = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n, unique=True))
    pool = draw(st.lists(st.integers(0, 600), min_size=1, max_size=3))
    arrivals = st.one_of(st.sampled_from(pool), st.integers(0, 600))
    requests = []
    for rid in ids:
        meta = draw(metadata())
        requests.append(
            (
                rid,
                draw(arrivals),
                draw(st.integers(0, 12)),
                draw(st.integers(0, 10)),
                meta["priority"],
                meta["deadline_us"],
            )
        )
    kind = draw(st.sampled_from(["single", "fast", "batching", "batching"]))
    # 6 blocks of 4 tokens hold the largest request (12 + 10 tokens) alone
    kv_blocks = draw(st.one_of(st.none(), st.integers(6, 9)))
    return Workload(
        policy=draw(policies),
        engine=kind,
        requests=tuple(requests),
        max_active=draw(st.integers(1, 4)),
        kv_blocks=kv_blocks,
        batching_policy=draw(st.sampled_from(["prefill_first", "mixed"])),
    )


def _check_admission_order(
    engine: simsim.SimulationEngine | simsim.BatchingEngine, policy: Policy
) -> None:
    """Every admission takes the least key among the requests queued at that moment.

    Queued at an admission at time t: arrived by t (arrivals at t are processed before
    the boundary's admissions) and admitted fewer times than preempted by t (preemptions
    happen at an iteration start before its admissions; with positive costs there is one
    iteration start per timestamp).
    """
    requests = engine.requests
    records = {rid: queued_request(request) for rid, request in requests.items()}
    preemptions: dict[int, list[int]] = {rid: [] for rid in requests}
    for event in engine.event_log:
        if event.event_type is EventType.REQUEST_PREEMPTED:
            preemptions[event.request_id].append(event.timestamp_us)
    admitted = Counter[int]()
    for record in engine.admission_log:
        t = record.timestamp_us
        queued = [
            item
            for rid, item in records.items()
            if item.arrival_time_us <= t
            and admitted[rid] <= sum(1 for p in preemptions[rid] if p <= t)
        ]
        best = min(queued, key=policy.key)
        assert record.request_id == best.request_id, (t, record, sorted(queued, key=policy.key))
        admitted[record.request_id] += 1
    assert all(r.state is RequestState.FINISHED for r in requests.values())
    assert sum(admitted.values()) == len(requests) + sum(map(len, preemptions.values()))


def _check_no_overtaking_past_the_virtual_arrival(
    engine: simsim.SimulationEngine | simsim.BatchingEngine, policy: Policy
) -> None:
    """docs/schedulers.md's bound: with aging, R is first admitted before every request
    that arrives after R, at or after R's virtual arrival."""
    first: dict[int, int] = {}
    for place, record in enumerate(engine.admission_log):
        first.setdefault(record.request_id, place)
    items = [queued_request(r) for r in engine.requests.values()]
    for r in items:
        v = policy.virtual_arrival(r)
        for q in items:
            if q.arrival_time_us >= v and q.arrival_time_us > r.arrival_time_us:
                assert first[r.request_id] < first[q.request_id], (r, q, v)


@_settings(120)
@given(workload=workloads())
def test_admissions_follow_the_promised_order_on_every_engine(workload: Workload) -> None:
    engine = workload.build()
    engine.run()
    _check_admission_order(engine, workload.policy)
    if workload.policy.aging_per_s:
        _check_no_overtaking_past_the_virtual_arrival(engine, workload.policy)


@_settings(40)
@given(workload=workloads())
def test_runs_are_deterministic(workload: Workload) -> None:
    runs = []
    for _ in range(2):
        engine = workload.build()
        engine.run()
        runs.append(
            (
                request_table(engine),
                [
                    (e.timestamp_us, e.sequence, e.event_type, e.request_id)
                    for e in engine.event_log
                ],
                list(engine.admission_log),
                engine.scheduler_stats,
            )
        )
    assert runs[0] == runs[1]
