"""The fitted cost model: fractional coefficients, context-aware steps, one rounding rule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim import (
    BatchingEngine,
    FastSimulationEngine,
    FittedBackend,
    FittedBackendConfig,
    KvCacheConfig,
    Request,
    SimulatedBackend,
    SimulatedBackendConfig,
    SimulationEngine,
)
from simsim.backend import round_us
from simsim.scenario import ScenarioError, load_scenario, run_scenario


def fitted(**coefficients: float) -> FittedBackend:
    return FittedBackend(FittedBackendConfig(**coefficients))


# ---------------------------------------------------------------------- the formula


def test_rounding_is_to_the_nearest_microsecond_with_halves_up() -> None:
    assert [round_us(x) for x in (0.0, 0.49, 0.5, 1.5, 2.5, 2.4999, 7.0)] == [0, 0, 1, 2, 3, 2, 7]
    assert type(round_us(3.7)) is int


@pytest.mark.parametrize("value", [math.inf, math.nan, 2.0**63])
def test_rounding_refuses_what_the_clock_cannot_hold(value: float) -> None:
    with pytest.raises(OverflowError, match="past the 64-bit limit"):
        round_us(value, "step_us")


def test_a_prefill_step_prices_each_sequence_new_and_cached_tokens() -> None:
    backend = fitted(
        prefill_base_us=100.0,
        prefill_per_token_us=0.5,
        prefill_per_token_squared_us=0.01,
        prefill_per_sequence_us=7.0,
    )
    # 100 + 0.5 * (10 + 20) + 0.01 * (10 * (10 + 0) + 20 * (20 + 2 * 30)) + 7 * 2
    expected = 100 + 15 + 0.01 * (100 + 1600) + 14
    assert backend.step_us([(10, 0), (20, 30)], []) == round_us(expected) == 146


def test_a_decode_step_grows_with_the_batch_and_every_context() -> None:
    backend = fitted(
        decode_base_us=1000.0, decode_per_sequence_us=250.0, decode_per_context_token_us=0.3
    )
    assert backend.step_us([], [100]) == 1000 + 250 + 30
    assert backend.step_us([], [100, 200, 1]) == round_us(1000 + 750 + 0.3 * 301) == 1840


def test_a_mixed_step_is_the_prefill_part_plus_the_decode_part_rounded_once() -> None:
    backend = fitted(prefill_base_us=0.4, decode_base_us=0.4)
    # Each part alone rounds down to 0; together 0.8 rounds to 1: one rounding per step.
    assert backend.step_us([(0, 0)], []) == 0
    assert backend.step_us([], [0]) == 0
    assert backend.step_us([(0, 0)], [0]) == 1
    assert backend.step_us([], []) == 0


@given(chunks=st.lists(st.integers(0, 5000), min_size=1, max_size=8))
def test_chunked_prefill_pays_the_same_quadratic_term_as_one_piece(chunks: list[int]) -> None:
    cached = 0
    total = 0
    for chunk in chunks:
        total += chunk * (chunk + 2 * cached)
        cached += chunk
    assert total == cached * cached


def test_the_backend_protocol_methods_price_one_sequence_with_no_context() -> None:
    backend = fitted(
        prefill_base_us=10.0,
        prefill_per_token_us=1.25,
        prefill_per_token_squared_us=0.5,
        prefill_per_sequence_us=3.0,
        decode_base_us=5.0,
        decode_per_sequence_us=2.5,
        decode_per_context_token_us=99.0,
    )
    assert backend.prefill_us(4, 1) == round_us(10 + 5 + 8 + 3) == 26
    assert backend.decode_step_us(3) == round_us(5 + 7.5) == 13
    assert isinstance(backend, simsim.Backend)
    assert isinstance(backend, simsim.StepCostBackend)
    assert not isinstance(SimulatedBackend(SimulatedBackendConfig()), simsim.StepCostBackend)


@pytest.mark.parametrize(
    ("coefficients", "error", "message"),
    [
        (
            {"decode_base_us": -1.0},
            ValueError,
            "decode_base_us must be a finite number >= 0 microseconds, got -1.0",
        ),
        (
            {"prefill_per_token_us": math.nan},
            ValueError,
            "prefill_per_token_us must be a finite number",
        ),
        ({"prefill_base_us": math.inf}, ValueError, "prefill_base_us must be a finite number"),
        ({"decode_base_us": True}, TypeError, "decode_base_us must be a number of microseconds"),
        ({"decode_base_us": "3"}, TypeError, "got str '3'"),
    ],
)
def test_bad_coefficients_are_refused_by_name(
    coefficients: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        FittedBackendConfig(**coefficients)  # type: ignore[arg-type]


def test_coefficients_are_floats_and_read_back_as_a_table() -> None:
    config = FittedBackendConfig(prefill_base_us=3, decode_per_context_token_us=0.25)
    assert type(config.prefill_base_us) is float
    assert config.as_dict()["decode_per_context_token_us"] == 0.25
    assert list(config.as_dict()) == list(FittedBackendConfig.__dataclass_fields__)
    with pytest.raises(TypeError, match="FittedBackendConfig"):
        FittedBackend(SimulatedBackendConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prefills", "decodes", "message"),
    [([(-1, 0)], [], "new_tokens"), ([(1, -2)], [], "cached_tokens"), ([], [1.5], "context")],
)
def test_bad_step_arguments_are_refused(
    prefills: list[tuple[int, int]], decodes: list[float], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        fitted(decode_base_us=1.0).step_us(prefills, decodes)  # type: ignore[arg-type]


def test_a_step_past_the_clock_raises_overflow() -> None:
    with pytest.raises(OverflowError, match="step_us"):
        fitted(prefill_per_token_squared_us=1e6).step_us([(2**40, 0)], [])


# ---------------------------------------------------------------------- engines


def test_the_single_slot_decodes_over_a_growing_context() -> None:
    backend = fitted(
        prefill_base_us=1000.4,
        prefill_per_token_us=0.5,
        prefill_per_token_squared_us=0.001,
        decode_base_us=500.0,
        decode_per_context_token_us=0.5,
    )
    engine = SimulationEngine(backend)
    engine.submit(Request(0, 0, 100, 3))
    engine.run()
    decode_times = [
        row.timestamp_us
        for row in engine.events_frame().itertuples()
        if row.event_type == "DECODE_STEP_COMPLETE"
    ]
    prefill_end = round_us(1000.4 + 50 + 0.001 * 100 * 100)  # 1060
    # Token t decodes over the prompt plus the t - 1 tokens before it.
    steps = [round_us(500 + 0.5 * (100 + t - 1)) for t in (1, 2, 3)]
    assert steps == [550, 551, 551]
    assert engine.requests[0].prefill_end_time_us == prefill_end == 1060
    assert decode_times == [1060 + 550, 1060 + 550 + 551, 1060 + 550 + 551 + 551]


class RecordingBackend:
    """A StepCostBackend that remembers what every step was asked to price."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[tuple[int, int]], list[int]]] = []

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        raise AssertionError("engines must call step_us")

    def decode_step_us(self, active_sequence_count: int) -> int:
        raise AssertionError("engines must call step_us")

    def step_us(self, prefills: Sequence[tuple[int, int]], decodes: Sequence[int]) -> int:
        self.steps.append((list(prefills), list(decodes)))
        return 10


