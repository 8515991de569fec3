"""Contract section 11: ``requests_frame``, ``events_frame``, ``admissions_frame``, ``summarize``.

Costs come from the ``backend`` fixture of ``conftest.py``: prefill = 100 + 2 * prompt
tokens, decode step = 10 (microseconds). Every expected number is worked out by hand in
the comments; nothing is recomputed with the code under test.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

import simsim
from simsim import RequestState as S
from simsim.results import REQUEST_COLUMNS, requests_frame

NA = pd.NA

COLUMNS = [
    "request_id",
    "state",
    "arrival_time_us",
    "prompt_token_count",
    "max_output_tokens",
    "generated_token_count",
    "admit_time_us",
    "prefill_end_time_us",
    "first_token_time_us",
    "finish_time_us",
    "queue_delay_us",
    "ttft_us",
    "e2e_latency_us",
    "tpot_us",
]
TIME_COLUMNS = [
    "arrival_time_us",
    "admit_time_us",
    "prefill_end_time_us",
    "first_token_time_us",
    "finish_time_us",
    "queue_delay_us",
    "ttft_us",
    "e2e_latency_us",
]
COUNT_COLUMNS = ["request_id", "prompt_token_count", "max_output_tokens", "generated_token_count"]

# (request_id, arrival_time_us, prompt_token_count, max_output_tokens), submitted in this
# deliberately scrambled order.
SUBMISSIONS = [
    (5, 10_000, 7, 4),  # cancelled at 20, before it arrives
    (3, 30, 10, 5),  # cancelled at 200 while queued
    (1, 10, 0, 1),  # one output token
    (4, 40, 0, 5),  # cancelled at 610 while decoding, after 2 tokens
    (0, 0, 50, 3),  # three output tokens, finishes normally
    (2, 20, 25, 0),  # zero output tokens
]

# Hand-worked timeline (prefill = 100 + 2 * prompt, decode step = 10):
#   t=0    request 0 arrives and is admitted at once; prefill 100 + 2*50 = 200
#   t=10..40 requests 1, 2, 3, 4 arrive and queue (5 is cancelled at t=20, never arrives)
#   t=200  request 3 cancelled while queued
#   t=200  PREFILL_COMPLETE(0); decode steps end at 210 (first token), 220, 230
#   t=230  REQUEST_COMPLETE(0); request 1 admitted; prefill 100 + 0 -> 330
#   t=340  first and only token of 1, REQUEST_COMPLETE(1); request 2 admitted
#   t=490  request 2 prefilled (100 + 2*25 = 150) and complete (no tokens); 4 admitted
#   t=590  PREFILL_COMPLETE(4); tokens at 600 and 610; cancelled at 610
#   t=10000 request 5's arrival is ignored
EXPECTED_ROWS = {
    # id: state, arrival, prompt, max_out, tokens, admit, prefill_end, first, finish,
    #     queue_delay, ttft, e2e, tpot
    0: ("FINISHED", 0, 50, 3, 3, 0, 200, 210, 230, 0, 210, 230, 10.0),  # (230-210)/2
    1: ("FINISHED", 10, 0, 1, 1, 230, 330, 340, 340, 220, 330, 330, NA),
    2: ("FINISHED", 20, 25, 0, 0, 340, 490, NA, 490, 320, NA, 470, NA),
    3: ("CANCELLED", 30, 10, 5, 0, NA, NA, NA, 200, NA, NA, NA, NA),
    4: ("CANCELLED", 40, 0, 5, 2, 490, 590, 600, 610, 450, 560, NA, NA),
    5: ("CANCELLED", 10_000, 7, 4, 0, NA, NA, NA, 20, NA, NA, NA, NA),
}

ARR, PF, DEC, RC = (
    "REQUEST_ARRIVAL",
    "PREFILL_COMPLETE",
    "DECODE_STEP_COMPLETE",
    "REQUEST_COMPLETE",
)
EXPECTED_EVENTS = [
    (0, ARR, 0),
    (10, ARR, 1),
    (20, ARR, 2),
    (30, ARR, 3),
    (40, ARR, 4),
    (200, PF, 0),
    (210, DEC, 0),
    (220, DEC, 0),
    (230, DEC, 0),
    (230, RC, 0),
    (330, PF, 1),
    (340, DEC, 1),
    (340, RC, 1),
    (490, PF, 2),
    (490, RC, 2),
    (590, PF, 4),
    (600, DEC, 4),
    (610, DEC, 4),
]
EXPECTED_ADMISSIONS = [(0, 0), (230, 1), (340, 2), (490, 4)]


def _run_to(engine: simsim.SimulationEngine, target: int) -> None:
    while True:
        t = engine.run_next_timestamp()
        assert t is not None, f"ran out of events before t={target}"
        assert t <= target
        if t == target:
            return


@pytest.fixture
def worked(backend: simsim.SimulatedBackend) -> simsim.SimulationEngine:
    engine = simsim.SimulationEngine(backend)
    for fields in SUBMISSIONS:
        engine.submit(simsim.Request(*fields))
    _run_to(engine, 20)
    engine.cancel_request(5)  # not yet arrived
    _run_to(engine, 200)
    assert engine.requests[3].state is S.WAITING
    engine.cancel_request(3)  # queued
    _run_to(engine, 610)
    assert engine.requests[4].state is S.DECODING
    engine.cancel_request(4)  # decoding, 2 tokens so far
    engine.run()
    return engine


# --------------------------------------------------------------------- requests_frame


def test_requests_frame_columns_in_contract_order(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame()
    assert list(frame.columns) == COLUMNS
    assert list(REQUEST_COLUMNS) == COLUMNS


def test_requests_frame_rows_in_request_id_order(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame()
    assert len(frame) == 6
    assert frame["request_id"].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("request_id", sorted(EXPECTED_ROWS))
def test_requests_frame_hand_worked_row(worked: simsim.SimulationEngine, request_id: int) -> None:
    frame = worked.requests_frame().set_index("request_id")
    row = frame.loc[request_id]
    expected = dict(zip(COLUMNS[1:], EXPECTED_ROWS[request_id], strict=True))
    for column, value in expected.items():
        got = row[column]
        if value is NA:
            assert pd.isna(got), f"request {request_id} {column}: expected <NA>, got {got!r}"
        else:
            assert not pd.isna(got), f"request {request_id} {column}: expected {value}, got <NA>"
            assert got == value, f"request {request_id} {column}: expected {value}, got {got!r}"


def test_requests_frame_matches_request_objects(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame().set_index("request_id")
    for rid, request in worked.requests.items():
        row = frame.loc[rid]
        assert row["state"] == request.state.name
        assert row["generated_token_count"] == request.generated_token_count
        for name in (
            "arrival_time_us",
            "admit_time_us",
            "prefill_end_time_us",
            "first_token_time_us",
            "finish_time_us",
        ):
            value = getattr(request, name)
            if value is None:
                assert pd.isna(row[name])
            else:
                assert row[name] == value


def test_requests_frame_dtypes(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame()
    for column in TIME_COLUMNS:
        assert frame[column].dtype == "Int64", (column, frame[column].dtype)
    for column in COUNT_COLUMNS:
        assert pd.api.types.is_integer_dtype(frame[column].dtype), column
        assert not frame[column].isna().any()
    assert pd.api.types.is_float_dtype(frame["tpot_us"].dtype)
    assert frame["tpot_us"].iloc[0] == 10.0
    assert isinstance(frame["tpot_us"].iloc[0], float)
    assert frame["state"].tolist() == [
        "FINISHED",
        "FINISHED",
        "FINISHED",
        "CANCELLED",
        "CANCELLED",
        "CANCELLED",
    ]
    assert all(isinstance(value, str) for value in frame["state"])


def test_missing_values_are_na_never_sentinels(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame()
    for column in TIME_COLUMNS:
        present = frame[column].dropna()
        assert (present >= 0).all(), column
    # Exactly the cells worked out by hand above are missing, and they are <NA>.
    missing = {
        (rid, column)
        for rid, values in EXPECTED_ROWS.items()
        for column, value in zip(COLUMNS[1:], values, strict=True)
        if value is NA
    }
    observed = {
        (int(rid), column)
        for rid, row in frame.set_index("request_id").iterrows()
        for column, value in row.items()
        if pd.isna(value)
    }
    assert observed == missing
    assert frame.loc[frame["request_id"] == 3, "admit_time_us"].iloc[0] is NA


def test_zero_output_request_has_no_first_token_but_an_e2e(
    worked: simsim.SimulationEngine,
) -> None:
    row = worked.requests_frame().set_index("request_id").loc[2]
    assert pd.isna(row["first_token_time_us"])
    assert pd.isna(row["ttft_us"])
    assert pd.isna(row["tpot_us"])
    assert row["prefill_end_time_us"] == 490
    assert row["e2e_latency_us"] == 470  # 490 - 20


def test_cancelled_rows_keep_tokens_but_have_no_e2e_or_tpot(
    worked: simsim.SimulationEngine,
) -> None:
    frame = worked.requests_frame().set_index("request_id")
    decoding = frame.loc[4]
    assert decoding["state"] == "CANCELLED"
    assert decoding["generated_token_count"] == 2
    assert decoding["first_token_time_us"] == 600
    assert decoding["ttft_us"] == 560  # 600 - 40: a cancelled request still had a first token
    assert decoding["finish_time_us"] == 610
    assert pd.isna(decoding["e2e_latency_us"])
    assert pd.isna(decoding["tpot_us"])
    queued = frame.loc[3]
    assert queued["finish_time_us"] == 200
    assert pd.isna(queued["admit_time_us"]) and pd.isna(queued["queue_delay_us"])
    before_arrival = frame.loc[5]
    assert before_arrival["finish_time_us"] == 20  # the cancel time, before its arrival
    assert before_arrival["arrival_time_us"] == 10_000
    assert pd.isna(before_arrival["e2e_latency_us"])


def test_requests_frame_of_an_empty_engine(backend: simsim.SimulatedBackend) -> None:
    frame = simsim.SimulationEngine(backend).requests_frame()
    assert len(frame) == 0
    assert list(frame.columns) == COLUMNS
    for column in TIME_COLUMNS:
        assert frame[column].dtype == "Int64"
    assert pd.api.types.is_float_dtype(frame["tpot_us"].dtype)


def test_requests_frame_while_requests_are_in_flight(backend: simsim.SimulatedBackend) -> None:
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 0, 50, 3))
    engine.submit(simsim.Request(1, 5, 0, 1))
    _run_to(engine, 210)  # request 0 has its first token, 1 is queued
    frame = engine.requests_frame().set_index("request_id")
    assert frame.loc[0, "state"] == "DECODING"
    assert frame.loc[0, "generated_token_count"] == 1
    assert frame.loc[0, "ttft_us"] == 210
    assert pd.isna(frame.loc[0, "finish_time_us"])
    assert pd.isna(frame.loc[0, "e2e_latency_us"])
    assert pd.isna(frame.loc[0, "tpot_us"])
    assert frame.loc[1, "state"] == "WAITING"
    assert pd.isna(frame.loc[1, "admit_time_us"])


def test_frames_do_not_change_the_engine(worked: simsim.SimulationEngine) -> None:
    before = [(r.request_id, r.state, r.finish_time_us) for r in worked.requests.values()]
    log_before = list(worked.event_log)
    first = worked.requests_frame()
    worked.events_frame()
    worked.admissions_frame()
    pd.testing.assert_frame_equal(first, worked.requests_frame())
    assert [(r.request_id, r.state, r.finish_time_us) for r in worked.requests.values()] == before
    assert list(worked.event_log) == log_before


# --------------------------------------------------------------- events / admissions


def test_events_frame_hand_worked(worked: simsim.SimulationEngine) -> None:
    frame = worked.events_frame()
    assert list(frame.columns) == ["timestamp_us", "sequence", "event_type", "request_id"]
    rows = list(zip(frame["timestamp_us"], frame["event_type"], frame["request_id"], strict=True))
    assert rows == EXPECTED_EVENTS


def test_events_frame_matches_event_log_row_by_row(worked: simsim.SimulationEngine) -> None:
    frame = worked.events_frame()
    log = list(worked.event_log)
    assert len(frame) == len(log) == 18
    for (_, row), record in zip(frame.iterrows(), log, strict=True):
        assert row["timestamp_us"] == record.timestamp_us
        assert row["sequence"] == record.sequence
        assert row["event_type"] == record.event_type.name
        assert row["request_id"] == record.request_id
    assert frame["timestamp_us"].dtype == "Int64"
    assert pd.api.types.is_integer_dtype(frame["sequence"].dtype)
    assert pd.api.types.is_integer_dtype(frame["request_id"].dtype)
    # (timestamp, sequence) order, unique.
    keys = list(zip(frame["timestamp_us"], frame["sequence"], strict=True))
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


def test_admissions_frame_matches_admission_log(worked: simsim.SimulationEngine) -> None:
    frame = worked.admissions_frame()
    assert list(frame.columns) == ["timestamp_us", "request_id", "epoch"]
    assert list(zip(frame["timestamp_us"], frame["request_id"], strict=True)) == (
        EXPECTED_ADMISSIONS
    )
    log = list(worked.admission_log)
    assert len(log) == len(frame)
    for (_, row), record in zip(frame.iterrows(), log, strict=True):
        assert (row["timestamp_us"], row["request_id"], row["epoch"]) == (
            record.timestamp_us,
            record.request_id,
            record.epoch,
        )
    assert frame["timestamp_us"].dtype == "Int64"
    # Every admission commits a decision on a newer queue than the one before.
    assert frame["epoch"].is_monotonic_increasing and frame["epoch"].is_unique


def test_admissions_agree_with_request_admit_times(worked: simsim.SimulationEngine) -> None:
    admissions = worked.admissions_frame()
    requests = worked.requests_frame().dropna(subset=["admit_time_us"])
    assert sorted(zip(admissions["request_id"], admissions["timestamp_us"], strict=True)) == sorted(
        zip(requests["request_id"], requests["admit_time_us"], strict=True)
    )


def test_event_and_admission_frames_of_an_empty_engine(backend: simsim.SimulatedBackend) -> None:
    engine = simsim.SimulationEngine(backend)
    events = engine.events_frame()
    admissions = engine.admissions_frame()
    assert len(events) == 0 and len(admissions) == 0
    assert list(events.columns) == ["timestamp_us", "sequence", "event_type", "request_id"]
    assert list(admissions.columns) == ["timestamp_us", "request_id", "epoch"]
    assert events["timestamp_us"].dtype == "Int64"
    assert admissions["timestamp_us"].dtype == "Int64"


# ---------------------------------------------------------------------- summarize

METRICS = [
    "requests",
    *(f"count_{state.name}" for state in S),
    "makespan_us",
    "throughput_requests_per_s",
    "throughput_tokens_per_s",
    *(
        f"{column}_{stat}"
        for column in ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us")
        for stat in ("mean", "p50", "p90", "p99")
    ),
]


def _values(summary: pd.DataFrame) -> pd.Series:
    assert list(summary.columns) == ["value"]
    return summary["value"]


def test_summarize_worked_engine(worked: simsim.SimulationEngine) -> None:
    summary = simsim.summarize(worked.requests_frame())
    assert summary.index.name == "metric"
    assert list(summary.index) == METRICS
    v = _values(summary)
    assert v["requests"] == 6
    assert v["count_FINISHED"] == 3
    assert v["count_CANCELLED"] == 3
    for state in ("WAITING", "PREFILLING", "DECODING", "PREEMPTED"):
        assert v[f"count_{state}"] == 0
    # First arrival 0, last finish 610 (request 4's cancellation).
    assert v["makespan_us"] == 610
    assert v["throughput_requests_per_s"] == pytest.approx(3 / 610e-6)
    assert v["throughput_tokens_per_s"] == pytest.approx(6 / 610e-6)  # 3 + 1 + 2 tokens
    # queue delays 0, 220, 320, 450 (requests 0, 1, 2, 4)
    assert v["queue_delay_us_mean"] == pytest.approx(247.5)
    assert v["queue_delay_us_p50"] == pytest.approx(270.0)  # halfway 220..320
    assert v["queue_delay_us_p90"] == pytest.approx(411.0)  # 320 + 0.7 * 130
    assert v["queue_delay_us_p99"] == pytest.approx(446.1)  # 320 + 0.97 * 130
    # TTFTs 210, 330, 560 (the cancelled request 4 had a first token too)
    assert v["ttft_us_mean"] == pytest.approx(1100 / 3)
    assert v["ttft_us_p50"] == pytest.approx(330.0)
    assert v["ttft_us_p90"] == pytest.approx(514.0)  # 330 + 0.8 * 230
    assert v["ttft_us_p99"] == pytest.approx(555.4)  # 330 + 0.98 * 230
    # e2e of the finished ones: 230, 330, 470
    assert v["e2e_latency_us_mean"] == pytest.approx(1030 / 3)
    assert v["e2e_latency_us_p50"] == pytest.approx(330.0)
    assert v["e2e_latency_us_p90"] == pytest.approx(442.0)  # 330 + 0.8 * 140
    assert v["e2e_latency_us_p99"] == pytest.approx(467.2)  # 330 + 0.98 * 140
    for stat in ("mean", "p50", "p90", "p99"):
        assert v[f"tpot_us_{stat}"] == pytest.approx(10.0)  # only request 0 has a TPOT
    assert "slo_attainment" not in v.index
    assert "goodput_requests_per_s" not in v.index


@pytest.mark.parametrize(
    ("ttft_slo_us", "tpot_slo_us", "good"),
    [
        # request 0: ttft 210, tpot 10; request 1: ttft 330, no tpot;
        # request 2: no first token, so its TTFT counts as its e2e 470, no tpot.
        (330, None, 2),  # 0 and 1 (<= is a pass); 2 fails with 470
        (470, None, 3),
        (209, None, 0),
        (None, 9.5, 2),  # 0 fails; 1 and 2 have no TPOT and pass
        (None, 10, 3),
        (330, 9.5, 1),  # only request 1
        (1_000_000, 1_000_000, 3),  # cancelled requests never count as good
    ],
)
def test_summarize_slo_worked_engine(
    worked: simsim.SimulationEngine, ttft_slo_us: int | None, tpot_slo_us: float | None, good: int
) -> None:
    v = _values(
        simsim.summarize(worked.requests_frame(), ttft_slo_us=ttft_slo_us, tpot_slo_us=tpot_slo_us)
    )
    assert list(v.index) == [*METRICS, "slo_attainment", "goodput_requests_per_s"]
    assert v["slo_attainment"] == pytest.approx(good / 6)  # of all six requests
    assert v["goodput_requests_per_s"] == pytest.approx(good / 610e-6)


def _synthetic() -> list[simsim.Request]:
    """Seven hand-made terminal requests with round numbers (see the table below)."""
    fin = S.FINISHED
    rows = [
        # id, arrival, queue delay, ttft, e2e, tokens      tpot
        (0, 0, 0, 100, 190, 10),  # (190-100)/9 = 10
        (1, 1000, 100, 200, 400, 11),  # 200/10 = 20
        (2, 2000, 200, 300, 600, 11),  # 300/10 = 30
        (3, 3000, 300, 400, 1000, 16),  # 600/15 = 40
        (4, 4000, 1400, 1500, 1500, 1),  # one token: no tpot
    ]
    out = [
        simsim.Request(
            rid,
            arrival,
            8,
            tokens,
            state=fin,
            generated_token_count=tokens,
            admit_time_us=arrival + qd,
            prefill_end_time_us=arrival + qd + 1,
            first_token_time_us=arrival + ttft,
            finish_time_us=arrival + e2e,
        )
        for rid, arrival, qd, ttft, e2e, tokens in rows
    ]
    # 5: zero output, queue delay 0, e2e 50, no first token
    out.append(
        simsim.Request(
            5,
            5000,
            8,
            0,
            state=fin,
            admit_time_us=5000,
            prefill_end_time_us=5050,
            finish_time_us=5050,
        )
    )
    # 6: cancelled while queued at 10_000 (the last finish: makespan 10_000 us)
    out.append(simsim.Request(6, 6000, 8, 4, state=S.CANCELLED, finish_time_us=10_000))
    return out


def test_summarize_hand_computable_set() -> None:
    frame = requests_frame(reversed(_synthetic()))
    assert frame["request_id"].tolist() == list(range(7))
    assert frame["tpot_us"].tolist()[:4] == [10.0, 20.0, 30.0, 40.0]
    v = _values(simsim.summarize(frame))
    assert v["requests"] == 7
    assert v["count_FINISHED"] == 6 and v["count_CANCELLED"] == 1
    assert v["makespan_us"] == 10_000
    assert v["throughput_requests_per_s"] == pytest.approx(600.0)  # 6 / 0.01 s
    assert v["throughput_tokens_per_s"] == pytest.approx(4900.0)  # 49 tokens / 0.01 s
    # queue delays sorted: 0, 0, 100, 200, 300, 1400
    assert v["queue_delay_us_mean"] == pytest.approx(2000 / 6)
    assert v["queue_delay_us_p50"] == pytest.approx(150.0)
    assert v["queue_delay_us_p90"] == pytest.approx(850.0)  # 300 + 0.5 * 1100
    assert v["queue_delay_us_p99"] == pytest.approx(1345.0)  # 300 + 0.95 * 1100
    # TTFTs: 100, 200, 300, 400, 1500
    assert v["ttft_us_mean"] == pytest.approx(500.0)
    assert v["ttft_us_p50"] == pytest.approx(300.0)
    assert v["ttft_us_p90"] == pytest.approx(1060.0)  # 400 + 0.6 * 1100
    assert v["ttft_us_p99"] == pytest.approx(1456.0)  # 400 + 0.96 * 1100
    # e2e sorted: 50, 190, 400, 600, 1000, 1500
    assert v["e2e_latency_us_mean"] == pytest.approx(3740 / 6)
    assert v["e2e_latency_us_p50"] == pytest.approx(500.0)
    assert v["e2e_latency_us_p90"] == pytest.approx(1250.0)
    assert v["e2e_latency_us_p99"] == pytest.approx(1475.0)
    # TPOTs: 10, 20, 30, 40
    assert v["tpot_us_mean"] == pytest.approx(25.0)
    assert v["tpot_us_p50"] == pytest.approx(25.0)
    assert v["tpot_us_p90"] == pytest.approx(37.0)
    assert v["tpot_us_p99"] == pytest.approx(39.7)


@pytest.mark.parametrize(
    ("ttft_slo_us", "tpot_slo_us", "good"),
    [
        # ttft: 100, 200, 300, 400, 1500, (5: e2e 50); tpot: 10, 20, 30, 40, -, -
        (300, None, 4),  # 0, 1, 2, 5
        (49, None, 0),  # even request 5's e2e (50) misses it
        (50, None, 1),
        (None, 25, 4),  # 0, 1, 4, 5
        (None, 10, 3),  # 0, 4, 5
        (300, 25, 3),  # 0, 1, 5
    ],
)
def test_summarize_slo_hand_computable_set(
    ttft_slo_us: int | None, tpot_slo_us: float | None, good: int
) -> None:
    frame = requests_frame(_synthetic())
    v = _values(simsim.summarize(frame, ttft_slo_us=ttft_slo_us, tpot_slo_us=tpot_slo_us))
    assert v["slo_attainment"] == pytest.approx(good / 7)
    assert v["goodput_requests_per_s"] == pytest.approx(good / 0.01)


def test_summarize_with_no_finished_request_gives_nan(backend: simsim.SimulatedBackend) -> None:
    engine = simsim.SimulationEngine(backend)
    engine.submit(simsim.Request(0, 100, 4, 4))
    engine.cancel_request(0)  # at t=0, before it arrives
    engine.run()
    v = _values(simsim.summarize(engine.requests_frame(), ttft_slo_us=1000))
    assert v["requests"] == 1 and v["count_CANCELLED"] == 1 and v["count_FINISHED"] == 0
    for column in ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert math.isnan(v[f"{column}_{stat}"]), f"{column}_{stat}"
    assert v["slo_attainment"] == 0.0


def test_summarize_empty_frame(backend: simsim.SimulatedBackend) -> None:
    v = _values(simsim.summarize(simsim.SimulationEngine(backend).requests_frame()))
    assert v["requests"] == 0
    assert v["count_FINISHED"] == 0
    assert math.isnan(v["makespan_us"])
    assert math.isnan(v["throughput_requests_per_s"])
    assert math.isnan(v["e2e_latency_us_mean"])


def test_summarize_rejects_a_frame_that_is_not_a_requests_frame(
    worked: simsim.SimulationEngine,
) -> None:
    with pytest.raises(ValueError, match="tpot_us"):
        simsim.summarize(worked.requests_frame().drop(columns=["tpot_us"]))
    with pytest.raises(ValueError):
        simsim.summarize(worked.events_frame())


def test_summarize_does_not_modify_its_input(worked: simsim.SimulationEngine) -> None:
    frame = worked.requests_frame()
    copy = frame.copy()
    simsim.summarize(frame, ttft_slo_us=300, tpot_slo_us=10)
    pd.testing.assert_frame_equal(frame, copy)


def test_results_module_imports_nothing_from_the_engines() -> None:
    """Results read records; the engines use results, never the other way round."""
    import ast
    from pathlib import Path

    source = Path(simsim.results.__file__).read_text(encoding="utf-8")
    imported = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
        elif isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
    assert not [name for name in imported if name.startswith("simsim.engines")]
