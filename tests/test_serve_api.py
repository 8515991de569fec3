"""``simsim serve``'s endpoints, called by the real ``openai`` client and by ``httpx``.

Each test runs a real :class:`~simsim.live.LiveServer` on a free port of 127.0.0.1, at a
high speed so a request takes a few wall milliseconds. What is checked is the wire
format (one chunk per token, usage, ``[DONE]``, the chat role, ``max_tokens``), the
token counting rule, the other endpoints, and that ``/metrics`` agrees with the
engine's request table; never how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers import (
    HeldStream,
    engine_request_id,
    serve_backend,
    serving,
    sse_payloads,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

import simsim
from simsim import EventType
from simsim.live import LiveDriver, LiveServer, ServeOptions, count_text_tokens, serving_engine
from simsim.scenario import default_serve_scenario

MODEL = "simsim"
SPEED = 200  # simulated seconds per wall second: a default-server token takes ~40 us


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """The built-in batching server (``simsim serve`` without a file), fast, shared."""
    with LiveServer(serving_engine(default_serve_scenario()), speed=SPEED, port=0) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as api:
        yield api


def _chat(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def _raw_stream(server: LiveServer, path: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of one streamed request, read raw with ``httpx``."""
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{server.base_url}{path}", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_payloads(response.iter_lines())


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("max_tokens", [1, 7, 40])
def test_streamed_completion_sends_one_chunk_per_token(
    server: LiveServer, client: openai.OpenAI, max_tokens: int
) -> None:
    prompt = "Count the tokens of this prompt, please."
    chunks = list(
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True)
    )
    assert len(chunks) == max_tokens
    texts = [chunk.choices[0].text for chunk in chunks]
    assert [count_text_tokens(text) for text in texts] == [1] * max_tokens
    assert count_text_tokens("".join(texts)) == max_tokens
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None] * (max_tokens - 1) + [
        "length"
    ]
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert {chunk.object for chunk in chunks} == {"text_completion"}
    assert {chunk.model for chunk in chunks} == {MODEL}
    request = server.engine.requests[engine_request_id(chunks[0].id)]
    assert request.state is simsim.RequestState.FINISHED
    assert request.generated_token_count == max_tokens
    assert request.prompt_token_count == count_text_tokens(prompt) == 9


@pytest.mark.parametrize("max_tokens", [1, 5, 33])
def test_streamed_chat_sends_the_role_first_and_one_chunk_per_token(
    server: LiveServer, client: openai.OpenAI, max_tokens: int
) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=_chat("Hi there!"), max_tokens=max_tokens, stream=True
        )
    )
    assert len(chunks) == max_tokens
    deltas = [chunk.choices[0].delta for chunk in chunks]
    assert [delta.role for delta in deltas] == ["assistant"] + [None] * (max_tokens - 1)
    assert [count_text_tokens(delta.content or "") for delta in deltas] == [1] * max_tokens
    assert count_text_tokens("".join(delta.content or "" for delta in deltas)) == max_tokens
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks[:-1])
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    request = server.engine.requests[engine_request_id(chunks[0].id)]
    # "user: Hi there!\n" -> user, :, Hi, there, !
    assert (request.prompt_token_count, request.generated_token_count) == (5, max_tokens)


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_raw_stream_ends_with_the_usage_chunk_and_done(server: LiveServer, path: str) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if path == "/completions":
        body["prompt"] = [11, 22, 33]
    else:
        body["messages"] = _chat("one two three")
    payloads = _raw_stream(server, path, body)
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    events = [json.loads(payload) for payload in payloads[:-1]]
    tokens, usage = events[:-1], events[-1]
    assert len(tokens) == 6
    assert all(len(event["choices"]) == 1 for event in tokens)
    assert usage["choices"] == []
    # token ids count exactly; "user: one two three\n" is 5 tokens
    prompt = 3 if path == "/completions" else 5
    assert usage["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 6,
        "total_tokens": prompt + 6,
    }
    assert {event["id"] for event in events} == {events[0]["id"]}


