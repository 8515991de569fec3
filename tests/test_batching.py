"""Contract section 12: ``simsim.BatchingEngine``, the continuous-batching server.

Unless a test says otherwise the cost model is (microseconds)::

    prefill_us(tokens, prefilling) = 100 + 2 * tokens + 5 * prefilling
    decode_step_us(decoding)       = 10 + 3 * decoding
    iteration_us = prefill part (if anyone prefills) + decode part (if anyone decodes)

so a few values come back again and again:

    prefill of n tokens by 1 request  = 105 + 2n      decode of 1 request  = 13
    prefill of n tokens by 2 requests = 110 + 2n      decode of 2 requests = 16
                                                      decode of 3 requests = 19

Every expected timestamp is worked out by hand in the comments. Records are compared as
``(timestamp_us, event_type, request_id)``; sequences are checked to be unique and
increasing in processing order. Admission records are ``(timestamp_us, request_id,
epoch)``; ``FcfsScheduler``'s epoch is bumped by every enqueue, remove and commit, and an
admission record carries the epoch under which the decision was made.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import simpy

import simsim
from simsim import EventType as E
from simsim import RequestState as S

ARR = E.REQUEST_ARRIVAL
PF = E.PREFILL_COMPLETE
DEC = E.DECODE_STEP_COMPLETE
RC = E.REQUEST_COMPLETE
PRE = E.REQUEST_PREEMPTED

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=100,
    prefill_per_token_us=2,
    prefill_per_active_sequence_us=5,
    decode_base_us=10,
    decode_per_active_sequence_us=3,
)

ITERATION_COLUMNS = [
    "start_us",
    "end_us",
    "prefill_tokens",
    "prefilling_count",
    "decoding_count",
    "abandoned",
    "batch_size",
    "kv_blocks_in_use",
]

Spec = tuple[int, int, int, int]  # request_id, arrival, prompt, output


class PlainBackend:
    """The same costs as ``COSTS``, but only the two methods of the Backend protocol."""

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        return 100 + 2 * prompt_token_count + 5 * active_batch_size

    def decode_step_us(self, active_sequence_count: int) -> int:
        return 10 + 3 * active_sequence_count


class BadIterationBackend(PlainBackend):
    """A backend whose iteration_us answers with a fixed (bad) value."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def iteration_us(self, prefill_tokens: int, prefilling_count: int, decoding_count: int) -> Any:
        return self.value


class NumpyIterationBackend(PlainBackend):
    """iteration_us answers with a NumPy integer: accepted, reported as a plain int."""

    def iteration_us(
        self, prefill_tokens: int, prefilling_count: int, decoding_count: int
    ) -> np.int64:
        total = 0
        if prefilling_count:
            total += self.prefill_us(prefill_tokens, prefilling_count)
        if decoding_count:
            total += self.decode_step_us(decoding_count)
        return np.int64(total)


def _engine(
    *specs: Spec, backend: Any = None, max_active_requests: int = 3, **kwargs: Any
) -> simsim.BatchingEngine:
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS) if backend is None else backend,
        max_active_requests=max_active_requests,
        **kwargs,
    )
    for rid, arrival, prompt, output in specs:
        engine.submit(simsim.Request(rid, arrival, prompt, output))
    return engine


def _log(engine: simsim.BatchingEngine) -> list[tuple[int, E, int]]:
    records = list(engine.event_log)
    keys = [(r.timestamp_us, r.sequence) for r in records]
    assert keys == sorted(keys)  # processing order is (timestamp, sequence) order
    assert len({r.sequence for r in records}) == len(records)  # one sequence per record
    for r in records:
        assert type(r.timestamp_us) is int and type(r.sequence) is int
    return [(r.timestamp_us, r.event_type, r.request_id) for r in records]


def _admissions(engine: simsim.BatchingEngine) -> list[tuple[int, int, int]]:
    return [(a.timestamp_us, a.request_id, a.epoch) for a in engine.admission_log]


def _iterations(engine: simsim.BatchingEngine) -> list[tuple[Any, ...]]:
    """(start, end, prefill_tokens, prefilling, decoding, abandoned) from the frame."""
    frame = engine.iterations_frame()
    assert list(frame.columns) == ITERATION_COLUMNS
    assert len(frame) == len(engine.iteration_log)
    return [
        (
            int(row.start_us),
            int(row.end_us),
            int(row.prefill_tokens),
            int(row.prefilling_count),
            int(row.decoding_count),
            bool(row.abandoned),
        )
        for row in frame.itertuples(index=False)
    ]


def _launch_state(engine: simsim.BatchingEngine) -> list[tuple[int, int]]:
    """(batch_size, kv_blocks_in_use) at launch, per iteration."""
    return [(it.batch_size, it.kv_blocks_in_use) for it in engine.iteration_log]


def _table(engine: simsim.BatchingEngine) -> dict[int, tuple[Any, ...]]:
    """id -> (state, tokens, admit, prefill_end, first_token, finish)."""
    return {
        rid: (
            r.state,
            r.generated_token_count,
            r.admit_time_us,
            r.prefill_end_time_us,
            r.first_token_time_us,
            r.finish_time_us,
        )
        for rid, r in engine.requests.items()
    }


def _advance(engine: simsim.BatchingEngine, count: int) -> list[int | None]:
    """Call run_next_timestamp() *count* times; return the results."""
    return [engine.run_next_timestamp() for _ in range(count)]


def _steps(engine: simsim.BatchingEngine) -> list[int | None]:
    """Call run_next_timestamp() until it returns None; return every result."""
    out: list[int | None] = []
    while True:
        t = engine.run_next_timestamp()
        out.append(t)
        if t is None:
            return out


# --------------------------------------------------------------------------- 1. a batch of three

# prefill_first, max_active_requests=3, no cap, no KV cache. Request 2 arrives before
# request 1, so the admission order (0, 2, 1) differs from the id order.
THREE: tuple[Spec, ...] = (
    (0, 0, 10, 3),
    (1, 60, 20, 2),
    (2, 50, 4, 1),
)
#   0: ARR0; nobody holds a slot -> admitted at the end of 0 (epoch 1: one enqueue).
#      iteration [0, 125]: prefill 10 tokens by 1 = 100 + 20 + 5.
#  50: ARR2, 60: ARR1: an iteration is running, both wait for the next iteration start.
# 125: PF0 (0 -> DECODING). Admit 2 (epoch 4: 3 enqueues + 1 commit), then 1 (epoch 5).
#      New admissions: prefill 4 + 20 = 24 tokens by 2 = 100 + 48 + 10 = 158 -> 283;
#      request 0 decodes nothing in it.
# 283: PF2, PF1 (admission order). Decode 0, 2, 1: 10 + 9 = 19 -> 302.
# 302: DEC0, DEC2 + RC2 (its only token), DEC1. Decode 0, 1: 16 -> 318.
# 318: DEC0, DEC1 + RC1. Decode 0: 13 -> 331.
# 331: DEC0 + RC0. Nothing left.
THREE_LOG = [
    (0, ARR, 0),
    (50, ARR, 2),
    (60, ARR, 1),
    (125, PF, 0),
    (283, PF, 2),
    (283, PF, 1),
    (302, DEC, 0),
    (302, DEC, 2),
    (302, RC, 2),
    (302, DEC, 1),
    (318, DEC, 0),
    (318, DEC, 1),
    (318, RC, 1),
    (331, DEC, 0),
    (331, RC, 0),
]
THREE_ITERATIONS = [
    (0, 125, 10, 1, 0, False),
    (125, 283, 24, 2, 0, False),
    (283, 302, 0, 0, 3, False),
    (302, 318, 0, 0, 2, False),
    (318, 331, 0, 0, 1, False),
]
THREE_TABLE = {
    0: (S.FINISHED, 3, 0, 125, 302, 331),
    1: (S.FINISHED, 2, 125, 283, 302, 318),
    2: (S.FINISHED, 1, 125, 283, 302, 302),
}
THREE_ADMISSIONS = [(0, 0, 1), (125, 2, 4), (125, 1, 5)]


