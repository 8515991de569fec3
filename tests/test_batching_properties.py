"""Property-based tests of the continuous-batching server (contract section 12).

Three families of properties, all on random workloads drawn the same way as in
``test_properties_single_slot.py``:

* **Equivalence.** With ``max_active_requests=1``, ``policy="prefill_first"`` and no KV
  cache, :class:`simsim.BatchingEngine` and :class:`simsim.SimulationEngine` fed the same
  requests (submitted before the run) and the same cancellations (made between
  timestamps) give the same request table, the same event log without sequence numbers
  and the same admission log, whenever a decode step costs more than zero. The
  cancellations are placed two ways: after the k-th ``run_next_timestamp()`` call (the two
  engines must return the same timestamps, call for call), and at a simulated time reached
  with ``env.run(until=T)``.
* **Invariants.** Random policies, batch sizes, token caps and KV caches, with mid-run
  submissions, cancellations between timestamps and cancellations made from SimPy
  processes inside the simulation. A driver snapshots the engine after every action; the
  slot holders are rebuilt from the event and admission logs and must match the engine's
  own ``active_request_ids`` at every snapshot.
* **Determinism.** The same inputs twice give identical logs, tables and iteration
  frames.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pytest
from helpers import property_settings, request_table
from hypothesis import given
from hypothesis import strategies as st

import simsim
from simsim import EventType, RequestState

ARRIVAL = EventType.REQUEST_ARRIVAL
PREFILL = EventType.PREFILL_COMPLETE
DECODE = EventType.DECODE_STEP_COMPLETE
COMPLETE = EventType.REQUEST_COMPLETE
PREEMPTED = EventType.REQUEST_PREEMPTED

ACTIVE_STATES = frozenset({RequestState.PREFILLING, RequestState.DECODING})
TERMINAL_STATES = frozenset({RequestState.FINISHED, RequestState.CANCELLED})

MAX_REQUESTS = 12
MAX_ARRIVAL_US = 3000
MAX_PLAN_STEP = 50
#: a between-timestamps cancellation target: "a request holding a slot then" (index below)
CANCEL_ACTIVE = -1
#: bound on run_next_timestamp() calls in the equivalence tests (see Scenario.call_bound)
MAX_CALLS = 20_000


_settings = property_settings


# ---------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Spec:
    """A request to create; for a late submission ``arrival_us`` is an offset from now."""

    request_id: int
    arrival_us: int
    prompt_token_count: int
    max_output_tokens: int

    def make(self, base_us: int = 0) -> simsim.Request:
        return simsim.Request(
            self.request_id,
            base_us + self.arrival_us,
            self.prompt_token_count,
            self.max_output_tokens,
        )


def _cost() -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.integers(0, 40), st.integers(0, 400))


@st.composite
def configs(draw: Any, *, decode_positive: bool = False) -> simsim.SimulatedBackendConfig:
    """Linear cost models; free prefills (and free everything) hold the edge cases."""
    modes = ["random", "random", "random", "free_prefill"] + ([] if decode_positive else ["free"])
    mode = draw(st.sampled_from(modes))
    prefill = st.just(0) if mode != "random" else _cost()
    decode_base = draw(st.just(0) if mode == "free" else _cost())
    decode_per = draw(st.just(0) if mode == "free" else st.one_of(st.just(0), st.integers(0, 30)))
    if decode_positive and decode_base + decode_per == 0:
        decode_base = draw(st.integers(1, 50))
    return simsim.SimulatedBackendConfig(
        prefill_base_us=draw(prefill),
        prefill_per_token_us=draw(st.just(0) if mode != "random" else st.integers(0, 20)),
        prefill_per_active_sequence_us=draw(prefill),
        decode_base_us=decode_base,
        decode_per_active_sequence_us=decode_per,
    )


@st.composite
def request_specs(draw: Any, ids: list[int], *, pressure: bool = False) -> list[Spec]:
    """One spec per id, in the given (submission) order; arrivals often tie.

    Under *pressure* the requests come in a burst with long outputs, so that batches
    fill up and (with a small KV cache) decode steps run out of blocks.
    """
    horizon = 300 if pressure else draw(st.sampled_from([300, MAX_ARRIVAL_US]))
    pool = draw(st.lists(st.integers(0, horizon), min_size=1, max_size=3))
    arrivals = st.one_of(st.sampled_from(pool), st.integers(0, horizon))
    prompts = st.one_of(st.just(0), st.integers(0, 8), st.integers(0, 48))
    outputs = (
        st.integers(3, 12)
        if pressure
        else st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 12))
    )
    return [Spec(rid, draw(arrivals), draw(prompts), draw(outputs)) for rid in ids]


def _ids(draw: Any, *, pressure: bool = False) -> list[int]:
    many = st.integers(MAX_REQUESTS // 2, MAX_REQUESTS)
    n = draw(many if pressure else st.one_of(st.integers(0, MAX_REQUESTS), many))
    return list(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True)))


def unsequenced(engine: Any) -> list[tuple[int, EventType, int]]:
    return [(rec.timestamp_us, rec.event_type, rec.request_id) for rec in engine.event_log]


# ---------------------------------------------------------------------------- equivalence


@dataclass(frozen=True)
class PairScenario:
    config: simsim.SimulatedBackendConfig
    specs: tuple[Spec, ...]  # submission order
    cancels: tuple[tuple[int, int], ...]  # (call index or time, request id or CANCEL_ACTIVE)


@st.composite
def pair_scenarios(draw: Any, *, by_call: bool = True) -> PairScenario:
    """Decode steps always cost something; *by_call*: plan cancellations by call index."""
    config = draw(configs(decode_positive=True))
    ids = _ids(draw)
    specs = draw(request_specs(ids))
    cancels: list[tuple[int, int]] = []
    if ids and by_call:
        steps = st.one_of(st.integers(0, 10), st.integers(0, MAX_PLAN_STEP))
        targets = st.one_of(st.sampled_from(ids), st.just(CANCEL_ACTIVE), st.just(CANCEL_ACTIVE))
        cancels = draw(st.lists(st.tuples(steps, targets), max_size=10))
    return PairScenario(config, tuple(specs), tuple(cancels))


def make_pair(
    scenario: PairScenario,
) -> tuple[simsim.SimulationEngine, simsim.BatchingEngine]:
    backend = simsim.SimulatedBackend(scenario.config)
    single = simsim.SimulationEngine(backend)
    batch = simsim.BatchingEngine(backend, max_active_requests=1, policy="prefill_first")
    assert batch.kv_cache is None and batch.max_batch_tokens is None
    for spec in scenario.specs:
        single.submit(spec.make())
        batch.submit(spec.make())
    return single, batch


def assert_pair_agrees(single: simsim.SimulationEngine, batch: simsim.BatchingEngine) -> None:
    assert single.now_us == batch.now_us
    assert unsequenced(batch) == unsequenced(single)
    assert request_table(batch) == request_table(single)
    assert list(batch.admission_log) == list(single.admission_log)
    active = [rid for rid, r in single.requests.items() if r.state in ACTIVE_STATES]
    assert batch.active_request_ids == active


def cancel_pair(single: simsim.SimulationEngine, batch: simsim.BatchingEngine, target: int) -> None:
    """The same cancellation, between timestamps, on both engines."""
    if target == CANCEL_ACTIVE:
        active = batch.active_request_ids
        if not active:
            return
        (target,) = active
    if single.requests[target].state in TERMINAL_STATES:
        assert batch.requests[target].state is single.requests[target].state
        with pytest.raises(simsim.InvalidTransitionError):
            single.cancel_request(target)
        with pytest.raises(simsim.InvalidTransitionError):
            batch.cancel_request(target)
    else:
        single.cancel_request(target)
        batch.cancel_request(target)
    assert_pair_agrees(single, batch)


def assert_pair_final(single: simsim.SimulationEngine, batch: simsim.BatchingEngine) -> None:
    assert not single.has_pending_events and not batch.has_pending_events
    assert_pair_agrees(single, batch)
    pd.testing.assert_frame_equal(batch.requests_frame(), single.requests_frame())
    single_events = single.events_frame().drop(columns="sequence")
    pd.testing.assert_frame_equal(batch.events_frame().drop(columns="sequence"), single_events)
    pd.testing.assert_frame_equal(batch.admissions_frame(), single.admissions_frame())
    assert batch.scheduler_stats == single.scheduler_stats
    for r in batch.requests.values():
        assert r.state in TERMINAL_STATES


# 100 examples (250 before) reach every branch of the engines that 250 did, and so did 25.
@_settings(100)
@given(pair_scenarios())
def test_equivalence_with_single_slot_cancelling_by_call_index(scenario: PairScenario) -> None:
    """Section 12 "Equivalence", cancellations after the k-th ``run_next_timestamp()`` call.

    Both engines must return the same timestamp on every call (otherwise "after the k-th
    call" would not name the same moment), and agree on every table after every call.
    """
    single, batch = make_pair(scenario)
    plan: dict[int, list[int]] = defaultdict(list)
    for step, target in scenario.cancels:
        plan[step].append(target)
    last = max(plan, default=0)
    returned: list[int | None] = []
    for step in range(MAX_CALLS):
        for target in plan.get(step, ()):
            cancel_pair(single, batch, target)
        t_single = single.run_next_timestamp()
        t_batch = batch.run_next_timestamp()
        assert t_batch == t_single, ("timestamps diverge at call", step, returned)
        returned.append(t_single)
        assert_pair_agrees(single, batch)
        if t_single is None and step >= last:
            break
    else:  # pragma: no cover - a livelock is a failure
        pytest.fail("the engines did not run dry within the call bound")
    assert_pair_final(single, batch)


# 100 examples (200 before) reach every branch of the engines that 200 did, and so did 25.
@_settings(100)
@given(
    scenario=pair_scenarios(by_call=False),
    data=st.data(),
)
def test_equivalence_with_single_slot_cancelling_by_time(
    scenario: PairScenario, data: st.DataObject
) -> None:
    """Section 12 "Equivalence", cancellations at times reached with ``env.run(until=T)``.

    The cancellation times are drawn around the timestamps of a cancellation-free
    reference run (exactly at an event's time, just after, or anywhere), so they often
    fall on a timestamp whose events are still pending.
    """
    reference = simsim.SimulationEngine(simsim.SimulatedBackend(scenario.config))
    for spec in scenario.specs:
        reference.submit(spec.make())
    reference.run()
    stamps = sorted({rec.timestamp_us for rec in reference.event_log}) or [0]
    horizon = stamps[-1] + 10
    times = st.one_of(
        st.sampled_from(stamps),
        st.sampled_from(stamps).map(lambda t: t + 1),
        st.integers(0, horizon),
    )
    ids = [spec.request_id for spec in scenario.specs]
    targets = st.one_of(st.sampled_from(ids), st.just(CANCEL_ACTIVE)) if ids else st.nothing()
    plan = sorted(data.draw(st.lists(st.tuples(times, targets), max_size=10 if ids else 0)))

    single, batch = make_pair(scenario)
    for at_us, target in plan:
        now = single.now_us
        if at_us > now:
            single.env.run(until=at_us)
            batch.env.run(until=at_us)
        assert single.now_us == batch.now_us == max(at_us, now)
        assert_pair_agrees(single, batch)
        cancel_pair(single, batch, target)
    single.run()
    batch.run()
    assert_pair_final(single, batch)
    if not plan:
        assert unsequenced(batch) == unsequenced(reference)


# ---------------------------------------------------------------------------- invariants


@dataclass(frozen=True)
class Scenario:
    config: simsim.SimulatedBackendConfig
    max_active_requests: int
    policy: str
    max_batch_tokens: int | None
    kv_cache: simsim.KvCacheConfig | None
    upfront: tuple[Spec, ...]  # in submission order
    late: tuple[tuple[int, Spec], ...]  # (driver step, spec with arrival offset)
    cancels: tuple[tuple[int, int], ...]  # (driver step, request id, or -1 - slot index)
    timed_cancels: tuple[tuple[int, int], ...]  # in a process: (time, request id)
    chained_cancels: tuple[tuple[int, int], ...]  # in a process: (upfront id done, id)

    def call_bound(self) -> int:
        """A generous bound on ``run_next_timestamp()`` calls (runs need under 3 per unit)."""
        specs = self.upfront + tuple(spec for _, spec in self.late)
        work = sum(s.prompt_token_count + s.max_output_tokens + 2 for s in specs)
        plan = len(self.cancels) + len(self.timed_cancels) + len(self.chained_cancels)
        return 50 * (work + plan) + 10 * MAX_PLAN_STEP + 500

    def fits(self, spec: Spec) -> bool:
        cache = self.kv_cache
        if cache is None:
            return True
        total = spec.prompt_token_count + spec.max_output_tokens
        return total <= cache.block_size_tokens * cache.total_blocks


@st.composite
def scenarios(draw: Any) -> Scenario:
    config = draw(configs())
    pressure = draw(st.integers(0, 2)) == 0  # a third: bursts of long requests, small cache
    slots = draw(st.integers(3, 6) if pressure else st.one_of(st.integers(1, 6), st.integers(2, 6)))
    policy, cap = draw(
        st.sampled_from(["prefill_first", "prefill_first_cap", "mixed"]).flatmap(
            lambda p: st.tuples(
                st.just(p.removesuffix("_cap")),
                st.none()
                if p == "prefill_first"
                else st.one_of(st.integers(slots, slots + 8), st.integers(slots, slots + 64)),
            )
        )
    )
    ids = _ids(draw, pressure=pressure)
    specs = draw(request_specs(ids, pressure=pressure))
    n_late = draw(st.one_of(st.just(0), st.integers(0, len(ids))))
    upfront, late_specs = specs[: len(specs) - n_late], specs[len(specs) - n_late :]
    kv_cache = None
    if pressure or draw(st.integers(0, 3)):  # otherwise a KV cache three times in four
        block = draw(st.sampled_from([1, 2, 3, 4]) | st.integers(1, 16))
        biggest = max((s.prompt_token_count + s.max_output_tokens for s in specs), default=1)
        need = max(1, -(-biggest // block))  # the largest request's blocks
        # all requests' blocks together: a cache of a fraction of that forces preemptions
        together = sum(-(-(s.prompt_token_count + s.max_output_tokens) // block) for s in specs)
        fraction = st.integers(need, max(need, together // 3))
        blocks = draw(
            fraction
            if pressure
            else st.one_of(
                st.integers(need, need + 2),  # tight: everyone fits, but barely
                fraction,
                st.integers(need, 3 * need + 8),
                st.integers(1, need),  # the largest may never fit: refused at submit
            )
        )
        kv_cache = simsim.KvCacheConfig(block_size_tokens=block, total_blocks=blocks)
    steps = st.one_of(st.integers(0, 12), st.integers(0, MAX_PLAN_STEP))
    offsets = st.one_of(st.just(0), st.integers(0, 1500))
    late = tuple((draw(steps), Spec(s.request_id, draw(offsets), *_sizes(s))) for s in late_specs)
    cancels: tuple[tuple[int, int], ...] = ()
    timed: tuple[tuple[int, int], ...] = ()
    chained: tuple[tuple[int, int], ...] = ()
    if ids:
        targets = st.one_of(st.sampled_from(ids), st.integers(-6, -1))
        cancels = tuple(draw(st.lists(st.tuples(steps, targets), max_size=8)))
        times = st.one_of(st.integers(0, 200), st.integers(0, 2 * MAX_ARRIVAL_US))
        timed = tuple(draw(st.lists(st.tuples(times, st.sampled_from(ids)), max_size=4)))
        upfront_ids = [s.request_id for s in upfront]
        if upfront_ids:
            chained = tuple(
                draw(
                    st.lists(
                        st.tuples(st.sampled_from(upfront_ids), st.sampled_from(ids)),
                        max_size=3,
                    )
                )
            )
    return Scenario(
        config=config,
        max_active_requests=slots,
        policy=policy,
        max_batch_tokens=cap,
        kv_cache=kv_cache,
        upfront=tuple(upfront),
        late=late,
        cancels=cancels,
        timed_cancels=timed,
        chained_cancels=chained,
    )


def _sizes(spec: Spec) -> tuple[int, int]:
    return spec.prompt_token_count, spec.max_output_tokens


@dataclass(frozen=True)
class Snapshot:
    """The engine right after one driver action (*kind*: ``call``, ``cancel``, ``start``)."""

    kind: str
    now_us: int
    active: tuple[int, ...]
    kv_blocks: int
    n_events: int
    n_admissions: int
    n_iterations: int
    n_sim_cancels: int
    cancelled: tuple[int, RequestState] | None = None  # a between-timestamps cancel: id, state


@dataclass
class Outcome:
    engine: simsim.BatchingEngine
    snapshots: list[Snapshot] = field(default_factory=list)
    returned: list[int | None] = field(default_factory=list)
    submitted: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    #: (time, request id, state before) of every cancellation, in the order made
    cancels: list[tuple[int, int, RequestState]] = field(default_factory=list)
    sim_cancels: list[tuple[int, int, RequestState]] = field(default_factory=list)


def make_engine(scenario: Scenario) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(scenario.config),
        max_active_requests=scenario.max_active_requests,
        max_batch_tokens=scenario.max_batch_tokens,
        policy=scenario.policy,
        kv_cache=scenario.kv_cache,
    )


def drive(scenario: Scenario) -> Outcome:
    """Play *scenario* with ``run_next_timestamp()`` and snapshot after every action."""
    engine = make_engine(scenario)
    env = engine.env
    out = Outcome(engine)
    cache = scenario.kv_cache

    def snapshot(kind: str, cancelled: tuple[int, RequestState] | None = None) -> None:
        active = tuple(engine.active_request_ids)
        kv = engine.kv_blocks_in_use
        out.snapshots.append(
            Snapshot(
                kind,
                engine.now_us,
                active,
                kv,
                len(engine.event_log),
                len(engine.admission_log),
                len(engine.iteration_log),
                len(out.sim_cancels),
                cancelled,
            )
        )
        # the batch never exceeds its slots; the cache never exceeds its blocks
        assert len(active) <= scenario.max_active_requests, active
        assert len(set(active)) == len(active)
        for rid in active:
            assert engine.requests[rid].state in ACTIVE_STATES, (rid, engine.requests[rid])
        if cache is None:
            assert kv == 0
            return
        assert 0 <= kv <= cache.total_blocks, (kv, cache)
        # each holder has the blocks for all it must prefill (held from admission) and at
        # most one block's worth more: the reservation for its next token
        low = high = 0
        for rid in active:
            r = engine.requests[rid]
            tokens = r.prompt_token_count + r.generated_token_count
            low += cache.blocks_for(tokens)
            high += cache.blocks_for(tokens + (r.generated_token_count < r.max_output_tokens))
        assert low <= kv <= high, (kv, low, high, active)

    def submit(spec: Spec, base_us: int) -> None:
        request = spec.make(base_us)
        if scenario.fits(spec):
            assert engine.submit(request) is request
            out.submitted.append(spec.request_id)
        else:
            # prompt + output can never fit in the whole cache: refused, nothing changes
            n = len(engine.requests)
            with pytest.raises(ValueError, match=str(spec.request_id)):
                engine.submit(request)
            assert spec.request_id not in engine.requests and len(engine.requests) == n
            assert request.state is RequestState.WAITING
            out.refused.append(spec.request_id)

    def cancel_between(target: int) -> None:
        if target < 0:  # -1 - slot index: whichever request holds that slot now
            active = engine.active_request_ids
            if not active:
                return
            target = active[(-1 - target) % len(active)]
        request = engine.requests.get(target)
        if request is None:
            with pytest.raises(simsim.UnknownRequestError):
                engine.cancel_request(target)
            return
        if request.state in TERMINAL_STATES:
            with pytest.raises(simsim.InvalidTransitionError):
                engine.cancel_request(target)
            return
        now, n_events = engine.now_us, len(engine.event_log)
        state = request.state
        engine.cancel_request(target)
        out.cancels.append((now, target, state))
        assert engine.now_us == now and len(engine.event_log) == n_events
        assert request.state is RequestState.CANCELLED and request.finish_time_us == now
        snapshot("cancel", (target, state))

    def cancel_inside(rid: int) -> None:
        request = engine.requests.get(rid)
        if request is None or request.state in TERMINAL_STATES:
            return
        state = request.state
        engine.cancel_request(rid)
        assert request.state is RequestState.CANCELLED and request.finish_time_us == env.now
        out.cancels.append((env.now, rid, state))
        out.sim_cancels.append((env.now, rid, state))

    def timed(at_us: int, rid: int) -> Any:
        yield env.timeout(at_us)
        cancel_inside(rid)

    def chained(done: int, rid: int) -> Any:
        finished = yield engine.completion(done)
        assert finished.state in TERMINAL_STATES
        cancel_inside(rid)

    for spec in scenario.upfront:
        submit(spec, 0)
    for at_us, rid in scenario.timed_cancels:
        env.process(timed(at_us, rid))
    for done, rid in scenario.chained_cancels:
        if done in engine.requests:
            env.process(chained(done, rid))
    snapshot("start")

    late_at: dict[int, list[Spec]] = defaultdict(list)
    for step, spec in scenario.late:
        late_at[step].append(spec)
    cancels_at: dict[int, list[int]] = defaultdict(list)
    for step, target in scenario.cancels:
        cancels_at[step].append(target)
    last = max([s for s, _ in scenario.late] + [s for s, _ in scenario.cancels], default=0)
    for step in range(scenario.call_bound()):
        for spec in late_at.get(step, ()):
            submit(spec, engine.now_us)
        for target in cancels_at.get(step, ()):
            cancel_between(target)
        before = engine.now_us
        t = engine.run_next_timestamp()
        out.returned.append(t)
        if t is None:
            assert not engine.has_pending_events and engine.now_us == before
        else:
            assert t >= before and engine.now_us == t
        snapshot("call")
        if t is None and step >= last:
            break
    else:  # pragma: no cover - a livelock is a failure
        pytest.fail(f"no end after {step + 1} run_next_timestamp() calls: livelock?")
    return out


def rebuild_holders(out: Outcome) -> None:
    """Replay the logs action by action; the slot holders must match the engine's.

    Within one ``run_next_timestamp()`` call at T, every ordinary event of T (arrivals,
    iteration ends, cancellations from processes) comes before the one iteration start at
    T's boundary, which first preempts (step 2) and then admits (step 3). Checks at every
    ``REQUEST_PREEMPTED`` that the victim held a slot, was the most recently admitted
    holder, and was not alone in the batch.
    """
    engine = out.engine
    log = list(engine.event_log)
    admissions = list(engine.admission_log)
    holders: list[int] = []
    previous = out.snapshots[0]
    assert previous.kind == "start" and previous.n_events == previous.n_admissions == 0
    for snap in out.snapshots[1:]:
        events = log[previous.n_events : snap.n_events]
        admitted = admissions[previous.n_admissions : snap.n_admissions]
        sim_cancels = out.sim_cancels[previous.n_sim_cancels : snap.n_sim_cancels]
        if snap.kind == "cancel":
            assert not events and not sim_cancels
            assert snap.cancelled is not None
            rid, state = snap.cancelled
            assert (rid in holders) == (state in ACTIVE_STATES), (rid, state, holders)
            if rid in holders:
                holders.remove(rid)
        else:
            kinds = [rec.event_type for rec in events]
            first = kinds.index(PREEMPTED) if PREEMPTED in kinds else len(kinds)
            assert all(k is PREEMPTED for k in kinds[first:]), ("preemption mid-call", events)
            for rec in events[:first]:
                if rec.event_type is COMPLETE:
                    holders.remove(rec.request_id)
            for _, rid, state in sim_cancels:
                assert (rid in holders) == (state in ACTIVE_STATES), (rid, state, holders)
                if rid in holders:
                    holders.remove(rid)
            for rec in events[first:]:
                victim = rec.request_id
                assert victim in holders, ("preempted a request holding no slot", rec, holders)
                assert len(holders) >= 2, ("a request alone in the batch was preempted", rec)
                assert holders[-1] == victim, ("not the most recently admitted", rec, holders)
                holders.remove(victim)
        for adm in admitted:
            assert adm.timestamp_us == snap.now_us
            assert adm.request_id not in holders
            holders.append(adm.request_id)
        assert tuple(holders) == snap.active, (snap, holders)
        previous = snap
    assert holders == []


LIFE_FINISHED = re.compile(r"A(?:(?:PD*)?X)*PD*C")
LIFE_CANCELLED = re.compile(r"(?:A(?:(?:PD*)?X)*(?:PD*)?)?")
LETTER = {ARRIVAL: "A", PREFILL: "P", DECODE: "D", COMPLETE: "C", PREEMPTED: "X"}


def check_invariants(scenario: Scenario, out: Outcome) -> None:
    engine = out.engine
    cache = scenario.kv_cache
    accepted = [s.request_id for s in scenario.upfront + tuple(s for _, s in scenario.late)]
    accepted = [rid for rid in accepted if rid not in out.refused]

    # no request lost: every accepted request is in the table and terminal; no work left
    assert sorted(engine.requests) == sorted(out.submitted) == sorted(accepted)
    for rid, r in engine.requests.items():
        assert r.state in TERMINAL_STATES, (rid, r.state)
    assert not engine.has_pending_events
    assert engine.active_request_ids == []
    assert engine.kv_blocks_in_use == 0
    assert engine.run_next_timestamp() is None

    # the event log is strictly increasing in (timestamp, sequence)
    log = list(engine.event_log)
    keys = [(rec.timestamp_us, rec.sequence) for rec in log]
    assert all(a < b for a, b in itertools.pairwise(keys)), keys

    per: dict[int, list[simsim.EventRecord]] = defaultdict(list)
    for rec in log:
        per[rec.request_id].append(rec)
    admitted: dict[int, list[int]] = defaultdict(list)
    for adm in engine.admission_log:
        admitted[adm.request_id].append(adm.timestamp_us)
    cancelled_as = {rid: state for _, rid, state in out.cancels}
    assert len(cancelled_as) == len(out.cancels)
    for rid, r in engine.requests.items():
        records = per.get(rid, [])
        life = "".join(LETTER[rec.event_type] for rec in records)
        decodes = [rec.timestamp_us for rec in records if rec.event_type is DECODE]
        assert decodes == sorted(decodes)
        assert len(decodes) == r.generated_token_count <= r.max_output_tokens
        preemptions = life.count("X")
        if r.state is RequestState.FINISHED:
            assert rid not in cancelled_as
            assert LIFE_FINISHED.fullmatch(life), (rid, life)
            assert r.generated_token_count == r.max_output_tokens
            assert r.finish_time_us == records[-1].timestamp_us
            # every preemption was followed by a readmission
            assert len(admitted[rid]) == preemptions + 1, (rid, life, admitted[rid])
        else:
            assert LIFE_CANCELLED.fullmatch(life), (rid, life)
            assert rid in cancelled_as
            # a preempted request was readmitted, or cancelled while it waited
            holding = cancelled_as[rid] in ACTIVE_STATES
            assert len(admitted[rid]) == preemptions + holding, (rid, life, cancelled_as[rid])
            if cancelled_as[rid] is RequestState.WAITING:
                assert preemptions == 0 and life in ("", "A"), (rid, life)
        if cancelled_as.get(rid) is RequestState.PREEMPTED:
            assert life.endswith("X")
        # the request's own timestamps agree with its records
        prefills = [rec.timestamp_us for rec in records if rec.event_type is PREFILL]
        assert r.admit_time_us == (admitted[rid][0] if admitted[rid] else None)
        assert r.prefill_end_time_us == (prefills[-1] if prefills else None)
        assert r.first_token_time_us == (decodes[0] if decodes else None)

    # iterations: costs, caps, policies, back to back while busy
    iterations = list(engine.iteration_log)
    frame = engine.iterations_frame()
    assert len(frame) == len(iterations)
    assert list(frame["abandoned"]) == [it.abandoned for it in iterations]
    backend = engine.backend
    cap = scenario.max_batch_tokens
    ends = {it.end_us for it in iterations if not it.abandoned}
    for it in iterations:
        assert it.end_us - it.start_us == backend.iteration_us(  # type: ignore[attr-defined]
            it.prefill_tokens, it.prefilling_count, it.decoding_count
        )
        assert it.prefilling_count + it.decoding_count <= scenario.max_active_requests
        if scenario.policy == "mixed":
            assert cap is not None
            assert it.prefill_tokens + it.decoding_count <= cap, it
        else:
            assert it.prefilling_count == 0 or it.decoding_count == 0, it
            if cap is not None and it.prefilling_count != 1:
                assert it.prefill_tokens <= cap, it
        if cache is not None:
            assert it.kv_blocks_in_use <= cache.total_blocks
    starts = {it.start_us for it in iterations}
    for rec in log:
        if rec.event_type in (PREFILL, DECODE, COMPLETE):
            assert rec.timestamp_us in ends, ("record outside an iteration end", rec)
        elif rec.event_type is PREEMPTED:
            assert rec.timestamp_us in starts, ("preemption outside an iteration start", rec)
    for adm in engine.admission_log:
        assert adm.timestamp_us in starts, ("admission outside an iteration start", adm)
    last_end = 0
    for a, b in itertools.pairwise(iterations):
        if not a.abandoned:
            last_end = a.end_us
        assert b.start_us >= last_end, ("iterations overlap", a, b)
        assert b.start_us >= a.start_us
    # back to back: after an iteration ends, the batch is empty until the next one starts
    # whenever there is a gap between them
    for i, (it, nxt) in enumerate(itertools.pairwise(iterations)):
        if it.abandoned or nxt.start_us == it.end_us:
            continue
        for snap in out.snapshots:
            if snap.n_iterations == i + 1 and snap.now_us < nxt.start_us:
                assert not snap.active, ("idle gap while a request holds a slot", it, nxt, snap)
    if iterations:
        final = iterations[-1]
        assert engine.now_us >= final.end_us or final.abandoned

    # counters: arrivals and iteration ends processed; ignored arrivals and abandonments
    n_arrivals = sum(1 for rec in log if rec.event_type is ARRIVAL)
    before_arrival = sum(
        1 for rid, state in cancelled_as.items() if state is RequestState.WAITING and rid not in per
    )
    abandoned = sum(1 for it in iterations if it.abandoned)
    assert engine.ignored_cancelled_event_count == before_arrival + abandoned
    assert engine.processed_event_count == n_arrivals + before_arrival + len(iterations)


# 200 examples (350 before) reach every branch of the engines that 350 did; 150 did not.
@_settings(200)
@given(scenarios())
def test_invariants_on_random_batching_workloads(scenario: Scenario) -> None:
    """No request lost, bounded batch and cache, policy caps, no lone preemption, no livelock."""
    out = drive(scenario)
    rebuild_holders(out)
    check_invariants(scenario, out)


# ---------------------------------------------------------------------------- determinism


@_settings(80)
@given(scenarios())
def test_same_inputs_give_identical_results(scenario: Scenario) -> None:
    first = drive(scenario)
    second = drive(scenario)
    a, b = first.engine, second.engine
    assert list(a.event_log) == list(b.event_log)
    assert list(a.admission_log) == list(b.admission_log)
    assert list(a.iteration_log) == list(b.iteration_log)
    pd.testing.assert_frame_equal(a.requests_frame(), b.requests_frame())
    pd.testing.assert_frame_equal(a.events_frame(), b.events_frame())
    pd.testing.assert_frame_equal(a.iterations_frame(), b.iterations_frame())
    assert first.snapshots == second.snapshots
    assert first.returned == second.returned
    assert first.cancels == second.cancels
    assert (a.processed_event_count, a.ignored_cancelled_event_count) == (
        b.processed_event_count,
        b.ignored_cancelled_event_count,
    )