def test_stream_without_include_usage_has_no_usage_chunk(server: LiveServer) -> None:
    payloads = _raw_stream(
        server, "/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True}
    )
    assert payloads[-1] == "[DONE]"
    events = [json.loads(payload) for payload in payloads[:-1]]
    assert len(events) == 3
    assert all("usage" not in event or event["usage"] is None for event in events)


def test_openai_client_sees_the_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=_chat("a b c d"),
            max_completion_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) == 5  # four tokens, then the usage chunk
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (6, 4)
    assert all(chunk.usage is None for chunk in chunks[:-1])


# --------------------------------------------------------------------------- whole answers


@pytest.mark.parametrize(
    ("path", "prompt_field", "prompt_tokens"),
    [
        ("/completions", {"prompt": "Hello, world!"}, 4),  # Hello , world !
        ("/completions", {"prompt": [101, 7, 7, 2048, 3]}, 5),  # token ids count exactly
        ("/completions", {"prompt": [[9, 8, 7]]}, 3),  # a list holding one id list
        ("/completions", {"prompt": ["don't panic"]}, 4),  # don ' t panic
        ("/completions", {"prompt": "   "}, 0),
        (
            "/chat/completions",
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Hi"},
                            {"type": "text", "text": "there!"},
                        ],
                    },
                ]
            },
            # "system: Be brief.\nuser: Hi there!\n": system : Be brief . user : Hi there !
            10,
        ),
        ("/chat/completions", {"messages": [{"role": "assistant", "content": None}]}, 2),
    ],
)
def test_usage_counts_the_prompt_by_the_documented_rule(
    server: LiveServer, path: str, prompt_field: dict[str, Any], prompt_tokens: int
) -> None:
    response = httpx.post(
        f"{server.base_url}{path}", json={"model": MODEL, "max_tokens": 3, **prompt_field}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 3,
        "total_tokens": prompt_tokens + 3,
    }
    choice = body["choices"][0]
    text = choice["text"] if path == "/completions" else choice["message"]["content"]
    assert count_text_tokens(text) == 3
    assert choice["finish_reason"] == "length"
    request = server.engine.requests[engine_request_id(body["id"])]
    assert (request.prompt_token_count, request.generated_token_count) == (prompt_tokens, 3)


def test_whole_completion_and_chat_through_the_openai_client(
    server: LiveServer, client: openai.OpenAI
) -> None:
    completion = client.completions.create(model=MODEL, prompt="Say nothing at all", max_tokens=9)
    assert completion.object == "text_completion"
    assert count_text_tokens(completion.choices[0].text) == 9
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 9)
    chat = client.chat.completions.create(model=MODEL, messages=_chat("Why?"), max_tokens=12)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert count_text_tokens(chat.choices[0].message.content or "") == 12
    assert chat.usage is not None
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (
        4,
        12,
        16,
    )
    assert completion.id != chat.id


def test_default_max_tokens_is_16(server: LiveServer, client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="go")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16
    assert count_text_tokens(completion.choices[0].text) == 16
    chunks = list(client.chat.completions.create(model=MODEL, messages=_chat("go"), stream=True))
    assert len(chunks) == 16
    request = server.engine.requests[engine_request_id(chunks[0].id)]
    assert request.max_output_tokens == request.generated_token_count == 16