def test_batch_of_three_staggered_arrivals_prefill_first() -> None:
    engine = _engine(*THREE)
    assert engine.run_next_timestamp() == 0
    assert engine.active_request_ids == [0]
    assert engine.requests[0].state is S.PREFILLING
    assert engine.run_next_timestamp() == 50
    assert engine.run_next_timestamp() == 60
    # both arrived during the first iteration: queued, not admitted
    assert engine.active_request_ids == [0]
    assert engine.requests[1].state is S.WAITING and engine.requests[2].state is S.WAITING
    assert engine.run_next_timestamp() == 125
    assert engine.active_request_ids == [0, 2, 1]
    assert engine.requests[0].state is S.DECODING
    assert _steps(engine) == [283, 302, 318, 331, None]

    assert _log(engine) == THREE_LOG
    assert _table(engine) == THREE_TABLE
    assert _admissions(engine) == THREE_ADMISSIONS
    assert _iterations(engine) == THREE_ITERATIONS
    assert _launch_state(engine) == [(1, 0), (3, 0), (3, 0), (2, 0), (1, 0)]
    assert engine.iteration_log[0] == simsim.IterationRecord(0, 125, 10, 1, 0, False, 1, 0)
    assert engine.active_request_ids == [] and engine.kv_blocks_in_use == 0
    assert engine.processed_event_count == 8  # 3 arrivals + 5 iteration ends
    assert engine.ignored_cancelled_event_count == 0
    assert engine.scheduler_stats == simsim.SchedulerStats(3, 3, 0, 0, 2)

    frame = engine.requests_frame()
    assert frame["request_id"].tolist() == [0, 1, 2]
    assert frame["state"].tolist() == ["FINISHED"] * 3
    assert frame["admit_time_us"].tolist() == [0, 125, 125]
    assert frame["prefill_end_time_us"].tolist() == [125, 283, 283]
    assert frame["first_token_time_us"].tolist() == [302, 302, 302]
    assert frame["finish_time_us"].tolist() == [331, 318, 302]
    assert frame["queue_delay_us"].tolist() == [0, 65, 75]
    assert frame["ttft_us"].tolist() == [302, 242, 252]
    assert frame["e2e_latency_us"].tolist() == [331, 258, 252]
    # tpot: (331 - 302) / 2, (318 - 302) / 1, and NA for a single token
    assert frame["tpot_us"].tolist()[:2] == [14.5, 16.0]
    assert frame["tpot_us"].isna().tolist() == [False, False, True]
    assert str(frame["finish_time_us"].dtype) == "Int64"

    events = engine.events_frame()
    assert events["event_type"].tolist()[:4] == [
        "REQUEST_ARRIVAL",
        "REQUEST_ARRIVAL",
        "REQUEST_ARRIVAL",
        "PREFILL_COMPLETE",
    ]
    assert events["sequence"].tolist() == [r.sequence for r in engine.event_log]
    assert engine.admissions_frame()["request_id"].tolist() == [0, 2, 1]


def test_run_gives_the_same_result_as_stepping() -> None:
    stepped = _engine(*THREE)
    _steps(stepped)
    ran = _engine(*THREE)
    ran.run()
    assert list(ran.event_log) == list(stepped.event_log)
    assert list(ran.admission_log) == list(stepped.admission_log)
    assert list(ran.iteration_log) == list(stepped.iteration_log)
    assert _table(ran) == THREE_TABLE


# --------------------------------------------------------------------------- 2. the token cap


def test_prefill_first_token_cap_stops_admission_and_nobody_overtakes() -> None:
    # max_active_requests=6, max_batch_tokens=30, every output 1 token.
    engine = _engine(
        (0, 0, 8, 1),
        (1, 10, 10, 1),
        (2, 20, 18, 1),
        (3, 30, 40, 1),  # longer than the cap
        (4, 40, 2, 1),  # would fit beside 1 and 2, but must not overtake 3
        (5, 50, 28, 1),
        max_active_requests=6,
        max_batch_tokens=30,
    )
    #   0: admit 0 (epoch 1). [0, 121]: prefill 8 by 1 = 100 + 16 + 5.
    # 10..50: 1..5 arrive during the iteration and queue (epochs 3..7).
    # 121: PF0. Admit 1 (10 tokens, epoch 7), 2 (10 + 18 = 28, epoch 8); 3 would make
    #      68 > 30: admission stops, and 4 (28 + 2 = 30 would fit, a slot is free) waits
    #      behind it. Prefill 28 by 2 = 100 + 56 + 10 = 166 -> 287; 0 decodes nothing.
    # 287: PF1, PF2. Admit 3 alone (40 > 30: a single longer prompt still runs, epoch 9);
    #      4 would make 42 > 30: waits. Prefill 40 by 1 = 100 + 80 + 5 = 185 -> 472.
    # 472: PF3. Admit 4 (2, epoch 10) and 5 (2 + 28 = 30: reaching the cap is allowed,
    #      epoch 11). Prefill 30 by 2 = 170 -> 642.
    # 642: PF4, PF5. Decode 0..5: 10 + 18 = 28 -> 670.
    # 670: DEC + RC for each, in admission order.
    assert _advance(engine, 7) == [0, 10, 20, 30, 40, 50, 121]
    assert engine.active_request_ids == [0, 1, 2]
    assert engine.scheduler.queued_ids() == [3, 4, 5]  # type: ignore[attr-defined]
    assert engine.run_next_timestamp() == 287
    assert engine.active_request_ids == [0, 1, 2, 3]
    assert engine.scheduler.queued_ids() == [4, 5]  # type: ignore[attr-defined]
    assert _steps(engine) == [472, 642, 670, None]

    assert _log(engine) == [
        (0, ARR, 0),
        (10, ARR, 1),
        (20, ARR, 2),
        (30, ARR, 3),
        (40, ARR, 4),
        (50, ARR, 5),
        (121, PF, 0),
        (287, PF, 1),
        (287, PF, 2),
        (472, PF, 3),
        (642, PF, 4),
        (642, PF, 5),
        *[(670, kind, rid) for rid in range(6) for kind in (DEC, RC)],
    ]
    assert _admissions(engine) == [
        (0, 0, 1),
        (121, 1, 7),
        (121, 2, 8),
        (287, 3, 9),
        (472, 4, 10),
        (472, 5, 11),
    ]
    assert _iterations(engine) == [
        (0, 121, 8, 1, 0, False),
        (121, 287, 28, 2, 0, False),
        (287, 472, 40, 1, 0, False),
        (472, 642, 30, 2, 0, False),
        (642, 670, 0, 0, 6, False),
    ]
    assert _launch_state(engine) == [(1, 0), (3, 0), (4, 0), (6, 0), (6, 0)]
    assert {rid: r.first_token_time_us for rid, r in engine.requests.items()} == dict.fromkeys(
        range(6), 670
    )


def test_prefill_first_without_cap_admits_every_head_a_slot_allows() -> None:
    # Same requests without the cap: at 121 all of 1..5 are admitted together:
    # prefill 10 + 18 + 40 + 2 + 28 = 98 tokens by 5 = 100 + 196 + 25 = 321 -> 442;
    # 442: PF1..PF5; decode 6: 28 -> 470.
    engine = _engine(
        (0, 0, 8, 1),
        (1, 10, 10, 1),
        (2, 20, 18, 1),
        (3, 30, 40, 1),
        (4, 40, 2, 1),
        (5, 50, 28, 1),
        max_active_requests=6,
    )
    engine.run()
    assert _iterations(engine) == [
        (0, 121, 8, 1, 0, False),
        (121, 442, 98, 5, 0, False),
        (442, 470, 0, 0, 6, False),
    ]


# --------------------------------------------------------------------------- 3. chunked prefill

# mixed, max_batch_tokens=10, max_active_requests=2.
CHUNKED: tuple[Spec, ...] = ((0, 0, 4, 5), (1, 1, 25, 2))
#   0: admit 0. Budget 10, chunk 4 (its whole prompt): prefill 4 by 1 = 113 -> 113.
#   1: ARR1, waits for the next iteration start.
# 113: PF0 (0 -> DECODING). Admit 1. 0 decodes (budget 10 - 1 = 9), 1 prefills a
#      9-token chunk: prefill(9, 1) + decode(1) = 123 + 13 = 136 -> 249.
# 249: DEC0 (1 token). 1 has 9 of 25. Same shape again: chunk 9 -> 136 -> 385.
# 385: DEC0 (2). 1 has 18 of 25. Last chunk 7: prefill(7, 1) + 13 = 119 + 13 = 132 -> 517.
# 517: DEC0 (3), PF1 (admission order: 0 first). Decode 0, 1: 16 -> 533.
# 533: DEC0 (4), DEC1 (its first token). Decode 0, 1: 16 -> 549.
# 549: DEC0 (5) + RC0, DEC1 (2) + RC1.
CHUNKED_LOG = [
    (0, ARR, 0),
    (1, ARR, 1),
    (113, PF, 0),
    (249, DEC, 0),
    (385, DEC, 0),
    (517, DEC, 0),
    (517, PF, 1),
    (533, DEC, 0),
    (533, DEC, 1),
    (549, DEC, 0),
    (549, RC, 0),
    (549, DEC, 1),
    (549, RC, 1),
]
CHUNKED_ITERATIONS = [
    (0, 113, 4, 1, 0, False),
    (113, 249, 9, 1, 1, False),
    (249, 385, 9, 1, 1, False),
    (385, 517, 7, 1, 1, False),
    (517, 533, 0, 0, 2, False),
    (533, 549, 0, 0, 2, False),
]
CHUNKED_TABLE = {
    0: (S.FINISHED, 5, 0, 113, 249, 549),
    1: (S.FINISHED, 2, 113, 517, 533, 549),
}


