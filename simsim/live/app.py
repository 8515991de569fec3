"""The live server's HTTP side: OpenAI's wire format on a Starlette app, nothing more.

It turns HTTP requests into :class:`~simsim.live.driver.LiveDriver` submissions and the
driver's token updates into responses: JSON for a plain request, server-sent events
(one chunk per output token, then ``data: [DONE]``) for a streaming one. It knows
nothing of engines: prompt sizes go in, token numbers and simulated times come out.
Reading request bodies is :mod:`simsim.live.wire`'s; ``docs/serve.md`` is the reference
for every field and error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from simsim.errors import EngineFailedError
from simsim.live.driver import LiveDriver, LiveRequest, Refusal
from simsim.live.metrics import CONTENT_TYPE, ServerMetrics
from simsim.live.tokens import filler_text, filler_token
from simsim.live.wire import (
    ApiError,
    Ask,
    ServeOptions,
    check_content_type,
    model_not_found,
    parse_completion,
    read_json_object,
)
from simsim.request import RequestState

__all__ = ["create_app"]

# The model card's word on a [prefix_cache] (until served prompts are hashed into blocks).
_PREFIX_CACHE_NOTE = (
    "served requests carry no KV block hashes (simsim does not hash prompts into blocks "
    "yet), so the prefix cache never serves a prompt token over HTTP: every prompt is "
    "prefilled in full"
)
# An injected failure's error type, where OpenAI's is not the generic one for its class.
_INJECTED_TYPES = {429: "rate_limit_error", 401: "authentication_error", 404: "not_found_error"}


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
            why = f"the simulation stopped: {self.driver.failure}"
            return _error_response(ApiError(500, why, error_type="server_error"))
        return Response(status_code=200)

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: HttpRequest) -> Response:
        name = request.path_params["model"]
        if name != self.options.model:
            return _error_response(model_not_found(name, self.options))
        return JSONResponse(self._card())

    def _card(self) -> dict[str, Any]:
        card = {
            "id": self.options.model,
            "object": "model",
            "created": self.driver.unix_time(0),
            "owned_by": "simsim",
            "root": self.options.model,
            "parent": None,
            "max_model_len": self.options.max_model_len,
        }
        if self.driver.prefix_cache:
            card["prefix_caching"] = {
                "enabled": True,
                "hits_over_http": False,
                "note": _PREFIX_CACHE_NOTE,
            }
        return card

    async def metrics_page(self, request: HttpRequest) -> Response:
        self.driver.catch_up()  # one page, one simulated time: counters and gauges agree
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._complete(request, chat=True)

    # ------------------------------------------------------------------ completions

    async def _complete(self, request: HttpRequest, *, chat: bool) -> Response:
        try:
            try:
                raw = await request.body()
            except ClientDisconnect:  # gone before its request was read: nobody to answer
                self.metrics.rejected("client_disconnect")
                return Response(status_code=499)
            check_content_type(request.headers.get("content-type"))
            ask = parse_completion(read_json_object(raw), chat, self.options)
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
                live = self.driver.submit(ask.prompt_tokens, ask.max_tokens, priority=ask.priority)
            except EngineFailedError as error:
                raise ApiError(500, str(error), error_type="server_error") from None
            except (ValueError, TypeError, ArithmeticError) as error:
                # The engine refuses what it could never run (a time past 64 bits, say).
                raise ApiError(400, str(error)) from None
        except ApiError as error:
            self.metrics.rejected(
                error.code if error.code == "injected_failure" else _reason(error.status)
            )
            return _error_response(error)
        # The scenario's admission control checks the arrival when the simulation
        # processes it, a simulated microsecond from now: only then is the answer known.
        await live.checked.wait()
        refusal = self.driver.refusal(live)
        if refusal is not None:  # the metrics counted it, as they saw it end refused
            return _error_response(self._refused(refusal))
        return _Served(self, live, ask)

    def _refused(self, refusal: Refusal) -> ApiError:
        """The 429 of a request the admission control turned away.

        ``Retry-After`` is when its token bucket holds a token again, rounded up to
        whole wall seconds, where that is known; else ``--retry-after``.
        """
        wait_s = refusal.retry_after_s
        seconds = self.options.retry_after_s if wait_s is None else math.ceil(wait_s)
        return ApiError(
            429,
            refusal.message,
            error_type="rate_limit_error",
            code=refusal.reason,
            headers={"Retry-After": str(seconds)},
        )

    def _inject_failure(self) -> None:
        options = self.options
        if options.fail_rate and self._failures.random() < options.fail_rate:
            status = options.fail_status
            # 429 and 503 say when to come back, as a real server's would.
            retry = {"Retry-After": str(options.retry_after_s)} if status in (429, 503) else {}
            raise ApiError(
                status,
                f"injected failure (--fail-rate {options.fail_rate}): HTTP {status}",
                error_type=_INJECTED_TYPES.get(
                    status, "server_error" if status >= 500 else "invalid_request_error"
                ),
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

    def __init__(self, server: _Server, live: LiveRequest, ask: Ask) -> None:
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
            await _send_json(send, error.status, error.body())
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
                finish = "length" if number == last else None
                choice = _chunk_choice(chat, filler_token(number), number == 1, finish)
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
                choice = _chunk_choice(chat, "", True, "length")
                await _send_event(send, {**head, "choices": [choice]})
            if ask.include_usage:
                await _send_event(send, {**head, "choices": [], "usage": self._usage()})
        else:  # the server stopped, or the simulation failed, before the end
            await _send_event(send, _server_stopped(self._server).body())
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
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
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
    answer = ApiError(
        status,
        f"{request.method} {request.url.path}: {error.detail}; simsim serves POST "
        "/v1/completions, POST /v1/chat/completions, GET /v1/models, /health and /metrics",
        error_type="not_found_error" if status == 404 else "invalid_request_error",
        headers=error.headers,
    )
    return _error_response(answer)


# --------------------------------------------------------------------------- helpers


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


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


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


def _chunk_choice(chat: bool, text: str, first: bool, finish: str | None) -> dict[str, Any]:
    """A stream chunk's one choice; a chat's first chunk also carries the role."""
    if chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def _event(body: Mapping[str, Any]) -> bytes:
    """*body* as one server-sent event: ``data: <json>`` and a blank line."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _send_event(send: Send, body: Mapping[str, Any]) -> None:
    await send({"type": "http.response.body", "body": _event(body), "more_body": True})