def test_max_completion_tokens_sets_a_chat_length_over_max_tokens(
    server: LiveServer, client: openai.OpenAI
) -> None:
    alone = client.chat.completions.create(
        model=MODEL, messages=_chat("x"), max_completion_tokens=3
    )
    both = client.chat.completions.create(
        model=MODEL, messages=_chat("x"), max_completion_tokens=2, max_tokens=9
    )
    assert alone.usage is not None and both.usage is not None
    assert (alone.usage.completion_tokens, both.usage.completion_tokens) == (3, 2)
    assert server.engine.requests[engine_request_id(both.id)].max_output_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero(server: LiveServer, client: openai.OpenAI, stream: bool) -> None:
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt="a", max_tokens=0, stream=True))
        assert len(chunks) == 1  # one empty chunk carries the finish reason
        assert (chunks[0].choices[0].text, chunks[0].choices[0].finish_reason) == ("", "length")
        chat = list(
            client.chat.completions.create(
                model=MODEL, messages=_chat("a"), max_tokens=0, stream=True
            )
        )
        assert len(chat) == 1
        assert chat[0].choices[0].delta.role == "assistant"
        assert (chat[0].choices[0].delta.content, chat[0].choices[0].finish_reason) == (
            "",
            "length",
        )
        rid = engine_request_id(chunks[0].id)
    else:
        completion = client.completions.create(model=MODEL, prompt="a", max_tokens=0)
        assert completion.choices[0].text == ""
        assert completion.usage is not None
        assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1, 0)
        rid = engine_request_id(completion.id)
    request = server.engine.requests[rid]
    assert request.state is simsim.RequestState.FINISHED
    assert request.generated_token_count == 0