def test_mixed_chunked_prefill_over_three_iterations() -> None:
    engine = _engine(*CHUNKED, max_active_requests=2, max_batch_tokens=10, policy="mixed")
    assert _advance(engine, 4) == [0, 1, 113, 249]
    assert engine.requests[1].state is S.PREFILLING  # 9 of 25 prefilled
    assert engine.requests[1].prefill_end_time_us is None
    assert engine.run_next_timestamp() == 385
    assert engine.requests[1].state is S.PREFILLING  # 18 of 25
    assert engine.run_next_timestamp() == 517
    assert engine.requests[1].state is S.DECODING
    assert engine.requests[1].generated_token_count == 0  # first token comes later
    assert engine.requests[1].first_token_time_us is None
    assert _steps(engine) == [533, 549, None]
    assert _log(engine) == CHUNKED_LOG
    assert _iterations(engine) == CHUNKED_ITERATIONS
    assert _table(engine) == CHUNKED_TABLE
    assert _admissions(engine) == [(0, 0, 1), (113, 1, 3)]
    # the decode tokens plus the prefill chunk never pass the budget
    assert all(p + d <= 10 for _, _, p, _, d, _ in _iterations(engine))


def test_mixed_zero_token_prompt_runs_without_budget_and_others_sit_out() -> None:
    # mixed, max_batch_tokens=4, max_active_requests=3; all three arrive at 0.
    engine = _engine(
        (0, 0, 10, 1),
        (1, 0, 0, 1),  # zero-token prompt
        (2, 0, 5, 1),
        max_batch_tokens=4,
        policy="mixed",
    )
    #   0: admit 0, 1, 2 (epochs 3, 4, 5). Budget 4: 0 takes a 4-token chunk (budget 0);
    #      1 has nothing left to prefill, so it takes part with 0 tokens; 2 has 5 left and
    #      no budget: it sits out. prefill(4, 2) = 100 + 8 + 10 = 118 -> 118.
    # 118: PF1 (0 tokens). 1 decodes (budget 3); 0 takes 3 (7 of 10); 2 sits out.
    #      prefill(3, 1) + decode(1) = 111 + 13 = 124 -> 242.
    # 242: DEC1 + RC1. 0 takes 3 (10 of 10, budget 1), 2 takes 1:
    #      prefill(4, 2) = 118 -> 360.
    # 360: PF0. 0 decodes (budget 3), 2 takes 3 (4 of 5): 111 + 13 = 124 -> 484.
    # 484: DEC0 + RC0. 2 takes 1 (5 of 5): prefill(1, 1) = 107 -> 591.
    # 591: PF2. Decode 2: 13 -> 604.
    # 604: DEC2 + RC2.
    engine.run()
    assert _iterations(engine) == [
        (0, 118, 4, 2, 0, False),
        (118, 242, 3, 1, 1, False),
        (242, 360, 4, 2, 0, False),
        (360, 484, 3, 1, 1, False),
        (484, 591, 1, 1, 0, False),
        (591, 604, 0, 0, 1, False),
    ]
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (0, ARR, 2),
        (118, PF, 1),
        (242, DEC, 1),
        (242, RC, 1),
        (360, PF, 0),
        (484, DEC, 0),
        (484, RC, 0),
        (591, PF, 2),
        (604, DEC, 2),
        (604, RC, 2),
    ]
    assert _admissions(engine) == [(0, 0, 3), (0, 1, 4), (0, 2, 5)]
    assert _table(engine) == {
        0: (S.FINISHED, 1, 0, 360, 484, 484),
        1: (S.FINISHED, 1, 0, 118, 242, 242),
        2: (S.FINISHED, 1, 0, 591, 604, 604),
    }


def test_prefill_first_zero_output_request_completes_with_its_prefill() -> None:
    # max_active_requests=2: 0 (prompt 6, no output) and 1 (prompt 0, 1 token) at 0.
    #   0: admit both: prefill 6 tokens by 2 = 100 + 12 + 10 = 122 -> 122.
    # 122: PF0 + RC0 (no first token, ever), PF1 (0 tokens). Decode 1: 13 -> 135.
    # 135: DEC1 + RC1.
    engine = _engine((0, 0, 6, 0), (1, 0, 0, 1), max_active_requests=2)
    engine.run()
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (122, PF, 0),
        (122, RC, 0),
        (122, PF, 1),
        (135, DEC, 1),
        (135, RC, 1),
    ]
    assert _iterations(engine) == [(0, 122, 6, 2, 0, False), (122, 135, 0, 0, 1, False)]
    assert _table(engine) == {
        0: (S.FINISHED, 0, 0, 122, None, 122),
        1: (S.FINISHED, 1, 0, 122, 135, 135),
    }


# --------------------------------------------------------------------------- 4. KV cache

# KvCacheConfig(block_size_tokens=4, total_blocks=3), prefill_first, 2 slots.
PREEMPT: tuple[Spec, ...] = (
    (0, 0, 3, 3),  # admission: ceil((3 + 1) / 4) = 1 block; at most 6 tokens = 2 blocks
    (1, 0, 4, 2),  # admission: ceil((4 + 1) / 4) = 2 blocks; at most 6 tokens = 2 blocks
)
#   0: admit 0 (epoch 2), 1 (epoch 3): 1 + 2 = 3 blocks, 0 free.
#      Prefill 7 tokens by 2 = 100 + 14 + 10 = 124 -> 124.
# 124: PF0, PF1. Step (2): 0 needs ceil((3 + 0 + 1) / 4) = 1 (has 1); 1 needs
#      ceil((4 + 0 + 1) / 4) = 2 (has 2). Decode 2: 16 -> 140.
# 140: DEC0, DEC1 (first tokens). Step (2): 0 needs ceil((3 + 1 + 1) / 4) = 2, has 1, no
#      block free -> the most recently admitted request, 1, is preempted (logged at 140,
#      2 blocks freed, queued again: epoch 4 -> 5); 0 takes one (1 free). Step (3): 1
#      needs ceil((4 + 1 + 1) / 4) = 2 blocks for prompt + recomputed token + next token,
#      only 1 free: it waits. Decode 0: 13 -> 153.
# 153: DEC0 (2 tokens). 0 needs ceil((3 + 2 + 1) / 4) = 2, has 2. 1 still waits. -> 166.
# 166: DEC0 (3) + RC0: 2 blocks freed, 3 free. Admit 1 (epoch 5), 2 blocks.
#      Recompute: prefill 4 + 1 = 5 tokens by 1 = 115 -> 281.
# 281: PF1 again (1 -> DECODING). 1 needs ceil((5 + 0 + 1) / 4) = 2, has 2. -> 294.
# 294: DEC1 (its 2nd token) + RC1.
PREEMPT_LOG = [
    (0, ARR, 0),
    (0, ARR, 1),
    (124, PF, 0),
    (124, PF, 1),
    (140, DEC, 0),
    (140, DEC, 1),
    (140, PRE, 1),
    (153, DEC, 0),
    (166, DEC, 0),
    (166, RC, 0),
    (281, PF, 1),
    (294, DEC, 1),
    (294, RC, 1),
]


def test_preemption_of_the_most_recent_admission_and_readmission_with_recompute() -> None:
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=3)
    engine = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache)
    assert engine.kv_cache == cache
    assert engine.run_next_timestamp() == 0
    assert engine.kv_blocks_in_use == 3
    assert engine.run_next_timestamp() == 124
    assert engine.run_next_timestamp() == 140
    one = engine.requests[1]
    assert one.state is S.PREEMPTED
    assert one.generated_token_count == 1
    assert (one.admit_time_us, one.prefill_end_time_us, one.first_token_time_us) == (0, 124, 140)
    assert one.finish_time_us is None
    assert engine.active_request_ids == [0]
    assert engine.kv_blocks_in_use == 2
    assert engine.scheduler.queued_ids() == [1]  # type: ignore[attr-defined]
    assert len(engine.scheduler) == 1

    assert engine.run_next_timestamp() == 153
    assert engine.requests[1].state is S.PREEMPTED  # still waiting for memory
    assert engine.kv_blocks_in_use == 2
    assert engine.run_next_timestamp() == 166
    assert engine.requests[1].state is S.PREFILLING  # readmitted, recomputing
    assert engine.active_request_ids == [1]
    assert engine.kv_blocks_in_use == 2
    assert engine.run_next_timestamp() == 281
    assert engine.requests[1].state is S.DECODING
    assert engine.kv_blocks_in_use == 2
    assert _steps(engine) == [294, None]

    assert _log(engine) == PREEMPT_LOG
    assert _table(engine) == {
        0: (S.FINISHED, 3, 0, 124, 140, 166),
        # admit and first token kept from the first admission; prefill end updated
        1: (S.FINISHED, 2, 0, 281, 140, 294),
    }
    assert _admissions(engine) == [(0, 0, 2), (0, 1, 3), (166, 1, 5)]
    assert _iterations(engine) == [
        (0, 124, 7, 2, 0, False),
        (124, 140, 0, 0, 2, False),
        (140, 153, 0, 0, 1, False),
        (153, 166, 0, 0, 1, False),
        (166, 281, 5, 1, 0, False),
        (281, 294, 0, 0, 1, False),
    ]
    assert _launch_state(engine) == [(2, 3), (2, 3), (1, 2), (1, 2), (1, 2), (1, 2)]
    assert max(it.kv_blocks_in_use for it in engine.iteration_log) <= cache.total_blocks
    assert engine.kv_blocks_in_use == 0
    # the preemption re-enqueued request 1 with its original arrival time
    assert engine.scheduler_stats == simsim.SchedulerStats(3, 3, 0, 0, 2)


