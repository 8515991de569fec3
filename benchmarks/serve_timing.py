"""How closely a streaming client's timing follows the simulation, through ``simsim serve``.

The server runs as a separate process (``python -m simsim serve --port 0 --speed S
--record DIR``), so the client does not share its interpreter. A streaming client
(``httpx``, asyncio) sends ``--requests`` completions at each ``--concurrency`` level
(1 is sequential: each request is sent when the previous one ended), with prompts of 16
to 1024 token ids and outputs of 1 to 32 tokens drawn from a seed. For every request it
records, on its own clock (``time.perf_counter``):

- the **TTFT**: from just before sending the request to the arrival of its first
  content chunk;
- the **end-to-end latency**: from the same moment to the arrival of ``data: [DONE]``;
- the **gap** between each pair of consecutive content chunks.

When the server stops, its recorded tables give the simulated values of the same
requests, matched by id (a response's id is ``cmpl-<request id>``): ``ttft_us`` and
``e2e_latency_us`` from the requests table, and each token's time from the events
table (its ``DECODE_STEP_COMPLETE`` rows). Simulated times are divided by the speed, so
every difference is in wall milliseconds: measured minus simulated. The difference is
what the HTTP layer adds to the model: the request's way in, the server's loop, the
way out.

The baseline, measured in the same client process against the same server at the same
concurrency: the round trip of ``GET /health``, a bare HTTP request through the same
stack. The report gives each median difference as a multiple of that round trip.

The script also checks that the recorded request table is exactly what the offline
engine gives for the same arrivals (every request submitted up front, then ``run()``);
it exits with status 1 if not, or if any request failed.

Run it:  python benchmarks/serve_timing.py [--requests 200] [--concurrency 1 4]
         [--speed 1] [--scenario FILE.toml]
Every figure is wall time on this machine over loopback; the simulated times come from
the cost model. ``benchmarks/serve_load.py`` reuses this file's server and client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import select
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import numpy as np
import pandas as pd

import simsim
from simsim.live import serving_engine
from simsim.results import REQUEST_COLUMNS
from simsim.scenario import default_serve_scenario, load_scenario

MODEL = "simsim"
PROMPT_TOKENS = (16, 1024)
OUTPUT_TOKENS = (1, 32)
TOKEN_ID = 7  # prompts are lists of token ids: they count exactly
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 120.0
# The request table's columns that hold a request's own values; the latency columns
# after them are computed from these.
ROW_COLUMNS = tuple(
    c
    for c in REQUEST_COLUMNS
    if c not in ("queue_delay_us", "ttft_us", "e2e_latency_us", "tpot_us")
)


# --------------------------------------------------------------------------- the server


class ServerProcess:
    """``simsim serve`` in a child process, recording into *record*; stopped with SIGINT.

    ``with ServerProcess(...) as server:`` starts it, reads its URL from the first line
    it prints, and waits until ``/health`` answers. Leaving the block stops it as Ctrl-C
    does (it writes its tables then), and kills it if it does not stop in time.
    """

    def __init__(self, record: Path, *, speed: float, scenario: str | None = None) -> None:
        self.record = record
        self.command = [sys.executable, "-m", "simsim", "serve"]
        if scenario is not None:
            self.command.append(scenario)
        self.command += ["--port", "0", "--speed", repr(speed), "--record", str(record)]
        self.base_url = ""
        self.output = ""
        self.stderr_path = record.with_name(f"{record.name}-server-stderr.txt")
        self._process: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        """The server process's id."""
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    @property
    def url(self) -> str:
        """The server's root URL (``base_url`` without ``/v1``)."""
        return self.base_url.removesuffix("/v1")

    def __enter__(self) -> ServerProcess:
        with self.stderr_path.open("w") as stderr:  # the child keeps its own descriptor
            process = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self._process = process
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
            line = process.stdout.readline() if ready else ""
            found = re.search(r" on (http://\S+/v1) ", line)
            if found is None:
                raise RuntimeError(
                    f"{' '.join(self.command)} did not print its URL; "
                    f"stdout {line!r}, stderr {self._read_stderr()!r}"
                )
            self.base_url = found.group(1)
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client() as client:
            while True:
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server at {self.url} never answered /health")
                time.sleep(0.02)

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system), from ``/proc/<pid>/stat`` (Linux)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
        return (utime + stime) / _CLOCK_TICKS

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            out, _ = process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        self.output = out or ""
        if kind is None and process.returncode != 0:
            raise RuntimeError(
                f"the server exited with status {process.returncode}: {self._read_stderr()!r}"
            )

    def _read_stderr(self) -> str:
        return self.stderr_path.read_text()[-2000:]


_CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))  # the unit of /proc's CPU times


def read_requests(record: Path) -> pd.DataFrame:
    """The recorded requests table, indexed by request id."""
    requests = pd.read_csv(record / "requests.csv")
    requests.index = requests["request_id"].to_numpy()
    return requests


def token_times_us(events: pd.DataFrame) -> dict[int, list[int]]:
    """Each request's simulated token times: its ``DECODE_STEP_COMPLETE`` rows, in order."""
    steps = events[events["event_type"] == "DECODE_STEP_COMPLETE"]
    steps = steps.sort_values(["request_id", "sequence"])
    return {
        int(rid): group["timestamp_us"].astype(int).tolist()
        for rid, group in steps.groupby("request_id")
    }


# --------------------------------------------------------------------------- the offline engine


def build_engine(scenario: str | None) -> simsim.BatchingEngine | simsim.SimulationEngine:
    """A fresh engine of the served scenario (the built-in server without a file)."""
    spec = (
        default_serve_scenario()
        if scenario is None
        else load_scenario(scenario, require_requests=False)
    )
    engine = serving_engine(spec)
    assert isinstance(engine, simsim.BatchingEngine | simsim.SimulationEngine)
    return engine


def run_offline(requests: pd.DataFrame, scenario: str | None) -> tuple[Any, float]:
    """The recorded arrivals through a fresh offline engine: (engine, CPU seconds).

    Every request is submitted up front (arrival time, prompt and output sizes from the
    recorded table), then ``engine.run()``: a plain simulation of the same arrivals.
    """
    rows = requests.sort_values("request_id")
    arrivals = list(
        zip(
            rows["request_id"].astype(int).tolist(),
            rows["arrival_time_us"].astype(int).tolist(),
            rows["prompt_token_count"].astype(int).tolist(),
            rows["max_output_tokens"].astype(int).tolist(),
            strict=True,
        )
    )
    engine = build_engine(scenario)
    started = time.process_time()
    for rid, arrival, prompt, output in arrivals:
        engine.submit(simsim.Request(rid, arrival, prompt, output))
    engine.run()
    return engine, time.process_time() - started


def _rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    def value(column: str, item: Any) -> Any:
        if pd.isna(item):
            return None
        return str(item) if column == "state" else int(item)

    frame = frame.sort_values("request_id")
    columns = [[value(c, item) for item in frame[c].tolist()] for c in ROW_COLUMNS]
    return list(zip(*columns, strict=True))


def first_difference(recorded: pd.DataFrame, offline: pd.DataFrame) -> str | None:
    """``None`` if both request tables hold the same rows; else the first row that differs."""
    left, right = _rows(recorded), _rows(offline)
    if len(left) != len(right):
        return f"{len(left)} recorded rows, {len(right)} offline"
    for a, b in zip(left, right, strict=True):
        if a != b:
            return f"recorded {dict(zip(ROW_COLUMNS, a, strict=True))}, offline {b}"
    return None


# --------------------------------------------------------------------------- the client


