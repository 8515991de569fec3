"""Engine defects found by randomized probes, each pinned by a test that failed before its fix.

* The fast single slot admitted a queued request at once after a cancellation made
  right after ``env.run(until=T)`` stopped the clock at a time T where the full engine
  still had the cancelled request's step event pending (issue 12, point 1).
"""

from __future__ import annotations

from collections.abc import Generator

import pandas as pd
import pytest
import simpy
from helpers import examples, request_table
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.scenario import parse_scenario, run_scenario

# Costs on a 10 us grid, so that stop times often fall exactly on a step's end.
GRID_CONFIG = simsim.SimulatedBackendConfig(
    prefill_base_us=100,
    prefill_per_token_us=0,
    prefill_per_active_sequence_us=0,
    decode_base_us=10,
    decode_per_active_sequence_us=0,
)

Workload = list[tuple[int, int, int]]  # (arrival, prompt, output), ids in list order
Plan = list[tuple[int, list[int]]]  # (stop time, request ids cancelled there in order)

SINGLE_SLOT_ENGINES = {
    "full": lambda backend: simsim.SimulationEngine(backend),
    "fast": lambda backend: simsim.FastSimulationEngine(backend),
    "batching": lambda backend: simsim.BatchingEngine(backend, max_active_requests=1),
}


def drive(
    kind: str,
    workload: Workload,
    plan: Plan,
    config: simsim.SimulatedBackendConfig = GRID_CONFIG,
) -> simsim.SimulationEngine:
    """Submit *workload*, then stop the clock at each planned time and cancel there."""
    engine = SINGLE_SLOT_ENGINES[kind](simsim.SimulatedBackend(config))
    for rid, (arrival, prompt, output) in enumerate(workload):
        engine.submit(simsim.Request(rid, arrival, prompt, output))
    for at, victims in plan:
        if at > engine.now_us:
            engine.env.run(until=at)
        for rid in victims:
            if not engine.requests[rid].is_terminal:
                engine.cancel_request(rid)
    engine.run()
    return engine


def test_cancelling_right_after_a_stop_on_a_step_end_leaves_admission_to_the_boundary() -> None:
    # Request 0 prefills 0..100 and decodes at 110, 120, ...; run(until=110) stops the
    # clock before the step ending at 110. Cancelling 0 and then the queued 1 must
    # leave 1 never admitted, as on the full engine.
    workload = [(0, 0, 5), (1, 0, 1)]
    plan = [(110, [0, 1])]
    tables = {kind: drive(kind, workload, plan) for kind in SINGLE_SLOT_ENGINES}
    for kind, engine in tables.items():
        frame = engine.requests_frame()
        assert frame["state"].tolist() == ["CANCELLED", "CANCELLED"], kind
        assert frame["admit_time_us"].tolist() == [0, pd.NA], kind
        assert [record.request_id for record in engine.admission_log] == [0], kind


def test_a_queued_request_is_still_admitted_at_the_stop_time_through_the_boundary() -> None:
    workload = [(0, 0, 5), (1, 0, 1)]
    for stop in (100, 110, 150):  # the prefill's end, a decode step's end, the last step
        plan = [(stop, [0])]
        full = drive("full", workload, plan)
        fast = drive("fast", workload, plan)
        pd.testing.assert_frame_equal(fast.requests_frame(), full.requests_frame())
        assert list(fast.admission_log) == list(full.admission_log)
        assert full.admission_log[-1].timestamp_us == stop


@st.composite
def grid_scenarios(draw: st.DrawFn) -> tuple[Workload, Plan]:
    count = draw(st.integers(1, 8))
    workload = [
        (
            10 * draw(st.integers(0, 30)),
            0,  # prompt length does not change the cost on this grid
            draw(st.integers(0, 6)),
        )
        for _ in range(count)
    ]
    times = draw(st.lists(st.integers(1, 90).map(lambda t: 10 * t), max_size=5, unique=True))
    plan = [
        (at, draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=3)))
        for at in sorted(times)
    ]
    return workload, plan


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(grid_scenarios())
def test_fast_and_full_engines_agree_on_cancellations_at_stop_times_on_the_step_grid(
    scenario: tuple[Workload, Plan],
) -> None:
    workload, plan = scenario
    full = drive("full", workload, plan)
    fast = drive("fast", workload, plan)
    pd.testing.assert_frame_equal(fast.requests_frame(), full.requests_frame())
    assert list(fast.admission_log) == list(full.admission_log)