def test_preemption_can_hit_the_request_asking_for_the_block() -> None:
    # KvCacheConfig(4, 3), 2 slots. 0: prompt 4, 4 tokens (admission ceil(5/4) = 2 blocks);
    # 1: prompt 3, 4 tokens (admission ceil(4/4) = 1 block). 0 free after admission.
    #   0: prefill 7 by 2 = 124 -> 124.  124: PF0, PF1; decode 2 = 16 -> 140.
    # 140: DEC0, DEC1. 0 needs ceil(6/4) = 2 (has 2). 1 needs ceil((3 + 1 + 1)/4) = 2, has 1,
    #      none free: the most recent admission is 1 itself -> preempted. Readmission needs
    #      ceil((3 + 1 + 1) / 4) = 2 blocks, 1 free: waits. Decode 0: 13 -> 153, 166, 179.
    # 179: DEC0 (4) + RC0. Admit 1: prefill 4 by 1 = 113 -> 292.
    # 292: PF1; decode 13 -> 305, 318, 331: DEC1 at each, RC1 at 331.
    cache = simsim.KvCacheConfig(4, 3)
    engine = _engine((0, 0, 4, 4), (1, 0, 3, 4), max_active_requests=2, kv_cache=cache)
    engine.run()
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (124, PF, 0),
        (124, PF, 1),
        (140, DEC, 0),
        (140, DEC, 1),
        (140, PRE, 1),
        (153, DEC, 0),
        (166, DEC, 0),
        (179, DEC, 0),
        (179, RC, 0),
        (292, PF, 1),
        (305, DEC, 1),
        (318, DEC, 1),
        (331, DEC, 1),
        (331, RC, 1),
    ]
    assert _table(engine)[1] == (S.FINISHED, 4, 0, 292, 140, 331)
    assert _admissions(engine) == [(0, 0, 2), (0, 1, 3), (179, 1, 5)]
    assert [it.kv_blocks_in_use for it in engine.iteration_log] == [3, 3, 2, 2, 2, 2, 2, 2, 2]
    assert engine.kv_blocks_in_use == 0


def test_preempting_a_request_in_the_middle_of_its_chunked_prefill() -> None:
    # mixed, max_batch_tokens=4, 2 slots, KvCacheConfig(block_size_tokens=2, total_blocks=5).
    # 0: prompt 1, 4 tokens -> ceil((1 + 1) / 2) = 1 block (at most 5 tokens = 3 blocks).
    # 1: prompt 7, no output -> ceil(7 / 2) = 4 blocks. 0 free after both are admitted.
    #   0: admit 0 (epoch 2), 1 (epoch 3). Budget 4: 0 takes 1, 1 takes 3 (3 of 7).
    #      prefill(4, 2) = 100 + 8 + 10 = 118 -> 118.
    # 118: PF0. 0 needs ceil((1 + 0 + 1) / 2) = 1 (has 1). 0 decodes (budget 3), 1 takes 3
    #      (6 of 7): prefill(3, 1) + decode(1) = 111 + 13 = 124 -> 242.
    # 242: DEC0. 0 needs ceil((1 + 1 + 1) / 2) = 2, has 1, none free: 1 (the most recent
    #      admission, still PREFILLING) is preempted: its 4 blocks and its 6 prefilled
    #      tokens are dropped (epoch 5). 0 takes a block (3 free). 1 needs 4: waits.
    #      Decode 0: 13 -> 255.
    # 255: DEC0 (2 tokens); needs ceil(4/2) = 2, has 2. -> 268.
    # 268: DEC0 (3); needs ceil(5/2) = 3: takes one (2 free). -> 281.
    # 281: DEC0 (4) + RC0; 5 free. Admit 1 (epoch 5, 4 blocks), prefilling from scratch:
    #      chunk 4: prefill(4, 1) = 113 -> 394; chunk 3: prefill(3, 1) = 111 -> 505.
    # 505: PF1 + RC1 (its only PREFILL_COMPLETE).
    cache = simsim.KvCacheConfig(block_size_tokens=2, total_blocks=5)
    engine = _engine(
        (0, 0, 1, 4),
        (1, 0, 7, 0),
        max_active_requests=2,
        max_batch_tokens=4,
        policy="mixed",
        kv_cache=cache,
    )
    assert _advance(engine, 3) == [0, 118, 242]
    assert engine.requests[1].state is S.PREEMPTED
    assert engine.requests[1].admit_time_us == 0
    assert engine.kv_blocks_in_use == 2
    assert _steps(engine) == [255, 268, 281, 394, 505, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (118, PF, 0),
        (242, DEC, 0),
        (242, PRE, 1),
        (255, DEC, 0),
        (268, DEC, 0),
        (281, DEC, 0),
        (281, RC, 0),
        (505, PF, 1),
        (505, RC, 1),
    ]
    assert _iterations(engine) == [
        (0, 118, 4, 2, 0, False),
        (118, 242, 3, 1, 1, False),
        (242, 255, 0, 0, 1, False),
        (255, 268, 0, 0, 1, False),
        (268, 281, 0, 0, 1, False),
        (281, 394, 4, 1, 0, False),
        (394, 505, 3, 1, 0, False),
    ]
    assert _launch_state(engine) == [(2, 5), (2, 5), (1, 2), (1, 2), (1, 3), (1, 4), (1, 4)]
    assert _admissions(engine) == [(0, 0, 2), (0, 1, 3), (281, 1, 5)]
    assert _table(engine) == {
        0: (S.FINISHED, 4, 0, 118, 242, 281),
        1: (S.FINISHED, 0, 0, 505, None, 505),
    }
    assert engine.kv_blocks_in_use == 0


def test_a_decoder_keeps_the_block_it_reserved_in_a_prefill_iteration() -> None:
    # prefill_first, 2 slots, KvCacheConfig(block_size_tokens=2, total_blocks=10).
    # 0: prompt 2, 3 tokens -> ceil((2 + 1) / 2) = 2 blocks. 1: prompt 2, 1 token -> 2.
    #   0: prefill 2 by 1 = 109 -> 109.  109: PF0; needs ceil(3/2) = 2 (has 2); 13 -> 122.
    # 122: DEC0 (1); needs ceil(4/2) = 2; 13 -> 135.  1 arrives at 130.
    # 135: DEC0 (2); step (2): needs ceil((2 + 2 + 1) / 2) = 3, takes a 3rd block; step
    #      (3): admit 1 (2 blocks): 5 in use. A prefill iteration: prefill 2 by 1 = 109
    #      -> 244, 0 decodes nothing but keeps its block.
    # 244: PF1; 0 needs 3 (has 3), 1 needs ceil(3/2) = 2 (has 2). Decode 2: 16 -> 260.
    # 260: DEC0 (3) + RC0, DEC1 + RC1.
    cache = simsim.KvCacheConfig(block_size_tokens=2, total_blocks=10)
    engine = _engine((0, 0, 2, 3), (1, 130, 2, 1), max_active_requests=2, kv_cache=cache)
    assert _steps(engine) == [0, 109, 122, 130, 135, 244, 260, None]
    assert _iterations(engine) == [
        (0, 109, 2, 1, 0, False),
        (109, 122, 0, 0, 1, False),
        (122, 135, 0, 0, 1, False),
        (135, 244, 2, 1, 0, False),
        (244, 260, 0, 0, 2, False),
    ]
    assert _launch_state(engine) == [(1, 2), (1, 2), (1, 2), (2, 5), (2, 5)]
    assert _table(engine)[0] == (S.FINISHED, 3, 0, 109, 122, 260)


def test_admission_needs_memory_and_a_head_that_does_not_fit_blocks_the_queue() -> None:
    # KvCacheConfig(4, 3), 3 slots, all arrive at 0.
    #   0: prompt 7, 1 token -> ceil(8/4) = 2 blocks; 1 free.
    #   1: prompt 8, no output -> ceil(8/4) = 2 blocks (no block for an output it will
    #      never produce): does not fit in 1 -> admission stops.
    #   2: prompt 3, no output -> 1 block: would fit, but nobody overtakes 1.
    #   0: admit 0: prefill 7 by 1 = 119 -> 119.
    # 119: PF0; 0 needs ceil((7 + 0 + 1)/4) = 2 (has 2); 1 still does not fit. Decode 13 -> 132.
    # 132: DEC0 + RC0: 3 free. Admit 1 (2), 2 (1): 3 blocks, all of them.
    #      Prefill 11 by 2 = 100 + 22 + 10 = 132 -> 264.
    # 264: PF1 + RC1, PF2 + RC2.
    cache = simsim.KvCacheConfig(4, 3)
    engine = _engine((0, 0, 7, 1), (1, 0, 8, 0), (2, 0, 3, 0), kv_cache=cache)
    assert engine.run_next_timestamp() == 0
    assert engine.active_request_ids == [0]
    assert engine.kv_blocks_in_use == 2
    assert _steps(engine) == [119, 132, 264, None]
    assert _admissions(engine) == [(0, 0, 3), (132, 1, 4), (132, 2, 5)]
    assert _iterations(engine) == [
        (0, 119, 7, 1, 0, False),
        (119, 132, 0, 0, 1, False),
        (132, 264, 11, 2, 0, False),
    ]
    assert _launch_state(engine) == [(1, 2), (1, 2), (2, 3)]
    assert _log(engine)[-4:] == [(264, PF, 1), (264, RC, 1), (264, PF, 2), (264, RC, 2)]


