"""Stretches against the step-by-step batching server (its oracle).

:class:`simsim.BatchingEngine` advances through a run of decode iterations in one event
when nothing can happen before it ends (``docs/batching.md``, "Stretches");
``stretches=False`` runs one event per iteration, as every release before did. These
tests run the same random model both ways and require the same requests, events,
admissions and iterations frames, the same counters, and the same observations by the
model's own SimPy processes (when a watched token or a completion came, what a
process read when it looked), over random workloads, the three cost models that price
stretches (the linear, fitted and GPU models), both policies, KV caches small enough to
preempt, prefix caching, the first token at the prefill, late submissions,
cancellations from inside the simulation (also at the very microsecond an iteration
ends) and between ``env.run(until=...)`` calls, and clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from helpers import property_settings
from hypothesis import given
from hypothesis import strategies as st

import simsim
from simsim.backend import FittedBackend, FittedBackendConfig
from simsim.gpu import PhysicsBackend
from simsim.schedulers import ShortestJobFirstScheduler, ShortestPromptFirstScheduler

_settings = property_settings


# ---------------------------------------------------------------------------- models


@st.composite
def backends(draw: Any) -> Any:
    """A linear, fitted or GPU cost model with random coefficients."""
    kind = draw(st.sampled_from(["simulated", "fitted", "physics"]))
    if kind == "simulated":
        cost = st.integers(0, 400)
        return simsim.SimulatedBackend(
            simsim.SimulatedBackendConfig(
                prefill_base_us=draw(cost),
                prefill_per_token_us=draw(st.integers(0, 5)),
                prefill_per_active_sequence_us=draw(st.integers(0, 30)),
                decode_base_us=draw(st.integers(1, 400)),
                decode_per_active_sequence_us=draw(st.integers(0, 40)),
            )
        )
    if kind == "fitted":
        real = st.floats(0.0, 60.0, allow_nan=False)
        return FittedBackend(
            FittedBackendConfig(
                prefill_base_us=draw(real),
                prefill_per_token_us=draw(st.floats(0.0, 2.0)),
                prefill_per_token_squared_us=draw(st.floats(0.0, 0.01)),
                prefill_per_sequence_us=draw(real),
                decode_base_us=draw(st.floats(1.0, 300.0)),
                decode_per_sequence_us=draw(real),
                decode_per_context_token_us=draw(st.floats(0.0, 0.9)),
            )
        )
    model, gpu, tp = draw(
        st.sampled_from(
            [
                ("meta-llama/Llama-2-7b-hf", "H100", 1),
                ("mistralai/Mixtral-8x7B-v0.1", "H100", 2),
                ("Qwen/Qwen2.5-7B-Instruct", "L40S", 1),
            ]
        )
    )
    return PhysicsBackend(model, gpu, tp=tp)


@dataclass(frozen=True)
class Plan:
    """One random model: a server, its requests and what the model's processes do."""

    backend: Any
    slots: int  # 0: the single slot
    policy: str
    max_batch_tokens: int | None
    kv_cache: simsim.KvCacheConfig | None
    prefix_cache: bool
    first_token_at_prefill: bool
    scheduler: str  # "fcfs", "sjf" or "spf"
    requests: tuple[tuple[int, int, int, int, tuple[str, ...] | None], ...]
    late: tuple[tuple[int, int, int, int, int], ...]  # submit at, id, offset, prompt, output
    cancels: tuple[tuple[int, int], ...]  # (time, request id): from a process
    watches: tuple[tuple[int, int], ...]  # (request id, token number)
    looks: tuple[int, ...]  # times at which a process reads every request
    stops: tuple[int, ...]  # env.run(until=...) times; a cancellation may follow each
    stop_cancels: tuple[int | None, ...]