def test_a_mixed_iteration_passes_each_chunk_with_its_cached_tokens() -> None:
    backend = RecordingBackend()
    engine = BatchingEngine(backend, max_active_requests=2, policy="mixed", max_batch_tokens=8)
    engine.submit(Request(0, 0, 12, 2))
    engine.submit(Request(1, 0, 3, 1))
    engine.run()
    assert backend.steps[:4] == [
        ([(8, 0)], []),  # request 0's first chunk takes the whole budget
        ([(4, 8), (3, 0)], []),  # its last chunk after 8 cached tokens, then request 1
        ([], [12, 3]),  # both decode: contexts are the prompts
        ([], [13]),  # request 0's second token decodes over 12 + 1
    ]


def test_a_recomputed_request_prefills_its_prompt_and_output_again() -> None:
    backend = RecordingBackend()
    engine = BatchingEngine(
        backend,
        max_active_requests=2,
        kv_cache=KvCacheConfig(block_size_tokens=4, total_blocks=4),
    )
    engine.submit(Request(0, 0, 4, 8))
    engine.submit(Request(1, 0, 4, 8))
    engine.run()
    assert engine.requests_frame()["state"].tolist() == ["FINISHED", "FINISHED"]
    recompute = [prefills for prefills, _ in backend.steps if prefills and prefills[0][0] > 4]
    assert recompute, "the scenario must preempt and recompute"
    assert all(cached == 0 for prefills in recompute for _, cached in prefills)


