"""Play a scenario's requests against a real OpenAI-compatible server and measure them.

:func:`replay_scenario` sends every request of a scenario to ``POST {url}/v1/completions``
at its scheduled arrival, in real time and open loop (each request is sent on time
whatever the others are doing), streams the answer, disconnects at the scenario's
cancellation times, and returns a :class:`~simsim.fidelity.measured.MeasuredRun` in
simsim's schema. ``simsim replay`` is the same from the command line
(``docs/fidelity.md``).

Lengths are exact by construction: a prompt is a list of token ids (drawn from a seeded
generator over :attr:`ReplayOptions.token_ids`, different for every request, so a prefix
cache cannot hit by accident), and the output is ``max_tokens`` with ``ignore_eos`` and
``min_tokens`` set. Every request gets a connection of its own (llama.cpp's server closes
one after each streamed response). Times come from :func:`time.perf_counter_ns`, in
integer microseconds since a time zero taken just before the schedule starts; a request's
``arrival_time_us`` is when it was actually sent, so latencies never include how late
the client sent it, which is recorded apart (``send_lag_us``).

:func:`stream_completion` is the building block: one streamed request, its token times.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import numpy as np
import pandas as pd

from simsim.fidelity.measured import (
    FAILED,
    MeasuredRun,
    RequestRecord,
    StreamedCompletion,
    measured_frames,
)
from simsim.scenario import Scenario, ScenarioError
from simsim.scenario.model import RequestSpec
from simsim.wording import counted
from simsim.workloads import ClosedLoopWorkload

__all__ = [
    "DEFAULT_TOKEN_IDS",
    "RESERVED_BODY_KEYS",
    "PlannedRequest",
    "ReplayError",
    "ReplayOptionError",
    "ReplayOptions",
    "completions_url",
    "first_model",
    "planned_requests",
    "prompt_token_ids",
    "replay_client",
    "replay_report",
    "replay_scenario",
    "replay_scenario_async",
    "server_root",
    "stream_completion",
]

DEFAULT_TOKEN_IDS: Final = (3, 1002)
"""The prompt token ids drawn by default, both ends included: valid for the random-weight
llama vocabulary of ``benchmarks/fidelity`` (ids 3..1002 are its words) and any real one."""

RESERVED_BODY_KEYS: Final = ("model", "prompt", "max_tokens", "stream", "stream_options")
"""Body fields replay sets itself, which :attr:`ReplayOptions.extra_body` may not set."""

_BANNED_BIAS: Final = -100
"""The ``logit_bias`` of a banned token (OpenAI's lowest; llama.cpp and vLLM honour it)."""


class ReplayError(Exception):
    """The replay could not start: the server's model list could not be read, say."""


class ReplayOptionError(ValueError):
    """A :class:`ReplayOptions` field broke a rule; ``field`` names it, ``rule`` says how."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field} {rule}")


@dataclass(frozen=True)
class ReplayOptions:
    """How replay builds each request body and waits for the server.

    - ``token_ids``: the (lowest, highest) prompt token id drawn, both included.
    - ``prompt_seed``: seeds the prompt ids (request *r*'s ids come from
      ``numpy.random.default_rng([prompt_seed, r])``); ``None`` draws a fresh seed per
      replay, so replaying twice never sends the same prompt twice (a server's prefix
      cache could hit the second time).
    - ``ban_tokens``: token ids given ``logit_bias`` -100 (a random-weight model's
      end-of-sequence and control tokens).
    - ``exact_output``: send ``ignore_eos: true`` and ``min_tokens`` = ``max_tokens``
      (vLLM, llama.cpp and ``simsim serve`` accept them; turn off for a server that
      refuses them).
    - ``extra_body``: more body fields, sent as given and winning over the ones above
      (``{"cache_prompt": false}`` for llama.cpp); :data:`RESERVED_BODY_KEYS` refused.
    - ``timeout_s``: how long to wait to connect, or for the next chunk, before a
      request fails.
    """

    token_ids: tuple[int, int] = DEFAULT_TOKEN_IDS
    prompt_seed: int | None = None
    ban_tokens: tuple[int, ...] = ()
    exact_output: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        low_high = self.token_ids
        if (
            not isinstance(low_high, tuple)
            or len(low_high) != 2
            or not all(_is_int(value) and value >= 0 for value in low_high)
            or low_high[0] > low_high[1]
        ):
            raise ReplayOptionError(
                "token_ids",
                f"must be (lowest, highest) token ids with 0 <= lowest <= highest, "
                f"got {low_high!r}",
            )
        if self.prompt_seed is not None and not (
            _is_int(self.prompt_seed) and self.prompt_seed >= 0
        ):
            raise ReplayOptionError(
                "prompt_seed", f"must be an integer >= 0, got {self.prompt_seed!r}"
            )
        for token in self.ban_tokens:
            if not (_is_int(token) and token >= 0):
                raise ReplayOptionError("ban_tokens", f"must be token ids >= 0, got {token!r}")
        if not isinstance(self.exact_output, bool):
            raise ReplayOptionError(
                "exact_output", f"must be true or false, got {self.exact_output!r}"
            )
        self._check_extra_body()
        timeout = self.timeout_s
        if not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout > 0
        ):
            raise ReplayOptionError("timeout_s", f"must be a positive number, got {timeout!r}")

    def _check_extra_body(self) -> None:
        extra = self.extra_body
        if not isinstance(extra, Mapping):
            raise ReplayOptionError("extra_body", f"must be a JSON object, got {extra!r}")
        reserved = [key for key in RESERVED_BODY_KEYS if key in extra]
        if reserved:
            raise ReplayOptionError(
                "extra_body",
                f"may not set {reserved}: replay sets {list(RESERVED_BODY_KEYS)} itself "
                "to keep prompt and output lengths exact",
            )
        if self.ban_tokens and "logit_bias" in extra:
            raise ReplayOptionError(
                "extra_body",
                "may not set logit_bias when ban_tokens are given: give the bans in one place",
            )
        try:
            json.dumps(dict(extra), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ReplayOptionError("extra_body", f"must hold JSON values only ({error})") from None

    def body(self, model: str, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
        """The streamed ``/v1/completions`` body of one request."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.exact_output:
            body["ignore_eos"] = True
            body["min_tokens"] = max_tokens
        if self.ban_tokens:
            body["logit_bias"] = {str(token): _BANNED_BIAS for token in self.ban_tokens}
        body.update(self.extra_body)
        return body

    def manifest(self) -> dict[str, Any]:
        """These options as the measured manifest records them."""
        return {
            "token_ids": list(self.token_ids),
            "ban_tokens": list(self.ban_tokens),
            "exact_output": self.exact_output,
            "extra_body": dict(self.extra_body),
            "timeout_s": self.timeout_s,
        }


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


# ------------------------------------------------------------------------------ one request


def server_root(url: str) -> str:
    """The server's root URL: *url* without a trailing ``/`` or ``/v1``.

    ``http://127.0.0.1:8000``, ``http://127.0.0.1:8000/``, ``http://127.0.0.1:8000/v1``
    and ``http://127.0.0.1:8000/v1/completions`` all give ``http://127.0.0.1:8000``. ``ValueError``
    naming *url* for anything but an ``http(s)://host[:port][/path]`` URL.
    """
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as error:
        raise ValueError(f"url {url!r} is not a URL ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"url {url!r} must be an http:// or https:// URL with a host, "
            "e.g. http://127.0.0.1:8000"
        )
    if parsed.query or parsed.fragment:
        raise ValueError(f"url {url!r} must not have a query or fragment")
    path = parsed.path.rstrip("/").removesuffix("/completions").removesuffix("/v1")
    root = str(parsed.copy_with(path=path))
    return root.rstrip("/")


def completions_url(url: str) -> str:
    """``POST`` here for a completion: :func:`server_root` + ``/v1/completions``."""
    return f"{server_root(url)}/v1/completions"


def replay_client(timeout_s: float = 300.0) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that opens a fresh connection for every request.

    No connection is kept alive or reused (``Connection: close``, no keep-alive pool;
    llama.cpp's server closes its end after each stream anyway), none waits for a free
    one (no limit on open connections, so a send is never delayed by the pool), and
    sockets set ``TCP_NODELAY``. *timeout_s* bounds connecting and each wait for data.
    Use it as ``async with replay_client() as client:``.
    """
    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout_s),
        headers={"connection": "close"},
    )


async def first_model(client: httpx.AsyncClient, url: str) -> str:
    """The id of the first model ``GET {url}/v1/models`` lists; :class:`ReplayError` if none."""
    models_url = f"{server_root(url)}/v1/models"
    try:
        response = await client.get(models_url)
    except httpx.HTTPError as error:
        raise ReplayError(
            f"cannot reach {models_url} ({type(error).__name__}: {error}); "
            "is the server running? (or give the model name)"
        ) from None
    if response.status_code != 200:
        raise ReplayError(
            f"GET {models_url} answered {response.status_code}: "
            f"{_error_message(response.content)} (give the model name)"
        )
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ReplayError(
            f"GET {models_url} did not list a model (got {response.text[:200]!r}); "
            "give the model name"
        ) from None


def prompt_token_ids(
    count: int, rng: np.random.Generator, token_ids: tuple[int, int] = DEFAULT_TOKEN_IDS
) -> list[int]:
    """*count* token ids drawn uniformly from *token_ids* (lowest, highest, both included)."""
    low, high = token_ids
    return [int(token) for token in rng.integers(low, high, size=count, endpoint=True)]


async def stream_completion(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    *,
    zero_ns: int | None = None,
    cancel_at_ns: int | None = None,
) -> StreamedCompletion:
    """Send one streamed completion and time every token chunk; never raises for the server.

    *url* is the full endpoint (:func:`completions_url`), *body* the JSON body
    (:meth:`ReplayOptions.body`; it must ask for a stream). Times in the result are
    integer microseconds since *zero_ns* (a :func:`time.perf_counter_ns` reading;
    default: the moment the request is sent, so ``sent_us`` is 0). At *cancel_at_ns*
    (same clock), if the stream is still open, the client disconnects and the result
    is ``cancelled``.

    A chunk counts as one token when its first choice has non-empty ``text``, or has
    no ``finish_reason`` (a token whose text is empty, such as a control token); an
    empty chunk that only carries the ``finish_reason`` (llama.cpp's last one) and the
    usage chunk count as none. A non-200 answer, an error chunk, a broken or
    unreadable stream, or one that ends with neither a ``finish_reason`` nor
    ``[DONE]`` gives a result with ``error`` set (and the tokens received until then).
    """
    content = json.dumps(body, separators=(",", ":")).encode()
    stream = _Stream()
    sent_ns = time.perf_counter_ns()
    zero = sent_ns if zero_ns is None else zero_ns
    delay_s = None if cancel_at_ns is None else max(0.0, (cancel_at_ns - sent_ns) / 1e9)
    scope = asyncio.timeout(delay_s)
    cancelled = False
    try:
        async with scope:
            await stream.read(client, url, content)
    except TimeoutError:
        if not scope.expired():
            stream.error = "TimeoutError: timed out"
        cancelled = scope.expired()
    except Exception as error:  # httpx's errors, bad JSON: this request's failure only
        stream.error = f"{type(error).__name__}: {error}"
    end_ns = time.perf_counter_ns()
    if not cancelled and stream.error is None and not (stream.done or stream.finish_reason):
        stream.error = (
            f"the stream ended after {counted(len(stream.token_ns), 'token')} with neither a "
            "finish_reason nor [DONE]"
        )
    return StreamedCompletion(
        sent_us=(sent_ns - zero) // 1000,
        token_times_us=tuple((t - zero) // 1000 for t in stream.token_ns),
        end_us=(end_ns - zero) // 1000,
        status=stream.status,
        finish_reason=stream.finish_reason,
        usage_prompt_tokens=stream.usage_prompt_tokens,
        usage_completion_tokens=stream.usage_completion_tokens,
        response_id=stream.response_id,
        cancelled=cancelled,
        error=None if cancelled else stream.error,
    )


@dataclass
class _Stream:
    """What has come back so far on one stream."""

    token_ns: list[int] = field(default_factory=list)
    status: int | None = None
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    response_id: str | None = None
    done: bool = False
    error: str | None = None

    async def read(self, client: httpx.AsyncClient, url: str, content: bytes) -> None:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        async with client.stream("POST", url, content=content, headers=headers) as response:
            self.status = response.status_code
            if response.status_code != 200:
                message = _error_message(await response.aread())
                self.error = f"HTTP {response.status_code}: {message}"
                return
            async for line in response.aiter_lines():
                now_ns = time.perf_counter_ns()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event names
                payload = line[5:].strip()
                if payload == "[DONE]":
                    self.done = True
                    return
                self.take(json.loads(payload), now_ns)
                if self.error is not None:
                    return

    def take(self, chunk: Any, now_ns: int) -> None:
        """Take one ``data:`` chunk received at *now_ns*."""
        if not isinstance(chunk, dict):
            self.error = f"a stream chunk is not a JSON object: {chunk!r:.200}"
            return
        if "error" in chunk:
            self.error = f"error chunk: {_message_of(chunk)}"
            return
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage_prompt_tokens = _count_or_none(usage.get("prompt_tokens"))
            self.usage_completion_tokens = _count_or_none(usage.get("completion_tokens"))
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return  # the usage chunk, or a keep-alive
        choice = choices[0]
        text, finish = choice.get("text"), choice.get("finish_reason")
        if isinstance(finish, str):
            self.finish_reason = finish
        if (isinstance(text, str) and text) or finish is None:
            self.token_ns.append(now_ns)


def _count_or_none(value: Any) -> int | None:
    return value if _is_int(value) and value >= 0 else None


def _message_of(body: Any) -> str:
    """The message of an OpenAI-style error object (or a FastAPI ``detail``)."""
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return f"{json.dumps(body)[:200]}"


def _error_message(raw: bytes) -> str:
    try:
        return _message_of(json.loads(raw))
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:200] or "(empty body)"


# ------------------------------------------------------------------------------ a scenario


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """A scenario request as replay sends it, with its earliest cancellation time."""

    spec: RequestSpec
    cancel_time_us: int | None


def planned_requests(scenario: Scenario) -> list[PlannedRequest]:
    """*scenario*'s requests in send order (arrival, then id), with their cancellations.

    A request's cancellation time is the earliest of its ``[[cancellations]]`` and
    its workload's patience deadline. Raises :class:`~simsim.scenario.ScenarioError`
    for a closed-loop workload (its arrivals depend on the server's answers) and for a
    scenario without requests.
    """
    if isinstance(scenario.workload, ClosedLoopWorkload):
        raise ScenarioError(
            scenario.source,
            "workload",
            "a closed-loop workload cannot be replayed: its arrivals depend on the "
            "server's answers; replay plays open-loop requests ([[requests]], [trace] "
            "or an open-loop [workload]) on their schedule",
        )
    specs = scenario.all_requests()
    if not specs:
        raise ScenarioError(scenario.source, "requests", "the scenario has no requests to replay")
    deadlines = [(c.time_us, c.request_id) for c in scenario.cancellations]
    generated = scenario.generated()
    if generated is not None:
        deadlines.extend(generated.cancellations)
    cancels: dict[int, int] = {}
    for time_us, request_id in deadlines:
        cancels[request_id] = min(time_us, cancels.get(request_id, time_us))
    planned = [PlannedRequest(spec, cancels.get(spec.request_id)) for spec in specs]
    planned.sort(key=lambda item: (item.spec.arrival_time_us, item.spec.request_id))
    return planned


async def replay_scenario_async(
    scenario: Scenario,
    url: str,
    *,
    model: str | None = None,
    options: ReplayOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MeasuredRun:
    """Replay *scenario*'s requests against the server at *url*; see :func:`replay_scenario`."""
    options = ReplayOptions() if options is None else options
    planned = planned_requests(scenario)
    endpoint = completions_url(url)
    prompt_seed = secrets.randbits(63) if options.prompt_seed is None else options.prompt_seed
    async with replay_client(options.timeout_s) as client:
        model = await _model_warming_up(client, url, model)

        def body(spec: RequestSpec) -> dict[str, Any]:
            rng = np.random.default_rng([prompt_seed, spec.request_id])
            prompt = prompt_token_ids(spec.prompt_token_count, rng, options.token_ids)
            return options.body(model, prompt, spec.max_output_tokens)

        started_at = datetime.datetime.now(datetime.UTC)
        results = await _play(client, endpoint, planned, body, progress)
    records = [
        RequestRecord(
            request_id=item.spec.request_id,
            scheduled_time_us=item.spec.arrival_time_us,
            prompt_token_count=item.spec.prompt_token_count,
            max_output_tokens=item.spec.max_output_tokens,
            cancel_time_us=item.cancel_time_us,
            result=results.get(item.spec.request_id),
        )
        for item in planned
    ]
    frames = measured_frames(records)
    return MeasuredRun(
        scenario=scenario.name,
        seed=scenario.seed,
        requests=frames["requests"],
        tokens=frames["tokens"],
        measured={
            "url": server_root(url),
            "model": model,
            "started_at": started_at.isoformat(timespec="milliseconds"),
            "scenario_file": scenario.source,
            "prompt_seed": prompt_seed,
            **options.manifest(),
        },
        end_us=_end_us(records),
    )


async def _play(
    client: httpx.AsyncClient,
    endpoint: str,
    planned: Sequence[PlannedRequest],
    body: Callable[[RequestSpec], dict[str, Any]],
    progress: Callable[[int, int], None] | None,
) -> dict[int, StreamedCompletion]:
    """Send *planned* on schedule from a time zero taken now; every request's result.

    Each request's body is built before its send time comes (while waiting for it), and
    each send starts a task of its own, so a slow stream never delays the next send. A
    request whose cancellation comes at or before its arrival is not sent (no result).
    """
    tasks: dict[int, asyncio.Task[StreamedCompletion]] = {}
    done = 0

    def one_done(_task: asyncio.Task[StreamedCompletion] | None) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, len(planned))

    zero_ns = time.perf_counter_ns()
    for item in planned:
        spec, cancel_us = item.spec, item.cancel_time_us
        if cancel_us is not None and cancel_us <= spec.arrival_time_us:
            one_done(None)
            continue
        content = body(spec)
        wait_s = (zero_ns + spec.arrival_time_us * 1000 - time.perf_counter_ns()) / 1e9
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        cancel_ns = None if cancel_us is None else zero_ns + cancel_us * 1000
        task = asyncio.create_task(
            stream_completion(client, endpoint, content, zero_ns=zero_ns, cancel_at_ns=cancel_ns)
        )
        task.add_done_callback(one_done)
        tasks[spec.request_id] = task
    await asyncio.gather(*tasks.values())
    return {request_id: task.result() for request_id, task in tasks.items()}


async def _model_warming_up(client: httpx.AsyncClient, url: str, model: str | None) -> str:
    """*model*, or the first one listed; the list is asked for even when *model* is given.

    A fresh client's first request pays tens of milliseconds of one-time set-up (seen
    on a loaded machine), which must fall before time zero, not on the first request.
    """
    try:
        listed = await first_model(client, url)
    except ReplayError:
        if model is None:
            raise
        return model
    return listed if model is None else model


def replay_scenario(
    scenario: Scenario,
    url: str,
    *,
    model: str | None = None,
    options: ReplayOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MeasuredRun:
    """Replay *scenario* against the OpenAI-compatible server at *url*, in real time.

    *url* is the server's root, with or without ``/v1`` (``http://127.0.0.1:8000``).
    *model* defaults to the first model ``GET /v1/models`` lists (asked before time
    zero in any case, so that the client's one-time set-up is not timed). Each request is sent
    at its scheduled arrival after a time zero taken just before the schedule starts,
    streamed, and cut off at its cancellation time if it has one; *progress*, if
    given, is called with (requests done, requests in all) as each ends. A request the
    server fails (an HTTP error, a broken stream) is recorded as ``FAILED`` with its
    ``error``, never raised. Raises :class:`~simsim.scenario.ScenarioError` for a
    closed-loop workload or a scenario without requests, ``ValueError`` for a bad
    *url*, and :class:`ReplayError` when the model list is needed and cannot be read.
    Runs its own event loop: from async code, await :func:`replay_scenario_async`.
    """
    return asyncio.run(
        replay_scenario_async(scenario, url, model=model, options=options, progress=progress)
    )


def _end_us(records: Iterable[RequestRecord]) -> int:
    """The last time anything was measured (or a never-sent request ended)."""
    latest = 0
    for record in records:
        result = record.result
        if result is None:
            latest = max(latest, record.cancel_time_us or 0)
        else:
            latest = max(latest, result.end_us, *result.token_times_us)
    return latest


def replay_report(run: MeasuredRun) -> str:
    """A few lines for a terminal: what was sent and how it ended, the client's lag."""
    requests = run.requests
    states = requests["state"].value_counts()
    sent = int(requests["send_lag_us"].notna().sum())
    lines = [
        f"replayed {run.scenario!r} against {run.measured['url']} (model "
        f"{run.measured['model']!r}): {sent} of {counted(len(requests), 'request')} sent, "
        f"{states.get('FINISHED', 0)} finished, {states.get('CANCELLED', 0)} cancelled, "
        f"{states.get(FAILED, 0)} failed"
    ]
    lag = requests["send_lag_us"].dropna()
    if len(lag):
        lines.append(
            f"send lag      max {_ms(lag.max())}, p99 {_ms(lag.quantile(0.99))} "
            "(how late the client sent a request; latencies count from the actual send)"
        )
    for column, label in (("ttft_us", "TTFT"), ("e2e_latency_us", "e2e latency")):
        values = requests[column].dropna().astype("float64")
        if len(values):
            cells = ", ".join(f"p{q} {_ms(values.quantile(q / 100))}" for q in (50, 90, 99))
            lines.append(f"{label:<14}{cells} (measured, {counted(len(values), 'request')})")
    usage = requests["usage_completion_tokens"]
    mismatched = int(((usage != requests["chunk_token_count"]) & usage.notna()).sum())
    if mismatched:
        lines.append(
            f"tokens        {counted(mismatched, 'request')} had a usage count that differs "
            f"from {'its' if mismatched == 1 else 'their'} chunk count "
            "(generated_token_count follows usage; see chunk_token_count)"
        )
    prompt_usage = requests["usage_prompt_tokens"]
    prompt_off = int(
        ((prompt_usage != requests["prompt_token_count"]) & prompt_usage.notna()).sum()
    )
    if prompt_off:
        lines.append(
            f"prompts       the server counted a different prompt length for {prompt_off} "
            "requests (see usage_prompt_tokens)"
        )
    failed = requests[requests["state"] == FAILED]
    for row in failed.head(5).itertuples():
        message = str(row.error)
        short = message if len(message) <= 160 else f"{message[:157]}..."
        lines.append(f"failed        request {row.request_id}: {short}")
    if len(failed) > 5:
        lines.append(f"failed        ... and {len(failed) - 5} more (see the error column)")
    return "\n".join(lines)


def _ms(value_us: Any) -> str:
    return "n/a" if pd.isna(value_us) else f"{float(value_us) / 1000:.2f} ms"