def test_ignore_eos_and_sampling_fields_are_accepted(
    server: LiveServer, client: openai.OpenAI
) -> None:
    completion = client.completions.create(
        model=MODEL,
        prompt="a b",
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["\n"],
        extra_body={"ignore_eos": True, "top_k": 5},
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    chat = client.chat.completions.create(
        model=MODEL, messages=_chat("a b"), max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 5


# --------------------------------------------------------------------------- other endpoints


def test_models_health_and_a_named_model() -> None:
    options = ServeOptions(model="acme/tiny-7b", max_model_len=4096)
    with (
        LiveServer(
            serving_engine(default_serve_scenario()), speed=SPEED, options=options, port=0
        ) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        models = client.models.list()
        assert [model.id for model in models.data] == ["acme/tiny-7b"]
        assert models.data[0].object == "model"
        assert httpx.get(f"{server.url}/health").status_code == 200
        completion = client.completions.create(model="acme/tiny-7b", prompt="x", max_tokens=2)
        assert completion.model == "acme/tiny-7b"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="simsim", prompt="x", max_tokens=2)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus page, keyed by name and labels (model and engine dropped)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert (labels.pop("model_name"), labels.pop("engine")) == (MODEL, "0")
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def _metric(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _idle(http: httpx.Client, server: LiveServer) -> bool:
    """Whether the server's gauges show no request running or waiting."""
    page = _samples(http.get(f"{server.url}/metrics").text)
    running = _metric(page, "vllm:num_requests_running")
    return running + _metric(page, "vllm:num_requests_waiting") == 0


def test_metrics_agree_with_the_request_table() -> None:
    # Slow enough (speed 20) that a 2000-token request is cut off by its client long
    # before it could finish: the table then holds FINISHED and CANCELLED requests.
    with (
        LiveServer(serving_engine(default_serve_scenario()), speed=20, port=0) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        for size in (1, 4, 11):
            client.completions.create(model=MODEL, prompt="word " * size, max_tokens=size)
        for size in (2, 9):
            list(
                client.chat.completions.create(
                    model=MODEL, messages=_chat("x " * size), max_tokens=size, stream=True
                )
            )
        with httpx.Client(timeout=30) as http:
            body = {"model": MODEL, "prompt": [1] * 30, "max_tokens": 2000, "stream": True}
            with http.stream("POST", f"{server.base_url}/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
            assert http.post(f"{server.base_url}/completions", content=b"{").status_code == 400
            bad_model = {"model": "gpt-4", "prompt": "x"}
            assert http.post(f"{server.base_url}/completions", json=bad_model).status_code == 404
            wait_for(lambda: _idle(http, server), "every request to end")
            response = http.get(f"{server.url}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        page = _samples(response.text)
    frame = server.engine.requests_frame()
    states = frame["state"].value_counts()
    assert states.get("CANCELLED", 0) == 1, frame  # the 2000-token stream
    assert states.get("FINISHED", 0) == len(frame) - 1 == 5
    finished = frame[frame["state"] == "FINISHED"]
    admitted = frame[frame["admit_time_us"].notna()]
    ttft = frame["ttft_us"].dropna()

    assert _metric(page, "vllm:time_to_first_token_seconds_count") == len(ttft) == 6
    assert _metric(page, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        ttft.sum() / 1e6, rel=1e-9
    )
    assert _metric(page, "vllm:generation_tokens_total") == frame["generated_token_count"].sum()
    assert _metric(page, "vllm:prompt_tokens_total") == admitted["prompt_token_count"].sum()
    assert _metric(page, "vllm:request_success_total", finished_reason="length") == len(finished)
    assert _metric(page, "vllm:request_success_total", finished_reason="abort") == 1
    assert _metric(page, "vllm:e2e_request_latency_seconds_count") == len(finished)
    assert _metric(page, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(
        finished["e2e_latency_us"].sum() / 1e6, rel=1e-9
    )
    assert _metric(page, "vllm:request_queue_time_seconds_count") == len(admitted)
    assert _metric(page, "vllm:request_queue_time_seconds_sum") == pytest.approx(
        admitted["queue_delay_us"].sum() / 1e6, rel=1e-9, abs=1e-12
    )
    gaps = (frame["generated_token_count"] - 1).clip(lower=0).sum()
    assert _metric(page, "vllm:inter_token_latency_seconds_count") == gaps
    tpot = finished["tpot_us"] * (finished["generated_token_count"] - 1)
    finished_gaps_s = tpot.fillna(0).sum() / 1e6
    assert _metric(page, "vllm:inter_token_latency_seconds_sum") >= finished_gaps_s - 1e-9
    assert _metric(page, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == len(ttft)
    assert _metric(page, "simsim:rejected_requests_total", reason="bad_request") == 1
    assert _metric(page, "simsim:rejected_requests_total", reason="model_not_found") == 1
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert (gauge, ()) in page and page[(gauge, ())] == 0
    assert page[("vllm:kv_cache_usage_perc", ())] == 0


def test_gauges_show_running_and_waiting_requests() -> None:
    engine = simsim.BatchingEngine(
        serve_backend(50_000),
        max_active_requests=1,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=64),
    )
    with serving(engine, 20) as (server, http, stack):
        first = HeldStream(stack, http, server.base_url, prompt=[1] * 64, max_tokens=900)
        first.read(1)  # it decodes
        second = HeldStream(stack, http, server.base_url, prompt=[1] * 64, max_tokens=900)
        page = _samples(http.get(f"{server.url}/metrics").text)
        assert _metric(page, "vllm:num_requests_running") == 1
        assert _metric(page, "vllm:num_requests_waiting") == 1
        # 64 prompt tokens and a few output tokens: 5 or more of 64 blocks
        assert 5 / 64 <= _metric(page, "vllm:kv_cache_usage_perc") < 1
        first.close()
        second.close()
        wait_for(lambda: _idle(http, server), "both streams to be cancelled")
    assert list(server.engine.requests_frame()["state"]) == ["CANCELLED", "CANCELLED"]


# --------------------------------------------------------------------------- token timing


def _token_times(engine: simsim.BatchingEngine | simsim.SimulationEngine) -> dict[int, list[int]]:
    """Each request's decode-step completion times, in token order, from the event log."""
    times: dict[int, list[int]] = {}
    for record in engine.event_log:
        if record.event_type is EventType.DECODE_STEP_COMPLETE:
            times.setdefault(record.request_id, []).append(record.timestamp_us)
    return times


def test_each_chunk_leaves_after_its_decode_step_completes() -> None:
    engine = simsim.BatchingEngine(serve_backend(20_000, 5_000), max_active_requests=2)
    received: list[tuple[int, int, int]] = []  # (request id, token number, sim time seen)
    lock = threading.Lock()

    def stream(client: openai.OpenAI, size: int) -> None:
        chunks = client.completions.create(
            model=MODEL, prompt="p " * size, max_tokens=size, stream=True
        )
        for number, chunk in enumerate(chunks, start=1):
            seen = server.driver.now_us()
            with lock:
                received.append((engine_request_id(chunk.id), number, seen))

    with (
        LiveServer(engine, speed=50, port=0) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        threads = [threading.Thread(target=stream, args=(client, size)) for size in (6, 9, 12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    times = _token_times(engine)
    frame = engine.requests_frame().set_index("request_id")
    assert sorted(times) == [0, 1, 2]
    assert len(received) == 6 + 9 + 12
    for rid, token_times in times.items():
        mine = [(number, seen) for r, number, seen in received if r == rid]
        assert [number for number, _ in mine] == list(range(1, len(token_times) + 1))
        assert len(token_times) == frame.loc[rid, "max_output_tokens"]
        assert token_times[0] == frame.loc[rid, "first_token_time_us"]
        assert token_times[-1] == frame.loc[rid, "finish_time_us"]
        for (number, seen), at in zip(mine, token_times, strict=True):
            # processed when the clock reaches T + 1, never before
            assert seen > at, (rid, number, seen, at)
    assert (frame["state"] == "FINISHED").all()


# --------------------------------------------------------------------------- overload and faults


def _slow_single_slot() -> simsim.SimulationEngine:
    """One slot, a token every 100 simulated ms: 5 wall ms a token at speed 20."""
    return simsim.SimulationEngine(serve_backend(100_000))


def _error_of(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI error object of *response*, checked to have exactly OpenAI's keys."""
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    return dict(error)


def test_a_full_queue_answers_429_with_retry_after() -> None:
    options = ServeOptions(max_waiting=1, retry_after_s=3)
    engine = _slow_single_slot()
    with (
        serving(engine, 20, options) as (server, http, stack),
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        running = HeldStream(stack, http, server.base_url, prompt="a", max_tokens=2000)
        running.read(1)
        queued = HeldStream(stack, http, server.base_url, prompt="b", max_tokens=2000)
        with pytest.raises(openai.RateLimitError) as refused:
            client.completions.create(model=MODEL, prompt="c", max_tokens=2)
        assert refused.value.status_code == 429
        assert refused.value.response.headers["retry-after"] == "3"
        error = _error_of(refused.value.response)
        assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=_chat("d"), stream=True)
        # Room again once the queued request leaves: the next one is accepted.
        queued.close()
        wait_for(lambda: len(server.actions) == 3, "the queued request to be cancelled")
        # The stream returns once its headers came, after the request was submitted.
        accepted = HeldStream(stack, http, server.base_url, prompt="e", max_tokens=2000)
        assert [action.kind for action in server.actions][-1:] == ["submit"]
        assert accepted.request_id is None  # no chunk yet: it waits behind the first
        page = _samples(http.get(f"{server.url}/metrics").text)
        assert _metric(page, "simsim:rejected_requests_total", reason="queue_full") == 2
        running.close()
        accepted.close()
        wait_for(lambda: _idle(http, server), "every request to end")
    assert sorted(engine.requests) == [0, 1, 2]  # the refused requests never reached it
    assert [action.kind for action in server.actions] == [
        "submit",
        "submit",
        "cancel",
        "submit",
        "cancel",
        "cancel",
    ]


def _failing_indices(server: LiveServer, count: int, noise: bool) -> tuple[list[int], list[str]]:
    """Send *count* valid requests (some streamed) in turn; return the refused ones' indices.

    With *noise*, an invalid request goes before each valid one: invalid requests draw
    no failure, so the indices must not change.
    """
    refused: list[int] = []
    served: list[str] = []
    with (
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
        httpx.Client(timeout=30) as http,
    ):
        for index in range(count):
            if noise:
                bad = http.post(f"{server.base_url}/completions", content=b"{oops")
                assert bad.status_code == 400
                wrong = http.post(f"{server.base_url}/completions", json={"model": "m"})
                assert wrong.status_code == 404
            try:
                if index % 3 == 0:
                    chunks = list(
                        client.completions.create(
                            model=MODEL, prompt="x", max_tokens=2, stream=True
                        )
                    )
                    assert len(chunks) == 2
                    served.append(chunks[0].id)
                else:
                    chat = client.chat.completions.create(
                        model=MODEL, messages=_chat("y"), max_tokens=2
                    )
                    served.append(chat.id)
            except openai.InternalServerError as error:
                assert error.status_code == 503
                failure = _error_of(error.response)
                assert (failure["type"], failure["code"]) == ("server_error", "injected_failure")
                # a 503 says when to come back, as a real server's would
                assert error.response.headers["Retry-After"] == str(server.options.retry_after_s)
                refused.append(index)
    return refused, served


def test_injected_failures_follow_the_seed() -> None:
    options = ServeOptions(fail_rate=0.3, fail_status=503, fail_seed=11)
    count = 30
    runs = []
    for noise in (False, True):
        with LiveServer(
            serving_engine(default_serve_scenario()), speed=SPEED, options=options, port=0
        ) as server:
            refused, served = _failing_indices(server, count, noise)
            page = _samples(httpx.get(f"{server.url}/metrics").text)
        runs.append(refused)
        # The failed requests never reached the simulation; every answered one did.
        table = server.engine.requests_frame()
        assert sorted(table["request_id"]) == sorted(engine_request_id(rid) for rid in served)
        assert len(table) == count - len(refused)
        assert (table["state"] == "FINISHED").all()
        assert _metric(page, "simsim:rejected_requests_total", reason="injected_failure") == len(
            refused
        )
    # One draw per valid request, in order, from random.Random(fail_seed) (docs/serve.md).
    draws = random.Random(11)
    expected = [index for index in range(count) if draws.random() < 0.3]
    assert runs[0] == runs[1] == expected
    assert 0 < len(expected) < count


# (path, body: JSON value or raw bytes, status, param, code)
_BAD_REQUESTS: list[tuple[str, Any, int, str | None, str | None]] = [
    ("/completions", b"{not json", 400, None, None),
    ("/completions", b"\xff\xfe", 400, None, None),
    ("/completions", [1, 2], 400, None, None),
    ("/completions", "a string", 400, None, None),
    ("/completions", {"model": MODEL, "prompt": "x", "frobnicate": 1}, 400, "frobnicate", None),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens", None),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": True}, 400, "max_tokens", None),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens", None),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2.5}, 400, "max_tokens", None),
    ("/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n", None),
    ("/completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, "echo", None),
    ("/completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs", None),
    ("/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream", None),
    (
        "/completions",
        {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        None,
    ),
    ("/completions", {"model": MODEL}, 400, "prompt", None),
    ("/completions", {"model": MODEL, "prompt": [1, "a"]}, 400, "prompt", None),
    ("/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", None),
    ("/completions", {"prompt": "x"}, 400, "model", None),
    (
        "/completions",
        {"model": MODEL, "prompt": [1] * 60, "max_tokens": 10},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "/completions",
        {"model": MODEL, "prompt": [1] * 65, "max_tokens": 0},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    ("/completions", {"model": "gpt-4o", "prompt": "x"}, 404, "model", "model_not_found"),
    ("/chat/completions", {"model": "gpt-4o", "messages": _chat("x")}, 404, "model", None),
    ("/chat/completions", {"model": MODEL}, 400, "messages", None),
    ("/chat/completions", {"model": MODEL, "messages": []}, 400, "messages", None),
    ("/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages", None),
    ("/chat/completions", {"model": MODEL, "messages": [{"content": "x"}]}, 400, None, None),
    (
        "/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        400,
        None,
        None,
    ),
    (
        "/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        None,
        None,
    ),
    (
        "/chat/completions",
        {"model": MODEL, "messages": _chat("x"), "max_completion_tokens": -3},
        400,
        "max_completion_tokens",
        None,
    ),
    (
        "/chat/completions",
        {"model": MODEL, "messages": _chat("x " * 30), "max_tokens": 60},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "/chat/completions",
        {"model": MODEL, "messages": _chat("x"), "prompt": "x"},
        400,
        "prompt",
        None,
    ),
    # Accepted and ignored, but only within OpenAI's documented ranges.
    ("/completions", {"model": MODEL, "prompt": "x", "temperature": 2.5}, 400, "temperature", None),
    (
        "/completions",
        {"model": MODEL, "prompt": "x", "temperature": -0.1},
        400,
        "temperature",
        None,
    ),
    ("/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p", None),
    (
        "/chat/completions",
        {"model": MODEL, "messages": _chat("x"), "frequency_penalty": -3},
        400,
        "frequency_penalty",
        None,
    ),
    (
        "/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages[0].role",
        None,
    ),
    # Strict JSON: no NaN or Infinity, and no number a float cannot hold.
    ("/completions", b'{"model": "simsim", "prompt": "x", "temperature": NaN}', 400, None, None),
    ("/completions", b'{"model": "simsim", "prompt": "x", "top_p": -Infinity}', 400, None, None),
    ("/completions", b'{"model": "simsim", "prompt": "x", "temperature": 1e999}', 400, None, None),
    # priority reaches the scheduler: an integer of the signed 64-bit range.
    ("/completions", {"model": MODEL, "prompt": "x", "priority": "high"}, 400, "priority", None),
    ("/completions", {"model": MODEL, "prompt": "x", "priority": True}, 400, "priority", None),
    ("/completions", {"model": MODEL, "prompt": "x", "priority": 1.5}, 400, "priority", None),
    ("/completions", {"model": MODEL, "prompt": "x", "priority": 2**63}, 400, "priority", None),
]


def test_bad_requests_get_openai_errors_and_disturb_no_one() -> None:
    options = ServeOptions(max_model_len=64)
    engine = serving_engine(default_serve_scenario())
    # speed 2: the stream's 40 tokens take about 160 wall ms, while the bad requests come
    with serving(engine, 2, options) as (server, http, stack):
        stream = HeldStream(stack, http, server.base_url, prompt=[1] * 20, max_tokens=40)
        stream.read(1)
        for path, body, status, param, code in _BAD_REQUESTS:
            url = f"{server.base_url}{path}"
            if isinstance(body, bytes):
                response = http.post(url, content=body)
            else:
                response = http.post(url, json=body)
            assert response.status_code == status, (path, body, response.text)
            error = _error_of(response)
            where = str(error["param"])
            assert where == str(param) or (param is None and where.startswith("messages")), (
                body,
                error,
            )
            if code is not None:
                assert error["code"] == code, (body, error)
        with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as bad:
                client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
            assert bad.value.param == "max_tokens"
            with pytest.raises(openai.BadRequestError) as bad:
                client.completions.create(model=MODEL, prompt="x", n=2)
            assert bad.value.param == "n"
            with pytest.raises(openai.NotFoundError) as missing:
                client.chat.completions.create(model="other", messages=_chat("x"))
            assert missing.value.code == "model_not_found"
            with pytest.raises(openai.BadRequestError) as long:
                client.completions.create(model=MODEL, prompt=[2] * 64, max_tokens=1)
            assert long.value.code == "context_length_exceeded"
        stream.read_to_end()
        page = _samples(http.get(f"{server.url}/metrics").text)
    assert len(stream.chunks) == 40
    assert count_text_tokens("".join(stream.chunks)) == 40
    frame = engine.requests_frame()
    assert list(frame["request_id"]) == [stream.request_id] == [0]
    assert list(frame["state"]) == ["FINISHED"]
    rejected = sum(
        value for (name, _), value in page.items() if name == "simsim:rejected_requests_total"
    )
    assert rejected == len(_BAD_REQUESTS) + 4


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("Application/JSON; charset=utf-8", 200),
        (None, 200),  # no header: read as JSON, as vLLM does
        ("text/plain", 400),
        ("application/x-www-form-urlencoded", 400),  # what curl -d sends without -H
        ("application/jsonl", 400),
    ],
)
def test_a_body_declared_as_anything_but_json_is_a_400(
    server: LiveServer, content_type: str | None, status: int
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    answer = httpx.post(
        f"{server.base_url}/completions",
        content=json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode(),
        headers=headers,
        timeout=30,
    )
    assert answer.status_code == status, answer.text
    if status == 400:
        error = _error_of(answer)
        assert error["type"] == "invalid_request_error"
        assert repr(content_type) in error["message"]
        assert "application/json" in error["message"]


def test_connections_send_each_chunk_at_once() -> None:
    """Every accepted connection has Nagle's algorithm off (``TCP_NODELAY``).

    With it on, a chunk written while the previous one is unacknowledged waits for the
    client's delayed ACK (40 ms on Linux), so tokens reach the client in bursts, late.
    asyncio turns it off only on sockets made with protocol ``IPPROTO_TCP``.
    """
    with serving(_slow_single_slot(), 20) as (server, http, stack):
        stream = HeldStream(stack, http, server.base_url, prompt="a", max_tokens=2000)
        stream.read(1)
        connections = list(server._uvicorn.server_state.connections)
        assert connections
        for connection in connections:
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        stream.close()


class _ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test says: no timer runs by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0

    def time(self) -> float:
        return self.now_s


def test_queue_counts_are_those_of_now_even_before_the_timer_runs() -> None:
    """The 429 rule and the gauges count the queue at the current simulated time.

    The driver's loop timer can run late (a busy loop runs it after other callbacks);
    the counts must not show requests that have long left the queue by now.
    """
    loop = _ManualClockLoop()

    async def scenario() -> list[tuple[int, int]]:
        engine = simsim.SimulationEngine(serve_backend(10_000))
        driver = LiveDriver(engine, speed=1)
        driver.start()
        driver.submit(4, 1)
        driver.submit(4, 1)
        seen = [driver.counts()]  # both arrive now: queued until the next microsecond
        loop.now_s = 1.0  # one second later both are done; no timer has run yet
        seen.append(driver.counts())
        seen.append((engine.requests[0].state.value, engine.requests[1].state.value))
        driver.stop()
        return seen

    try:
        seen = loop.run_until_complete(scenario())
    finally:
        loop.close()
    finished = simsim.RequestState.FINISHED.value
    assert seen == [(0, 2), (0, 0), (finished, finished)]


class _BreakingBackend:
    """A cost model that prices five decode steps and then raises, as a broken one would."""

    def __init__(self) -> None:
        self.steps = 0

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        return 1_000

    def decode_step_us(self, active_sequence_count: int) -> int:
        self.steps += 1
        if self.steps > 5:
            raise RuntimeError("the cost model broke")
        return 50_000


def test_a_failed_simulation_ends_streams_and_answers_500() -> None:
    engine = simsim.SimulationEngine(_BreakingBackend())
    with serving(engine, 20) as (server, http, stack):
        stream = HeldStream(stack, http, server.base_url, prompt="x", max_tokens=20)
        stream.read_to_end()
        assert len(stream.chunks) < 20
        assert [error["type"] for error in stream.errors] == ["server_error"]
        assert "the cost model broke" in stream.errors[0]["message"]
        health = http.get(f"{server.url}/health")
        assert health.status_code == 500
        assert "the cost model broke" in _error_of(health)["message"]
        for path, body in (
            ("/completions", {"model": MODEL, "prompt": "x"}),
            ("/chat/completions", {"model": MODEL, "messages": _chat("x"), "stream": True}),
        ):
            refused = http.post(f"{server.base_url}{path}", json=body)
            assert refused.status_code == 500
            assert _error_of(refused)["type"] == "server_error"
        assert http.get(f"{server.url}/metrics").status_code == 200
    assert isinstance(server.driver.failure, RuntimeError)
    assert engine.failed  # the refused requests were never submitted to it
    assert [action.kind for action in server.actions] == ["submit"]
