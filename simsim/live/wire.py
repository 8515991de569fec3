"""OpenAI's request bodies as simsim reads them, and the errors it answers with.

:func:`parse_completion` checks a completion or chat completion body against the rules
of ``docs/serve.md`` ("Endpoints and fields") and says what it asks of the simulation
(an :class:`Ask`: prompt tokens, output tokens, priority, streaming); anything it refuses is an
:class:`ApiError` carrying OpenAI's error object. :class:`ServeOptions` are the
server's settings these rules read. Nothing here knows the simulation, nor HTTP beyond
the value of a ``Content-Type`` header (:func:`check_content_type`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from simsim.clock import MAX_TIME_US
from simsim.live.tokens import chat_text, count_text_tokens

__all__ = [
    "MAX_MODEL_LEN",
    "ApiError",
    "Ask",
    "OptionError",
    "ServeOptions",
    "check_content_type",
    "model_not_found",
    "parse_completion",
    "read_json_object",
]


MAX_MODEL_LEN: Final = 2**40
"""The largest context limit a server takes: far beyond any model, well inside 64 bits."""


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
            raise OptionError("model", f"must be a non-empty string, got {self.model!r}")
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
                raise OptionError(name, f"must be an integer, got {value!r}")
            if minimum is not None and value < minimum:
                raise OptionError(name, f"must be an integer >= {minimum}, got {value!r}")
        if self.max_model_len is not None and self.max_model_len > MAX_MODEL_LEN:
            raise OptionError(
                "max_model_len", f"must be at most {MAX_MODEL_LEN}, got {self.max_model_len}"
            )
        rate = self.fail_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise OptionError("fail_rate", f"must be a number from 0 to 1, got {rate!r}")
        status = self.fail_status
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise OptionError(
                "fail_status", f"must be an HTTP error status 400-599, got {status!r}"
            )


class OptionError(ValueError):
    """A :class:`ServeOptions` field that breaks its rule; :attr:`field` names it."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field} {rule}")
        self.field = field
        self.rule = rule


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

    def body(self) -> dict[str, Any]:
        """OpenAI's error object for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


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
        "request_id", "cache_salt", "include_stop_str_in_output",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
        "bad_words", "length_penalty", "add_special_tokens", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "structured_outputs", "logits_processors",
        "return_tokens_as_token_ids", "return_token_ids", "kv_transfer_params", "vllm_xargs",
        "guided_decoding_backend", "prompt_logprobs", "use_beam_search",
    }
)  # fmt: skip
_COMMON: Final = _SAMPLING | _HINTS | {
    "model", "stream", "stream_options", "max_tokens", "n", "logprobs", "priority",
}  # fmt: skip
_COMPLETION_FIELDS: Final = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT_FIELDS: Final = _COMMON | {
    "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "reasoning_effort", "verbosity", "modalities",
    "prediction", "web_search_options", "audio", "functions", "function_call",
    "chat_template", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "documents", "mm_processor_kwargs",
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
# OpenAI's documented ranges of the sampling numbers (inclusive): ignored, but a value
# outside its range is a client's bug that OpenAI's API refuses too.
_RANGES: Final = {
    "temperature": (0, 2),
    "top_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
}
# The roles of OpenAI's chat messages.
_ROLES: Final = ("system", "user", "assistant", "tool", "developer")
# A priority is a scheduler key: an int of the signed 64-bit range, as in scenario files.
_PRIORITY_RANGE: Final = (-MAX_TIME_US - 1, MAX_TIME_US)


@dataclass(frozen=True, slots=True)
class Ask:
    """What a valid completion request asks of the simulation."""

    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int = 0
    """The request's ``priority`` (a lower value runs first under a priority scheduler)."""


def model_not_found(name: str, options: ServeOptions) -> ApiError:
    """The 404 for a model *name* this server does not serve."""
    return ApiError(
        404,
        f"The model `{name}` does not exist; this server serves `{options.model}`.",
        error_type="not_found_error",
        param="model",
        code="model_not_found",
    )


def check_content_type(content_type: str | None) -> None:
    """Refuse (400) a body declared as anything but JSON.

    *content_type* is the request's ``Content-Type`` header: its media type must be
    ``application/json`` (in any case; parameters such as ``charset=utf-8`` are
    allowed). A request without the header is read as JSON, as vLLM reads it.
    """
    if content_type is None:
        return
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            400,
            f"the request body must be JSON with Content-Type: application/json, got "
            f"Content-Type: {content_type!r} (curl: -H 'Content-Type: application/json')",
        )


def _refuse_constant(name: str) -> Any:
    raise ApiError(
        400,
        f"the request body is not valid JSON: {name} is not a JSON number (JSON numbers "
        "are finite)",
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ApiError(
            400,
            f"the request body has the number {text}, too large for a double-precision "
            "float (JSON numbers must be finite)",
        )
    return value


def read_json_object(raw: bytes) -> dict[str, Any]:
    """The request body *raw* as a JSON object; :class:`ApiError` (400) otherwise.

    Strict JSON: ``NaN``, ``Infinity`` and numbers too large for a float (which Python
    reads as infinite) are refused.
    """
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise ApiError(400, "the request body is JSON nested too deeply to read") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_completion(body: dict[str, Any], chat: bool, options: ServeOptions) -> Ask:
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
    for key, (low, high) in _RANGES.items():
        value = body.get(key)
        if value is not None and not low <= value <= high:
            raise ApiError(
                400,
                f"'{key}' must be from {low} to {high} (OpenAI's range), got {value!r}",
                param=key,
            )
    priority = body.get("priority")
    if priority is None:
        priority = 0
    elif (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not _PRIORITY_RANGE[0] <= priority <= _PRIORITY_RANGE[1]
    ):
        raise ApiError(
            400,
            f"'priority' must be an integer from -2**63 to 2**63 - 1 (lower runs first "
            f"under a priority scheduler), got {priority!r}",
            param="priority",
        )
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(
            400, f"'model' must be a string naming the served model, got {model!r}", param="model"
        )
    if model != options.model:
        raise model_not_found(model, options)
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
    _only(body, "prompt_logprobs", (None, 0), "simsim has no log probabilities")
    _only(body, "use_beam_search", (None, False), "simsim does not model beam search")
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
    return Ask(chat, prompt_tokens, max_tokens, stream, include_usage, priority)


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
        if message["role"] not in _ROLES:
            raise ApiError(
                400,
                f"{where}.role must be one of {', '.join(map(repr, _ROLES))}, got "
                f"{message['role']!r}",
                param=f"{where}.role",
            )
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