def test_chunked_prefill_holds_its_blocks_from_admission() -> None:
    # mixed, max_batch_tokens=4, 1 slot, KvCacheConfig(4, 4): prompt 10 + 1 token ->
    # ceil(11/4) = 3 blocks at admission, although only 4 tokens are prefilled at first.
    #   0: chunk 4: prefill(4, 1) = 113 -> 113;  113: chunk 4 -> 226;  226: chunk 2:
    #      prefill(2, 1) = 109 -> 335.  335: PF0; needs ceil(11/4) = 3 (has 3); 13 -> 348.
    cache = simsim.KvCacheConfig(4, 4)
    engine = _engine(
        (0, 0, 10, 1),
        max_active_requests=1,
        max_batch_tokens=4,
        policy="mixed",
        kv_cache=cache,
    )
    engine.run()
    assert _iterations(engine) == [
        (0, 113, 4, 1, 0, False),
        (113, 226, 4, 1, 0, False),
        (226, 335, 2, 1, 0, False),
        (335, 348, 0, 0, 1, False),
    ]
    assert _launch_state(engine) == [(1, 3)] * 4
    assert _log(engine) == [(0, ARR, 0), (335, PF, 0), (348, DEC, 0), (348, RC, 0)]


# --------------------------------------------------------------------------- 5. cancellation


def test_cancel_before_arrival() -> None:
    engine = _engine((0, 100, 4, 1), (1, 0, 4, 1), max_active_requests=2)
    engine.cancel_request(0)
    assert _table(engine)[0] == (S.CANCELLED, 0, None, None, None, 0)
    #   0: ARR1, admit 1: prefill 4 by 1 = 113 -> 113.
    # 100: request 0's arrival is consumed without effect (the clock stops there).
    # 113: PF1; 13 -> 126: DEC1 + RC1.
    assert _steps(engine) == [0, 100, 113, 126, None]
    assert _log(engine) == [(0, ARR, 1), (113, PF, 1), (126, DEC, 1), (126, RC, 1)]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 4  # 2 arrivals (1 ignored) + 2 iteration ends
    assert _admissions(engine) == [(0, 1, 1)]
    assert engine.scheduler_stats.enqueued == 1


def test_cancel_queued_request() -> None:
    # 1 slot: 0 runs [0, 113] (prefill 4 by 1); 1 arrives at 50 and queues behind it.
    engine = _engine((0, 0, 4, 1), (1, 50, 4, 1), max_active_requests=1)
    assert _advance(engine, 2) == [0, 50]
    engine.cancel_request(1)
    assert _table(engine)[1] == (S.CANCELLED, 0, None, None, None, 50)
    assert len(engine.scheduler) == 0
    # 113: PF0; 126: DEC0 + RC0. Nobody else.
    assert _steps(engine) == [113, 126, None]
    assert _log(engine) == [(0, ARR, 0), (50, ARR, 1), (113, PF, 0), (126, DEC, 0), (126, RC, 0)]
    assert engine.scheduler_stats == simsim.SchedulerStats(2, 1, 1, 0, 1)
    assert engine.ignored_cancelled_event_count == 0
    assert engine.processed_event_count == 4


def test_cancel_preempted_request_while_queued() -> None:
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=3)
    engine = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache)
    assert _advance(engine, 3) == [0, 124, 140]  # 1 preempted at 140 (see PREEMPT)
    assert engine.requests[1].state is S.PREEMPTED
    engine.cancel_request(1)
    # it keeps the token and the timestamps it had; finish = now
    assert _table(engine)[1] == (S.CANCELLED, 1, 0, 124, 140, 140)
    assert len(engine.scheduler) == 0
    assert engine.scheduler_stats.removed == 1
    # 0 goes on alone: 153 DEC0, 166 DEC0 + RC0.
    assert _steps(engine) == [153, 166, None]
    assert _log(engine) == PREEMPT_LOG[:10]  # up to RC0 at 166
    assert _admissions(engine) == [(0, 0, 2), (0, 1, 3)]
    assert len(engine.iteration_log) == 4
    assert engine.ignored_cancelled_event_count == 0
    assert engine.processed_event_count == 6  # 2 arrivals + 4 iteration ends
    with pytest.raises(simsim.InvalidTransitionError, match="request 1"):
        engine.cancel_request(1)


def test_cancel_prefilling_request_mid_iteration() -> None:
    # 2 slots. 0 and 1 are admitted at 0: prefill 30 by 2 = 100 + 60 + 10 = 170 -> 170.
    # 2 arrives at 50 (both slots taken) and queues; 1 is cancelled at 50.
    engine = _engine((0, 0, 10, 2), (1, 0, 20, 2), (2, 50, 6, 1), max_active_requests=2)
    assert _advance(engine, 2) == [0, 50]
    engine.cancel_request(1)
    assert _table(engine)[1] == (S.CANCELLED, 0, 0, None, None, 50)
    assert engine.active_request_ids == [0]
    assert engine.admission_log[-1].request_id == 1  # 2 waits for the next iteration start
    # 170: the iteration ends as planned; only PF0 (1's share is ignored). Admit 2:
    #      prefill 6 by 1 = 117 -> 287 (0 waits). 287: PF2; decode 0, 2: 16 -> 303.
    # 303: DEC0, DEC2 + RC2; decode 0: 13 -> 316. 316: DEC0 + RC0.
    assert _steps(engine) == [170, 287, 303, 316, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (50, ARR, 2),
        (170, PF, 0),
        (287, PF, 2),
        (303, DEC, 0),
        (303, DEC, 2),
        (303, RC, 2),
        (316, DEC, 0),
        (316, RC, 0),
    ]
    assert _iterations(engine) == [
        (0, 170, 30, 2, 0, False),  # counts as launched
        (170, 287, 6, 1, 0, False),
        (287, 303, 0, 0, 2, False),
        (303, 316, 0, 0, 1, False),
    ]
    assert _admissions(engine)[-1] == (170, 2, 5)
    assert _table(engine)[1] == (S.CANCELLED, 0, 0, None, None, 50)
    assert engine.ignored_cancelled_event_count == 0
    assert engine.processed_event_count == 7  # 3 arrivals + 4 iteration ends


def test_cancel_decoding_request_mid_iteration() -> None:
    # 2 slots. 0 and 1 at 0: prefill 30 by 2 = 170 -> 170. 170: PF0, PF1; decode 2 -> 186.
    # 186: DEC0, DEC1 (1 token each); decode 2 -> 202. 2 arrives at 190; 1 is cancelled.
    engine = _engine((0, 0, 10, 3), (1, 0, 20, 3), (2, 190, 6, 1), max_active_requests=2)
    assert [engine.run_next_timestamp() for _ in range(4)] == [0, 170, 186, 190]
    assert engine.requests[1].state is S.DECODING
    engine.cancel_request(1)
    assert _table(engine)[1] == (S.CANCELLED, 1, 0, 170, 186, 190)
    # 202: as planned; DEC0 only (1's token is not counted). Admit 2: prefill 6 by 1 = 117
    #      -> 319 (0 waits). 319: PF2; decode 2 -> 335. 335: DEC0 + RC0, DEC2 + RC2.
    assert _steps(engine) == [202, 319, 335, None]
    assert _log(engine) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (170, PF, 0),
        (170, PF, 1),
        (186, DEC, 0),
        (186, DEC, 1),
        (190, ARR, 2),
        (202, DEC, 0),
        (319, PF, 2),
        (335, DEC, 0),
        (335, RC, 0),
        (335, DEC, 2),
        (335, RC, 2),
    ]
    assert _iterations(engine) == [
        (0, 170, 30, 2, 0, False),
        (170, 186, 0, 0, 2, False),
        (186, 202, 0, 0, 2, False),  # as launched: two decoders
        (202, 319, 6, 1, 0, False),
        (319, 335, 0, 0, 2, False),
    ]
    assert _table(engine)[1] == (S.CANCELLED, 1, 0, 170, 186, 190)
    assert engine.requests[0].generated_token_count == 3


def test_cancel_mid_iteration_frees_blocks_at_once() -> None:
    # PREEMPT with 1 cancelled at 130, during the decode iteration [124, 140]: its 2
    # blocks are free at once, so at 140 request 0 gets its block without preempting.
    # 140: DEC0 only; 0 needs 2 (has 1, 2 free). 153: DEC0. 166: DEC0 + RC0.
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=3)
    engine = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache)
    engine.env.run(until=130)
    assert engine.now_us == 130
    assert engine.requests[1].state is S.DECODING
    engine.cancel_request(1)
    assert engine.kv_blocks_in_use == 1
    assert engine.active_request_ids == [0]
    engine.run()
    assert _log(engine) == [
        *PREEMPT_LOG[:4],
        (140, DEC, 0),
        (153, DEC, 0),
        (166, DEC, 0),
        (166, RC, 0),
    ]
    assert _launch_state(engine) == [(2, 3), (2, 3), (1, 2), (1, 2)]
    assert _table(engine)[1] == (S.CANCELLED, 0, 0, 124, None, 130)