@st.composite
def plans(draw: Any, *, cache_kind: str | None = None) -> Plan:
    backend = draw(backends())
    slots = draw(st.integers(1, 6))
    policy = draw(st.sampled_from(["prefill_first", "mixed"]))
    max_batch_tokens = None
    if policy == "mixed" or draw(st.booleans()):
        max_batch_tokens = draw(st.integers(max(slots, 4), 96))
    count = draw(st.integers(1, 10))
    block = draw(st.sampled_from([2, 4, 8]))
    kinds = ["none", "kv", "prefix"] if cache_kind is None else [cache_kind]
    kind = draw(st.sampled_from(kinds))
    prompts = [draw(st.integers(0, 40)) for _ in range(count)]
    outputs = [draw(st.integers(0, 60)) for _ in range(count)]
    kv_cache = None
    if kind != "none":
        biggest = max(1, *(-(-(p + o) // block) for p, o in zip(prompts, outputs, strict=True)))
        kv_cache = simsim.KvCacheConfig(block, biggest + draw(st.integers(0, 30)))
    requests = []
    for rid in range(count):
        hashes = None
        if kind == "prefix":
            # Prompts from a few families share their first blocks; some name their
            # answer's blocks too (a multi-turn conversation's next turn does).
            family = draw(st.integers(0, 2))
            full = (prompts[rid] + (outputs[rid] if draw(st.booleans()) else 0)) // block
            hashes = tuple(f"{family}-{i}" if i < 3 else f"{rid}-{i}" for i in range(full))
        arrival = draw(st.integers(0, 4000))
        requests.append((rid, arrival, prompts[rid], outputs[rid], hashes))
    late = []
    for index in range(draw(st.integers(0, 3))):
        rid = count + index
        prompt, output = draw(st.integers(0, 40)), draw(st.integers(0, 60))
        if kv_cache is not None and -(-(prompt + output) // block) > kv_cache.total_blocks:
            continue
        late.append((draw(st.integers(0, 6000)), rid, draw(st.integers(0, 300)), prompt, output))
    ids = list(range(count)) + [item[1] for item in late]
    times = st.integers(0, 12_000)
    cancels = tuple(
        (draw(times), draw(st.sampled_from(ids))) for _ in range(draw(st.integers(0, 4)))
    )
    watches = tuple(
        (draw(st.sampled_from(ids)), draw(st.integers(1, 40)))
        for _ in range(draw(st.integers(0, 3)))
    )
    looks = tuple(draw(times) for _ in range(draw(st.integers(0, 3))))
    stops = tuple(sorted(set(draw(times) + 1 for _ in range(draw(st.integers(0, 4))))))
    stop_cancels = tuple(draw(st.none() | st.sampled_from(ids)) for _ in stops)
    return Plan(
        backend,
        slots,
        policy,
        max_batch_tokens,
        kv_cache,
        kind == "prefix",
        draw(st.booleans()),
        draw(st.sampled_from(["fcfs", "sjf", "spf"])),
        tuple(requests),
        tuple(late),
        cancels,
        watches,
        looks,
        stops,
        stop_cancels,
    )


def _engine(plan: Plan, env: simsim.Environment, stretches: bool) -> Any:
    if plan.slots == 0:  # the single slot
        return simsim.SimulationEngine(plan.backend, env=env, stretches=stretches)
    schedulers = {
        "fcfs": simsim.FcfsScheduler,
        "sjf": ShortestJobFirstScheduler,
        "spf": ShortestPromptFirstScheduler,
    }
    return simsim.BatchingEngine(
        plan.backend,
        schedulers[plan.scheduler](),
        max_active_requests=plan.slots,
        max_batch_tokens=plan.max_batch_tokens,
        policy=plan.policy,
        kv_cache=plan.kv_cache,
        prefix_cache=plan.prefix_cache,
        first_token_at_prefill=plan.first_token_at_prefill,
        env=env,
        stretches=stretches,
    )


def _snapshot(requests: Any) -> list[tuple[Any, ...]]:
    return [
        (
            r.request_id,
            r.state.name,
            r.generated_token_count,
            r.first_token_time_us,
            r.prefill_end_time_us,
            r.finish_time_us,
        )
        for r in requests.values()
    ]


def simulate(plan: Plan, *, stretches: bool, replicas: int = 0) -> dict[str, Any]:
    """Run *plan* (on one engine, or a cluster of *replicas* engines) and return what
    the two modes must agree on."""
    env = simsim.Environment()
    if replicas:
        engines = [_engine(plan, env, stretches) for _ in range(replicas)]
        server: Any = simsim.Cluster(engines, router="least_outstanding")
    else:
        server = engines = _engine(plan, env, stretches)
        engines = [server]
    for rid, arrival, prompt, output, hashes in plan.requests:
        server.submit(simsim.Request(rid, arrival, prompt, output, block_hashes=hashes))
    seen: list[tuple[Any, ...]] = []

    def late(at: int, rid: int, offset: int, prompt: int, output: int) -> Any:
        yield env.timeout(at)
        server.submit(simsim.Request(rid, env.now + offset, prompt, output))

    def cancel(at: int, rid: int) -> Any:
        yield env.timeout(at)
        if rid in server.requests and not server.requests[rid].is_terminal:
            server.cancel_request(rid)
            seen.append(("cancel", rid, env.now))

    def watch(rid: int, number: int) -> Any:
        while rid not in server.requests:  # a late submission
            yield env.timeout(500)
            if env.now > 20_000:
                return
        request = yield server.token(rid, number)
        seen.append(("token", rid, number, env.now, request.generated_token_count))
        done = yield server.completion(rid)
        seen.append(("done", rid, env.now, done.state.name))

    def look(at: int) -> Any:
        yield env.timeout(at)
        seen.append(("look", env.now, _snapshot(server.requests)))

    for item in plan.late:
        env.process(late(*item))
    for item in plan.cancels:
        env.process(cancel(*item))
    for item in plan.watches:
        env.process(watch(*item))
    for at in plan.looks:
        env.process(look(at))
    for stop, target in zip(plan.stops, plan.stop_cancels, strict=True):
        if stop > env.now:
            env.run(until=stop)
        seen.append(("stop", env.now, _snapshot(server.requests)))
        if target in server.requests and not server.requests[target].is_terminal:
            server.cancel_request(target)
    server.run()
    frames = {
        "requests": server.requests_frame(),
        "events": server.events_frame(),
        "admissions": server.admissions_frame(),
    }
    for index, engine in enumerate(engines):
        frames[f"counts {index}"] = (
            engine.processed_event_count,
            engine.ignored_cancelled_event_count,
            engine.now_us,
            engine.scheduler_stats,
        )
        if isinstance(engine, simsim.BatchingEngine):
            frames[f"iterations {index}"] = engine.iterations_frame()
            frames[f"blocks {index}"] = engine.kv_blocks_in_use
    frames["seen"] = seen
    return frames


def assert_same(plan: Plan, replicas: int = 0) -> None:
    fast = simulate(plan, stretches=True, replicas=replicas)
    oracle = simulate(plan, stretches=False, replicas=replicas)
    assert fast.keys() == oracle.keys()
    for name, expected in oracle.items():
        got = fast[name]
        if isinstance(expected, pd.DataFrame):
            pd.testing.assert_frame_equal(got, expected, obj=name)
        else:
            assert got == expected, name


@_settings(150)
@given(plans())
def test_stretches_give_the_step_by_step_results(plan: Plan) -> None:
    assert_same(plan)


@st.composite
def single_slot_plans(draw: Any) -> Plan:
    """A plan for the single slot: no KV cache, one slot, FCFS."""
    plan = draw(plans(cache_kind="none"))
    return Plan(
        plan.backend,
        0,
        "prefill_first",
        None,
        None,
        False,
        False,
        "fcfs",
        plan.requests,
        plan.late,
        plan.cancels,
        plan.watches,
        plan.looks,
        plan.stops,
        plan.stop_cancels,
    )


@_settings(150)
@given(single_slot_plans())
def test_single_slot_stretches_give_the_step_by_step_results(plan: Plan) -> None:
    assert_same(plan)


@_settings(60)
@given(plans(cache_kind="kv"))
def test_stretches_with_a_small_kv_cache_preempt_as_step_by_step(plan: Plan) -> None:
    assert_same(plan)


@_settings(40)
@given(plans(), st.integers(2, 3))
def test_stretches_in_a_cluster(plan: Plan, replicas: int) -> None:
    assert_same(plan, replicas)


def _cancel_at_iteration_ends(stretches: bool, offsets: tuple[int, ...]) -> dict[str, Any]:
    env = simsim.Environment()
    engine = simsim.BatchingEngine(
        FittedBackend(FittedBackendConfig(decode_base_us=97.3, decode_per_context_token_us=0.37)),
        max_active_requests=3,
        env=env,
        stretches=stretches,
    )
    for rid in range(3):
        engine.submit(simsim.Request(rid, 0, 10 * rid, 40))
    # The oracle's iteration ends: a cancellation scheduled at one of them ties with it.
    ends = [1_000 + offset for offset in offsets]

    def cancel(at: int, rid: int) -> Any:
        yield env.timeout(at)
        if not engine.requests[rid].is_terminal:
            engine.cancel_request(rid)

    for rid, at in enumerate(ends):
        env.process(cancel(at, rid))
    engine.run()
    return {
        "requests": engine.requests_frame(),
        "events": engine.events_frame(),
        "iterations": engine.iterations_frame(),
    }


def test_cancellations_exactly_at_iteration_ends() -> None:
    oracle = simsim.BatchingEngine(
        FittedBackend(FittedBackendConfig(decode_base_us=97.3, decode_per_context_token_us=0.37)),
        max_active_requests=3,
        stretches=False,
    )
    for rid in range(3):
        oracle.submit(simsim.Request(rid, 0, 10 * rid, 40))
    oracle.run()
    ends = oracle.iterations_frame()["end_us"].tolist()
    offsets = (ends[5] - 1_000, ends[9] - 1_000 + 1, ends[12] - 1_000 - 1)
    fast = _cancel_at_iteration_ends(True, offsets)
    slow = _cancel_at_iteration_ends(False, offsets)
    for name in fast:
        pd.testing.assert_frame_equal(fast[name], slow[name], obj=name)
    assert (fast["requests"]["state"] == "CANCELLED").sum() == 3


def test_a_stretch_takes_one_event_for_many_iterations() -> None:
    """The point of it: decode iterations of a batch that nothing interrupts cost one
    heap event, not one each (counted here by the events SimPy processes)."""
    costs = simsim.SimulatedBackendConfig(decode_base_us=100, prefill_base_us=50)
    popped = {}
    for stretches in (True, False):
        env = simsim.Environment()
        engine = simsim.BatchingEngine(
            simsim.SimulatedBackend(costs), max_active_requests=2, env=env, stretches=stretches
        )
        engine.submit(simsim.Request(0, 0, 8, 500))
        engine.submit(simsim.Request(1, 0, 8, 500))
        steps = 0
        while env.next_event_time() is not None:
            env._drain_some(env._queue, 1)
            steps += 1
        popped[stretches] = (steps, engine.processed_event_count, len(engine.iteration_log))
    assert popped[True][1:] == popped[False][1:]
    assert popped[True][0] < 10 and popped[False][0] > 500


def test_stretches_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="stretches must be True or False"):
        simsim.BatchingEngine(
            simsim.SimulatedBackend(simsim.SimulatedBackendConfig()),
            max_active_requests=1,
            stretches=1,  # type: ignore[arg-type]
        )