def test_the_fast_engine_refuses_a_backend_with_step_costs() -> None:
    with pytest.raises(TypeError, match="use SimulationEngine"):
        FastSimulationEngine(fitted())


@st.composite
def linear_costs(draw: st.DrawFn) -> dict[str, int]:
    names = list(SimulatedBackendConfig.__dataclass_fields__)
    return {name: draw(st.integers(0, 5000)) for name in names}


@st.composite
def workloads(draw: st.DrawFn) -> list[Request]:
    count = draw(st.integers(1, 8))
    return [
        Request(i, draw(st.integers(0, 20_000)), draw(st.integers(0, 64)), draw(st.integers(0, 6)))
        for i in range(count)
    ]


@settings(max_examples=60, deadline=None)
@given(costs=linear_costs(), requests=workloads(), slots=st.integers(1, 3))
def test_with_whole_linear_coefficients_it_prices_as_the_simulated_backend(
    costs: dict[str, int], requests: list[Request], slots: int
) -> None:
    """Zero quadratic and context terms and whole microseconds: the same run."""
    linear = SimulatedBackend(SimulatedBackendConfig(**costs))
    fitted_backend = fitted(
        prefill_base_us=costs["prefill_base_us"],
        prefill_per_token_us=costs["prefill_per_token_us"],
        prefill_per_sequence_us=costs["prefill_per_active_sequence_us"],
        decode_base_us=costs["decode_base_us"],
        decode_per_sequence_us=costs["decode_per_active_sequence_us"],
    )
    frames = []
    for backend in (linear, fitted_backend):
        engine: SimulationEngine | BatchingEngine
        if slots == 1:
            engine = SimulationEngine(backend)
        else:
            engine = BatchingEngine(backend, max_active_requests=slots)
        for request in requests:
            engine.submit(
                Request(
                    request.request_id,
                    request.arrival_time_us,
                    request.prompt_token_count,
                    request.max_output_tokens,
                )
            )
        engine.run()
        frames.append((engine.requests_frame(), engine.events_frame()))
    assert frames[0][0].equals(frames[1][0])
    assert frames[0][1].equals(frames[1][1])


# ---------------------------------------------------------------------- scenario files

FITTED_SCENARIO = """
[scenario]
engine = "{engine}"

[backend]
kind = "fitted"
prefill_base_us = 1000.5
prefill_per_token_us = 0.25
prefill_per_token_squared_us = 0.001
decode_base_us = 500
decode_per_context_token_us = 0.5

[[requests]]
request_id = 0
arrival_time_us = 0
prompt_token_count = 100
max_output_tokens = 3
"""


def test_a_scenario_file_selects_the_fitted_backend(tmp_path: Path) -> None:
    path = tmp_path / "fitted.toml"
    path.write_text(FITTED_SCENARIO.format(engine="single_slot"), encoding="utf-8")
    scenario = load_scenario(path)
    assert scenario.backend == FittedBackendConfig(
        prefill_base_us=1000.5,
        prefill_per_token_us=0.25,
        prefill_per_token_squared_us=0.001,
        decode_base_us=500,
        decode_per_context_token_us=0.5,
    )
    request = run_scenario(scenario).requests[0]
    assert request.prefill_end_time_us == round_us(1000.5 + 25 + 10)
    assert request.finish_time_us == 1036 + 550 + 551 + 551


def test_a_fitted_backend_with_the_fast_engine_is_refused_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fast.toml"
    path.write_text(FITTED_SCENARIO.format(engine="single_slot_fast"), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r'backend\.kind: .*use engine = "single_slot"'):
        load_scenario(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("decode_base_us = -2.0", "backend.decode_base_us: must be >= 0 microseconds"),
        ('decode_base_us = "fast"', "backend.decode_base_us: must be a number"),
        (
            "prefill_per_active_sequence_us = 3",
            "backend.prefill_per_active_sequence_us: unknown key",
        ),
        ('kind = "magic"', "backend.kind"),
    ],
)
def test_bad_fitted_tables_name_the_key(tmp_path: Path, line: str, message: str) -> None:
    text = FITTED_SCENARIO.format(engine="single_slot").replace(
        "decode_per_context_token_us = 0.5", f"decode_per_context_token_us = 0.5\n{line}"
    )
    if line.startswith("decode_base_us"):
        text = text.replace("decode_base_us = 500\n", "")
    if line.startswith("kind"):
        text = text.replace('kind = "fitted"\n', "")
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_float_coefficients_are_refused_without_kind_fitted(tmp_path: Path) -> None:
    path = tmp_path / "linear.toml"
    text = FITTED_SCENARIO.format(engine="single_slot").replace('kind = "fitted"\n', "")
    path.write_text(
        text.replace("prefill_per_token_squared_us = 0.001\n", "").replace(
            "decode_per_context_token_us = 0.5\n", ""
        ),
        encoding="utf-8",
    )
    with pytest.raises(ScenarioError, match=r"backend\.prefill_base_us"):
        load_scenario(path)