def test_cancel_emptying_the_batch_abandons_the_iteration_and_admits_at_once() -> None:
    # 1 slot. 0 (prompt 10, 5 tokens) runs [0, 125]; 1 arrives at 30 and queues.
    engine = _engine((0, 0, 10, 5), (1, 30, 4, 1), max_active_requests=1)
    assert _advance(engine, 2) == [0, 30]
    engine.cancel_request(0)
    # abandoned: its row is written now, with the planned end 125
    assert list(engine.iteration_log) == [simsim.IterationRecord(0, 125, 10, 1, 0, True, 1, 0)]
    # nothing else is pending at 30: 1 is admitted at once, at 30, clock unmoved
    assert engine.now_us == 30
    assert _admissions(engine) == [(0, 0, 1), (30, 1, 3)]
    assert engine.requests[1].state is S.PREFILLING
    assert engine.requests[1].admit_time_us == 30
    # 1: prefill 4 by 1 = 113 -> 143. 125: the abandoned end is consumed silently.
    # 143: PF1; 13 -> 156: DEC1 + RC1.
    assert engine.run_next_timestamp() == 125
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 3
    assert _steps(engine) == [143, 156, None]
    assert _log(engine) == [(0, ARR, 0), (30, ARR, 1), (143, PF, 1), (156, DEC, 1), (156, RC, 1)]
    assert _iterations(engine) == [
        (0, 125, 10, 1, 0, True),
        (30, 143, 4, 1, 0, False),
        (143, 156, 0, 0, 1, False),
    ]
    assert _table(engine) == {
        0: (S.CANCELLED, 0, 0, None, None, 30),
        1: (S.FINISHED, 1, 30, 143, 156, 156),
    }
    assert engine.ignored_cancelled_event_count == 1  # counted once
    assert engine.processed_event_count == 5  # 2 arrivals + abandoned end + 2 ends
    frame = engine.iterations_frame()
    assert frame["abandoned"].tolist() == [True, False, False]
    assert str(frame["abandoned"].dtype) == "bool"


def test_cancel_emptying_the_batch_with_nothing_queued() -> None:
    # 0 alone, cancelled at 40 (a foreign-free pause via run(until=40)); nothing to admit.
    engine = _engine((0, 0, 10, 5))
    engine.env.run(until=40)
    engine.cancel_request(0)
    assert list(engine.iteration_log) == [simsim.IterationRecord(0, 125, 10, 1, 0, True, 1, 0)]
    assert engine.has_pending_events  # the abandoned end, still in the heap
    assert _steps(engine) == [125, None]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 2
    assert list(engine.admission_log) == [simsim.AdmissionRecord(0, 0, 1)]
    assert _log(engine) == [(0, ARR, 0)]


def test_cancel_emptying_the_batch_waits_when_an_event_is_pending_now() -> None:
    # 2 slots. 0 runs [0, 125]; 1 arrives at 30. At 30 a new request 2 is submitted for
    # 30 and 0 is cancelled: the iteration is abandoned, but 2's arrival is pending at 30,
    # so admission waits for the next run_next_timestamp(), which processes ARR2 and then
    # admits 1 and 2 at 30 (epochs 4, 5): prefill 10 by 2 = 130 -> 160.
    # 125: abandoned end. 160: PF1, PF2; decode 2: 16 -> 176: DEC1 + RC1, DEC2 + RC2.
    engine = _engine((0, 0, 10, 5), (1, 30, 4, 1), max_active_requests=2)
    assert _advance(engine, 2) == [0, 30]
    engine.submit(simsim.Request(2, 30, 6, 1))
    engine.cancel_request(0)
    assert _admissions(engine) == [(0, 0, 1)]
    assert engine.iteration_log[-1].abandoned is True
    assert engine.run_next_timestamp() == 30
    assert _admissions(engine) == [(0, 0, 1), (30, 1, 4), (30, 2, 5)]
    assert _steps(engine) == [125, 160, 176, None]
    assert _iterations(engine) == [
        (0, 125, 10, 1, 0, True),
        (30, 160, 10, 2, 0, False),
        (160, 176, 0, 0, 2, False),
    ]
    assert _log(engine) == [
        (0, ARR, 0),
        (30, ARR, 1),
        (30, ARR, 2),
        (160, PF, 1),
        (160, PF, 2),
        (176, DEC, 1),
        (176, RC, 1),
        (176, DEC, 2),
        (176, RC, 2),
    ]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 6  # 3 arrivals + 1 abandoned + 2 ends


def test_cancel_emptying_the_batch_waits_for_its_own_zero_cost_iteration_end() -> None:
    # All costs 0, 1 slot, 0 and 1 arrive at 0. The first call admits 0 at the end of 0
    # and launches [0, 0]. Cancelling 0 abandons it, but its end event is pending at 0,
    # so 1 is admitted by the next call (epoch 3), after that end is consumed silently.
    engine = _engine(
        (0, 0, 4, 1),
        (1, 0, 4, 1),
        backend=simsim.SimulatedBackend(simsim.SimulatedBackendConfig()),
        max_active_requests=1,
    )
    assert engine.run_next_timestamp() == 0
    engine.cancel_request(0)
    assert _admissions(engine) == [(0, 0, 2)]
    assert list(engine.iteration_log) == [simsim.IterationRecord(0, 0, 4, 1, 0, True, 1, 0)]
    assert engine.run_next_timestamp() == 0
    assert _admissions(engine) == [(0, 0, 2), (0, 1, 3)]
    assert engine.ignored_cancelled_event_count == 1
    assert _steps(engine) == [0, 0, None]  # PF1, then DEC1 + RC1, all at 0
    assert _log(engine) == [(0, ARR, 0), (0, ARR, 1), (0, PF, 1), (0, DEC, 1), (0, RC, 1)]
    assert _iterations(engine) == [
        (0, 0, 4, 1, 0, True),
        (0, 0, 4, 1, 0, False),
        (0, 0, 0, 0, 1, False),
    ]
    assert engine.processed_event_count == 5


def _cancel_at(env: simsim.Environment, engine: simsim.BatchingEngine, at: int, rid: int) -> Any:
    def process() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        engine.cancel_request(rid)

    return env.process(process())


def test_cancel_from_inside_a_process_admits_at_the_end_of_the_timestamp() -> None:
    # 1 slot. 0 (prompt 10) runs [0, 125]; 1 (prompt 4, 1 token) arrives at 20 and
    # queues. A process cancels 0 at 30: the iteration is abandoned and 1 is admitted at
    # the end of 30 (epoch 3): prefill 4 by 1 = 113 -> 143; 125: abandoned end;
    # 143: PF1; 156: DEC1 + RC1.
    env = simsim.Environment()
    engine = _engine((0, 0, 10, 5), (1, 20, 4, 1), max_active_requests=1, env=env)
    _cancel_at(env, engine, 30, 0)
    assert _advance(engine, 3) == [0, 20, 30]
    assert _admissions(engine) == [(0, 0, 1), (30, 1, 3)]
    assert engine.requests[0].finish_time_us == 30
    assert _steps(engine) == [125, 143, 156, None]
    assert _iterations(engine) == [
        (0, 125, 10, 1, 0, True),
        (30, 143, 4, 1, 0, False),
        (143, 156, 0, 0, 1, False),
    ]
    assert _log(engine) == [(0, ARR, 0), (20, ARR, 1), (143, PF, 1), (156, DEC, 1), (156, RC, 1)]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == 5  # the process's timeout is not counted


def _decoding_pair(env: simsim.Environment) -> simsim.BatchingEngine:
    # The decode-cancellation workload: 0 and 1 decode in [186, 202]; 2 arrives at 190.
    return _engine((0, 0, 10, 3), (1, 0, 20, 3), (2, 190, 6, 1), max_active_requests=2, env=env)


def test_cancel_inside_the_simulation_before_the_iteration_end_at_the_same_time() -> None:
    # The process's timeout for 202 is scheduled at 0, before the iteration [186, 202]
    # is launched at 186: at 202 the cancellation comes first, so 1's share of the
    # iteration is ignored (no DEC1 at 202). 2 is admitted at the end of 202 as before:
    # 319 PF2, 335 DEC0 + RC0, DEC2 + RC2.
    env = simsim.Environment()
    engine = _decoding_pair(env)
    _cancel_at(env, engine, 202, 1)
    engine.run()
    assert _table(engine)[1] == (S.CANCELLED, 1, 0, 170, 186, 202)
    assert _log(engine)[6:9] == [(190, ARR, 2), (202, DEC, 0), (319, PF, 2)]
    assert engine.iteration_log[2].decoding_count == 2  # as launched
    assert engine.iteration_log[2].abandoned is False
    assert engine.ignored_cancelled_event_count == 0


