"""The live server's HTTP side: OpenAI's wire format on a Starlette app, nothing more.

It turns HTTP requests into :class:`~simsim.live.driver.LiveDriver` submissions and the
driver's token updates into responses: JSON for a plain request, server-sent events
(one chunk per output token, then ``data: [DONE]``) for a streaming one. It knows
nothing of engines: prompt sizes go in, token numbers and simulated times come out.
``docs/serve.md`` is the reference for every field and error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from simsim.errors import EngineFailedError
from simsim.live.driver import LiveDriver, LiveRequest
from simsim.live.metrics import CONTENT_TYPE, ServerMetrics
from simsim.live.tokens import chat_text, count_text_tokens, filler_text, filler_token
from simsim.request import RequestState

__all__ = ["ApiError", "ServeOptions", "create_app"]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How the live server answers (``simsim serve``'s options; ``docs/serve.md``)."""

    model: str = "simsim"
    """The model name served: requests must name it, ``/v1/models`` lists it."""
    max_model_len: int | None = None
    """The context limit: prompt plus ``max_tokens`` above it is refused with 400.

    ``None`` here means no limit; :class:`~simsim.live.LiveServer` replaces it with the
    engine's capacity (the KV cache's tokens, or 8192 without a cache).
    """
    default_max_tokens: int = 16
    """The output length of a request that gives no ``max_tokens`` (OpenAI's default)."""
    max_waiting: int | None = None
    """Refuse with 429 while this many requests are queued (``None``: never)."""
    retry_after_s: int = 1
    """The ``Retry-After`` header of a 429 or 503, in seconds."""
    fail_rate: float = 0.0
    """The fraction of valid completion requests answered with *fail_status* instead."""
    fail_status: int = 500
    """The HTTP status of an injected failure."""
    fail_seed: int = 0
    """Seeds the draw of injected failures (one draw per valid completion request)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty string, got {self.model!r}")
        for name, minimum, optional in (
            ("max_model_len", 1, True),
            ("default_max_tokens", 0, False),
            ("max_waiting", 1, True),
            ("retry_after_s", 0, False),
            ("fail_seed", None, False),
        ):
            value = getattr(self, name)
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if minimum is not None and value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        rate = self.fail_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ValueError(f"fail_rate must be a number from 0 to 1, got {rate!r}")
        status = self.fail_status
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"fail_status must be an HTTP error status 400-599, got {status!r}")


class ApiError(Exception):
    """An error answered with OpenAI's error object: ``{"error": {message, type, ...}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        """The error as an HTTP response."""
        body = {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# Fields simsim accepts. Sampling fields change what a real model writes, not how long
# it takes, so they are accepted and ignored; anything else is refused (400).
_SAMPLING: Final = frozenset(
    {
        "temperature", "top_p", "top_k", "min_p", "stop", "seed", "user",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
        "ignore_eos", "min_tokens", "stop_token_ids", "skip_special_tokens",
    }
)  # fmt: skip
# What else clients send that changes nothing simsim models: OpenAI's caching, routing
# and tracing hints, and vLLM's own request extras.
_HINTS: Final = frozenset(
    {
        "prompt_cache_key", "safety_identifier", "service_tier", "metadata", "store",
        "priority", "request_id", "cache_salt",
    }
)  # fmt: skip
_COMMON: Final = (
    _SAMPLING | _HINTS | {"model", "stream", "stream_options", "max_tokens", "n", "logprobs"}
)
_COMPLETION_FIELDS: Final = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT_FIELDS: Final = _COMMON | {
    "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "reasoning_effort", "verbosity", "modalities",
    "prediction", "web_search_options", "audio", "functions", "function_call",
}  # fmt: skip

# The types of the accepted-and-ignored fields a client may get wrong (null is always
# fine): ignored values are still checked, so a client bug shows here as on a real server.
_NUMBER = (int, float)
_FIELD_TYPES: Final[dict[str, tuple[tuple[type, ...], str]]] = {
    **{
        name: (_NUMBER, "a number")
        for name in (
            "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty",
        )
    },
    **{name: ((int,), "an integer") for name in ("seed", "top_k", "min_tokens", "top_logprobs")},
    **{name: ((bool,), "true or false") for name in ("ignore_eos", "skip_special_tokens", "store")},
    **{name: ((str,), "a string") for name in ("user", "prompt_cache_key", "safety_identifier")},
    "stop": ((str, list), "a string or a list of strings"),
    "logit_bias": ((dict,), "an object"),
    "metadata": ((dict,), "an object"),
    "stop_token_ids": ((list,), "a list of token ids"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Ask:
    """What a valid completion request asks of the simulation."""

    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


class _Server:
    """The state behind the routes: the driver, the metrics and the options."""

    def __init__(self, driver: LiveDriver, metrics: ServerMetrics, options: ServeOptions) -> None:
        self.driver = driver
        self.metrics = metrics
        self.options = options
        self._failures = random.Random(options.fail_seed)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The simulated clock starts with the server and stops with it."""
        self.driver.start()
        try:
            yield
        finally:
            self.driver.stop()

    # ------------------------------------------------------------------ routes

    async def health(self, request: HttpRequest) -> Response:
        if self.driver.failure is not None:
            return _error(500, f"the simulation stopped: {self.driver.failure}", "server_error")
        return Response(status_code=200)

    async def models(self, request: HttpRequest) -> Response:
        card = {
            "id": self.options.model,
            "object": "model",
            "created": self.driver.unix_time(0),
            "owned_by": "simsim",
            "root": self.options.model,
            "parent": None,
            "max_model_len": self.options.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics_page(self, request: HttpRequest) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=True)

    # ------------------------------------------------------------------ completions

    async def _complete(self, request: HttpRequest, *, chat: bool) -> Response:
        try:
            ask = _parse(await _json_object(request), chat, self.options)
            self._inject_failure()
            self._check_queue()
            if not self.driver.started:  # shutting down: the simulation has stopped
                raise ApiError(
                    503,
                    "the server is shutting down",
                    error_type="server_error",
                    headers={"Retry-After": str(self.options.retry_after_s)},
                )
            try:
                live = self.driver.submit(ask.prompt_tokens, ask.max_tokens)
            except EngineFailedError as error:
                raise ApiError(500, str(error), error_type="server_error") from None
            except (ValueError, TypeError) as error:
                raise ApiError(400, str(error)) from None
        except ApiError as error:
            self.metrics.rejected(
                error.code if error.code == "injected_failure" else _reason(error.status)
            )
            return error.response()
        return _Served(self, live, ask)

    def _inject_failure(self) -> None:
        options = self.options
        if options.fail_rate and self._failures.random() < options.fail_rate:
            status = options.fail_status
            # 429 and 503 say when to come back, as a real server's would.
            retry = {"Retry-After": str(options.retry_after_s)} if status in (429, 503) else {}
            raise ApiError(
                status,
                f"injected failure (--fail-rate {options.fail_rate}): HTTP {status}",
                error_type="server_error" if status >= 500 else "invalid_request_error",
                code="injected_failure",
                headers=retry,
            )

    def _check_queue(self) -> None:
        limit = self.options.max_waiting
        if limit is None:
            return
        _, waiting = self.driver.counts()
        if waiting >= limit:
            raise ApiError(
                429,
                f"the server's queue is full ({waiting} waiting, --max-waiting {limit}); "
                "retry later",
                error_type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(self.options.retry_after_s)},
            )

    def created(self, live: LiveRequest) -> int:
        """A response's ``created``: the Unix second of the request's simulated arrival."""
        return self.driver.unix_time(live.request.arrival_time_us)


class _Served(Response):
    """The answer to a submitted request, streamed or whole, as its tokens come.

    It listens for the client's disconnect the whole time: a client that goes away
    cancels its request in the simulation at that moment, freeing its slot.
    """

    def __init__(self, server: _Server, live: LiveRequest, ask: _Ask) -> None:
        super().__init__(status_code=200)
        self._server = server
        self._live = live
        self._ask = ask
        rid = live.request_id
        self._id = f"chatcmpl-{rid}" if ask.chat else f"cmpl-{rid}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener = asyncio.ensure_future(self._listen(receive))
        try:
            if self._ask.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        except OSError:
            pass  # the client went away while we wrote; the listener cancels
        finally:
            listener.cancel()

    async def _listen(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._server.driver.cancel(self._live.request_id)

    async def _whole(self, send: Send) -> None:
        live = self._live
        while await live.updates.get() is not None:
            pass
        request = live.request
        if request.state is RequestState.CANCELLED:
            return  # its client went away: nobody to answer
        if request.state is not RequestState.FINISHED:
            error = _server_stopped(self._server)
            await _send_json(send, error.status, _error_body(error))
            return
        text = filler_text(request.generated_token_count)
        if self._ask.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            kind = "text_completion"
        body = self._head(kind)
        body["choices"] = [choice]
        body["usage"] = self._usage()
        await _send_json(send, 200, body)

    async def _stream(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        live, ask = self._live, self._ask
        chat = ask.chat
        head = self._head("chat.completion.chunk" if chat else "text_completion")
        last = ask.max_tokens
        updates = live.updates
        ended = False
        while not ended:
            # Every token the simulation has produced by now goes out in one write: a
            # server-sent event each, one syscall for all (the simulation produces
            # them in bursts when it runs ahead of the loop, or at a high speed).
            batch = [await updates.get()]
            while not updates.empty():
                batch.append(updates.get_nowait())
            events = []
            for update in batch:
                if update is None:
                    ended = True
                    break
                number = update.number
                text = filler_token(number)
                if chat:
                    delta = (
                        {"role": "assistant", "content": text} if number == 1 else {"content": text}
                    )
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None}
                choice["finish_reason"] = "length" if number == last else None
                events.append(_event({**head, "choices": [choice]}))
            if events:
                await send(
                    {"type": "http.response.body", "body": b"".join(events), "more_body": True}
                )
        request = live.request
        if request.state is RequestState.CANCELLED:
            # Its client went away (the only way a served request is cancelled).
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if request.state is RequestState.FINISHED:
            if last == 0:  # no token: one empty chunk carries the finish reason
                if chat:
                    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                else:
                    choice = {"index": 0, "text": ""}
                choice.update(logprobs=None, finish_reason="length")
                await _send_event(send, {**head, "choices": [choice]})
            if ask.include_usage:
                await _send_event(send, {**head, "choices": [], "usage": self._usage()})
        else:  # the server stopped, or the simulation failed, before the end
            await _send_event(send, _error_body(_server_stopped(self._server)))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": kind,
            "created": self._server.created(self._live),
            "model": self._server.options.model,
        }

    def _usage(self) -> dict[str, int]:
        request = self._live.request
        prompt, completion = request.prompt_token_count, request.generated_token_count
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


def create_app(driver: LiveDriver, metrics: ServerMetrics, options: ServeOptions) -> Starlette:
    """The ASGI app of one served model: its routes, run by *driver*, counted in *metrics*.

    The driver starts with the app's lifespan and stops with it.
    """
    server = _Server(driver, metrics, options)
    routes = [
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_page, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=server.lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.server = server
    return app


async def _http_error(request: HttpRequest, error: Exception) -> Response:
    """An unknown path (404) or method (405), as OpenAI's error object."""
    assert isinstance(error, HTTPException)
    status = error.status_code
    return ApiError(
        status,
        f"{request.method} {request.url.path}: {error.detail}; simsim serves POST "
        "/v1/completions, POST /v1/chat/completions, GET /v1/models, /health and /metrics",
        error_type="not_found_error" if status == 404 else "invalid_request_error",
        headers=error.headers,
    ).response()


# --------------------------------------------------------------------------- parsing


async def _json_object(request: HttpRequest) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _parse(body: dict[str, Any], chat: bool, options: ServeOptions) -> _Ask:
    """Check *body* against the rules of ``docs/serve.md``; raise :class:`ApiError`."""
    allowed = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    unknown = sorted(key for key in body if key not in allowed)
    if unknown:
        raise ApiError(
            400,
            f"unknown field {unknown[0]!r}; simsim accepts {', '.join(sorted(allowed))}",
            param=unknown[0],
        )
    for key, (types, expected) in _FIELD_TYPES.items():
        value = body.get(key)
        if value is None:
            continue
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            raise ApiError(400, f"'{key}' must be {expected}, got {value!r}", param=key)
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(
            400, f"'model' must be a string naming the served model, got {model!r}", param="model"
        )
    if model != options.model:
        raise ApiError(
            404,
            f"The model `{model}` does not exist; this server serves `{options.model}`.",
            error_type="not_found_error",
            param="model",
            code="model_not_found",
        )
    if chat:
        prompt_tokens = _chat_tokens(body.get("messages"))
        key = (
            "max_completion_tokens"
            if body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
    else:
        prompt_tokens = _prompt_tokens(body.get("prompt"))
        key = "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = options.default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ApiError(400, f"'{key}' must be an integer >= 0, got {max_tokens!r}", param=key)
    _only(body, "n", (None, 1), "simsim generates one choice per request")
    _only(body, "best_of", (None, 1), "simsim generates one choice per request")
    _only(body, "echo", (None, False), "simsim does not echo the prompt")
    _only(body, "suffix", (None,), "simsim does not model suffixes")
    _only(body, "logprobs", (None, False, 0), "simsim has no log probabilities")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {stream!r}", param="stream")
    include_usage = False
    options_field = body.get("stream_options")
    if options_field is not None:
        if not stream:
            raise ApiError(
                400, "'stream_options' is only allowed with 'stream': true", param="stream_options"
            )
        if not isinstance(options_field, dict) or not set(options_field) <= {
            "include_usage",
            "continuous_usage_stats",
        }:
            raise ApiError(
                400,
                f"'stream_options' must be an object with 'include_usage', got {options_field!r}",
                param="stream_options",
            )
        include_usage = options_field.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise ApiError(
                400,
                f"'stream_options.include_usage' must be true or false, got {include_usage!r}",
                param="stream_options",
            )
    total = prompt_tokens + max_tokens
    if options.max_model_len is not None and total > options.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {options.max_model_len} tokens. However, "
            f"you requested {total} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
            "completion). Please reduce the length of the prompt or the completion.",
            param=key
            if prompt_tokens <= options.max_model_len
            else ("messages" if chat else "prompt"),
            code="context_length_exceeded",
        )
    return _Ask(chat, prompt_tokens, max_tokens, stream, include_usage)


def _only(body: Mapping[str, Any], key: str, allowed: tuple[Any, ...], why: str) -> None:
    value = body.get(key)
    if not any(
        value is choice or (type(value) is type(choice) and value == choice) for choice in allowed
    ):
        raise ApiError(400, f"'{key}' = {value!r} is not supported: {why}", param=key)


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return count_text_tokens(prompt)
    if isinstance(prompt, list):
        if all(type(token) is int for token in prompt):
            if any(token < 0 for token in prompt):
                raise ApiError(400, "'prompt' token ids must be integers >= 0", param="prompt")
            return len(prompt)  # token ids count exactly (an empty list is 0)
        if len(prompt) == 1 and isinstance(prompt[0], str | list):
            return _prompt_tokens(prompt[0])
        raise ApiError(
            400,
            "'prompt' must be a string, a list of token ids, or a list holding one of those; "
            "send one prompt per request",
            param="prompt",
        )
    raise ApiError(
        400, f"'prompt' must be a string or a list of token ids, got {prompt!r}", param="prompt"
    )


def _chat_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", param="messages")
    parts: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a string 'role'", param=where)
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            texts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise ApiError(
                        400,
                        f"{where}: simsim reads only text parts ({{'type': 'text', 'text': ...}})",
                        param=where,
                    )
                texts.append(part["text"])
            text = " ".join(texts)
        else:
            raise ApiError(
                400, f"{where}.content must be a string, a list of text parts or null", param=where
            )
        parts.append((message["role"], text))
    return count_text_tokens(chat_text(parts))


def _reason(status: int) -> str:
    if status == 429:
        return "queue_full"
    if status == 404:
        return "model_not_found"
    if 400 <= status < 500:
        return "bad_request"
    return "server_error"


def _server_stopped(server: _Server) -> ApiError:
    failure = server.driver.failure
    why = (
        f"the simulation failed: {failure}"
        if failure is not None
        else "the server is shutting down"
    )
    return ApiError(500, why, error_type="server_error")


def _error(status: int, message: str, error_type: str) -> JSONResponse:
    return ApiError(status, message, error_type=error_type).response()


def _error_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }


async def _send_json(send: Send, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data, "more_body": False})


def _event(body: Mapping[str, Any]) -> bytes:
    """*body* as one server-sent event: ``data: <json>`` and a blank line."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _send_event(send: Send, body: Mapping[str, Any]) -> None:
    await send({"type": "http.response.body", "body": _event(body), "more_body": True})