# ---------------------------------------------------------------------- --backend FILE

BACKEND_FILE = """# as simsim calibrate writes it
[backend]
kind = "fitted"
prefill_base_us = 2000.5
decode_base_us = 700.0
decode_per_context_token_us = 1.5
"""


def test_run_takes_the_backend_table_from_another_file(tmp_path: Path) -> None:
    from simsim.cli import main
    from simsim.run_folder import read_run_folder

    backend = tmp_path / "backend.toml"
    backend.write_text(BACKEND_FILE, encoding="utf-8")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(FITTED_SCENARIO.format(engine="single_slot"), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--backend", str(backend)]) == 0
    request = read_run_folder(tmp_path / "out").table("requests").iloc[0]
    prefill = round_us(2000.5)
    steps = [round_us(700 + 1.5 * (100 + t - 1)) for t in (1, 2, 3)]
    assert request["finish_time_us"] == prefill + sum(steps)
    loaded = load_scenario(scenario, backend=backend)
    assert loaded.backend == FittedBackendConfig(
        prefill_base_us=2000.5, decode_base_us=700.0, decode_per_context_token_us=1.5
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[scenario]\n", "backend: missing or empty table"),
        ('[backend]\nkind = "fitted"\nspeed = 3\n', "backend.speed: unknown key"),
        ('[backend]\nkind = "fitted"\ndecode_base_us = -1.0\n', "backend.decode_base_us"),
    ],
)
def test_a_bad_backend_file_is_named_with_its_key(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from simsim.cli import main

    backend = tmp_path / "backend.toml"
    backend.write_text(text, encoding="utf-8")
    assert main(["run", "--backend", str(backend), "--out", str(tmp_path / "out")]) == 2
    assert f"{backend}: {message}" in capsys.readouterr().err


def test_the_fast_engine_refuses_a_fitted_backend_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simsim.cli import main

    backend = tmp_path / "backend.toml"
    backend.write_text(BACKEND_FILE, encoding="utf-8")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(FITTED_SCENARIO.format(engine="single_slot_fast"), encoding="utf-8")
    text = scenario.read_text(encoding="utf-8")
    scenario.write_text(
        text.replace('kind = "fitted"\n', "")
        .replace("prefill_base_us = 1000.5", "prefill_base_us = 1000")
        .replace("prefill_per_token_us = 0.25\nprefill_per_token_squared_us = 0.001\n", "")
        .replace("decode_per_context_token_us = 0.5\n", ""),
        encoding="utf-8",
    )
    load_scenario(scenario)  # a valid file on its own
    assert main(["run", str(scenario), "--backend", str(backend), "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    # Blamed on the backend file's kind, naming the scenario whose engine cannot take it.
    assert f"{backend}: backend.kind: " in error
    assert f'{scenario} uses engine = "single_slot_fast"' in error


def test_a_test_double_does_not_opt_in_to_step_costs() -> None:
    """step_us is looked up on the class: a Mock answers every attribute, yet prices its
    work through prefill_us and decode_step_us as before."""
    from unittest import mock

    double = mock.Mock()
    double.prefill_us.return_value = 10
    double.decode_step_us.return_value = 3
    engine = SimulationEngine(double)
    engine.submit(Request(0, 0, 5, 3))
    engine.run()
    assert engine.requests[0].finish_time_us == 10 + 3 * 3
    FastSimulationEngine(double)  # not refused: it has no step_us of its own


def test_the_batching_server_refuses_an_output_that_must_overflow_the_clock() -> None:
    engine = BatchingEngine(fitted(decode_base_us=2.0**40), max_active_requests=2)
    engine.submit(Request(0, 0, 1, 2**40))
    with pytest.raises(OverflowError, match="decode_base_us \\+ decode_per_sequence_us, rounded"):
        engine.run()