def test_cancel_inside_the_simulation_after_the_iteration_end_at_the_same_time() -> None:
    # The process waits until 190 and then 12 more: its timeout for 202 is scheduled at
    # 190, after the iteration's end event (186). At 202 the iteration ends first: DEC0
    # and DEC1 stand (1 has 2 tokens); then 1 is cancelled, before the boundary of 202,
    # which admits 2: prefill 6 by 1 = 117 -> 319; 335 DEC0 + RC0, DEC2 + RC2.
    env = simsim.Environment()
    engine = _decoding_pair(env)

    def process() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(190)
        yield env.timeout(12)
        engine.cancel_request(1)

    env.process(process())
    engine.run()
    assert _table(engine) == {
        0: (S.FINISHED, 3, 0, 170, 186, 335),
        1: (S.CANCELLED, 2, 0, 170, 186, 202),
        2: (S.FINISHED, 1, 202, 319, 335, 335),
    }
    assert _log(engine)[6:10] == [(190, ARR, 2), (202, DEC, 0), (202, DEC, 1), (319, PF, 2)]
    assert _admissions(engine)[-1][:2] == (202, 2)
    assert engine.ignored_cancelled_event_count == 0


def test_cancel_errors_change_nothing() -> None:
    engine = _engine(*THREE)
    engine.run()
    before = (list(engine.event_log), _table(engine), engine.scheduler_stats)
    with pytest.raises(simsim.InvalidTransitionError, match="request 0"):
        engine.cancel_request(0)  # FINISHED
    with pytest.raises(simsim.UnknownRequestError, match="request 9"):
        engine.cancel_request(9)
    assert (list(engine.event_log), _table(engine), engine.scheduler_stats) == before
    assert engine.failed is False


# --------------------------------------------------------------------------- 6. validation


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_active_requests": 0}, ValueError),
        ({"max_active_requests": -2}, ValueError),
        ({"max_active_requests": 1.5}, TypeError),
        ({"max_active_requests": 2.0}, TypeError),
        ({"max_active_requests": True}, TypeError),
        ({"max_active_requests": "2"}, TypeError),
        ({"max_active_requests": None}, TypeError),
        ({"max_active_requests": 2, "max_batch_tokens": 0}, ValueError),
        ({"max_active_requests": 2, "max_batch_tokens": -8}, ValueError),
        ({"max_active_requests": 2, "max_batch_tokens": 8.0}, TypeError),
        ({"max_active_requests": 2, "max_batch_tokens": False}, TypeError),
        ({"max_active_requests": 4, "max_batch_tokens": 3}, ValueError),
        ({"max_active_requests": 2, "policy": "fcfs"}, ValueError),
        ({"max_active_requests": 2, "policy": "MIXED", "max_batch_tokens": 8}, ValueError),
        ({"max_active_requests": 2, "policy": "mixed"}, ValueError),
        ({"max_active_requests": 2, "env": simpy.Environment()}, TypeError),
        ({"max_active_requests": 2, "kv_cache": (4, 8)}, TypeError),
    ],
)
def test_constructor_rejects(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), **kwargs)


def test_constructor_requires_max_active_requests() -> None:
    with pytest.raises(TypeError):
        simsim.BatchingEngine(simsim.SimulatedBackend(COSTS))  # type: ignore[call-arg]


def test_constructor_accepts_valid_arguments() -> None:
    env = simsim.Environment()
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=np.int64(4),
        max_batch_tokens=4,  # equal to the slot count is enough
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(16, 8),
        env=env,
    )
    assert engine.env is env
    assert engine.max_active_requests == 4 and type(engine.max_active_requests) is int
    assert engine.max_batch_tokens == 4
    assert engine.policy == "mixed"
    assert engine.kv_cache == simsim.KvCacheConfig(16, 8)
    default = simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), max_active_requests=1)
    assert default.policy == "prefill_first"
    assert default.max_batch_tokens is None and default.kv_cache is None
    assert isinstance(default.env, simsim.Environment)
    assert isinstance(default.scheduler, simsim.FcfsScheduler)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, 8), ValueError),
        ((4, 0), ValueError),
        ((-4, 8), ValueError),
        ((4, -1), ValueError),
        ((4.0, 8), TypeError),
        ((4, 8.5), TypeError),
        ((True, 8), TypeError),
        ((4, "8"), TypeError),
    ],
)
def test_kv_cache_config_needs_positive_ints(args: tuple[Any, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        simsim.KvCacheConfig(*args)


def test_kv_cache_config_is_immutable() -> None:
    cache = simsim.KvCacheConfig(block_size_tokens=np.int64(4), total_blocks=8)
    assert (cache.block_size_tokens, cache.total_blocks) == (4, 8)
    assert type(cache.block_size_tokens) is int
    with pytest.raises(AttributeError):
        cache.total_blocks = 9  # type: ignore[misc]


def test_submit_rejects_a_request_that_never_fits_in_the_cache() -> None:
    # 2 blocks of 4 tokens: at most 8 tokens of prompt + output.
    engine = _engine(kv_cache=simsim.KvCacheConfig(4, 2))
    too_big = simsim.Request(7, 0, 5, 4)  # 9 tokens -> 3 blocks
    with pytest.raises(ValueError, match="request 7"):
        engine.submit(too_big)
    assert len(engine.requests) == 0
    assert engine.has_pending_events is False
    assert engine.scheduler_stats == simsim.SchedulerStats(0, 0, 0, 0, 0)
    assert too_big.state is S.WAITING and too_big.is_pristine
    with pytest.raises(ValueError, match="request 8"):
        engine.submit(simsim.Request(8, 0, 9, 0))  # 9 prompt tokens, no output: 3 blocks
    # the same id may still be used; exactly 8 tokens fit
    engine.submit(simsim.Request(7, 0, 5, 3))
    engine.submit(simsim.Request(8, 0, 8, 0))
    engine.run()
    assert {rid: r.state for rid, r in engine.requests.items()} == {
        7: S.FINISHED,
        8: S.FINISHED,
    }
    assert engine.kv_blocks_in_use == 0


def test_submit_without_cache_accepts_any_size_and_keeps_the_usual_rules() -> None:
    engine = _engine((0, 5, 10_000, 1000))
    with pytest.raises(ValueError, match="request 0"):
        engine.submit(simsim.Request(0, 5, 1, 1))  # duplicate id
    engine.run_next_timestamp()
    with pytest.raises(ValueError, match="request 1"):
        engine.submit(simsim.Request(1, 4, 1, 1))  # arrival before now (5)


# --------------------------------------------------------------------------- 7. backends


def test_backend_without_iteration_us_gets_the_default_cost() -> None:
    assert not hasattr(PlainBackend(), "iteration_us")
    plain = _engine(*THREE, backend=PlainBackend())
    plain.run()
    assert _log(plain) == THREE_LOG
    assert _iterations(plain) == THREE_ITERATIONS
    assert _table(plain) == THREE_TABLE
    # and with prefill and decode in one iteration (mixed): the two parts add up
    mixed = _engine(
        *CHUNKED,
        backend=PlainBackend(),
        max_active_requests=2,
        max_batch_tokens=10,
        policy="mixed",
    )
    mixed.run()
    assert _iterations(mixed) == CHUNKED_ITERATIONS
    assert _log(mixed) == CHUNKED_LOG


def test_simulated_backend_iteration_us() -> None:
    backend = simsim.SimulatedBackend(COSTS)
    assert backend.iteration_us(0, 0, 0) == 0
    assert backend.iteration_us(9, 1, 1) == 123 + 13
    assert backend.iteration_us(24, 2, 0) == 158
    assert backend.iteration_us(0, 1, 0) == 105  # a zero-token prompt still costs the base
    assert backend.iteration_us(0, 0, 3) == 19


def test_numpy_integer_iteration_cost_is_accepted() -> None:
    engine = _engine(*THREE, backend=NumpyIterationBackend())
    engine.run()
    assert _log(engine) == THREE_LOG
    assert all(type(it.end_us) is int for it in engine.iteration_log)
    assert all(type(r.timestamp_us) is int for r in engine.event_log)


@pytest.mark.parametrize(("value", "error"), [(12.5, TypeError), (-1, ValueError)])
def test_bad_iteration_cost_fails_the_engine(value: Any, error: type[Exception]) -> None:
    engine = _engine((0, 0, 4, 1), (1, 50, 4, 1), backend=BadIterationBackend(value))
    with pytest.raises(error, match="request 0"):
        engine.run_next_timestamp()  # the first launch, at the end of 0
    assert engine.failed is True
    assert engine.processed_event_count == 1  # the arrival
    assert engine.ignored_cancelled_event_count == 0
    assert engine.has_pending_events is True  # request 1's arrival
    calls = [
        lambda: engine.run(),
        lambda: engine.run_next_timestamp(),
        lambda: engine.submit(simsim.Request(9, 100, 1, 1)),
        lambda: engine.cancel_request(1),
        lambda: engine.now_us,
        lambda: engine.requests,
        lambda: engine.event_log,
        lambda: engine.admission_log,
        lambda: engine.scheduler_stats,
        lambda: engine.iteration_log,
        lambda: engine.iterations_frame(),
        lambda: engine.requests_frame(),
        lambda: engine.completion(0),
    ]
    for call in calls:
        with pytest.raises(simsim.EngineFailedError):
            call()
    assert engine.failed is True


def test_bad_iteration_cost_fails_the_engine_under_env_run() -> None:
    env = simsim.Environment()
    engine = _engine((0, 0, 4, 1), backend=BadIterationBackend(-5), env=env)
    with pytest.raises(ValueError, match="negative"):
        env.run(until=1000)
    assert engine.failed is True
    with pytest.raises(simsim.EngineFailedError):
        engine.run()


# --------------------------------------------------------------------------- 8. frames


def test_engine_without_iterations_has_an_empty_iterations_frame() -> None:
    engine = _engine()
    frame = engine.iterations_frame()
    assert list(frame.columns) == ITERATION_COLUMNS
    assert len(frame) == 0
    assert str(frame["start_us"].dtype) == "Int64"
    assert str(frame["end_us"].dtype) == "Int64"
    assert list(engine.iteration_log) == []
    # a cancelled-before-arrival request: still no iteration
    engine.submit(simsim.Request(0, 10, 4, 1))
    engine.cancel_request(0)
    engine.run()
    assert len(engine.iterations_frame()) == 0
    assert list(engine.iterations_frame().columns) == ITERATION_COLUMNS


def test_iterations_frame_dtypes() -> None:
    engine = _engine(*THREE)
    engine.run()
    frame = engine.iterations_frame()
    assert str(frame["start_us"].dtype) == "Int64"
    assert str(frame["end_us"].dtype) == "Int64"
    assert frame["start_us"].tolist() == [0, 125, 283, 302, 318]
    assert frame["end_us"].tolist() == [125, 283, 302, 318, 331]
    assert frame["prefill_tokens"].tolist() == [10, 24, 0, 0, 0]
    assert frame["prefilling_count"].tolist() == [1, 2, 0, 0, 0]
    assert frame["decoding_count"].tolist() == [0, 0, 3, 2, 1]
    assert frame["batch_size"].tolist() == [1, 3, 3, 2, 1]
    assert frame["abandoned"].tolist() == [False] * 5
    pd.testing.assert_series_equal(
        frame["end_us"] - frame["start_us"],
        pd.Series([125, 158, 19, 16, 13], dtype="Int64"),
        check_names=False,
    )


# --------------------------------------------------------------------------- 9. event counts


def test_processed_event_count_counts_arrivals_and_iteration_ends_only() -> None:
    env = simsim.Environment()
    engine = _engine(*THREE, env=env)
    ticks: list[int] = []

    def clock() -> Generator[simpy.Event, Any, None]:
        for _ in range(4):
            yield env.timeout(100)
            ticks.append(env.now)

    env.process(clock())
    counts = []
    while (t := engine.run_next_timestamp()) is not None:
        counts.append((t, engine.processed_event_count))
    assert ticks == [100, 200, 300, 400]
    # arrivals at 0, 50, 60; iteration ends at 125, 283, 302, 318, 331; the foreign
    # timeouts (100, 200, 300, 400) and the admission boundaries are not counted.
    assert counts == [
        (0, 1),
        (50, 2),
        (60, 3),
        (100, 3),
        (125, 4),
        (200, 4),
        (283, 5),
        (300, 5),
        (302, 6),
        (318, 7),
        (331, 8),
        (400, 8),
    ]
    assert _log(engine) == THREE_LOG  # the foreign process changes nothing
    assert engine.ignored_cancelled_event_count == 0


# --------------------------------------------------------------------------- 10. SimPy use


def test_completion_events_for_batched_requests() -> None:
    env = simsim.Environment()
    engine = _engine(*THREE, env=env)
    seen: list[tuple[int, int, S]] = []

    def waiter(rid: int) -> Generator[simpy.Event, Any, None]:
        request = yield engine.completion(rid)
        seen.append((env.now, request.request_id, request.state))

    for rid in (0, 1, 2):
        env.process(waiter(rid))
    engine.run()
    assert seen == [(302, 2, S.FINISHED), (318, 1, S.FINISHED), (331, 0, S.FINISHED)]
    # already terminal: an event that is already triggered
    done = engine.completion(1)
    assert done.triggered and done.value is engine.requests[1]
    with pytest.raises(simsim.UnknownRequestError):
        engine.completion(99)


def test_completion_event_for_a_cancelled_batched_request() -> None:
    env = simsim.Environment()
    engine = _engine((0, 0, 10, 3), (1, 0, 20, 3), (2, 190, 6, 1), max_active_requests=2, env=env)
    seen: list[tuple[int, S]] = []

    def waiter() -> Generator[simpy.Event, Any, None]:
        request = yield engine.completion(1)
        seen.append((env.now, request.state))

    env.process(waiter())
    _cancel_at(env, engine, 190, 1)  # mid-iteration [186, 202], as a process
    engine.run()
    assert seen == [(190, S.CANCELLED)]
    # same outcome as the between-timestamps cancellation at 190
    assert _table(engine) == {
        0: (S.FINISHED, 3, 0, 170, 186, 335),
        1: (S.CANCELLED, 1, 0, 170, 186, 190),
        2: (S.FINISHED, 1, 202, 319, 335, 335),
    }


def test_completion_does_not_fire_on_preemption() -> None:
    # PREEMPT: request 1 is preempted at 140 and finishes at 294.
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=3)
    engine = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache)
    env = engine.env
    seen: list[tuple[int, S]] = []

    def waiter() -> Generator[simpy.Event, Any, None]:
        request = yield engine.completion(1)
        seen.append((env.now, request.state))

    env.process(waiter())
    assert _advance(engine, 3) == [0, 124, 140]
    assert engine.requests[1].state is S.PREEMPTED
    assert not engine.completion(1).triggered
    engine.run()
    assert seen == [(294, S.FINISHED)]


