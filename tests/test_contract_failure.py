"""Contract sections 8-9: terminal failure of the engine and the error hierarchy.

A failing cost model makes the engine fail for good; the original exception propagates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import simsim
from simsim import RequestState as S

MAX_US = 2**63 - 1


class BoomError(RuntimeError):
    """A user exception type, to check the engine re-raises the original type."""


class ScriptedBackend:
    """Fixed costs until a chosen call, which returns *bad* (or raises it if an exception)."""

    def __init__(
        self,
        prefill: Any = 10,
        decode: Any = 5,
        *,
        bad_prefill_call: int | None = None,
        bad_decode_call: int | None = None,
        bad: Any = None,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.bad_prefill_call = bad_prefill_call
        self.bad_decode_call = bad_decode_call
        self.bad = bad
        self.prefill_calls = 0
        self.decode_calls = 0

    def _answer(self, normal: Any, call: int, bad_call: int | None) -> Any:
        if bad_call is not None and call == bad_call:
            if isinstance(self.bad, BaseException):
                raise self.bad
            return self.bad
        return normal

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        self.prefill_calls += 1
        return self._answer(self.prefill, self.prefill_calls, self.bad_prefill_call)  # type: ignore[no-any-return]

    def decode_step_us(self, active_sequence_count: int) -> int:
        self.decode_calls += 1
        return self._answer(self.decode, self.decode_calls, self.bad_decode_call)  # type: ignore[no-any-return]


def _assert_failed_surface(engine: simsim.SimulationEngine) -> None:
    """Section 8: what raises EngineFailedError after a failure, and what still answers."""
    assert engine.failed is True
    assert isinstance(engine.processed_event_count, int)
    assert isinstance(engine.has_pending_events, bool)
    assert isinstance(engine.ignored_cancelled_event_count, int)

    calls: list[tuple[str, Callable[[], object]]] = [
        ("run", engine.run),
        ("run_next_timestamp", engine.run_next_timestamp),
        ("submit", lambda: engine.submit(simsim.Request(999, MAX_US, 1, 1))),
        ("cancel_request", lambda: engine.cancel_request(0)),
        ("now_us", lambda: engine.now_us),
        ("requests", lambda: engine.requests),
        ("event_log", lambda: engine.event_log),
        ("admission_log", lambda: engine.admission_log),
        ("scheduler_stats", lambda: engine.scheduler_stats),
    ]
    for name, call in calls:
        with pytest.raises(simsim.EngineFailedError):
            call()
        assert engine.failed is True, name
    # a second round behaves the same (failed for good)
    with pytest.raises(simsim.EngineFailedError):
        engine.run_next_timestamp()


# --------------------------------------------------------------------------- raising backend


def test_backend_exception_propagates_from_run_next_timestamp() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(bad_prefill_call=1, bad=BoomError("kaboom")))
    eng.submit(simsim.Request(0, 0, 4, 2))
    assert eng.failed is False
    with pytest.raises(BoomError, match="kaboom"):
        eng.run_next_timestamp()  # 0: arrival, then admission costs the prefill -> raises
    _assert_failed_surface(eng)


def test_backend_exception_propagates_from_run() -> None:
    # second prefill raises: request 0 runs 0 -> 10 (PF) -> 15 (DEC, RC); admitting 1 fails
    eng = simsim.SimulationEngine(ScriptedBackend(bad_prefill_call=2, bad=BoomError("second")))
    eng.submit(simsim.Request(0, 0, 4, 1))
    eng.submit(simsim.Request(1, 0, 4, 1))
    with pytest.raises(BoomError):
        eng.run()
    _assert_failed_surface(eng)


def test_backend_exception_in_decode_cost_fails_the_engine() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(bad_decode_call=1, bad=BoomError("decode")))
    eng.submit(simsim.Request(0, 0, 4, 3))
    assert eng.run_next_timestamp() == 0
    with pytest.raises(BoomError):
        eng.run_next_timestamp()  # 10: PREFILL_COMPLETE costs the first decode step
    _assert_failed_surface(eng)


def test_failure_state_before_it_happens_is_normal() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(bad_decode_call=2, bad=BoomError("later")))
    eng.submit(simsim.Request(0, 0, 4, 3))
    # 0: admit, PF at 10; 10: PF -> DEC at 15; 15: DEC -> next decode cost raises
    assert eng.run_next_timestamp() == 0
    assert eng.run_next_timestamp() == 10
    assert eng.failed is False
    assert eng.now_us == 10
    with pytest.raises(BoomError):
        eng.run_next_timestamp()
    _assert_failed_surface(eng)


# --------------------------------------------------------------------------- bad durations


def test_negative_prefill_duration_is_a_value_error() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(prefill=-5))
    eng.submit(simsim.Request(4242, 0, 4, 2))
    with pytest.raises(ValueError) as info:
        eng.run_next_timestamp()
    message = str(info.value)
    assert "-5" in message or "4242" in message
    _assert_failed_surface(eng)


def test_negative_decode_duration_is_a_value_error() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(decode=-1))
    eng.submit(simsim.Request(0, 0, 4, 2))
    with pytest.raises(ValueError):
        eng.run()
    _assert_failed_surface(eng)


@pytest.mark.parametrize("bad", [10.0, 2.5, True, "10", None])
def test_non_int_prefill_duration_is_a_type_error(bad: Any) -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(prefill=bad))
    eng.submit(simsim.Request(4243, 0, 4, 2))
    with pytest.raises(TypeError) as info:
        eng.run_next_timestamp()
    message = str(info.value)
    assert repr(bad) in message or str(bad) in message or "4243" in message
    _assert_failed_surface(eng)


def test_float_decode_duration_is_a_type_error() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(decode=5.0))
    eng.submit(simsim.Request(0, 0, 4, 2))
    with pytest.raises(TypeError):
        eng.run()
    _assert_failed_surface(eng)


def test_overflowing_simulated_backend_is_an_overflow_error() -> None:
    cfg = simsim.SimulatedBackendConfig(
        prefill_base_us=MAX_US,
        prefill_per_token_us=1,
        prefill_per_active_sequence_us=0,
        decode_base_us=1,
        decode_per_active_sequence_us=0,
    )
    eng = simsim.SimulationEngine(simsim.SimulatedBackend(cfg))
    eng.submit(simsim.Request(0, 0, 1, 1))  # (2**63 - 1) + 1 * 1 = 2**63
    with pytest.raises(OverflowError):
        eng.run_next_timestamp()
    _assert_failed_surface(eng)


def test_overflowing_decode_cost_is_an_overflow_error() -> None:
    cfg = simsim.SimulatedBackendConfig(
        prefill_base_us=1,
        prefill_per_token_us=0,
        prefill_per_active_sequence_us=0,
        decode_base_us=MAX_US,
        decode_per_active_sequence_us=1,
    )
    eng = simsim.SimulationEngine(simsim.SimulatedBackend(cfg))
    eng.submit(simsim.Request(0, 0, 1, 1))  # decode: (2**63 - 1) + 1 * 1 = 2**63
    with pytest.raises(OverflowError):
        eng.run()
    _assert_failed_surface(eng)


def test_overflowing_timestamp_is_an_overflow_error() -> None:
    # the duration 2**63 - 5 is legal, but arrival 10 + (2**63 - 5) passes 2**63 - 1
    eng = simsim.SimulationEngine(ScriptedBackend(prefill=MAX_US - 4))
    eng.submit(simsim.Request(0, 10, 1, 1))
    with pytest.raises(OverflowError):
        eng.run()
    _assert_failed_surface(eng)


def test_timestamp_exactly_at_the_limit_is_fine() -> None:
    # prefill MAX_US - 10 = 2**63 - 11; 10 + (2**63 - 11) = 2**63 - 1: the zero-output
    # request finishes exactly on the limit
    eng = simsim.SimulationEngine(ScriptedBackend(prefill=MAX_US - 10))
    eng.submit(simsim.Request(0, 10, 1, 0))
    eng.run()
    assert eng.failed is False
    assert eng.requests[0].finish_time_us == MAX_US
    assert eng.now_us == MAX_US


# --------------------------------------------------------------------------- cancel_request


def test_failure_during_immediate_admission_inside_cancel_request() -> None:
    backend = ScriptedBackend(prefill=100, bad_prefill_call=2, bad=BoomError("admit-1"))
    eng = simsim.SimulationEngine(backend)
    eng.submit(simsim.Request(0, 0, 4, 2))  # admitted at 0, PF at 100
    eng.submit(simsim.Request(1, 50, 4, 2))  # queued at 50
    assert eng.run_next_timestamp() == 0
    assert eng.run_next_timestamp() == 50
    with pytest.raises(BoomError, match="admit-1"):
        eng.cancel_request(0)  # nothing pending at 50: admits 1 now, whose prefill raises
    assert backend.prefill_calls == 2
    _assert_failed_surface(eng)


def test_negative_duration_during_cancel_admission() -> None:
    backend = ScriptedBackend(prefill=100, bad_prefill_call=2, bad=-3)
    eng = simsim.SimulationEngine(backend)
    eng.submit(simsim.Request(0, 0, 4, 2))
    eng.submit(simsim.Request(1, 50, 4, 2))
    eng.run_next_timestamp()
    eng.run_next_timestamp()
    with pytest.raises(ValueError):
        eng.cancel_request(0)
    _assert_failed_surface(eng)


# --------------------------------------------------------------------------- other failures


def test_illegal_transition_during_processing_fails_the_engine() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend())
    eng.submit(simsim.Request(0, 0, 4, 2))
    assert eng.run_next_timestamp() == 0
    # tamper with the live request behind the engine's back: its PF at 10 can no longer
    # make a legal transition (FINISHED is terminal), which is an error, not an ignore
    eng.requests[0].state = S.FINISHED
    with pytest.raises(simsim.SimulationError):
        eng.run_next_timestamp()
    _assert_failed_surface(eng)


def test_failure_while_driven_by_env_run() -> None:
    env = simsim.Environment()
    eng = simsim.SimulationEngine(
        ScriptedBackend(bad_prefill_call=1, bad=BoomError("env")), env=env
    )
    eng.submit(simsim.Request(0, 3, 4, 2))
    with pytest.raises(BoomError):
        env.run()
    _assert_failed_surface(eng)


def test_counters_still_answer_after_failure() -> None:
    # request 0 is cancelled before arrival (ignored at 5); request 1 arrives at 7 and its
    # admission fails
    eng = simsim.SimulationEngine(ScriptedBackend(bad_prefill_call=1, bad=BoomError("x")))
    eng.submit(simsim.Request(0, 5, 1, 1))
    eng.submit(simsim.Request(1, 7, 1, 1))
    eng.cancel_request(0)
    assert eng.run_next_timestamp() == 5
    with pytest.raises(BoomError):
        eng.run_next_timestamp()
    assert eng.failed is True
    assert eng.ignored_cancelled_event_count == 1
    assert eng.processed_event_count >= 2  # the ignored arrival and request 1's arrival
    _assert_failed_surface(eng)


# --------------------------------------------------------------------------- error classes


@pytest.mark.parametrize(
    "cls",
    [
        simsim.InvalidTransitionError,
        simsim.StaleDecisionError,
        simsim.EngineFailedError,
        simsim.UnknownRequestError,
    ],
)
def test_errors_derive_from_simulation_error(cls: type[Exception]) -> None:
    assert issubclass(cls, simsim.SimulationError)
    assert issubclass(simsim.SimulationError, Exception)


def test_unknown_request_error_is_also_a_key_error() -> None:
    assert issubclass(simsim.UnknownRequestError, KeyError)
    eng = simsim.SimulationEngine(ScriptedBackend())
    with pytest.raises(KeyError) as info:
        eng.cancel_request(31337)
    assert isinstance(info.value, simsim.UnknownRequestError)
    assert isinstance(info.value, simsim.SimulationError)
    assert "31337" in str(info.value)


def test_engine_failed_error_message_is_informative() -> None:
    eng = simsim.SimulationEngine(ScriptedBackend(bad_prefill_call=1, bad=BoomError("why")))
    eng.submit(simsim.Request(0, 0, 1, 1))
    with pytest.raises(BoomError):
        eng.run()
    with pytest.raises(simsim.EngineFailedError) as info:
        eng.run()
    assert str(info.value)  # a non-empty message


def test_cancel_messages_name_the_request(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(515, 0, 0, 0))
    engine.run()
    with pytest.raises(simsim.InvalidTransitionError) as info:
        engine.cancel_request(515)
    assert "515" in str(info.value)


def test_submit_messages_name_the_request(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(616, 0, 0, 0))
    with pytest.raises(ValueError, match="616"):
        engine.submit(simsim.Request(616, 0, 0, 0))
    with pytest.raises(ValueError, match="717"):
        engine.submit(simsim.Request(717, 0, 0, 0, generated_token_count=3))


def test_time_type_errors_name_the_value() -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError) as info:
        env.timeout(1.25)
    assert "1.25" in str(info.value) or "float" in str(info.value)
    with pytest.raises(ValueError, match="-17"):
        env.timeout(-17)


def test_request_validation_names_the_value() -> None:
    with pytest.raises(ValueError, match="-9"):
        simsim.Request(1, -9, 1, 1)
    with pytest.raises(ValueError, match="-3"):
        simsim.Request(-3, 0, 1, 1)
    with pytest.raises(TypeError) as info:
        simsim.Request(1, 0, 2.5, 1)  # type: ignore[arg-type]
    assert "2.5" in str(info.value) or "float" in str(info.value)
