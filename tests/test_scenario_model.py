"""The scenario layer does each job once: one workload draw per run, one engine registry."""

from __future__ import annotations

from pathlib import Path

import pytest

import simsim
from simsim.scenario import ENGINE_BUILDERS, ENGINES, parse_scenario, run_scenario
from simsim.sweeps.runner import RunTask, ScenarioSource, execute
from simsim.workloads import OpenLoopWorkload

DOCUMENT = {
    "backend": {"prefill_base_us": 100, "decode_base_us": 10},
    "workload": {
        "count": 30,
        "rate_per_s": 1000.0,
        "prompt_tokens": [1, 8],
        "output_tokens": [1, 4],
        "patience_us": 500,
    },
    "cancellations": [{"time_us": 50, "request_id": 3}],
}


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every seed an open-loop workload is generated from, in order."""
    seen: list[int] = []
    original = OpenLoopWorkload.generate

    def counting(self: OpenLoopWorkload, seed: int) -> simsim.workloads.GeneratedWorkload:
        seen.append(seed)
        return original(self, seed)

    monkeypatch.setattr(OpenLoopWorkload, "generate", counting)
    return seen


def test_parsing_and_running_a_scenario_draw_its_workload_once(draws: list[int]) -> None:
    scenario = parse_scenario(DOCUMENT)  # checks the cancellation's request id
    engine = run_scenario(scenario)
    assert draws == [0]
    assert len(engine.requests) == 30
    assert engine.requests[3].state is simsim.RequestState.CANCELLED


def test_a_sweep_run_draws_its_workload_once(draws: list[int]) -> None:
    task = RunTask(ScenarioSource(DOCUMENT, str(Path.cwd()), "<doc>"), {}, 17, None, None, (99,))
    metrics = execute(task)
    assert draws == [17]
    assert metrics["requests"] == 30


def test_engine_names_come_from_the_registry() -> None:
    assert tuple(ENGINE_BUILDERS) == ENGINES
    assert ENGINES == ("single_slot", "single_slot_fast", "batching", "vllm")
    kinds = {
        "single_slot": simsim.SimulationEngine,
        "single_slot_fast": simsim.FastSimulationEngine,
        "batching": simsim.BatchingEngine,
    }
    for name, kind in kinds.items():
        document = {**DOCUMENT, "scenario": {"engine": name}}
        if name == "batching":
            document["batching"] = {"max_active_requests": 4}
        engine = parse_scenario(document).build_engine()
        assert type(engine) is kind


def test_a_registered_builder_is_a_scenario_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    # Adding a server to scenario files is one registry entry.
    def two_slot_batching(
        scenario: object, backend: simsim.SimulatedBackend, scheduler: object, env: object
    ) -> simsim.BatchingEngine:
        return simsim.BatchingEngine(backend, scheduler, max_active_requests=2, env=env)  # type: ignore[arg-type]

    monkeypatch.setitem(ENGINE_BUILDERS, "two_slots", two_slot_batching)  # type: ignore[arg-type]
    engine = run_scenario(parse_scenario({**DOCUMENT, "scenario": {"engine": "two_slots"}}))
    assert isinstance(engine, simsim.BatchingEngine)
    assert engine.max_active_requests == 2
    with pytest.raises(simsim.scenario.ScenarioError, match="one of"):
        parse_scenario({**DOCUMENT, "scenario": {"engine": "three_slots"}})


def test_the_fast_engine_is_not_offered_for_closed_loop_users() -> None:
    # Closed-loop users submit and cancel during the run; the fast engine's events at a
    # shared microsecond come in another order than the full engine's, so its request
    # table would differ (ids are given in submission order): refused, naming the key.
    document = {
        "scenario": {"engine": "single_slot_fast"},
        "backend": {"prefill_base_us": 100, "decode_base_us": 10},
        "workload": {
            "kind": "closed_loop",
            "users": 2,
            "requests_per_user": 2,
            "think_time_us": 10,
            "prompt_tokens": 4,
            "output_tokens": 2,
        },
    }
    with pytest.raises(simsim.scenario.ScenarioError, match=r"workload\.kind: closed_loop needs"):
        parse_scenario(document)
    for engine in ("single_slot", "batching"):
        accepted = {**document, "scenario": {"engine": engine}}
        if engine == "batching":
            accepted["batching"] = {"max_active_requests": 2}
        assert len(run_scenario(parse_scenario(accepted)).requests) == 4
