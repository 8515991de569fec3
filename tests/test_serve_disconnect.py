"""Clients that go away, and the served run against the same run offline.

A client that closes its stream, or gives up on a plain request, cancels its request
in the simulation at once: the request ends ``CANCELLED`` with the tokens it had, its
slot and KV blocks are freed, and the next waiting request is admitted at that very
microsecond, as ``docs/semantics.md`` says for a cancellation made between timestamps.
Other requests are undisturbed.

The served request table is then compared with two offline runs on a fresh engine:
:func:`simsim.live.replay` of the server's actions, and a plain run that submits every
request up front with its arrival time and cancels between timestamps at the served
cancellation times. Both must give the served table exactly, preemptions included.

The servers here decode a token every 50 to 100 simulated ms at speed 20 (2.5 to 5
wall ms a token), slow enough that a request the test means to cut off is always far
from its end when its client goes away.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers import (
    HeldStream,
    engine_request_id,
    request_table,
    serve_backend,
    serving,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

import simsim
from simsim import EventType, RequestState
from simsim.engines.base import EngineBase
from simsim.live import LiveServer, replay

MODEL = "simsim"
SPEED = 20
SLACK_TOKENS = 40
"""How many more tokens than a client read its cut-off request may have generated.

The server cancels when it sees the disconnect; until then the decode steps go on.
At 2.5 to 5 wall ms a token this allows 100 to 200 ms for the disconnect to arrive:
a bound that only a hung server breaks, not a slow machine.
"""


def _single_slot() -> EngineBase:
    return simsim.SimulationEngine(serve_backend(50_000))


def _single_slot_slow() -> EngineBase:
    return simsim.SimulationEngine(serve_backend(100_000))


def _batching_small_kv() -> EngineBase:
    # 12 blocks of 16 tokens: two requests of 60 prompt tokens fill it in about 36 steps.
    return simsim.BatchingEngine(
        serve_backend(50_000),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=12),
    )


def _batching_roomy() -> EngineBase:
    return simsim.BatchingEngine(
        serve_backend(50_000),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=256),
    )


def _cancel_times(server: LiveServer) -> dict[int, int]:
    return {
        action.request_id: action.time_us for action in server.actions if action.kind == "cancel"
    }


def _wait_cancelled(server: LiveServer, rid: int) -> None:
    wait_for(lambda: rid in _cancel_times(server), f"request {rid} to be cancelled")


def _log(engine: EngineBase) -> list[tuple[int, EventType, int]]:
    return [(r.timestamp_us, r.event_type, r.request_id) for r in engine.event_log]


def _assert_offline_runs_agree(server: LiveServer, fresh: Callable[[], EngineBase]) -> None:
    """The served table equals replay's, and a plain offline run's with the same arrivals."""
    served = server.engine
    replayed = fresh()
    replay(server.actions, replayed, until_us=server.stopped_at_us)
    assert request_table(replayed) == request_table(served)
    assert _log(replayed) == _log(served)
    assert list(replayed.admission_log) == list(served.admission_log)

    plain = fresh()
    for action in server.actions:
        if action.kind == "submit":
            plain.submit(
                simsim.Request(
                    action.request_id,
                    action.time_us,
                    action.prompt_token_count,
                    action.max_output_tokens,
                )
            )
    for rid, at in sorted(_cancel_times(server).items(), key=lambda item: item[1]):
        if at > plain.env.now:
            plain.env.run(until=at)
        plain.cancel_request(rid)
    plain.run()
    assert request_table(plain) == request_table(served)


# --------------------------------------------------------------------------- disconnects


@pytest.mark.parametrize("chat", [False, True])
def test_closed_stream_cancels_and_the_waiting_request_takes_the_slot(chat: bool) -> None:
    engine = _single_slot_slow()
    read = 3
    answer: list[Any] = []
    with (
        LiveServer(engine, speed=SPEED, port=0) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        if chat:
            stream: Any = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "go"}],
                max_tokens=2000,
                stream=True,
            )
        else:
            stream = client.completions.create(
                model=MODEL, prompt="go", max_tokens=2000, stream=True
            )
        chunks = iter(stream)
        first = next(chunks)
        a = engine_request_id(first.id)

        def waiting_request() -> None:
            answer.append(client.completions.create(model=MODEL, prompt="me next", max_tokens=4))

        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        wait_for(lambda: len(server.actions) == 2, "the second request to be submitted")
        for _ in range(read - 1):
            next(chunks)
        stream.close()
        waiter.join()
    requests = engine.requests
    cut, waited = requests[a], requests[engine_request_id(answer[0].id)]
    assert cut.state is RequestState.CANCELLED
    assert read <= cut.generated_token_count <= read + SLACK_TOKENS
    assert cut.finish_time_us == _cancel_times(server)[a]
    assert waited.arrival_time_us < cut.finish_time_us
    assert waited.admit_time_us == cut.finish_time_us  # the freed slot, at once
    assert waited.state is RequestState.FINISHED
    assert waited.generated_token_count == 4
    assert answer[0].usage is not None
    assert answer[0].usage.completion_tokens == 4
    assert [action.kind for action in server.actions] == ["submit", "submit", "cancel"]


def test_plain_request_whose_client_times_out_is_cancelled() -> None:
    engine = _single_slot_slow()
    answer: list[httpx.Response] = []
    with (
        LiveServer(engine, speed=SPEED, port=0) as server,
        openai.OpenAI(
            base_url=server.base_url, api_key="unused", max_retries=0, timeout=0.3
        ) as impatient,
        httpx.Client(timeout=30) as http,
    ):

        def waiting_request() -> None:
            wait_for(lambda: len(server.actions) == 1, "the first request to be submitted")
            body = {"model": MODEL, "prompt": "me next", "max_tokens": 3}
            answer.append(http.post(f"{server.base_url}/completions", json=body))

        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        # 2000 tokens at 5 wall ms each: far longer than the client's 0.3 s patience.
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model=MODEL, prompt="too long", max_tokens=2000)
        waiter.join()
        _wait_cancelled(server, 0)
    assert answer[0].status_code == 200
    assert answer[0].json()["usage"]["completion_tokens"] == 3
    gone, waited = engine.requests[0], engine.requests[1]
    assert gone.state is RequestState.CANCELLED
    assert gone.generated_token_count < 2000
    assert gone.finish_time_us == _cancel_times(server)[0]
    assert waited.admit_time_us == gone.finish_time_us
    assert waited.state is RequestState.FINISHED


def test_plain_request_closed_by_httpx_timeout_is_cancelled_while_waiting() -> None:
    engine = _single_slot_slow()
    with serving(engine, SPEED) as (server, http, stack):
        running = HeldStream(stack, http, server.base_url, prompt="hold the slot", max_tokens=2000)
        running.read(1)
        body = {"model": MODEL, "prompt": "wait", "max_tokens": 5}
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{server.base_url}/completions", json=body, timeout=0.2)
        _wait_cancelled(server, 1)
        running.read(2)  # the stream goes on, undisturbed
        running.close()
        _wait_cancelled(server, 0)
    queued = engine.requests[1]
    assert queued.state is RequestState.CANCELLED
    assert (queued.admit_time_us, queued.generated_token_count) == (None, 0)
    assert engine.requests[0].generated_token_count >= 3


def test_a_disconnect_leaves_concurrent_requests_undisturbed() -> None:
    engine = _batching_roomy()
    with serving(engine, SPEED) as (server, http, stack):
        first = HeldStream(stack, http, server.base_url, prompt="one", max_tokens=30)
        cut = HeldStream(stack, http, server.base_url, prompt="two", max_tokens=2000)
        third = HeldStream(stack, http, server.base_url, prompt="three", max_tokens=25)
        for stream in (first, cut, third):
            stream.read(2)
        cut.close()
        assert cut.request_id is not None
        _wait_cancelled(server, cut.request_id)
        first.read_to_end()
        third.read_to_end()
    assert (len(first.chunks), len(third.chunks)) == (30, 25)
    assert first.done and third.done
    states = {rid: request.state for rid, request in engine.requests.items()}
    assert states == {
        first.request_id: RequestState.FINISHED,
        cut.request_id: RequestState.CANCELLED,
        third.request_id: RequestState.FINISHED,
    }
    assert 2 <= engine.requests[cut.request_id].generated_token_count <= 2 + SLACK_TOKENS
    assert engine.kv_blocks_in_use == 0  # the cancelled request's blocks came back
    _assert_offline_runs_agree(server, _batching_roomy)


# --------------------------------------------------------------------------- offline equality


def test_single_slot_served_table_equals_offline_runs() -> None:
    engine = _single_slot()
    with serving(engine, SPEED) as (server, http, stack):
        # 120 tokens, 300 wall ms: the queued requests wait all that time
        a = HeldStream(stack, http, server.base_url, prompt="first in line", max_tokens=120)
        a.read(1)
        b = HeldStream(stack, http, server.base_url, prompt=[5] * 12, max_tokens=5)  # queued
        c = HeldStream(stack, http, server.base_url, prompt="third", max_tokens=5)  # queued
        b.close()  # cancelled while it waits
        _wait_cancelled(server, 1)
        d = HeldStream(stack, http, server.base_url, prompt="long", max_tokens=2000)  # queued
        a.read_to_end()
        c.read_to_end()
        d.read(2)
        e = HeldStream(stack, http, server.base_url, prompt="last", max_tokens=3)  # behind d
        d.close()  # cancelled mid-decode
        e.read_to_end()
    requests = engine.requests
    assert [requests[rid].state for rid in range(5)] == [
        RequestState.FINISHED,
        RequestState.CANCELLED,
        RequestState.FINISHED,
        RequestState.CANCELLED,
        RequestState.FINISHED,
    ]
    assert (len(a.chunks), len(c.chunks), len(e.chunks)) == (120, 5, 3)
    assert requests[1].admit_time_us is None
    assert requests[2].admit_time_us == requests[0].finish_time_us
    assert 2 <= requests[3].generated_token_count <= 2 + SLACK_TOKENS
    assert requests[4].admit_time_us == requests[3].finish_time_us
    _assert_offline_runs_agree(server, _single_slot)


def test_batching_with_preemption_served_table_equals_offline_runs() -> None:
    engine = _batching_small_kv()
    with serving(engine, SPEED) as (server, http, stack):
        big = [
            HeldStream(stack, http, server.base_url, prompt=[7] * 60, max_tokens=100)
            for _ in range(2)
        ]
        for stream in big:
            # Both hold 4 blocks and grow a block every 16 tokens: the 12 blocks run
            # out long before either is done (the first has 99 tokens, 250 ms, to go).
            stream.read(1)
        cut = HeldStream(stack, http, server.base_url, prompt=[3] * 10, max_tokens=150)
        queued = HeldStream(stack, http, server.base_url, prompt=[4] * 10, max_tokens=20)
        queued.close()
        _wait_cancelled(server, 3)
        cut.read(3)
        cut.close()
        _wait_cancelled(server, 2)
        for stream in big:
            stream.read_to_end()
        late = HeldStream(stack, http, server.base_url, prompt=[1] * 30, max_tokens=40)
        late.read_to_end()
    assert [len(stream.chunks) for stream in big] == [100, 100]
    assert len(late.chunks) == 40
    assert any(event == EventType.REQUEST_PREEMPTED for _, event, _ in _log(engine))
    states = [engine.requests[rid].state for rid in range(5)]
    assert states == [
        RequestState.FINISHED,
        RequestState.FINISHED,
        RequestState.CANCELLED,
        RequestState.CANCELLED,
        RequestState.FINISHED,
    ]
    assert engine.kv_blocks_in_use == 0
    _assert_offline_runs_agree(server, _batching_small_kv)
    # The metrics count what the tables hold (read once the server has stopped).
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(server.metrics.render().decode())
        for sample in family.samples
    }
    preempted = sum(event == EventType.REQUEST_PREEMPTED for _, event, _ in _log(engine))
    assert samples["vllm:num_preemptions_total"] == preempted > 0
    requests = engine.requests_frame()
    finished = requests[requests["state"] == "FINISHED"]
    with_tokens = requests[requests["generated_token_count"] > 0]
    assert samples["vllm:request_prefill_time_seconds_count"] == len(with_tokens)
    assert samples["vllm:request_prefill_time_seconds_sum"] == pytest.approx(
        (with_tokens["first_token_time_us"] - with_tokens["admit_time_us"]).sum() / 1e6
    )
    assert samples["vllm:request_decode_time_seconds_count"] == len(finished)
    assert samples["vllm:request_decode_time_seconds_sum"] == pytest.approx(
        (finished["finish_time_us"] - finished["first_token_time_us"]).sum() / 1e6
    )
    assert samples["vllm:request_inference_time_seconds_sum"] == pytest.approx(
        (finished["finish_time_us"] - finished["admit_time_us"]).sum() / 1e6
    )


@pytest.fixture
def no_leftover_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, leftover


def test_stopping_the_server_ends_open_streams(no_leftover_threads: None) -> None:
    engine = _single_slot_slow()
    with httpx.Client(timeout=30) as http, contextlib.ExitStack() as stack:
        server = LiveServer(engine, speed=SPEED, port=0).start()
        try:
            open_stream = HeldStream(
                stack, http, server.base_url, prompt="never ends", max_tokens=2000
            )
            open_stream.read(1)
        finally:
            server.stop()
        # The stream ends with an error event and [DONE]; the request stays unfinished.
        open_stream.read_to_end()
        assert open_stream.done
        assert [error["code"] for error in open_stream.errors] == [None]
        assert "shutting down" in open_stream.errors[0]["message"]
    request = engine.requests[0]
    assert request.state is RequestState.DECODING
    assert request.finish_time_us is None
