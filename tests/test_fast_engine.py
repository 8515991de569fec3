"""FastSimulationEngine gives the full engine's request table with far fewer events.

The fast engine schedules one event per request's work instead of one per prefill and
per token, and works out progress when it can be observed. These tests compare it with
SimulationEngine on random workloads with cancellations made between timestamps, and
pin the rules where the two can differ by design.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import pandas as pd
import simpy
from helpers import examples, request_table
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim

Workload = list[tuple[int, int, int, int]]  # (request id, arrival, prompt, output)
Plan = list[tuple[int, int]]  # (time, request id) cancellations

EngineFactory = Callable[[simsim.SimulatedBackend], simsim.SimulationEngine]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[simsim.SimulatedBackendConfig, Workload, Plan]:
    config = simsim.SimulatedBackendConfig(
        prefill_base_us=draw(st.sampled_from([0, 0, 5, 100])),
        prefill_per_token_us=draw(st.sampled_from([0, 1, 2])),
        prefill_per_active_sequence_us=draw(st.sampled_from([0, 3])),
        decode_base_us=draw(st.sampled_from([0, 1, 7, 10])),
        decode_per_active_sequence_us=draw(st.sampled_from([0, 2])),
    )
    count = draw(st.integers(0, 14))
    ids = draw(st.permutations(list(range(count))))
    workload = [
        (
            rid,
            draw(st.sampled_from([0, 0, 10, 50, 120, 300]) | st.integers(0, 600)),
            draw(st.integers(0, 40)),
            draw(st.integers(0, 6)),
        )
        for rid in ids
    ]
    plan = draw(
        st.lists(
            st.tuples(st.integers(0, 900), st.integers(0, max(count - 1, 0))),
            max_size=6,
        )
    )
    return config, workload, sorted(plan)


def drive_with_stops(
    make: EngineFactory, config: simsim.SimulatedBackendConfig, workload: Workload, plan: Plan
) -> simsim.SimulationEngine:
    """Cancel at given times, stopping the clock there with env.run(until=...)."""
    engine = make(simsim.SimulatedBackend(config))
    for rid, arrival, prompt, output in workload:
        engine.submit(simsim.Request(rid, arrival, prompt, output))
    for at, rid in plan:
        if at > engine.now_us:
            engine.env.run(until=at)
        if rid in engine.requests and not engine.requests[rid].is_terminal:
            engine.cancel_request(rid)
    engine.run()
    return engine


def table(engine: simsim.SimulationEngine) -> pd.DataFrame:
    return engine.requests_frame()


@settings(max_examples=examples(150), deadline=None, derandomize=True, database=None)
@given(scenarios())
def test_same_request_table_with_cancellations_at_stopped_times(
    scenario: tuple[simsim.SimulatedBackendConfig, Workload, Plan],
) -> None:
    config, workload, plan = scenario
    full = drive_with_stops(simsim.SimulationEngine, config, workload, plan)
    fast = drive_with_stops(simsim.FastSimulationEngine, config, workload, plan)
    pd.testing.assert_frame_equal(table(fast), table(full))
    assert list(fast.admission_log) == list(full.admission_log)


def settle(engine: simsim.SimulationEngine, at: int) -> None:
    """Process every event at or before *at*."""
    queue = engine.env._queue
    while queue and queue[0][0] <= at:
        engine.run_next_timestamp()


@settings(max_examples=examples(150), deadline=None, derandomize=True, database=None)
@given(scenarios(), st.lists(st.integers(0, 30), max_size=5))
def test_same_state_at_every_fast_timestamp_and_after_cancellations(
    scenario: tuple[simsim.SimulatedBackendConfig, Workload, Plan], cancel_steps: list[int]
) -> None:
    config, workload, _ = scenario
    full = simsim.SimulationEngine(simsim.SimulatedBackend(config))
    fast = simsim.FastSimulationEngine(simsim.SimulatedBackend(config))
    for engine in (full, fast):
        for rid, arrival, prompt, output in workload:
            engine.submit(simsim.Request(rid, arrival, prompt, output))
    step = 0
    while (at := fast.run_next_timestamp()) is not None:
        # Both engines have now processed every event at or before `at`. (Their clocks
        # can differ: a cancelled request's ignored event lies at a different time.)
        settle(fast, at)
        settle(full, at)
        assert fast.now_us == at
        # Rows, not frames, inside the loop: the frame is computed from exactly these
        # fields (compared as frames once at the end) and is 20 times dearer to build.
        assert request_table(fast) == request_table(full), at
        if step in cancel_steps and full.now_us == at:
            active = [r for r in full.requests.values() if not r.is_terminal]
            if active:
                victim = active[step % len(active)].request_id
                full.cancel_request(victim)
                fast.cancel_request(victim)
                assert request_table(fast) == request_table(full), (at, victim)
        step += 1
    full.run()
    assert request_table(fast) == request_table(full)
    pd.testing.assert_frame_equal(table(fast), table(full))


def costs() -> simsim.SimulatedBackend:
    # prefill = 100 + 2 * prompt, decode step = 10
    return simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=100,
            prefill_per_token_us=2,
            prefill_per_active_sequence_us=0,
            decode_base_us=10,
            decode_per_active_sequence_us=0,
        )
    )


def test_fast_engine_logs_arrivals_and_completions_only() -> None:
    engine = simsim.FastSimulationEngine(costs())
    engine.submit(simsim.Request(0, 0, 10, 3))  # prefill ends at 120, tokens 130/140/150
    engine.run()
    assert [(r.timestamp_us, r.event_type.name) for r in engine.event_log] == [
        (0, "REQUEST_ARRIVAL"),
        (150, "REQUEST_COMPLETE"),
    ]
    request = engine.requests[0]
    assert (request.prefill_end_time_us, request.first_token_time_us) == (120, 130)
    assert (request.generated_token_count, request.finish_time_us) == (3, 150)
    assert engine.processed_event_count == 2


def test_progress_is_worked_out_between_timestamps() -> None:
    engine = simsim.FastSimulationEngine(costs())
    request = engine.submit(simsim.Request(0, 0, 10, 3))
    engine.submit(simsim.Request(1, 135, 0, 1))
    assert engine.run_next_timestamp() == 0
    assert request.state is simsim.RequestState.PREFILLING
    assert engine.run_next_timestamp() == 135  # the second arrival; 0 is mid-decode
    assert request.state is simsim.RequestState.DECODING
    assert (request.prefill_end_time_us, request.generated_token_count) == (120, 1)
    engine.env.run(until=140)  # stopped before the step that ends at 140
    assert engine.requests[0].generated_token_count == 1
    engine.cancel_request(0)
    assert (request.state, request.generated_token_count) == (simsim.RequestState.CANCELLED, 1)
    assert request.finish_time_us == 140
    engine.run()
    assert engine.requests[1].admit_time_us == 140


def cancel_in_simulation(make: EngineFactory, waits_us: tuple[int, ...]) -> simsim.SimulationEngine:
    """Request 0 makes tokens at 130, 140, 150, ...; a process cancels it after *waits_us*."""
    engine = make(costs())
    engine.submit(simsim.Request(0, 0, 10, 5))

    def canceller(env: simsim.Environment) -> Generator[simpy.Event, object, None]:
        for wait in waits_us:
            yield env.timeout(wait)
        engine.cancel_request(0)

    engine.env.process(canceller(engine.env))
    engine.run()
    return engine


def test_a_cancellation_inside_the_simulation_wins_a_tie_with_a_skipped_step() -> None:
    # The process's timeout to 140 was scheduled before the step ending at 140 (at 130),
    # so on the full engine the cancellation comes first; the fast engine lets the
    # cancellation win every tie with a step it skips, and agrees.
    full, fast = (
        cancel_in_simulation(make, (140,))
        for make in (simsim.SimulationEngine, simsim.FastSimulationEngine)
    )
    for engine in (full, fast):
        assert engine.requests[0].state is simsim.RequestState.CANCELLED
        assert engine.requests[0].generated_token_count == 1
        assert engine.requests[0].finish_time_us == 140


def test_where_the_tie_rule_differs_from_the_full_engine() -> None:
    # A cancelling event scheduled after the step's own (at 135, after the step ending at
    # 140 was scheduled at 130) comes second on the full engine, which counts the step;
    # the fast engine does not (docs/semantics.md, "The fast single slot").
    full, fast = (
        cancel_in_simulation(make, (135, 5))
        for make in (simsim.SimulationEngine, simsim.FastSimulationEngine)
    )
    assert full.requests[0].generated_token_count == 2
    assert fast.requests[0].generated_token_count == 1
    for engine in (full, fast):
        assert engine.requests[0].state is simsim.RequestState.CANCELLED
        assert engine.requests[0].finish_time_us == 140


def test_scenario_files_can_choose_the_fast_engine() -> None:
    from dataclasses import replace
    from pathlib import Path

    from simsim.scenario import load_scenario, run_scenario

    path = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "bursty.toml"
    scenario = load_scenario(path)
    full = run_scenario(scenario)
    fast = run_scenario(replace(scenario, engine="single_slot_fast"))
    assert type(fast) is simsim.FastSimulationEngine
    pd.testing.assert_frame_equal(fast.requests_frame(), full.requests_frame())
    assert fast.processed_event_count < full.processed_event_count / 10
