"""Per-token events: ``engine.token(rid, n)`` and ``engine.first_token(rid)``.

A SimPy process that waits on them sees each token at the microsecond its decode step
completes (the event log's ``DECODE_STEP_COMPLETE`` time), sees the end of a request
that stops short, and changes nothing: the request table and the event log (without
sequence numbers, which the watcher's own events take) are those of an unwatched run.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import simpy
from helpers import examples, request_table
from hypothesis import example, given, settings
from hypothesis import strategies as st

import simsim
from simsim import EventType as E
from simsim import RequestState as S

Engine = simsim.SimulationEngine | simsim.BatchingEngine


def _backend() -> simsim.SimulatedBackend:
    return simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=100,
            prefill_per_token_us=2,
            prefill_per_active_sequence_us=0,
            decode_base_us=30,
            decode_per_active_sequence_us=5,
        )
    )


def _single(env: simsim.Environment) -> Engine:
    return simsim.SimulationEngine(_backend(), env=env)


def _batching(env: simsim.Environment) -> Engine:
    return simsim.BatchingEngine(_backend(), max_active_requests=3, env=env)


def _batching_kv(env: simsim.Environment) -> Engine:
    # Small memory, so requests are preempted and recomputed while someone watches.
    return simsim.BatchingEngine(
        _backend(),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=12),
        env=env,
    )


ENGINES: dict[str, Callable[[simsim.Environment], Engine]] = {
    "single_slot": _single,
    "batching": _batching,
    "batching_kv": _batching_kv,
}


def _stream(
    env: simsim.Environment, engine: Engine, rid: int, seen: list[tuple[int, int, int]]
) -> Generator[simpy.Event, Any, None]:
    """Record (time, request id, token number) per token, then (time, rid, -tokens)."""
    n = 1
    while True:
        request = yield engine.token(rid, n)
        if request.generated_token_count < n:
            seen.append((env.now, rid, -request.generated_token_count))
            return
        seen.append((env.now, rid, n))
        n += 1


def _log_without_sequences(engine: Engine) -> list[tuple[int, E, int]]:
    return [(r.timestamp_us, r.event_type, r.request_id) for r in engine.event_log]


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_each_token_arrives_at_its_decode_step_and_the_stream_ends_at_the_finish(
    kind: str,
) -> None:
    env = simsim.Environment()
    engine = ENGINES[kind](env)
    sizes = [(0, 5, 4), (1, 9, 3), (40, 2, 6), (45, 7, 0), (60, 3, 1)]
    for rid, (arrival, prompt, output) in enumerate(sizes):
        engine.submit(simsim.Request(rid, arrival, prompt, output))
    seen: list[tuple[int, int, int]] = []
    for rid in range(len(sizes)):
        env.process(_stream(env, engine, rid, seen))
    engine.run()

    decode_steps = [
        (r.timestamp_us, r.request_id)
        for r in engine.event_log
        if r.event_type is E.DECODE_STEP_COMPLETE
    ]
    tokens = [(t, rid) for t, rid, n in seen if n > 0]
    assert sorted(tokens) == sorted(decode_steps)
    for rid, (_, _, output) in enumerate(sizes):
        mine = [(t, n) for t, r, n in seen if r == rid]
        assert [n for _, n in mine] == [*range(1, output + 1), -output]
        request = engine.requests[rid]
        assert request.state is S.FINISHED
        if output:
            assert mine[0][0] == request.first_token_time_us
        # the end of the stream comes at the finish, after the last token
        assert mine[-1][0] == request.finish_time_us


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_a_cancelled_request_ends_its_stream_at_the_cancellation(kind: str) -> None:
    env = simsim.Environment()
    engine = ENGINES[kind](env)
    engine.submit(simsim.Request(0, 0, 4, 30))
    seen: list[tuple[int, int, int]] = []
    env.process(_stream(env, engine, 0, seen))

    def client() -> Generator[simpy.Event, Any, None]:
        yield engine.token(0, 3)
        yield env.timeout(1)
        engine.cancel_request(0)

    env.process(client())
    engine.run()
    request = engine.requests[0]
    assert request.state is S.CANCELLED
    assert [n for _, _, n in seen] == [1, 2, 3, -3]
    assert seen[-1][0] == request.finish_time_us == seen[-2][0] + 1


def test_first_token_of_a_zero_output_request_comes_at_its_finish_with_no_token() -> None:
    env = simsim.Environment()
    engine = simsim.SimulationEngine(_backend(), env=env)
    engine.submit(simsim.Request(0, 0, 10, 0))
    event = engine.first_token(0)
    engine.run()
    assert event.processed and event.value is engine.requests[0]
    assert event.value.generated_token_count == 0
    assert event.value.state is S.FINISHED


def test_tokens_already_generated_and_terminal_requests_give_processed_events() -> None:
    env = simsim.Environment()
    engine = simsim.SimulationEngine(_backend(), env=env)
    engine.submit(simsim.Request(0, 0, 10, 3))
    engine.submit(simsim.Request(1, 0, 10, 3))
    same = engine.token(0, 2)
    assert engine.token(0, 2) is same  # one event per token
    env.run(until=200)
    assert engine.requests[0].generated_token_count == 2
    assert same.processed and same.value is engine.requests[0]
    early = engine.first_token(0)
    assert early.processed and early.value is engine.requests[0]
    engine.cancel_request(1)
    late = engine.token(1, 1)
    assert late.processed and late.value.state is S.CANCELLED


def test_bad_arguments_name_the_value_and_change_nothing() -> None:
    env = simsim.Environment()
    engine = simsim.SimulationEngine(_backend(), env=env)
    engine.submit(simsim.Request(0, 0, 10, 3))
    with pytest.raises(simsim.UnknownRequestError, match="request 7"):
        engine.token(7, 1)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n"):
            engine.token(0, bad)
    for bad_type in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="n"):
            engine.token(0, bad_type)  # type: ignore[arg-type]
    assert engine._token_waiters == {}
    engine.run()
    assert engine.requests[0].state is S.FINISHED


def test_the_fast_engine_has_no_token_events_and_says_which_engine_does() -> None:
    engine = simsim.FastSimulationEngine(_backend())
    engine.submit(simsim.Request(0, 0, 10, 3))
    with pytest.raises(NotImplementedError, match="SimulationEngine"):
        engine.first_token(0)
    engine.run()
    assert engine.requests[0].state is S.FINISHED


_request = st.tuples(
    st.integers(0, 300),  # arrival
    st.integers(0, 12),  # prompt tokens
    st.integers(0, 6),  # output tokens
    st.one_of(st.none(), st.integers(0, 600)),  # cancellation time, if any
)


@settings(max_examples=examples(300), deadline=None)
@example(
    # Two cancellations in one microsecond: the first one's token notices for the
    # watcher were pending at that time, and made the freed slot wait for the boundary
    # (so the third request was never admitted before its own cancellation).
    kind="batching",
    requests=[(0, 0, 1, 102), (0, 0, 1, 102), (101, 0, 0, 102)],
    watched={0},
)
@given(
    kind=st.sampled_from(sorted(ENGINES)),
    requests=st.lists(_request, min_size=1, max_size=8),
    watched=st.sets(st.integers(0, 7)),
)
def test_watching_tokens_changes_nothing(
    kind: str, requests: list[tuple[int, int, int, int | None]], watched: set[int]
) -> None:
    def play(watch: bool) -> tuple[Engine, list[tuple[int, int, int]]]:
        env = simsim.Environment()
        engine = ENGINES[kind](env)
        for rid, (arrival, prompt, output, _) in enumerate(requests):
            engine.submit(simsim.Request(rid, arrival, prompt, output))
        seen: list[tuple[int, int, int]] = []
        if watch:
            for rid in sorted(watched):
                if rid < len(requests):
                    env.process(_stream(env, engine, rid, seen))
        cancels = sorted((at, rid) for rid, (*_, at) in enumerate(requests) if at is not None)
        for at, rid in cancels:
            if at > env.now:
                env.run(until=at)
            if not engine.requests[rid].is_terminal:
                engine.cancel_request(rid)
        engine.run()
        return engine, seen

    plain, _ = play(False)
    watched_engine, seen = play(True)
    assert request_table(watched_engine) == request_table(plain)
    assert _log_without_sequences(watched_engine) == _log_without_sequences(plain)
    # every token the watched requests generated was seen once, at its decode step
    decode_steps = sorted(
        (r.timestamp_us, r.request_id)
        for r in plain.event_log
        if r.event_type is E.DECODE_STEP_COMPLETE and r.request_id in watched
    )
    assert sorted((t, rid) for t, rid, n in seen if n > 0) == decode_steps