def cancel_at(
    engine: simsim.SimulationEngine, request_id: int, waits_us: list[int], said: list[str]
) -> Generator[simpy.Event, None, None]:
    """A SimPy process: wait *waits_us* one after another, then try to cancel."""
    for wait in waits_us:
        yield engine.env.timeout(wait)
    try:
        engine.cancel_request(request_id)
        said.append("cancelled")
    except simsim.InvalidTransitionError:
        said.append("already finished")


def test_a_cancellation_inside_the_simulation_at_the_last_step_differs_as_documented() -> None:
    # docs/semantics.md, "The fast single slot": the one case where the engines differ.
    outcomes = {}
    for engine_class in (simsim.SimulationEngine, simsim.FastSimulationEngine):
        engine = engine_class(simsim.SimulatedBackend(GRID_CONFIG))
        engine.submit(simsim.Request(0, 0, 0, 2))  # prefill 0..100, steps end at 110, 120
        said: list[str] = []
        engine.env.process(cancel_at(engine, 0, [5, 115], said))
        engine.env.run()
        request = engine.requests[0]
        outcomes[engine_class.__name__] = (
            said,
            request.state.name,
            request.generated_token_count,
            request.finish_time_us,
        )
    assert outcomes == {
        "SimulationEngine": (["cancelled"], "CANCELLED", 1, 120),
        "FastSimulationEngine": (["already finished"], "FINISHED", 2, 120),
    }


# --------------------------------------------------------------------------- batching durations


class PhaseBackend:
    """A backend with only the two per-phase costs (no iteration_us), answering as told."""

    def __init__(self, prefill: object = 100, decode: object = 10) -> None:
        self.prefill = prefill
        self.decode = decode

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> object:
        return self.prefill

    def decode_step_us(self, active_sequence_count: int) -> object:
        return self.decode


class NegativePrefillSimulatedBackend(simsim.SimulatedBackend):
    """SimulatedBackend's own iteration_us, with a subclass's broken prefill price."""

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        return -5


BAD_ANSWERS = [
    # (prefill answer, decode answer, error, method named)
    (-5, 10, ValueError, "prefill_us"),
    (True, 10, TypeError, "prefill_us"),
    ("7", 10, TypeError, "prefill_us"),
    (None, 10, TypeError, "prefill_us"),
    (7, True, TypeError, "decode_step_us"),
    (7, -1, ValueError, "decode_step_us"),
    (7, None, TypeError, "decode_step_us"),
    (7, "x", TypeError, "decode_step_us"),
]


def mixed_engine(backend: object) -> simsim.BatchingEngine:
    """Request 0 decodes while request 1 prefills: a mixed iteration prices both parts."""
    engine = simsim.BatchingEngine(
        backend,  # type: ignore[arg-type]
        max_active_requests=2,
        max_batch_tokens=64,
        policy="mixed",
    )
    engine.submit(simsim.Request(0, 0, 4, 3))
    engine.submit(simsim.Request(1, 1, 4, 3))
    return engine


@pytest.mark.parametrize(("prefill", "decode", "error", "method"), BAD_ANSWERS)
def test_batching_checks_each_part_of_an_iteration_and_names_the_method_and_request(
    prefill: object, decode: object, error: type[Exception], method: str
) -> None:
    # Prefill answers are checked in request 0's first iteration, decode answers in the
    # mixed iteration at 10 us that decodes request 0 and prefills request 1.
    bad_prefill = method == "prefill_us"
    backend = PhaseBackend(prefill, decode) if bad_prefill else PhaseBackend(10, decode)
    engine = mixed_engine(backend)
    with pytest.raises(error) as raised:
        engine.run()
    message = str(raised.value)
    assert f"backend {method} for the iteration at" in message
    assert "iteration_us" not in message.replace("the iteration at", "")
    assert ("request 0" if bad_prefill else "requests 0, 1") in message
    assert "unsupported operand" not in message
    assert engine.failed


