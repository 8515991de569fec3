"""Contract sections 4, 7 and 8: the event log, ``SimulationEngine`` and ignored events.

Unless a test says otherwise it uses the ``engine`` fixture of ``conftest.py``:
prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds), one active request.
Every expected timestamp is derived by hand in the comments.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim import EventType as E
from simsim import RequestState as S

ARR = E.REQUEST_ARRIVAL
PF = E.PREFILL_COMPLETE
DEC = E.DECODE_STEP_COMPLETE
RC = E.REQUEST_COMPLETE


class FixedBackend:
    """A user backend with fixed costs (zero allowed)."""

    def __init__(self, prefill: int, decode: int) -> None:
        self.prefill = prefill
        self.decode = decode

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        return self.prefill

    def decode_step_us(self, active_sequence_count: int) -> int:
        return self.decode


def _log(engine: simsim.SimulationEngine) -> list[tuple[int, E, int]]:
    return [(r.timestamp_us, r.event_type, r.request_id) for r in engine.event_log]


def _admissions(engine: simsim.SimulationEngine) -> list[tuple[int, int]]:
    return [(a.timestamp_us, a.request_id) for a in engine.admission_log]


def _steps(engine: simsim.SimulationEngine) -> list[int | None]:
    """Call run_next_timestamp() until it returns None; return every result, None included."""
    out: list[int | None] = []
    while True:
        t = engine.run_next_timestamp()
        out.append(t)
        if t is None:
            return out


def _snap(req: simsim.Request) -> tuple[Any, ...]:
    return (
        req.state,
        req.generated_token_count,
        req.admit_time_us,
        req.prefill_end_time_us,
        req.first_token_time_us,
        req.finish_time_us,
    )


def _engine_state(engine: simsim.SimulationEngine) -> tuple[Any, ...]:
    return (
        engine.failed,
        engine.now_us,
        list(engine.event_log),
        list(engine.admission_log),
        {rid: _snap(r) for rid, r in engine.requests.items()},
        engine.scheduler_stats,
        engine.has_pending_events,
        engine.processed_event_count,
        engine.ignored_cancelled_event_count,
    )


def _check_log_invariants(engine: simsim.SimulationEngine) -> None:
    log = list(engine.event_log)
    keys = [(r.timestamp_us, r.sequence) for r in log]
    assert keys == sorted(keys)  # processing order is (timestamp, sequence) order
    assert len({r.sequence for r in log}) == len(log)
    for r in log:
        assert type(r.timestamp_us) is int
        assert isinstance(r.sequence, int)
        assert isinstance(r.event_type, E)
    assert engine.processed_event_count == len(log) + engine.ignored_cancelled_event_count


# --------------------------------------------------------------------------- value types


def test_event_type_members() -> None:
    assert [m.name for m in simsim.EventType] == [
        "REQUEST_ARRIVAL",
        "PREFILL_COMPLETE",
        "DECODE_STEP_COMPLETE",
        "REQUEST_COMPLETE",
        "REQUEST_PREEMPTED",
    ]


def test_event_record_is_immutable() -> None:
    rec = simsim.EventRecord(timestamp_us=5, sequence=2, event_type=ARR, request_id=9)
    assert (rec.timestamp_us, rec.sequence, rec.event_type, rec.request_id) == (5, 2, ARR, 9)
    with pytest.raises(AttributeError):
        rec.timestamp_us = 6  # type: ignore[misc]
    assert rec == simsim.EventRecord(5, 2, ARR, 9)


def test_admission_record_fields() -> None:
    rec = simsim.AdmissionRecord(timestamp_us=5, request_id=3, epoch=8)
    assert (rec.timestamp_us, rec.request_id, rec.epoch) == (5, 3, 8)


# --------------------------------------------------------------------------- construction


def test_fresh_engine(engine: simsim.SimulationEngine) -> None:
    assert engine.now_us == 0
    assert type(engine.now_us) is int
    assert len(engine.requests) == 0
    assert list(engine.event_log) == []
    assert list(engine.admission_log) == []
    assert engine.failed is False
    assert engine.has_pending_events is False
    assert engine.processed_event_count == 0
    assert engine.ignored_cancelled_event_count == 0
    assert engine.scheduler_stats == simsim.SchedulerStats(0, 0, 0, 0, 0)
    assert engine.run_next_timestamp() is None
    assert engine.run() is None
    assert engine.now_us == 0


def test_default_env_is_a_new_simsim_environment(backend: simsim.SimulatedBackend) -> None:
    a = simsim.SimulationEngine(backend)
    b = simsim.SimulationEngine(backend)
    assert isinstance(a.env, simsim.Environment)
    assert a.env is not b.env


def test_given_env_is_used(backend: simsim.SimulatedBackend) -> None:
    env = simsim.Environment(initial_time=1_000)
    eng = simsim.SimulationEngine(backend, env=env)
    assert eng.env is env
    assert eng.now_us == 1_000
    with pytest.raises(ValueError):
        eng.submit(simsim.Request(0, 999, 1, 1))  # before now
    eng.submit(simsim.Request(1, 1_000, 0, 0))
    # arrival 1000, prefill 100 -> done at 1100
    assert _steps(eng) == [1_000, 1_100, None]
    assert env.now == 1_100


def test_plain_simpy_environment_is_rejected(backend: simsim.SimulatedBackend) -> None:
    with pytest.raises(TypeError):
        simsim.SimulationEngine(backend, env=simpy.Environment())  # type: ignore[arg-type]


def test_scheduler_is_used_when_given(backend: simsim.SimulatedBackend) -> None:
    sched = simsim.FcfsScheduler()
    eng = simsim.SimulationEngine(backend, sched)
    eng.submit(simsim.Request(0, 0, 1, 1))
    eng.submit(simsim.Request(1, 0, 1, 1))
    eng.run_next_timestamp()
    assert len(sched) == 1  # 0 admitted, 1 queued in *this* scheduler
    assert sched.stats == eng.scheduler_stats


def test_max_active_requests_one_is_accepted(backend: simsim.SimulatedBackend) -> None:
    eng = simsim.SimulationEngine(backend, max_active_requests=1)
    assert eng.now_us == 0


@pytest.mark.parametrize("bad", [0, -1, 2, 8])
def test_max_active_requests_other_ints_are_value_errors(
    backend: simsim.SimulatedBackend, bad: int
) -> None:
    with pytest.raises(ValueError):
        simsim.SimulationEngine(backend, max_active_requests=bad)


@pytest.mark.parametrize("bad", [1.0, 1.5, True, "1", None])
def test_max_active_requests_non_ints_are_rejected(
    backend: simsim.SimulatedBackend, bad: Any
) -> None:
    with pytest.raises((TypeError, ValueError)):
        simsim.SimulationEngine(backend, max_active_requests=bad)


# --------------------------------------------------------------------------- a full timeline


def test_hand_worked_three_request_timeline(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 2))  # prefill 100 + 20 = 120
    engine.submit(simsim.Request(1, 30, 5, 1))  # prefill 100 + 10 = 110
    engine.submit(simsim.Request(2, 30, 0, 0))  # prefill 100, no output
    assert engine.has_pending_events is True
    #   0: ARR0, admit 0 -> PF0 at 120
    #  30: ARR1, ARR2 (queued; slot busy)
    # 120: PF0 -> decode at 130;  130: DEC0 (token 1) -> 140
    # 140: DEC0 (token 2), RC0 at 140; admit 1 -> PF1 at 140 + 110 = 250
    # 250: PF1 -> 260;  260: DEC1, RC1; admit 2 -> PF2 at 360
    # 360: PF2, RC2 (zero output)
    assert _steps(engine) == [0, 30, 120, 130, 140, 250, 260, 360, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (30, ARR, 1),
        (30, ARR, 2),
        (120, PF, 0),
        (130, DEC, 0),
        (140, DEC, 0),
        (140, RC, 0),
        (250, PF, 1),
        (260, DEC, 1),
        (260, RC, 1),
        (360, PF, 2),
        (360, RC, 2),
    ]
    assert _admissions(engine) == [(0, 0), (140, 1), (260, 2)]
    r0, r1, r2 = (engine.requests[i] for i in range(3))
    assert _snap(r0) == (S.FINISHED, 2, 0, 120, 130, 140)
    assert _snap(r1) == (S.FINISHED, 1, 140, 250, 260, 260)
    assert _snap(r2) == (S.FINISHED, 0, 260, 360, None, 360)
    assert engine.now_us == 360
    assert engine.processed_event_count == 12
    assert engine.ignored_cancelled_event_count == 0
    assert engine.has_pending_events is False
    assert engine.scheduler_stats == simsim.SchedulerStats(3, 3, 0, 0, 2)
    _check_log_invariants(engine)
    for a in engine.admission_log:
        assert isinstance(a, simsim.AdmissionRecord)
        assert isinstance(a.epoch, int)


def test_run_gives_the_same_result_as_stepping(backend: simsim.SimulatedBackend) -> None:
    def build() -> simsim.SimulationEngine:
        eng = simsim.SimulationEngine(backend)
        for rid, arrival, prompt, out in [(0, 0, 10, 2), (1, 30, 5, 1), (2, 30, 0, 0)]:
            eng.submit(simsim.Request(rid, arrival, prompt, out))
        return eng

    stepped, ran = build(), build()
    _steps(stepped)
    assert ran.run() is None
    assert list(ran.event_log) == list(stepped.event_log)
    assert list(ran.admission_log) == list(stepped.admission_log)
    assert ran.now_us == stepped.now_us == 360


def test_lifecycle_shape_per_request(engine: simsim.SimulationEngine) -> None:
    outputs = {0: 3, 1: 0, 2: 1, 3: 4}
    for rid, out in outputs.items():
        engine.submit(simsim.Request(rid, 5 * rid, 2 * rid, out))
    engine.run()
    for rid, out in outputs.items():
        types = [t for _, t, i in _log(engine) if i == rid]
        assert types == [ARR, PF] + [DEC] * out + [RC]
        assert engine.requests[rid].generated_token_count == out
    _check_log_invariants(engine)


def test_event_log_snapshot_does_not_follow_the_engine(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 0, 1))
    engine.run_next_timestamp()
    snapshot = engine.event_log
    assert list(snapshot) == [simsim.EventRecord(0, snapshot[0].sequence, ARR, 0)]
    engine.run()
    assert len(snapshot) == 1
    assert len(engine.event_log) == 4  # ARR, PF@100, DEC@110, RC@110


# --------------------------------------------------------------------------- time reporting


def test_future_arrival_is_the_first_timestamp(engine: simsim.SimulationEngine) -> None:
    # submitting at now=0 must not create a bookkeeping stop at 0
    engine.submit(simsim.Request(0, 100, 0, 0))
    assert engine.now_us == 0
    assert engine.has_pending_events is True
    t = engine.run_next_timestamp()
    assert t == 100
    assert type(t) is int
    assert engine.now_us == 100
    assert engine.requests[0].admit_time_us == 100


def test_submissions_between_steps_add_no_extra_stops(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 1))  # PF 120, DEC+RC 130
    assert engine.run_next_timestamp() == 0
    engine.submit(simsim.Request(1, 500, 0, 0))  # submitted at 0, arrives 500: PF 600
    assert _steps(engine) == [120, 130, 500, 600, None]


def test_arrival_at_the_current_time_is_accepted(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 1))  # PF 120, DEC + RC 130
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 120
    engine.submit(simsim.Request(1, 120, 0, 0))  # arrives now: queued at 120, slot busy
    assert engine.run_next_timestamp() == 120
    assert engine.requests[1].state is S.WAITING
    # 130: 0 finishes, 1 admitted -> PF at 230
    assert _steps(engine) == [130, 230, None]
    assert engine.requests[1].admit_time_us == 130
    assert engine.requests[1].finish_time_us == 230


def test_numpy_inputs_give_plain_int_outputs(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(np.int64(0), np.int64(7), np.int64(3), np.int64(1)))
    steps = _steps(engine)
    # admit 7; prefill 100 + 6 = 106 -> 113; decode 123
    assert steps == [7, 113, 123, None]
    assert all(type(t) is int for t in steps[:-1])
    req = engine.requests[0]
    for value in (
        req.arrival_time_us,
        req.admit_time_us,
        req.prefill_end_time_us,
        req.first_token_time_us,
        req.finish_time_us,
        engine.now_us,
    ):
        assert type(value) is int
    assert all(type(r.timestamp_us) is int for r in engine.event_log)
    assert all(type(a.timestamp_us) is int for a in engine.admission_log)


# --------------------------------------------------------------------------- admission rules


def test_one_admission_per_call_with_zero_costs() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=0))
    for rid in range(3):
        eng.submit(simsim.Request(rid, 0, 1, 0))
    # call 1: ARR0..2, admit 0 (its PF at 0 is left for the next call)
    assert eng.run_next_timestamp() == 0
    assert _admissions(eng) == [(0, 0)]
    assert [eng.requests[i].state for i in range(3)] == [S.PREFILLING, S.WAITING, S.WAITING]
    # call 2: PF0, RC0 (zero delay, same call); admit 1
    assert eng.run_next_timestamp() == 0
    assert _admissions(eng) == [(0, 0), (0, 1)]
    assert eng.requests[0].state is S.FINISHED
    # call 3: PF1, RC1; admit 2.  call 4: PF2, RC2.  call 5: nothing.
    assert eng.run_next_timestamp() == 0
    assert _admissions(eng) == [(0, 0), (0, 1), (0, 2)]
    assert eng.run_next_timestamp() == 0
    assert eng.run_next_timestamp() is None
    assert _log(eng) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (0, ARR, 2),
        (0, PF, 0),
        (0, RC, 0),
        (0, PF, 1),
        (0, RC, 1),
        (0, PF, 2),
        (0, RC, 2),
    ]
    assert eng.now_us == 0
    assert all(eng.requests[i].finish_time_us == 0 for i in range(3))
    _check_log_invariants(eng)


def test_zero_cost_decode_steps_all_run_in_one_call() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=0))
    eng.submit(simsim.Request(0, 0, 4, 2))
    assert eng.run_next_timestamp() == 0  # ARR + admission; PF left pending at 0
    assert eng.has_pending_events is True
    assert _log(eng) == [(0, ARR, 0)]
    # PF at 0 schedules DEC at 0, which schedules DEC at 0, then RC at 0: all in this call
    assert eng.run_next_timestamp() == 0
    assert _log(eng)[1:] == [(0, PF, 0), (0, DEC, 0), (0, DEC, 0), (0, RC, 0)]
    assert eng.run_next_timestamp() is None
    assert _snap(eng.requests[0]) == (S.FINISHED, 2, 0, 0, 0, 0)


def test_zero_cost_prefill_after_admission_waits_for_next_call() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=5))
    eng.submit(simsim.Request(0, 10, 4, 2))
    # 10: ARR, admit (PF at 10 left); 10: PF -> DEC at 15; 15: DEC; 20: DEC + RC
    assert _steps(eng) == [10, 10, 15, 20, None]
    assert _snap(eng.requests[0]) == (S.FINISHED, 2, 10, 10, 15, 20)


def test_zero_prompt_request(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 0, 1))
    # prefill = 100 + 2 * 0 = 100; decode 110
    assert _steps(engine) == [0, 100, 110, None]
    assert _log(engine) == [(0, ARR, 0), (100, PF, 0), (110, DEC, 0), (110, RC, 0)]
    assert _snap(engine.requests[0]) == (S.FINISHED, 1, 0, 100, 110, 110)


def test_zero_output_request(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 20, 10, 0))
    # prefill 120 -> PF at 140, RC at 140 (zero delay), no decode step at all
    assert _steps(engine) == [20, 140, None]
    assert _log(engine) == [(20, ARR, 0), (140, PF, 0), (140, RC, 0)]
    assert _snap(engine.requests[0]) == (S.FINISHED, 0, 20, 140, None, 140)


def test_zero_prompt_zero_output_request_with_zero_costs() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=0))
    eng.submit(simsim.Request(0, 3, 0, 0))
    assert _steps(eng) == [3, 3, None]
    assert _log(eng) == [(3, ARR, 0), (3, PF, 0), (3, RC, 0)]
    assert _snap(eng.requests[0]) == (S.FINISHED, 0, 3, 3, None, 3)


# --------------------------------------------------------------------------- cancellation


def test_cancel_before_arrival(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 50, 10, 2))
    engine.cancel_request(0)
    req = engine.requests[0]
    assert _snap(req) == (S.CANCELLED, 0, None, None, None, 0)  # finish = clock now = 0
    assert engine.now_us == 0
    assert engine.has_pending_events is True  # the arrival is still in the heap
    assert engine.run() is None
    # the arrival at 50 is consumed without any state change, but the clock reaches it
    assert engine.now_us == 50
    assert list(engine.event_log) == []
    assert list(engine.admission_log) == []
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 1
    assert engine.has_pending_events is False
    assert _snap(req) == (S.CANCELLED, 0, None, None, None, 0)
    assert engine.scheduler_stats.enqueued == 0


def test_cancel_before_arrival_then_others_proceed(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 50, 10, 2))
    engine.submit(simsim.Request(1, 60, 0, 0))
    engine.cancel_request(0)
    # 50: ignored arrival; 60: ARR1 + admit -> PF1 at 160, RC1 at 160
    assert _steps(engine) == [50, 60, 160, None]
    assert _log(engine) == [(60, ARR, 1), (160, PF, 1), (160, RC, 1)]
    assert _admissions(engine) == [(60, 1)]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 4
    _check_log_invariants(engine)


def test_cancel_while_queued(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 2))  # PF 120, DEC 130, DEC+RC 140
    engine.submit(simsim.Request(1, 0, 0, 0))
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 120
    engine.cancel_request(1)
    assert _snap(engine.requests[1]) == (S.CANCELLED, 0, None, None, None, 120)
    assert engine.requests[0].state is S.DECODING  # the active request is untouched
    assert engine.scheduler_stats == simsim.SchedulerStats(2, 1, 1, 0, 2)
    assert _admissions(engine) == [(0, 0)]
    assert _steps(engine) == [130, 140, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (120, PF, 0),
        (130, DEC, 0),
        (140, DEC, 0),
        (140, RC, 0),
    ]
    assert engine.ignored_cancelled_event_count == 0  # nothing was outstanding for it
    assert engine.processed_event_count == 6
    assert engine.requests[0].finish_time_us == 140


def test_cancel_while_prefilling_admits_the_head_at_once(
    engine: simsim.SimulationEngine,
) -> None:
    engine.submit(simsim.Request(0, 0, 10, 3))  # admitted at 0, PF would be at 120
    engine.submit(simsim.Request(1, 50, 5, 2))  # queued at 50; prefill 110
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 50
    engine.cancel_request(0)
    assert _snap(engine.requests[0]) == (S.CANCELLED, 0, 0, None, None, 50)
    # nothing pending at 50: request 1 is admitted now, at 50, without advancing the clock
    assert engine.now_us == 50
    assert _snap(engine.requests[1]) == (S.PREFILLING, 0, 50, None, None, None)
    assert _admissions(engine) == [(0, 0), (50, 1)]
    assert engine.scheduler_stats.admitted == 2
    # 120: request 0's PF is ignored (the clock still stops there); 160: PF1;
    # 170: DEC1; 180: DEC1 + RC1
    assert engine.run_next_timestamp() == 120
    assert engine.ignored_cancelled_event_count == 1
    assert len(engine.event_log) == 2
    assert _steps(engine) == [160, 170, 180, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (50, ARR, 1),
        (160, PF, 1),
        (170, DEC, 1),
        (180, DEC, 1),
        (180, RC, 1),
    ]
    assert _snap(engine.requests[1]) == (S.FINISHED, 2, 50, 160, 170, 180)
    assert _snap(engine.requests[0]) == (S.CANCELLED, 0, 0, None, None, 50)
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 7
    _check_log_invariants(engine)


def test_cancel_while_decoding_keeps_progress(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 5))  # PF 120, DEC 130, 140, 150, ...
    assert [engine.run_next_timestamp() for _ in range(4)] == [0, 120, 130, 140]
    engine.cancel_request(0)
    assert _snap(engine.requests[0]) == (S.CANCELLED, 2, 0, 120, 130, 140)
    assert _admissions(engine) == [(0, 0)]  # nobody to admit
    engine.run()
    assert engine.now_us == 150  # the ignored decode step still moves the clock
    assert _log(engine) == [(0, ARR, 0), (120, PF, 0), (130, DEC, 0), (140, DEC, 0)]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 5
    assert _snap(engine.requests[0]) == (S.CANCELLED, 2, 0, 120, 130, 140)


def test_cancel_while_decoding_admits_the_queued_head(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 5))
    engine.submit(simsim.Request(1, 0, 0, 0))
    assert [engine.run_next_timestamp() for _ in range(4)] == [0, 120, 130, 140]
    engine.cancel_request(0)
    # admitted at 140 -> PF1 at 240, RC1 at 240; request 0's decode at 150 is ignored
    assert _snap(engine.requests[1]) == (S.PREFILLING, 0, 140, None, None, None)
    assert _steps(engine) == [150, 240, None]
    assert _snap(engine.requests[1]) == (S.FINISHED, 0, 140, 240, None, 240)
    assert _admissions(engine) == [(0, 0), (140, 1)]
    assert engine.ignored_cancelled_event_count == 1


def test_cancel_defers_admission_when_an_arrival_is_pending_now(
    engine: simsim.SimulationEngine,
) -> None:
    engine.submit(simsim.Request(0, 0, 10, 3))  # active, PF would be 120
    engine.submit(simsim.Request(5, 50, 0, 0))  # queued at 50
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 50
    engine.submit(simsim.Request(3, 50, 0, 1))  # arrival pending at now = 50
    engine.cancel_request(0)
    # admission waits: request 5 is not admitted now
    assert engine.requests[5].state is S.WAITING
    assert _admissions(engine) == [(0, 0)]
    assert engine.now_us == 50
    # next call at 50: ARR3, then FCFS picks (50, 3) before (50, 5)
    assert engine.run_next_timestamp() == 50
    assert _admissions(engine) == [(0, 0), (50, 3)]
    # 120: ignored PF0; 150: PF3 (100); 160: DEC3 + RC3, admit 5 -> PF5 at 260
    assert _steps(engine) == [120, 150, 160, 260, None]
    assert _admissions(engine) == [(0, 0), (50, 3), (160, 5)]
    assert _log(engine) == [
        (0, ARR, 0),
        (50, ARR, 5),
        (50, ARR, 3),
        (150, PF, 3),
        (160, DEC, 3),
        (160, RC, 3),
        (260, PF, 5),
        (260, RC, 5),
    ]
    assert engine.ignored_cancelled_event_count == 1
    _check_log_invariants(engine)


def test_cancel_defers_admission_when_an_ignorable_arrival_is_pending_now(
    engine: simsim.SimulationEngine,
) -> None:
    engine.submit(simsim.Request(0, 0, 10, 3))  # active, PF would be 120
    engine.submit(simsim.Request(1, 50, 0, 0))  # queued at 50
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 50
    engine.submit(simsim.Request(2, 50, 0, 0))  # arrival pending at now = 50 ...
    engine.cancel_request(2)  # ... and now cancelled: it will be ignored, but is pending
    assert _snap(engine.requests[2]) == (S.CANCELLED, 0, None, None, None, 50)
    engine.cancel_request(0)
    # "if any event is pending at the current time ... admission waits"
    assert engine.requests[1].state is S.WAITING
    assert _admissions(engine) == [(0, 0)]
    # 50: ARR2 ignored, admit 1 -> PF1 at 150; 120: PF0 ignored
    assert _steps(engine) == [50, 120, 150, None]
    assert _admissions(engine) == [(0, 0), (50, 1)]
    assert engine.ignored_cancelled_event_count == 2
    assert _log(engine) == [(0, ARR, 0), (50, ARR, 1), (150, PF, 1), (150, RC, 1)]


def test_cancel_defers_admission_when_a_foreign_event_is_pending_now(
    backend: simsim.SimulatedBackend,
) -> None:
    env = simsim.Environment()
    eng = simsim.SimulationEngine(backend, env=env)
    eng.submit(simsim.Request(0, 0, 10, 3))  # active, PF would be 120
    eng.submit(simsim.Request(1, 50, 0, 0))  # queued at 50
    assert eng.run_next_timestamp() == 0
    assert eng.run_next_timestamp() == 50
    fired: list[int] = []
    env.timeout(0).callbacks.append(lambda _e: fired.append(env.now))  # pending at 50
    eng.cancel_request(0)
    assert eng.requests[1].state is S.WAITING
    assert _admissions(eng) == [(0, 0)]
    # 50: the foreign event, then admission of 1 -> PF1 at 150
    assert eng.run_next_timestamp() == 50
    assert fired == [50]
    assert _admissions(eng) == [(0, 0), (50, 1)]
    assert _steps(eng) == [120, 150, None]
    assert eng.requests[1].finish_time_us == 150


def test_cancel_defers_admission_while_its_own_zero_cost_event_is_pending() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=7))
    eng.submit(simsim.Request(0, 0, 1, 2))
    eng.submit(simsim.Request(1, 0, 1, 0))
    assert eng.run_next_timestamp() == 0  # admit 0; its PF at 0 is still pending
    eng.cancel_request(0)
    assert _snap(eng.requests[0]) == (S.CANCELLED, 0, 0, None, None, 0)
    assert eng.requests[1].state is S.WAITING
    assert _admissions(eng) == [(0, 0)]
    assert eng.ignored_cancelled_event_count == 0
    # next call at 0: PF0 ignored, then admit 1 (its PF at 0 left for the call after)
    assert eng.run_next_timestamp() == 0
    assert eng.ignored_cancelled_event_count == 1
    assert _admissions(eng) == [(0, 0), (0, 1)]
    assert eng.requests[1].state is S.PREFILLING
    assert eng.run_next_timestamp() == 0  # PF1, RC1
    assert eng.run_next_timestamp() is None
    assert _log(eng) == [(0, ARR, 0), (0, ARR, 1), (0, PF, 1), (0, RC, 1)]
    assert eng.processed_event_count == 5
    assert _snap(eng.requests[1]) == (S.FINISHED, 0, 0, 0, None, 0)


def test_immediate_admission_after_cancel_leaves_zero_cost_events_for_next_call() -> None:
    eng = simsim.SimulationEngine(FixedBackend(prefill=0, decode=10))
    eng.submit(simsim.Request(0, 0, 1, 3))  # PF at 0, DEC at 10, 20, 30
    eng.submit(simsim.Request(1, 0, 1, 0))
    assert [eng.run_next_timestamp() for _ in range(3)] == [0, 0, 10]
    eng.cancel_request(0)  # at 10: nothing pending at 10 (DEC0 is at 20)
    assert _admissions(eng) == [(0, 0), (10, 1)]
    assert eng.requests[1].state is S.PREFILLING
    assert eng.now_us == 10
    # PF1 at 10 (zero cost) is pending; DEC0 at 20 is ignored
    assert _steps(eng) == [10, 20, None]
    assert _snap(eng.requests[1]) == (S.FINISHED, 0, 10, 10, None, 10)
    assert _snap(eng.requests[0]) == (S.CANCELLED, 1, 0, 0, 10, 10)
    assert eng.ignored_cancelled_event_count == 1


def test_cancel_active_with_empty_queue_admits_nothing(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 1))
    engine.run_next_timestamp()
    engine.cancel_request(0)
    assert _admissions(engine) == [(0, 0)]
    # a later arrival is admitted on arrival: 200 -> PF at 300
    engine.submit(simsim.Request(1, 200, 0, 0))
    assert _steps(engine) == [120, 200, 300, None]
    assert _admissions(engine) == [(0, 0), (200, 1)]


def test_cancel_terminal_raises_and_changes_nothing(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(31, 0, 0, 0))
    engine.submit(simsim.Request(32, 500, 0, 0))
    engine.cancel_request(32)
    engine.run()
    before = _engine_state(engine)
    for rid in (31, 32):  # FINISHED and CANCELLED
        with pytest.raises(simsim.InvalidTransitionError, match=str(rid)):
            engine.cancel_request(rid)
        assert _engine_state(engine) == before


def test_cancel_unknown_raises_and_changes_nothing(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(1, 0, 10, 2))
    engine.run_next_timestamp()
    before = _engine_state(engine)
    with pytest.raises(simsim.UnknownRequestError, match="4711"):
        engine.cancel_request(4711)
    assert _engine_state(engine) == before
    with pytest.raises(KeyError):
        engine.cancel_request(4712)
    assert _engine_state(engine) == before


# --------------------------------------------------------------------------- submit


def test_submit_returns_the_registered_request(engine: simsim.SimulationEngine) -> None:
    req = simsim.Request(6, 10, 1, 1)
    returned = engine.submit(req)
    assert isinstance(returned, simsim.Request)
    assert returned.request_id == 6
    assert engine.requests[6] is returned
    assert engine.has_pending_events is True
    assert list(engine.event_log) == []  # the arrival is scheduled, not yet processed


def test_requests_is_read_only(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 1, 1))
    with pytest.raises(TypeError):
        engine.requests[1] = simsim.Request(1, 0, 1, 1)  # type: ignore[index]
    with pytest.raises(TypeError):
        del engine.requests[0]  # type: ignore[attr-defined]
    assert list(engine.requests) == [0]


@pytest.mark.parametrize(
    "extra",
    [
        {"state": S.PREFILLING, "admit_time_us": 0},
        {"state": S.DECODING, "admit_time_us": 0},
        {"state": S.FINISHED, "finish_time_us": 0},
        {"state": S.CANCELLED, "finish_time_us": 0},
        {"state": S.PREEMPTED},
        {"generated_token_count": 1},
        {"admit_time_us": 0},
        {"prefill_end_time_us": 5},
        {"first_token_time_us": 5},
        {"finish_time_us": 5},
    ],
    ids=lambda d: "-".join(str(k) for k in d),
)
def test_submit_rejects_non_pristine_requests(
    engine: simsim.SimulationEngine, extra: dict[str, Any]
) -> None:
    req = simsim.Request(77, 10, 1, 1, **extra)
    before_req = _snap(req)
    before = _engine_state(engine)
    with pytest.raises(ValueError, match="77"):
        engine.submit(req)
    assert _engine_state(engine) == before
    assert _snap(req) == before_req
    assert engine.run_next_timestamp() is None


def test_submit_rejects_a_duplicate_id(engine: simsim.SimulationEngine) -> None:
    original = engine.submit(simsim.Request(8, 10, 1, 1))
    before = _engine_state(engine)
    with pytest.raises(ValueError, match="8"):
        engine.submit(simsim.Request(8, 20, 50, 7))
    assert _engine_state(engine) == before
    assert engine.requests[8] is original
    engine.run()
    # only the original ran: 10 admit, PF at 10 + 102 = 112, DEC + RC 122
    assert _log(engine) == [(10, ARR, 8), (112, PF, 8), (122, DEC, 8), (122, RC, 8)]


def test_submit_rejects_a_duplicate_of_a_finished_request(
    engine: simsim.SimulationEngine,
) -> None:
    engine.submit(simsim.Request(9, 0, 0, 0))
    engine.run()
    before = _engine_state(engine)
    with pytest.raises(ValueError, match="9"):
        engine.submit(simsim.Request(9, 500, 0, 0))
    assert _engine_state(engine) == before


def test_submit_rejects_arrival_before_now(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(0, 0, 10, 1))
    assert engine.run_next_timestamp() == 0
    assert engine.run_next_timestamp() == 120
    before = _engine_state(engine)
    late = simsim.Request(66, 119, 1, 1)
    with pytest.raises(ValueError, match=r"66|119"):
        engine.submit(late)
    assert _engine_state(engine) == before
    assert 66 not in engine.requests
    assert late.state is S.WAITING


# --------------------------------------------------------------------------- counters


def test_has_pending_events_follows_the_heap(engine: simsim.SimulationEngine) -> None:
    assert engine.has_pending_events is False
    engine.submit(simsim.Request(0, 5, 0, 0))
    assert engine.has_pending_events is True
    engine.run_next_timestamp()  # 5: ARR + admit, PF at 105 pending
    assert engine.has_pending_events is True
    engine.run_next_timestamp()  # 105: PF + RC
    assert engine.has_pending_events is False


def test_foreign_events_are_stops_but_not_counted(backend: simsim.SimulatedBackend) -> None:
    env = simsim.Environment()
    eng = simsim.SimulationEngine(backend, env=env)
    seen: list[int] = []

    def foreign() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(30)
        seen.append(env.now)
        yield env.timeout(500)
        seen.append(env.now)

    env.process(foreign())
    eng.submit(simsim.Request(0, 0, 10, 1))  # PF 120, DEC + RC 130
    # 0: process start + ARR; 30: foreign; 120; 130; 530: foreign
    assert _steps(eng) == [0, 30, 120, 130, 530, None]
    assert seen == [30, 530]
    assert eng.processed_event_count == 4
    assert eng.now_us == 530
    assert eng.has_pending_events is False


def test_run_drives_the_whole_shared_heap(backend: simsim.SimulatedBackend) -> None:
    env = simsim.Environment()
    eng = simsim.SimulationEngine(backend, env=env)
    env.timeout(1_000)
    eng.submit(simsim.Request(0, 0, 10, 1))
    eng.run()
    assert eng.now_us == 1_000
    assert eng.processed_event_count == 4
    assert eng.requests[0].finish_time_us == 130


# --------------------------------------------------------------------------- property


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 400),  # arrival
            st.integers(0, 20),  # prompt tokens
            st.integers(0, 4),  # output tokens
        ),
        min_size=1,
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
def test_single_slot_fcfs_matches_a_reference_model(
    specs: list[tuple[int, int, int]], rnd: Any
) -> None:
    backend = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=100,
            prefill_per_token_us=2,
            prefill_per_active_sequence_us=0,
            decode_base_us=10,
            decode_per_active_sequence_us=0,
        )
    )
    eng = simsim.SimulationEngine(backend)
    order = list(enumerate(specs))
    rnd.shuffle(order)  # submission order must not matter
    for rid, (arrival, prompt, out) in order:
        eng.submit(simsim.Request(rid, arrival, prompt, out))
    eng.run()
    # reference: FCFS by (arrival, id); the slot frees at the finish of the previous one
    free_at = 0
    expected_admissions = []
    for rid, (arrival, prompt, out) in sorted(enumerate(specs), key=lambda p: (p[1][0], p[0])):
        admit = max(arrival, free_at)
        prefill_end = admit + 100 + 2 * prompt
        finish = prefill_end + 10 * out
        first = prefill_end + 10 if out else None
        assert _snap(eng.requests[rid]) == (S.FINISHED, out, admit, prefill_end, first, finish)
        expected_admissions.append((admit, rid))
        free_at = finish
    assert _admissions(eng) == expected_admissions
    assert eng.now_us == free_at
    _check_log_invariants(eng)
    for rid, (_, _, out) in enumerate(specs):
        assert [t for _, t, i in _log(eng) if i == rid] == [ARR, PF] + [DEC] * out + [RC]