@pytest.mark.parametrize("until", [1, 125, 290, 10_000])
def test_env_run_until_gives_the_same_logs_as_stepping(until: int) -> None:
    stepped = _engine(*THREE)
    _steps(stepped)

    env = simsim.Environment()
    driven = _engine(*THREE, env=env)
    env.run(until=until)
    while env.peek() != float("inf"):
        env.run(until=env.now + 1000)
    assert list(driven.event_log) == list(stepped.event_log)  # sequences included
    assert list(driven.admission_log) == list(stepped.admission_log)
    assert list(driven.iteration_log) == list(stepped.iteration_log)
    assert _table(driven) == THREE_TABLE
    assert driven.processed_event_count == stepped.processed_event_count == 8


def test_env_run_with_preemption_and_chunks_matches_stepping() -> None:
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=3)
    stepped = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache)
    _steps(stepped)
    env = simsim.Environment()
    driven = _engine(*PREEMPT, max_active_requests=2, kv_cache=cache, env=env)
    env.run(until=5000)
    assert list(driven.event_log) == list(stepped.event_log)
    assert list(driven.admission_log) == list(stepped.admission_log)
    assert list(driven.iteration_log) == list(stepped.iteration_log)

    stepped = _engine(*CHUNKED, max_active_requests=2, max_batch_tokens=10, policy="mixed")
    _steps(stepped)
    env = simsim.Environment()
    driven = _engine(*CHUNKED, max_active_requests=2, max_batch_tokens=10, policy="mixed", env=env)
    env.run(until=5000)
    assert list(driven.event_log) == list(stepped.event_log)
    assert list(driven.iteration_log) == list(stepped.iteration_log)


def test_log_stays_in_timestamp_sequence_order_when_an_arrival_meets_an_iteration_end() -> None:
    # Contract section 4: "The log lists processed events in processing order, which is
    # (timestamp, sequence) order." The iteration [0, 125] is launched at 0; request 1 is
    # submitted afterwards for 125, so its arrival event is scheduled after the
    # iteration's end event and is processed after it, at 125. The log must therefore
    # read PF0 then ARR1, and their sequences must increase in that order.
    engine = _engine((0, 0, 10, 2))
    assert engine.run_next_timestamp() == 0
    engine.submit(simsim.Request(1, 125, 4, 1))
    engine.run()
    records = list(engine.event_log)
    assert [(r.timestamp_us, r.event_type, r.request_id) for r in records[:3]] == [
        (0, ARR, 0),
        (125, PF, 0),
        (125, ARR, 1),
    ]
    keys = [(r.timestamp_us, r.sequence) for r in records]
    assert keys == sorted(keys), keys


# --------------------------------------------------------------------------- equivalence


def test_one_slot_prefill_first_matches_the_single_slot_engine() -> None:
    specs = [(0, 0, 10, 3), (1, 5, 0, 2), (2, 5, 7, 0), (3, 40, 3, 1), (4, 400, 2, 2)]
    batching = _engine(*specs, max_active_requests=1)
    single = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS))
    for rid, arrival, prompt, output in specs:
        single.submit(simsim.Request(rid, arrival, prompt, output))
    for engine in (batching, single):
        # both: 0 runs [0, 125] prefill, then decodes at 138, 151, 164; cancel 3 while
        # queued at 40, then everything else to the end.
        engine.run_next_timestamp()
        engine.run_next_timestamp()
        engine.run_next_timestamp()  # 40
        engine.cancel_request(3)
        engine.run()
    assert [(r.timestamp_us, r.event_type, r.request_id) for r in single.event_log] == _log(
        batching
    )
    pd.testing.assert_frame_equal(batching.requests_frame(), single.requests_frame())
    assert _log(batching)[:6] == [
        (0, ARR, 0),
        (5, ARR, 1),
        (5, ARR, 2),
        (40, ARR, 3),
        (125, PF, 0),
        (138, DEC, 0),
    ]