def test_a_negative_prefill_is_not_hidden_by_a_decode_cost_under_a_simulated_subclass() -> None:
    backend = NegativePrefillSimulatedBackend(GRID_CONFIG)
    engine = mixed_engine(backend)
    with pytest.raises(ValueError, match=r"prefill_us .* negative duration -5 us"):
        engine.run()


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_a_refused_launch_leaves_the_heads_waiting_as_the_single_slot_does(policy: str) -> None:
    tokens = 64 if policy == "mixed" else None
    batching = simsim.BatchingEngine(
        PhaseBackend(prefill=-1),  # type: ignore[arg-type]
        max_active_requests=4,
        max_batch_tokens=tokens,
        policy=policy,
    )
    single = simsim.SimulationEngine(PhaseBackend(prefill=-1))  # type: ignore[arg-type]
    for engine in (batching, single):
        held = [engine.submit(simsim.Request(rid, 0, 4, 2)) for rid in range(3)]
        with pytest.raises(ValueError, match="negative duration -1 us"):
            engine.run()
        for request in held:
            assert request.state is simsim.RequestState.WAITING
            assert request.admit_time_us is None
        assert engine.failed


# --------------------------------------------------------------------------- absurd output limits

ENGINE_KINDS = {
    "full": lambda backend: simsim.SimulationEngine(backend),
    "fast": lambda backend: simsim.FastSimulationEngine(backend),
    "batching": lambda backend: simsim.BatchingEngine(backend, max_active_requests=4),
    "mixed": lambda backend: simsim.BatchingEngine(
        backend, max_active_requests=4, max_batch_tokens=64, policy="mixed"
    ),
}


@pytest.mark.parametrize("kind", ENGINE_KINDS)
@pytest.mark.parametrize("prefill_base_us", [100, 0])
@pytest.mark.parametrize("limit", [2**63 - 1, 2**60])
def test_an_output_limit_that_must_overflow_is_refused_before_its_first_decode_step(
    kind: str, prefill_base_us: int, limit: int
) -> None:
    # 2**60 tokens at 10 us each end past 2**63 - 1 too, although the count itself fits.
    config = simsim.SimulatedBackendConfig(
        prefill_base_us=prefill_base_us,
        prefill_per_token_us=0,
        prefill_per_active_sequence_us=0,
        decode_base_us=10,
        decode_per_active_sequence_us=0,
    )
    engine = ENGINE_KINDS[kind](simsim.SimulatedBackend(config))
    engine.submit(simsim.Request(3, 0, 4, limit))
    with pytest.raises(OverflowError, match="request 3") as raised:
        engine.run()
    assert "2**63 - 1" in str(raised.value)
    assert engine.failed
    assert engine.processed_event_count <= 2  # the arrival and at most the prefill


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_an_output_limit_just_inside_the_clock_still_runs(kind: str) -> None:
    # Finish = 100 + 10 * tokens: the largest limit whose finish fits is refused by nobody
    # (the per-token engines are not run to the end: a few steps show it was not refused).
    tokens = (2**63 - 1 - 100) // 10
    engine = ENGINE_KINDS[kind](simsim.SimulatedBackend(GRID_CONFIG))
    engine.submit(simsim.Request(3, 0, 0, tokens))
    for _ in range(4):
        engine.run_next_timestamp()
    assert not engine.failed
    request = engine.requests[3]
    if kind == "fast":  # one event for the whole request: it has finished
        assert request.finish_time_us == 100 + 10 * tokens
    else:
        assert request.state is simsim.RequestState.DECODING


def test_a_cancelled_requests_pending_step_counts_as_work_due_on_both_engines() -> None:
    # Request 0 is cancelled at 50 while prefilling: the full engine keeps its ignored
    # PREFILL_COMPLETE at 100, the fast engine its work event at 130. Cancelling 1 at
    # 100 must leave admission to the boundary on both (the full engine's event at 100
    # is pending), so 2, cancelled next, is never admitted.
    workload = [(0, 0, 3), (1, 0, 0), (2, 0, 1)]
    plan = [(50, [0]), (100, [1, 2])]
    full = drive("full", workload, plan)
    fast = drive("fast", workload, plan)
    pd.testing.assert_frame_equal(fast.requests_frame(), full.requests_frame())
    assert [(a.timestamp_us, a.request_id) for a in full.admission_log] == [(0, 0), (50, 1)]
    assert list(fast.admission_log) == list(full.admission_log)


