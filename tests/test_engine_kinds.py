"""An engine kind says what it can do, and every rule asks it (issue 25, point 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import simsim
from simsim.scenario import ENGINE_BUILDERS, parse_scenario
from simsim.scenario.engine_kinds import ENGINE_KINDS, EngineKind, cannot, kind_of, require

FAST = ENGINE_KINDS["single_slot_fast"]


def test_each_engine_kind_is_a_record_of_its_abilities() -> None:
    assert ENGINE_BUILDERS is ENGINE_KINDS
    assert [kind.name for kind in ENGINE_KINDS.values()] == list(ENGINE_KINDS)
    full = ENGINE_KINDS["single_slot"]
    assert (full.streams_tokens, full.prices_context, full.closed_loop) == (True, True, True)
    assert (FAST.streams_tokens, FAST.prices_context, FAST.closed_loop) == (False, False, False)
    assert FAST.serves_as == "single_slot"
    engine = simsim.FastSimulationEngine(simsim.SimulatedBackend(simsim.SimulatedBackendConfig()))
    assert kind_of(engine) is FAST


def test_each_rule_is_written_once_and_names_the_stand_in() -> None:
    assert cannot("single_slot", "streams_tokens") is None
    assert cannot("no_such_engine", "streams_tokens") is None  # reported by the name check
    message = cannot("single_slot_fast", "prices_context")
    assert message == (
        "a fitted backend prices each decode step from its context; engine "
        '"single_slot_fast" (FastSimulationEngine) prices one decode step per request: use '
        'engine = "single_slot" (SimulationEngine), which gives the same request table'
    )
    with pytest.raises(ValueError, match="closed_loop needs an engine"):
        require("single_slot_fast", "closed_loop")
    require("batching", "closed_loop")


def test_a_kind_without_a_stand_in_lists_the_kinds_that_can() -> None:
    lone = replace(FAST, name="lone_fast", serves_as=None)
    ENGINE_KINDS.register("lone_fast", lone)
    try:
        message = cannot("lone_fast", "streams_tokens")
        assert message is not None
        assert message.endswith('use engine = "single_slot" or "batching" or "vllm"')
        # vllm prices its own steps: it is no home for a fitted backend.
        message = cannot("lone_fast", "prices_context")
        assert message is not None
        assert message.endswith('use engine = "single_slot" or "batching"')
    finally:
        del ENGINE_KINDS["lone_fast"]


def test_parsing_asks_the_kind_not_the_name() -> None:
    # A registered kind that cannot price context is refused a fitted backend, whatever
    # its name: the rule reads the record.
    ENGINE_KINDS.register("my_fast", replace(FAST, name="my_fast"))
    try:
        with pytest.raises(simsim.scenario.ScenarioError, match=r"backend\.kind: a fitted"):
            parse_scenario(
                {
                    "scenario": {"engine": "my_fast"},
                    "backend": {"kind": "fitted", "decode_base_us": 1.0},
                    "requests": [
                        {
                            "request_id": 0,
                            "arrival_time_us": 0,
                            "prompt_token_count": 1,
                            "max_output_tokens": 1,
                        }
                    ],
                }
            )
    finally:
        del ENGINE_KINDS["my_fast"]


def test_a_plain_builder_registered_is_a_kind_that_can_do_everything() -> None:
    def build(scenario: object, backend: object, scheduler: object, env: object) -> object:
        raise AssertionError("not built here")

    ENGINE_KINDS["plain"] = build  # type: ignore[assignment]
    try:
        kind = ENGINE_KINDS["plain"]
        assert isinstance(kind, EngineKind)
        assert kind.streams_tokens and kind.prices_context and kind.closed_loop
    finally:
        del ENGINE_KINDS["plain"]


def test_serving_and_calibration_ask_the_kinds() -> None:
    pytest.importorskip("uvicorn")
    from simsim.fidelity.calibrate import ENGINES
    from simsim.live.driver import LiveDriver
    from simsim.live.server import serving_engine

    able = tuple(
        name for name, kind in ENGINE_KINDS.items() if kind.prices_context and kind.takes_backend
    )
    assert able == ENGINES == ("single_slot", "batching")  # vllm prices itself
    scenario = parse_scenario(
        {"scenario": {"engine": "single_slot_fast"}, "backend": {"decode_base_us": 1}},
        require_requests=False,
    )
    assert type(serving_engine(scenario)) is simsim.SimulationEngine
    engine = simsim.FastSimulationEngine(simsim.SimulatedBackend(simsim.SimulatedBackendConfig()))
    with pytest.raises(TypeError, match="streaming tokens needs an engine") as raised:
        LiveDriver(engine)
    assert str(raised.value) == cannot("single_slot_fast", "streams_tokens")
