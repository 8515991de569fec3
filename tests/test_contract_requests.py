"""Contract section 3: requests, their validation and their state machine.

Transitions are checked both directly (``Request.transition_to(new_state, now_us)``) and
through ``simsim.SimulationEngine`` with the easy cost model of ``conftest.py``
(prefill = 100 + 2 * prompt tokens, decode step = 10, all in microseconds).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

import simsim
from simsim import RequestState as S

MAX_US = 2**63 - 1


def _snapshot(req: simsim.Request) -> dict[str, Any]:
    return {
        name: getattr(req, name)
        for name in (
            "request_id",
            "arrival_time_us",
            "prompt_token_count",
            "max_output_tokens",
            "state",
            "generated_token_count",
            "admit_time_us",
            "prefill_end_time_us",
            "first_token_time_us",
            "finish_time_us",
        )
    }


# --------------------------------------------------------------------------- enum


def test_request_state_members() -> None:
    assert [m.name for m in simsim.RequestState] == [
        "WAITING",
        "PREFILLING",
        "DECODING",
        "FINISHED",
        "CANCELLED",
        "PREEMPTED",
    ]


# --------------------------------------------------------------------------- construction


def test_construction_defaults() -> None:
    req = simsim.Request(3, 250, 16, 4)
    assert req.request_id == 3
    assert req.arrival_time_us == 250
    assert req.prompt_token_count == 16
    assert req.max_output_tokens == 4
    assert req.state is S.WAITING
    assert req.generated_token_count == 0
    # optional lifecycle timestamps are None, never a sentinel number
    assert req.admit_time_us is None
    assert req.prefill_end_time_us is None
    assert req.first_token_time_us is None
    assert req.finish_time_us is None


def test_construction_by_keyword() -> None:
    req = simsim.Request(request_id=0, arrival_time_us=0, prompt_token_count=0, max_output_tokens=0)
    # zero is valid for every one of the four
    assert (req.request_id, req.arrival_time_us) == (0, 0)
    assert (req.prompt_token_count, req.max_output_tokens) == (0, 0)


def test_construction_accepts_numpy_ints_and_reports_plain_int_timestamps() -> None:
    req = simsim.Request(np.int64(5), np.int64(1_000), np.int32(8), np.int16(2))
    assert req.request_id == 5
    assert req.arrival_time_us == 1_000
    assert type(req.arrival_time_us) is int
    assert req.prompt_token_count == 8
    assert req.max_output_tokens == 2


def test_construction_with_optional_fields() -> None:
    req = simsim.Request(
        1,
        0,
        10,
        5,
        state=S.DECODING,
        generated_token_count=2,
        admit_time_us=0,
        prefill_end_time_us=120,
        first_token_time_us=130,
    )
    assert req.state is S.DECODING
    assert req.generated_token_count == 2
    assert (req.admit_time_us, req.prefill_end_time_us, req.first_token_time_us) == (0, 120, 130)
    assert req.finish_time_us is None


def test_arrival_may_be_the_64_bit_maximum() -> None:
    assert simsim.Request(0, MAX_US, 0, 0).arrival_time_us == MAX_US


FIELDS = ["request_id", "arrival_time_us", "prompt_token_count", "max_output_tokens"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [1.0, 2.5, True, False, Decimal(1), "1", None])
def test_construction_rejects_non_int_values(field: str, bad: Any) -> None:
    args: dict[str, Any] = dict.fromkeys(FIELDS, 1)
    args[field] = bad
    with pytest.raises(TypeError):
        simsim.Request(**args)


@pytest.mark.parametrize("field", FIELDS)
def test_construction_rejects_negative_values(field: str) -> None:
    args: dict[str, Any] = dict.fromkeys(FIELDS, 1)
    args[field] = -1
    with pytest.raises(ValueError):
        simsim.Request(**args)


def test_construction_rejects_arrival_past_64_bits() -> None:
    with pytest.raises((OverflowError, ValueError)):
        simsim.Request(0, MAX_US + 1, 1, 1)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("generated_token_count", -1),
        ("admit_time_us", -5),
        ("prefill_end_time_us", -5),
        ("first_token_time_us", -5),
        ("finish_time_us", -5),
    ],
)
def test_construction_rejects_negative_optional_values(field: str, bad: int) -> None:
    with pytest.raises(ValueError):
        simsim.Request(1, 0, 1, 1, **{field: bad})


@pytest.mark.parametrize(
    "field",
    [
        "generated_token_count",
        "admit_time_us",
        "prefill_end_time_us",
        "first_token_time_us",
        "finish_time_us",
    ],
)
def test_construction_rejects_float_optional_values(field: str) -> None:
    with pytest.raises(TypeError):
        simsim.Request(1, 0, 1, 1, **{field: 1.5})


def test_construction_rejects_a_state_that_is_not_a_request_state() -> None:
    with pytest.raises((TypeError, ValueError)):
        simsim.Request(1, 0, 1, 1, state="WAITING")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- transition_to


def test_waiting_to_prefilling_sets_admit_time() -> None:
    req = simsim.Request(7, 10, 4, 2)
    req.transition_to(S.PREFILLING, 35)
    assert req.state is S.PREFILLING
    assert req.admit_time_us == 35
    assert type(req.admit_time_us) is int
    assert req.finish_time_us is None


def test_transition_time_given_as_numpy_int_is_stored_as_plain_int() -> None:
    req = simsim.Request(7, 10, 4, 2)
    req.transition_to(S.PREFILLING, np.int64(35))
    assert req.admit_time_us == 35
    assert type(req.admit_time_us) is int


def test_prefilling_to_decoding_when_output_is_expected() -> None:
    req = simsim.Request(7, 0, 4, 2, state=S.PREFILLING, admit_time_us=0)
    req.transition_to(S.DECODING, 108)
    assert req.state is S.DECODING
    assert req.admit_time_us == 0  # untouched
    assert req.finish_time_us is None


def test_prefilling_to_finished_for_zero_output_request() -> None:
    req = simsim.Request(7, 0, 4, 0, state=S.PREFILLING, admit_time_us=0)
    req.transition_to(S.FINISHED, 108)
    assert req.state is S.FINISHED
    assert req.finish_time_us == 108
    assert req.first_token_time_us is None
    assert req.generated_token_count == 0


def test_decoding_to_finished_sets_finish_time() -> None:
    req = simsim.Request(
        7,
        0,
        4,
        2,
        state=S.DECODING,
        generated_token_count=2,
        admit_time_us=0,
        prefill_end_time_us=108,
        first_token_time_us=118,
    )
    req.transition_to(S.FINISHED, 128)
    assert req.state is S.FINISHED
    assert req.finish_time_us == 128
    assert req.generated_token_count == 2
    assert req.first_token_time_us == 118


@pytest.mark.parametrize("source", [S.WAITING, S.PREFILLING, S.DECODING])
def test_cancellation_from_every_live_state_sets_finish_time(source: S) -> None:
    extra: dict[str, Any] = {}
    if source is not S.WAITING:
        extra["admit_time_us"] = 3
    if source is S.DECODING:
        extra.update(generated_token_count=1, prefill_end_time_us=111, first_token_time_us=121)
    req = simsim.Request(9, 0, 4, 3, state=source, **extra)
    before = _snapshot(req)
    req.transition_to(S.CANCELLED, 125)
    assert req.state is S.CANCELLED
    assert req.finish_time_us == 125
    # everything it already had is kept
    after = _snapshot(req)
    for name in ("generated_token_count", "admit_time_us", "prefill_end_time_us"):
        assert after[name] == before[name]
    assert after["first_token_time_us"] == before["first_token_time_us"]


# Section 12 (batching) adds PREFILLING/DECODING -> PREEMPTED and PREEMPTED -> PREFILLING /
# CANCELLED to the shared state machine, so those four pairs are not listed here; section 3
# only promises that the single-slot engine never uses them (checked further down).
ILLEGAL = [
    (S.WAITING, S.WAITING),
    (S.WAITING, S.DECODING),
    (S.WAITING, S.FINISHED),
    (S.WAITING, S.PREEMPTED),
    (S.PREFILLING, S.WAITING),
    (S.PREFILLING, S.PREFILLING),
    (S.DECODING, S.WAITING),
    (S.DECODING, S.PREFILLING),
    (S.DECODING, S.DECODING),
    (S.FINISHED, S.WAITING),
    (S.FINISHED, S.PREFILLING),
    (S.FINISHED, S.DECODING),
    (S.FINISHED, S.FINISHED),
    (S.FINISHED, S.CANCELLED),
    (S.FINISHED, S.PREEMPTED),
    (S.CANCELLED, S.WAITING),
    (S.CANCELLED, S.PREFILLING),
    (S.CANCELLED, S.DECODING),
    (S.CANCELLED, S.FINISHED),
    (S.CANCELLED, S.CANCELLED),
    (S.CANCELLED, S.PREEMPTED),
    (S.PREEMPTED, S.WAITING),
    (S.PREEMPTED, S.DECODING),
    (S.PREEMPTED, S.FINISHED),
]


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=lambda s: s.name)
def test_illegal_transition_raises_and_changes_nothing(source: S, target: S) -> None:
    extra: dict[str, Any] = {}
    if source is not S.WAITING:
        extra["admit_time_us"] = 1
    if source in (S.FINISHED, S.CANCELLED):
        extra["finish_time_us"] = 50
    req = simsim.Request(4242, 0, 4, 3, state=source, **extra)
    before = _snapshot(req)
    with pytest.raises(simsim.InvalidTransitionError) as info:
        req.transition_to(target, 99)
    assert _snapshot(req) == before
    # section 9: the message names the request id, state or value at fault
    message = str(info.value)
    assert "4242" in message or source.name in message or target.name in message


def test_invalid_transition_error_is_a_simulation_error() -> None:
    assert issubclass(simsim.InvalidTransitionError, simsim.SimulationError)


def test_prefilling_to_decoding_is_illegal_for_a_zero_output_request() -> None:
    # PREFILLING -> DECODING is legal only "when ... max_output_tokens > 0"
    req = simsim.Request(5, 0, 4, 0, state=S.PREFILLING, admit_time_us=0)
    before = _snapshot(req)
    with pytest.raises(simsim.InvalidTransitionError):
        req.transition_to(S.DECODING, 108)
    assert _snapshot(req) == before


def test_prefilling_to_finished_is_illegal_when_output_is_expected() -> None:
    # PREFILLING -> FINISHED is legal only for "a request whose max_output_tokens == 0"
    req = simsim.Request(5, 0, 4, 3, state=S.PREFILLING, admit_time_us=0)
    before = _snapshot(req)
    with pytest.raises(simsim.InvalidTransitionError):
        req.transition_to(S.FINISHED, 108)
    assert _snapshot(req) == before


def test_transition_time_must_be_an_int() -> None:
    req = simsim.Request(1, 0, 4, 3)
    with pytest.raises(TypeError):
        req.transition_to(S.PREFILLING, 1.5)
    assert req.state is S.WAITING
    assert req.admit_time_us is None


def test_request_is_a_mutable_dataclass() -> None:
    req = simsim.Request(1, 0, 4, 3)
    assert dataclasses.is_dataclass(req)
    req.max_output_tokens = 9  # mutable: plain assignment works
    assert req.max_output_tokens == 9


# --------------------------------------------------------------------------- via the engine


def test_engine_drives_the_full_lifecycle(engine: simsim.SimulationEngine) -> None:
    # prompt 10 -> prefill 100 + 20 = 120; 3 tokens -> decode steps end at 130, 140, 150
    engine.submit(simsim.Request(0, 0, 10, 3))
    req = engine.requests[0]
    seen: list[tuple[int | None, S, int]] = []
    while (t := engine.run_next_timestamp()) is not None:
        seen.append((t, req.state, req.generated_token_count))
    assert seen == [
        (0, S.PREFILLING, 0),  # arrival + admission at 0
        (120, S.DECODING, 0),  # prefill complete
        (130, S.DECODING, 1),  # first token
        (140, S.DECODING, 2),
        (150, S.FINISHED, 3),  # last token and REQUEST_COMPLETE at the same time
    ]
    assert req.admit_time_us == 0
    assert req.prefill_end_time_us == 120
    assert req.first_token_time_us == 130  # only the first decode step sets it
    assert req.finish_time_us == 150


def test_engine_zero_output_request_goes_prefilling_to_finished(
    engine: simsim.SimulationEngine,
) -> None:
    # arrival 5, prompt 3: prefill 100 + 6 = 106 -> PREFILL_COMPLETE at 5 + 106 = 111
    engine.submit(simsim.Request(2, 5, 3, 0))
    engine.run()
    req = engine.requests[2]
    assert req.state is S.FINISHED
    assert req.admit_time_us == 5
    assert req.prefill_end_time_us == 111  # set for zero-output requests too
    assert req.finish_time_us == 111
    assert req.first_token_time_us is None  # no first token, ever
    assert req.generated_token_count == 0


def test_engine_each_decode_step_generates_exactly_one_token(
    engine: simsim.SimulationEngine,
) -> None:
    # prompt 0 -> prefill 100; 5 decode steps of 10: 110, 120, 130, 140, 150
    engine.submit(simsim.Request(1, 0, 0, 5))
    req = engine.requests[1]
    counts: dict[int, int] = {}
    while (t := engine.run_next_timestamp()) is not None:
        counts[t] = req.generated_token_count
    assert counts == {0: 0, 100: 0, 110: 1, 120: 2, 130: 3, 140: 4, 150: 5}
    assert req.first_token_time_us == 110


def test_engine_cancelled_request_keeps_tokens_and_timestamps(
    engine: simsim.SimulationEngine,
) -> None:
    # prompt 10 -> prefill ends 120; decode steps at 130, 140, 150, ...
    engine.submit(simsim.Request(3, 0, 10, 9))
    for expected in (0, 120, 130, 140):
        assert engine.run_next_timestamp() == expected
    engine.cancel_request(3)
    req = engine.requests[3]
    assert req.state is S.CANCELLED
    assert req.generated_token_count == 2
    assert req.admit_time_us == 0
    assert req.prefill_end_time_us == 120
    assert req.first_token_time_us == 130
    assert req.finish_time_us == 140  # clock now
    engine.run()
    # the ignored decode step at 150 changes nothing
    assert _snapshot(req)["generated_token_count"] == 2
    assert req.finish_time_us == 140
    assert req.state is S.CANCELLED


def test_engine_finished_request_cannot_be_cancelled(engine: simsim.SimulationEngine) -> None:
    engine.submit(simsim.Request(11, 0, 0, 0))
    engine.run()
    req = engine.requests[11]
    before = _snapshot(req)
    with pytest.raises(simsim.InvalidTransitionError, match="11"):
        engine.cancel_request(11)
    assert _snapshot(req) == before


def test_engine_cancelled_request_cannot_be_cancelled_again(
    engine: simsim.SimulationEngine,
) -> None:
    engine.submit(simsim.Request(12, 50, 0, 0))
    engine.cancel_request(12)
    req = engine.requests[12]
    before = _snapshot(req)
    assert before["state"] is S.CANCELLED
    assert before["finish_time_us"] == 0
    with pytest.raises(simsim.InvalidTransitionError, match="12"):
        engine.cancel_request(12)
    assert _snapshot(req) == before


def test_engine_never_uses_preempted(engine: simsim.SimulationEngine) -> None:
    for rid, arrival in enumerate((0, 0, 30)):
        engine.submit(simsim.Request(rid, arrival, 4, 2))
    states: set[S] = set()
    while engine.run_next_timestamp() is not None:
        states.update(r.state for r in engine.requests.values())
    assert S.PREEMPTED not in states
    assert {r.state for r in engine.requests.values()} == {S.FINISHED}