@st.composite
def mixed_cost_scenarios(
    draw: st.DrawFn,
) -> tuple[simsim.SimulatedBackendConfig, Workload, Plan]:
    """Costs and stop times on a 10 us grid (now and then off it), several stops, and
    several cancellations at each: cancelled requests' pending steps then often fall
    on a later stop."""
    prefill, per_token, decode = draw(
        st.sampled_from([(100, 0, 10), (0, 0, 10), (100, 10, 10), (5, 1, 1), (0, 0, 0)])
    )
    config = simsim.SimulatedBackendConfig(
        prefill_base_us=prefill,
        prefill_per_token_us=per_token,
        prefill_per_active_sequence_us=0,
        decode_base_us=decode,
        decode_per_active_sequence_us=0,
    )
    count = draw(st.integers(3, 6))
    workload = [
        (
            draw(st.sampled_from([0, 0, 1, 2, 10, 50])),
            draw(st.sampled_from([0, 0, 3])),
            draw(st.integers(0, 4)),
        )
        for _ in range(count)
    ]
    # Two to four stops, mostly at the grid costs' prefill and step ends, so that a
    # request cancelled at one stop often has its next step at a later one.
    ends = st.sampled_from([50, 100, 105, 110, 120, 150, 200, 210, 230])
    times = draw(st.lists(ends | st.integers(1, 30).map(lambda t: 10 * t), min_size=2, max_size=4))
    # Victims: mostly the first few requests, the ones likely to hold the slot or wait.
    victim = st.integers(0, 2) | st.integers(0, count - 1)
    plan = [(at, draw(st.lists(victim, min_size=1, max_size=3))) for at in sorted(set(times))]
    return config, workload, plan


@settings(max_examples=examples(1000), deadline=None, derandomize=True, database=None)
@given(mixed_cost_scenarios())
def test_fast_and_full_engines_agree_on_cancellations_between_timestamps(
    scenario: tuple[simsim.SimulatedBackendConfig, Workload, Plan],
) -> None:
    # Rows, not frames: the frame is computed from exactly these fields, and building
    # two DataFrames per example would make the 1000 examples slow.
    config, workload, plan = scenario
    full = drive("full", workload, plan, config)
    fast = drive("fast", workload, plan, config)
    assert request_table(fast) == request_table(full)
    assert list(fast.admission_log) == list(full.admission_log)


def test_scenario_cancellations_at_step_ends_give_the_same_table_on_the_fast_engine() -> None:
    # A scenario's cancellations are timeouts set up before the run, so on the full
    # engine they come before any step ending at their microsecond; the fast engine's
    # tie rule agrees. Prefill ends at 100, steps at 110, 120, ...; one cancellation
    # on each kind of tie: a prefill's end, a middle step, a last step.
    document = {
        "backend": {"prefill_base_us": 100, "decode_base_us": 10},
        "requests": [
            {
                "request_id": rid,
                "arrival_time_us": 0,
                "prompt_token_count": 0,
                "max_output_tokens": 3,
            }
            for rid in range(4)
        ],
        "cancellations": [
            {"time_us": 110, "request_id": 0},  # its first token's step
            {"time_us": 230, "request_id": 1},  # admitted at 110: prefill ends at 210
            {"time_us": 250, "request_id": 2},  # admitted at 230: prefill ends at 330
            {"time_us": 360, "request_id": 2},  # its last step (330 + 3 * 10)
        ],
    }
    tables = {}
    for engine in ("single_slot", "single_slot_fast"):
        scenario = parse_scenario({**document, "scenario": {"engine": engine}})
        tables[engine] = run_scenario(scenario).requests_frame()
    pd.testing.assert_frame_equal(tables["single_slot_fast"], tables["single_slot"])
    assert tables["single_slot"]["generated_token_count"].tolist() == [0, 1, 0, 3]


def test_batching_does_not_refuse_a_limit_that_fits_at_the_cheapest_decode_pace() -> None:
    # Request 0's first decode iteration also prefills request 1's 5,000 tokens (5e9
    # us); later iterations decode alone at 1 us each, so 10**13 tokens fit. Only a
    # bound every later iteration must meet (decode_base_us + per sequence) may refuse.
    costs = simsim.SimulatedBackendConfig(
        prefill_base_us=0,
        prefill_per_token_us=10**6,
        prefill_per_active_sequence_us=0,
        decode_base_us=1,
        decode_per_active_sequence_us=0,
    )
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(costs),
        max_active_requests=4,
        max_batch_tokens=10_000,
        policy="mixed",
    )
    engine.submit(simsim.Request(0, 0, 1, 10**13))
    engine.submit(simsim.Request(1, 1, 5_000, 1))
    for _ in range(6):
        engine.run_next_timestamp()
    assert not engine.failed
    assert engine.requests[0].generated_token_count == 3
