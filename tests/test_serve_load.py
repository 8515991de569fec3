"""Load, at a small scale: nothing lost, nothing duplicated.

150 streaming requests from 30 concurrent ``AsyncOpenAI`` clients, each with its own
connection pool, against the built-in server (``simsim serve`` without a file) at speed
100. At that pace the server cannot keep up with the wall clock, so its simulated clock
runs ahead and tokens come in bursts: exactly the situation in which a lost chunk or a
crossed stream would show. The benchmark (``benchmarks/``) does the same at full size
and reports throughput; this test only counts.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import httpx
import openai
from helpers import engine_request_id, request_table
from prometheus_client.parser import text_string_to_metric_families

from simsim.live import LiveServer, count_text_tokens, replay, serving_engine
from simsim.scenario import default_serve_scenario

MODEL = "simsim"
CLIENTS = 30
REQUESTS_PER_CLIENT = 5
SPEED = 100


@dataclass
class _Answer:
    """What one client saw of one streamed request."""

    max_tokens: int
    ids: set[str]
    texts: list[str]
    finish_reasons: list[str | None]
    prompt_tokens: int | None
    completion_tokens: int | None


async def _client(base_url: str, seed: int) -> list[_Answer]:
    draw = random.Random(seed)
    answers = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        for _ in range(REQUESTS_PER_CLIENT):
            max_tokens = draw.randint(1, 24)
            words = draw.randint(0, 40)
            stream = await client.completions.create(
                model=MODEL,
                prompt=" ".join(["word"] * words),
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            answer = _Answer(max_tokens, set(), [], [], None, None)
            async for chunk in stream:
                answer.ids.add(chunk.id)
                if chunk.usage is not None:
                    assert chunk.choices == []
                    answer.prompt_tokens = chunk.usage.prompt_tokens
                    answer.completion_tokens = chunk.usage.completion_tokens
                else:
                    answer.texts.append(chunk.choices[0].text)
                    answer.finish_reasons.append(chunk.choices[0].finish_reason)
            assert answer.prompt_tokens == words
            answers.append(answer)
    return answers


async def _load(base_url: str) -> list[_Answer]:
    per_client = await asyncio.gather(*(_client(base_url, seed) for seed in range(CLIENTS)))
    return [answer for answers in per_client for answer in answers]


def test_concurrent_streams_lose_and_duplicate_nothing() -> None:
    engine = serving_engine(default_serve_scenario())
    with LiveServer(engine, speed=SPEED, port=0) as server:
        answers = asyncio.run(_load(server.base_url))
        page = httpx.get(f"{server.url}/metrics").text
    assert len(answers) == CLIENTS * REQUESTS_PER_CLIENT
    for answer in answers:
        assert len(answer.ids) == 1  # every chunk of a stream carries its one id
        assert len(answer.texts) == answer.max_tokens
        assert [count_text_tokens(text) for text in answer.texts] == [1] * answer.max_tokens
        assert answer.finish_reasons == [None] * (answer.max_tokens - 1) + ["length"]
        assert answer.completion_tokens == answer.max_tokens
    ids = [next(iter(answer.ids)) for answer in answers]
    assert len(set(ids)) == len(ids)

    frame = engine.requests_frame().set_index("request_id")
    served = {engine_request_id(rid): answer for rid, answer in zip(ids, answers, strict=True)}
    assert sorted(frame.index) == sorted(served)
    assert (frame["state"] == "FINISHED").all()
    for rid, answer in served.items():
        assert frame.loc[rid, "max_output_tokens"] == answer.max_tokens
        assert frame.loc[rid, "generated_token_count"] == answer.max_tokens
        assert frame.loc[rid, "prompt_token_count"] == answer.prompt_tokens

    counters = {
        sample.name: sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name in ("vllm:generation_tokens_total", "vllm:request_success_total")
    }
    total = sum(answer.max_tokens for answer in answers)
    assert counters == {
        "vllm:generation_tokens_total": total,
        "vllm:request_success_total": len(answers),
    }
    # The clients really overlapped: requests shared decode iterations.
    assert engine.iterations_frame()["batch_size"].max() > 1
    # Under load too, the served run is the simulation of its arrivals.
    offline = serving_engine(default_serve_scenario())
    replay(server.actions, offline, until_us=server.stopped_at_us)
    assert request_table(offline) == request_table(engine)