@dataclass
class Stream:
    """What a streaming client saw of one request (times in ``perf_counter`` seconds)."""

    prompt_tokens: int
    max_tokens: int
    sent_s: float = 0.0
    status: int = 0
    chunk_s: list[float] = field(default_factory=list)
    done_s: float | None = None
    ids: set[str] = field(default_factory=set)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None

    @property
    def request_id(self) -> int | None:
        """The engine's id of the request, from the chunks' ``cmpl-<id>``; None if unclear."""
        if len(self.ids) != 1:
            return None
        (name,) = self.ids
        number = name.removeprefix("cmpl-")
        return int(number) if number.isdigit() else None

    def problem(self) -> str | None:
        """Why this response is not a complete, correct stream; ``None`` when it is."""
        if self.error is not None:
            return self.error
        if self.status != 200:
            return f"HTTP {self.status}"
        if self.request_id is None:
            return f"chunk ids {sorted(self.ids)}"
        if self.done_s is None:
            return "no [DONE]"
        if len(self.chunk_s) != self.max_tokens:
            return f"{len(self.chunk_s)} content chunks for max_tokens {self.max_tokens}"
        if self.max_tokens and self.finish_reason != "length":
            return f"last finish_reason {self.finish_reason!r}"
        expected = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
        }
        if self.usage != expected:
            return f"usage {self.usage} instead of {expected}"
        return None


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, prompt_tokens: int, max_tokens: int
) -> Stream:
    """Send one streaming completion and record when each part of the answer arrives."""
    seen = Stream(prompt_tokens, max_tokens)
    body = {
        "model": MODEL,
        "prompt": [TOKEN_ID] * prompt_tokens,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        seen.sent_s = time.perf_counter()
        async with client.stream("POST", f"{base_url}/completions", json=body) as response:
            seen.status = response.status_code
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    seen.done_s = now
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    seen.error = f"error chunk {chunk['error']}"
                    continue
                seen.ids.add(chunk["id"])
                if chunk.get("usage"):
                    seen.usage = chunk["usage"]
                if chunk["choices"]:
                    seen.chunk_s.append(now)
                    seen.finish_reason = chunk["choices"][0]["finish_reason"]
    except (httpx.HTTPError, ValueError, KeyError) as error:
        seen.error = f"{type(error).__name__}: {error}"
    return seen


def client(tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """One client: an ``httpx.AsyncClient`` with a single keep-alive connection.

    Each concurrent client gets its own: one pool holding many connections scans all of
    them on every read (httpcore), which would make the client, not the server, the
    cost being measured. *tls* shares one (unused) TLS context between clients.
    """
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(
        limits=limits, timeout=httpx.Timeout(600.0), verify=tls or ssl.create_default_context()
    )


async def send_all(
    base_url: str, jobs: Sequence[tuple[int, int]], concurrency: int, *, warm: bool = False
) -> list[Stream]:
    """Stream every ``(prompt, max_tokens)`` job from *concurrency* clients.

    Each client sends its next job (the next one not taken) when its previous one has
    ended; results come back in the jobs' order. With *warm*, each client first opens
    its connection with an untimed ``GET /health``.
    """
    results: list[Stream | None] = [None] * len(jobs)
    pending = iter(enumerate(jobs))

    async def send(http: httpx.AsyncClient) -> None:
        for index, (prompt, output) in pending:
            results[index] = await stream_completion(http, base_url, prompt, output)

    await _clients(base_url.removesuffix("/v1"), concurrency, warm, send)
    return [r for r in results if r is not None]


async def health_round_trips(url: str, count: int, concurrency: int) -> list[float]:
    """*count* ``GET /health`` round trips from *concurrency* warm clients, in seconds."""
    times: list[float] = []
    remaining = iter(range(count))

    async def send(http: httpx.AsyncClient) -> None:
        for _ in remaining:
            started = time.perf_counter()
            response = await http.get(f"{url}/health")
            times.append(time.perf_counter() - started)
            response.raise_for_status()

    await _clients(url, concurrency, True, send)
    return times


async def _clients(
    url: str,
    concurrency: int,
    warm: bool,
    work: Callable[[httpx.AsyncClient], Awaitable[None]],
) -> None:
    """Run *work* in *concurrency* clients at once (after a ``GET /health`` each if *warm*)."""
    tls = ssl.create_default_context()
    ready = asyncio.Barrier(concurrency)

    async def one_client() -> None:
        async with client(tls) as http:
            if warm:
                (await http.get(f"{url}/health")).raise_for_status()
            await ready.wait()  # every client starts its timed work together
            await work(http)

    await asyncio.gather(*(one_client() for _ in range(concurrency)))


def make_jobs(
    count: int,
    seed: int,
    prompt_tokens: tuple[int, int] = PROMPT_TOKENS,
    output_tokens: tuple[int, int] = OUTPUT_TOKENS,
) -> list[tuple[int, int]]:
    """*count* ``(prompt tokens, max_tokens)`` pairs, each uniform on its inclusive range."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, count).tolist()
    outputs = rng.integers(output_tokens[0], output_tokens[1] + 1, count).tolist()
    return list(zip(prompts, outputs, strict=True))


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Keep the client's full garbage collections short while it measures.

    This process holds pandas, NumPy and simsim; a full collection walks all of it (about
    30 ms here) and would pause every stream the client is reading. ``gc.freeze()``
    moves what exists now out of the collector's way; the server runs as shipped.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stats:
    """Order statistics of a sample, in milliseconds."""

    count: int
    min_ms: float
    median_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, values_s: Iterable[float]) -> Stats:
        """The statistics of *values_s* (seconds)."""
        values = np.asarray(list(values_s), dtype=float) * 1e3
        if values.size == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        low, median, p99, high = np.percentile(values, [0, 50, 99, 100])
        return cls(int(values.size), float(low), float(median), float(p99), float(high))


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level: measured minus simulated, and the baseline round trip."""

    concurrency: int
    requests: int
    ttft: Stats
    e2e: Stats
    gap: Stats
    health: Stats
    ttft_measured: Stats
    e2e_measured: Stats


@dataclass(frozen=True)
class TimingResult:
    """The whole run."""

    speed: float
    levels: list[LevelResult]
    failed: list[str]
    table_difference: str | None

    @property
    def ok(self) -> bool:
        """No failed request, and the recorded table equals the offline engine's."""
        return not self.failed and self.table_difference is None


def differences(
    streams: Sequence[Stream],
    requests: pd.DataFrame,
    tokens_us: dict[int, list[int]],
    speed: float,
) -> tuple[list[float], list[float], list[float]]:
    """Per request (and per gap): measured minus simulated TTFT, e2e and gaps, seconds."""
    ttft, e2e, gaps = [], [], []
    us = 1e-6 / speed  # simulated microseconds to wall seconds
    for stream in streams:
        rid = stream.request_id
        assert rid is not None and stream.done_s is not None
        row = requests.loc[rid]
        if stream.chunk_s:
            ttft.append(stream.chunk_s[0] - stream.sent_s - int(row["ttft_us"]) * us)
        e2e.append(stream.done_s - stream.sent_s - int(row["e2e_latency_us"]) * us)
        simulated = tokens_us.get(rid, [])
        if len(simulated) == len(stream.chunk_s):
            for k in range(1, len(simulated)):
                measured = stream.chunk_s[k] - stream.chunk_s[k - 1]
                gaps.append(measured - (simulated[k] - simulated[k - 1]) * us)
    return ttft, e2e, gaps


# --------------------------------------------------------------------------- report


def report(result: TimingResult) -> str:
    """The result as text: one Markdown table per level, then the checks."""
    lines = [
        f"simsim serve at speed {result.speed:g}, in another process; a streaming httpx "
        "client over loopback. Differences are measured minus simulated (simulated / "
        "speed), wall ms on this machine.",
    ]
    for level in result.levels:
        lines += [
            "",
            f"Concurrency {level.concurrency}: {level.requests} requests",
            "",
            "| quantity | n | min ms | median ms | p99 ms | max ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, stats in (
            ("TTFT measured - simulated", level.ttft),
            ("e2e measured - simulated", level.e2e),
            ("inter-token gap measured - simulated", level.gap),
            ("GET /health round trip (baseline)", level.health),
            ("TTFT measured", level.ttft_measured),
            ("e2e measured", level.e2e_measured),
        ):
            lines.append(
                f"| {name} | {stats.count} | {stats.min_ms:.3f} | {stats.median_ms:.3f} "
                f"| {stats.p99_ms:.3f} | {stats.max_ms:.3f} |"
            )
        base = level.health.median_ms
        lines.append("")
        lines.append(
            f"Median difference over the median /health round trip: TTFT "
            f"{level.ttft.median_ms / base:.2f}x, e2e {level.e2e.median_ms / base:.2f}x "
            f"(round trip {base:.3f} ms)"
        )
    lines.append("")
    if result.failed:
        lines.append(f"FAILED requests: {len(result.failed)}; first: {result.failed[0]}")
    else:
        lines.append("Every request streamed completely (chunks, finish reason, usage, [DONE]).")
    if result.table_difference is None:
        lines.append(
            "The recorded request table equals the offline engine's for the same arrivals."
        )
    else:
        lines.append(
            "The recorded request table DIFFERS from the offline engine's: "
            f"{result.table_difference}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> TimingResult:
    """Run the benchmark, print its report and return the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per level")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 4], help="clients in flight"
    )
    parser.add_argument("--speed", type=float, default=1.0, help="the server's --speed")
    parser.add_argument("--scenario", default=None, help="a scenario TOML file to serve")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests first")
    parser.add_argument("--seed", type=int, default=13, help="seeds the request sizes")
    args = parser.parse_args(argv)
    if args.requests < 1 or min(args.concurrency) < 1 or args.warmup < 0:
        parser.error("--requests and --concurrency must be >= 1, --warmup >= 0")

    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "record"
        measured: list[tuple[int, list[Stream], list[float]]] = []
        with (
            quiet_collector(),
            ServerProcess(record, speed=args.speed, scenario=args.scenario) as server,
        ):
            asyncio.run(health_round_trips(server.url, 20, 1))
            if args.warmup:
                asyncio.run(send_all(server.base_url, make_jobs(args.warmup, args.seed + 1), 1))
            for index, concurrency in enumerate(args.concurrency):
                health = asyncio.run(health_round_trips(server.url, args.requests, concurrency))
                jobs = make_jobs(args.requests, args.seed + 2 + index)
                streams = asyncio.run(send_all(server.base_url, jobs, concurrency, warm=True))
                measured.append((concurrency, streams, health))
        requests = read_requests(record)
        events = pd.read_csv(record / "events.csv")

    failed = [
        f"request {i} at concurrency {c}: {why}"
        for c, streams, _ in measured
        for i, stream in enumerate(streams)
        if (why := stream.problem()) is not None
    ]
    offline, _ = run_offline(requests, args.scenario)
    difference = first_difference(requests, offline.requests_frame())
    tokens_us = token_times_us(events)
    levels = []
    for concurrency, streams, health in measured:
        good = [s for s in streams if s.problem() is None]
        ttft, e2e, gaps = differences(good, requests, tokens_us, args.speed)
        levels.append(
            LevelResult(
                concurrency=concurrency,
                requests=len(streams),
                ttft=Stats.of(ttft),
                e2e=Stats.of(e2e),
                gap=Stats.of(gaps),
                health=Stats.of(health),
                ttft_measured=Stats.of(s.chunk_s[0] - s.sent_s for s in good if s.chunk_s),
                e2e_measured=Stats.of(s.done_s - s.sent_s for s in good if s.done_s),
            )
        )
    result = TimingResult(args.speed, levels, failed, difference)
    print(report(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main().ok else 1)
