"""Drive simsim's live server with the official ``openai`` client.

A :class:`simsim.live.LiveServer` serves a small batching server over HTTP in this
process (on a free port, fifty times faster than real time). The ``openai`` client,
unchanged, sends it one plain completion, one streaming chat completion and a burst of
concurrent chats from ``AsyncOpenAI``. Once the server stops, its request table holds
every request the clients sent, and replaying the server's log of submissions offline
gives the same table.

Wall-clock times (arrivals, queueing) differ from run to run, so this example prints
only what does not: token counts, finish reasons, states and metric totals. Every time
the server reports is simulated from the cost model, not measured on hardware.

Needs the serve extra and the openai client: pip install '.[serve]' openai
Run it:  python examples/serve_openai_client.py
"""

from __future__ import annotations

import asyncio
from collections import Counter

import openai
import pandas as pd

import simsim
from simsim.live import LiveServer, replay

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=0,
    decode_base_us=8_000,
    decode_per_active_sequence_us=250,
)
SPEED = 50.0  # simulated seconds per wall second
CONCURRENT = 6


def make_engine() -> simsim.BatchingEngine:
    """The served server: four slots, so a burst of six requests queues."""
    return simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=256),
    )


def plain_and_streaming(base_url: str) -> None:
    """One plain completion and one streaming chat completion, one after the other."""
    client = openai.OpenAI(base_url=base_url, api_key="not-needed")
    completion = client.completions.create(
        model="simsim", prompt="Tell me about queues.", max_tokens=5, temperature=0.7
    )
    choice = completion.choices[0]
    assert completion.usage is not None
    print(f"completion: {choice.text!r}, finish_reason={choice.finish_reason}")
    print(
        f"  usage: prompt {completion.usage.prompt_tokens}, "
        f"completion {completion.usage.completion_tokens}"
    )

    stream = client.chat.completions.create(
        model="simsim",
        messages=[{"role": "user", "content": "Stream four tokens, please."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for delta_choice in chunk.choices:
            pieces.append(delta_choice.delta.content or "")
            finish = delta_choice.finish_reason or finish
    assert usage is not None
    print(f"streamed chat: {len(pieces)} chunks {pieces}, finish_reason={finish}")
    print(f"  usage: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}")


async def one_chat(client: openai.AsyncOpenAI, max_tokens: int) -> tuple[int, int, str]:
    """A streaming chat; returns (max_tokens, chunks received, finish reason)."""
    stream = await client.chat.completions.create(
        model="simsim",
        messages=[{"role": "user", "content": "Hello!"}],
        max_tokens=max_tokens,
        stream=True,
    )
    chunks, finish = 0, ""
    async for chunk in stream:
        for choice in chunk.choices:
            chunks += 1
            finish = choice.finish_reason or finish
    return max_tokens, chunks, finish


async def burst(base_url: str) -> None:
    """Several streaming chats at once from AsyncOpenAI; more than the server's slots."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="not-needed") as client:
        results = await asyncio.gather(
            *(one_chat(client, max_tokens=8 + 4 * n) for n in range(CONCURRENT))
        )
    print(f"{CONCURRENT} concurrent streaming chats:")
    for max_tokens, chunks, finish in results:
        print(f"  max_tokens {max_tokens:2d}: {chunks:2d} chunks, finish_reason={finish}")


def main() -> pd.DataFrame:
    """Serve, send the requests, stop; print what is deterministic and return the table."""
    with LiveServer(make_engine(), speed=SPEED, port=0) as server:
        plain_and_streaming(server.base_url)
        asyncio.run(burst(server.base_url))
        metrics = server.metrics_text()

    requests = server.engine.requests_frame()
    states = Counter(requests["state"])
    print(f"request table: {len(requests)} requests, states {dict(states)}")
    print(
        f"  tokens: {requests['prompt_token_count'].sum()} prompt, "
        f"{requests['generated_token_count'].sum()} generated"
    )
    # The first two requests ran alone, so their simulated latencies are the cost
    # model's, whatever the wall clock did: 2000 + 50 x prompt for the prefill, then
    # 8000 + 250 us per decode step (one token each; the first token ends the first).
    for row in requests.head(2).itertuples():
        print(
            f"  request {row.request_id}: TTFT {row.ttft_us / 1000:.2f} ms, "
            f"end-to-end {row.e2e_latency_us / 1000:.2f} ms (simulated)"
        )
    for line in metrics.splitlines():
        if line.startswith(("vllm:generation_tokens_total", "vllm:request_success_total")):
            print(f"  metric {line}")

    # The same submissions at the same simulated times, offline: the same table.
    offline = make_engine()
    replay(server.actions, offline, until_us=server.stopped_at_us)
    same = offline.requests_frame().equals(requests)
    print(f"offline replay of the served run gives the same request table: {same}")
    return requests


if __name__ == "__main__":
    main()
