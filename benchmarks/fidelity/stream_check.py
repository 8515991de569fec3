"""A quick look at the reference server: lone-request timings, or a workload played roughly.

Not the measurement (that is ``simsim replay``): a sanity check of the launcher, the
request options and the workload files, and the numbers the workload rates were chosen
from. It starts llama-server itself (``llama.llama_server``) and always stops it.

- ``--probe``: lone streamed requests, one after another, at a few prompt lengths; prints
  TTFT and the median gap between tokens (ms), and the service time of a request of the
  workload's mean size, from which a rate for a target load follows.
- ``--scenario FILE.toml``: sends the file's requests open loop on their schedule
  (token-id prompts, ``llama.REQUEST_EXTRAS``), one connection each, and prints the
  TTFT, inter-token gap and E2E percentiles, the send lag, whether every request got all
  its tokens, and how long the server was busy.

Run it (after ``setup.sh``)::

    python benchmarks/fidelity/stream_check.py --probe [--parallel 4]
    python benchmarks/fidelity/stream_check.py --scenario \
        benchmarks/fidelity/workloads/single_slot/calib.toml
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama import PROMPT_TOKEN_IDS, REQUEST_EXTRAS, llama_server, model_path


@dataclass
class Timing:
    """What the client saw of one request (token times: seconds after its scheduled send)."""

    request_id: int
    prompt_tokens: int
    max_tokens: int
    scheduled_s: float
    send_lag_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def ttft_ms(self) -> float:
        """Send to first token."""
        return 1000 * (self.token_times_s[0] - self.send_lag_s)

    @property
    def gaps_ms(self) -> list[float]:
        """The gaps between consecutive tokens."""
        times = self.token_times_s
        return [1000 * (later - earlier) for earlier, later in itertools.pairwise(times)]

    @property
    def sent_s(self) -> float:
        """When it was sent, from the run's time zero."""
        return self.scheduled_s + self.send_lag_s

    @property
    def end_s(self) -> float:
        """When its last token came, from the run's time zero."""
        return self.scheduled_s + self.token_times_s[-1]

    @property
    def e2e_ms(self) -> float:
        """Send to last token."""
        return 1000 * (self.token_times_s[-1] - self.send_lag_s)


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    request_id: int,
    prompt_tokens: int,
    max_tokens: int,
    scheduled_s: float,
    zero: float,
) -> Timing:
    """Send one streamed completion at *scheduled_s* after *zero* and time its chunks."""
    timing = Timing(request_id, prompt_tokens, max_tokens, scheduled_s)
    rng = random.Random(request_id)
    body = {
        "prompt": [rng.choice(PROMPT_TOKEN_IDS) for _ in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "stream": True,
        "seed": request_id,
        **REQUEST_EXTRAS,
    }
    await asyncio.sleep(max(0.0, zero + scheduled_s - time.perf_counter()))
    sent = time.perf_counter()
    timing.send_lag_s = sent - (zero + scheduled_s)
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                timing.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return timing
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text"):
                    timing.token_times_s.append(time.perf_counter() - (zero + scheduled_s))
    except httpx.HTTPError as error:
        timing.error = f"{type(error).__name__}: {error}"
    if not timing.error and len(timing.token_times_s) != max_tokens:
        timing.error = f"{len(timing.token_times_s)} tokens, not {max_tokens}"
    return timing


def new_client() -> httpx.AsyncClient:
    """A client that opens a fresh connection per request.

    llama-server closes the connection after a stream, so nothing is kept alive. The
    client is made once: making one costs milliseconds (its TLS context), which would
    otherwise land in the first request's TTFT.
    """
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=300, limits=limits)


def _percentiles(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return f"p50 {at(0.5):8.1f}  p90 {at(0.9):8.1f}  p99 {at(0.99):8.1f}  max {ordered[-1]:8.1f}"


async def probe(url: str, prompt_lengths: Sequence[int], output_tokens: int) -> None:
    """Lone requests, each after the previous one ended; two repeats per length."""
    async with new_client() as client:
        await stream_one(client, url, -1, 16, 4, 0.0, time.perf_counter())  # warm-up
        print(f"lone requests, {output_tokens} output tokens each:")
        for length in prompt_lengths:
            for repeat in range(2):
                zero = time.perf_counter()
                timing = await stream_one(client, url, repeat, length, output_tokens, 0.0, zero)
                if timing.error:
                    print(f"  prompt {length}: {timing.error}")
                    continue
                print(
                    f"  prompt {length:5d}: TTFT {timing.ttft_ms:7.1f} ms, median gap "
                    f"{statistics.median(timing.gaps_ms):5.2f} ms, E2E {timing.e2e_ms:7.1f} ms"
                )


async def play(url: str, scenario_path: Path) -> None:
    """Send the scenario's requests on schedule and summarize what came back."""
    from simsim.scenario import load_scenario

    specs = sorted(
        load_scenario(scenario_path).all_requests(), key=lambda spec: spec.arrival_time_us
    )
    async with new_client() as client:
        zero = time.perf_counter() + 0.2
        timings = await asyncio.gather(
            *(
                stream_one(
                    client,
                    url,
                    spec.request_id,
                    spec.prompt_token_count,
                    spec.max_output_tokens,
                    spec.arrival_time_us / 1e6,
                    zero,
                )
                for spec in specs
            )
        )
        wall = time.perf_counter() - zero
    good = [timing for timing in timings if not timing.error and timing.token_times_s]
    for timing in timings:
        if timing.error:
            print(f"request {timing.request_id}: {timing.error}")
    print(f"{scenario_path}: {len(good)}/{len(timings)} complete in {wall:.1f} s wall")
    print(f"  TTFT ms      {_percentiles([timing.ttft_ms for timing in good])}")
    gaps = [gap for timing in good for gap in timing.gaps_ms]
    print(f"  token gap ms {_percentiles(gaps)}")
    print(f"  E2E ms       {_percentiles([timing.e2e_ms for timing in good])}")
    print(f"  send lag ms  {_percentiles([1000 * timing.send_lag_s for timing in timings])}")
    # One slot serves one request at a time: it is busy from when a request is both sent
    # and the previous one has finished, to its last token. (An estimate for --parallel 1.)
    busy_s = previous_end_s = 0.0
    for timing in sorted(good, key=lambda timing: timing.end_s):
        busy_s += timing.end_s - max(timing.sent_s, previous_end_s)
        previous_end_s = timing.end_s
    print(f"  one-slot busy time {busy_s:.1f} s: {busy_s / wall:.0%} of the wall time")


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line, start the server, run the probe or the scenario."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--probe", action="store_true", help="lone requests at a few lengths")
    mode.add_argument("--scenario", type=Path, help="play this scenario's requests")
    parser.add_argument("--parallel", type=int, default=1, help="llama-server slots")
    parser.add_argument("--model", type=Path, default=None, help="default: the cache's model")
    parser.add_argument("--lengths", default="16,128,512,1024,2048", help="--probe prompts")
    parser.add_argument("--output-tokens", type=int, default=64, help="--probe outputs")
    args = parser.parse_args(argv)
    with llama_server(args.model or model_path(), parallel=args.parallel) as url:
        print(f"llama-server --parallel {args.parallel} at {url}")
        if args.probe:
            lengths = [int(length) for length in args.lengths.split(",")]
            asyncio.run(probe(url, lengths, args.output_tokens))
        else:
            asyncio.run(play(url, args.scenario))


if __name__ == "__main__":
    main()
