"""A measured run: what a real server did with a scenario's requests, as simsim's frames.

:func:`measured_frames` turns the client's record of each request (:class:`RequestRecord`)
into the tables a measured results folder holds (``docs/fidelity.md``):

- ``requests``: simsim's :data:`~simsim.results.REQUEST_COLUMNS` first, with the same
  dtypes and the derived latencies computed by :func:`simsim.results.requests_frame`
  itself, then the columns of :data:`~simsim.run_folder.MEASURED_REQUEST_DTYPES`;
- ``tokens``: one row per token received, with the time it arrived.

The state rule: ``FINISHED`` when the stream ended normally with every requested token;
``CANCELLED`` when the scenario cancelled the request and the client disconnected (or
never sent it, its cancellation coming first); ``FAILED`` (:data:`FAILED`, not a
:class:`~simsim.RequestState`) otherwise, with the reason in ``error``. Nothing here
talks to a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pandas as pd

from simsim.request import Request, RequestState
from simsim.results import TOKEN_COLUMNS, requests_frame, summarize
from simsim.run_folder import MEASURED_REQUEST_DTYPES, Format, write_run_folder
from simsim.wording import counted

__all__ = [
    "FAILED",
    "MEASURED_KEY",
    "TOKEN_COLUMNS",
    "MeasuredRun",
    "RequestRecord",
    "StreamedCompletion",
    "measured_frames",
]

FAILED: Final = "FAILED"
"""The ``state`` of a request the server did not serve as asked (see ``error``)."""

MEASURED_KEY: Final = "measured"
"""The manifest key that marks a results folder as measured (``run.json``)."""


@dataclass(frozen=True, slots=True)
class StreamedCompletion:
    """What one streamed completion request gave, every time in int microseconds.

    Times count from the caller's time zero (by default the moment the request was
    sent, so ``sent_us`` is 0 and ``token_times_us[0]`` is the time to first token).
    ``token_times_us`` holds one entry per chunk that carried a token, in order;
    ``end_us`` is when the stream ended: ``[DONE]`` or the server closing it, the
    client disconnecting (``cancelled``), or the error. ``status`` is the HTTP status
    (``None`` when no response came), ``error`` what went wrong (``None`` when
    nothing did), ``usage_*`` the server's ``usage`` (``None`` if it sent none).
    """

    sent_us: int
    token_times_us: tuple[int, ...]
    end_us: int
    status: int | None = None
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    response_id: str | None = None
    cancelled: bool = False
    error: str | None = None

    @property
    def generated_token_count(self) -> int:
        """Tokens generated: the server's ``usage`` when it gave one, else the chunks."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return len(self.token_times_us)

    @property
    def ttft_us(self) -> int | None:
        """First token minus send, or ``None`` without a token."""
        return self.token_times_us[0] - self.sent_us if self.token_times_us else None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One scenario request and what became of it (``result`` ``None``: never sent).

    ``cancel_time_us`` is the scenario's cancellation time for it, if any; a request
    whose cancellation comes at or before its arrival is never sent: it ends
    ``CANCELLED`` at its cancellation time, with its scheduled arrival.
    """

    request_id: int
    scheduled_time_us: int
    prompt_token_count: int
    max_output_tokens: int
    cancel_time_us: int | None
    result: StreamedCompletion | None

    def state(self) -> str:
        """``FINISHED``, ``CANCELLED`` or :data:`FAILED`, by the module's rule."""
        result = self.result
        if result is None:
            return RequestState.CANCELLED.name
        if result.cancelled:
            # All tokens before the disconnect: it finished before its cancellation.
            done = len(result.token_times_us) == self.max_output_tokens > 0
            return RequestState.FINISHED.name if done else RequestState.CANCELLED.name
        if result.error is not None or self.short_by() is not None:
            return FAILED
        return RequestState.FINISHED.name

    def short_by(self) -> str | None:
        """Why a stream that ended normally is not ``FINISHED`` (wrong token count)."""
        result = self.result
        if result is None or result.cancelled or result.error is not None:
            return None
        got = result.generated_token_count
        if got == self.max_output_tokens:
            return None
        return (
            f"the server generated {got} of the {counted(self.max_output_tokens, 'token')} "
            "asked for "
            f"(finish_reason {result.finish_reason!r}); pass ignore_eos/min_tokens or ban "
            "end-of-sequence tokens, and keep prompt + output within the server's context"
        )

    def error(self) -> str | None:
        """The ``error`` column: the failure, or ``None``."""
        if self.result is None:
            return None
        if self.result.error is not None:
            return self.result.error
        return self.short_by()

    def to_request(self) -> Request:
        """A :class:`Request` holding the measured times, for ``requests_frame``.

        A failed request is built ``CANCELLED`` (its derived latencies are those of any
        request that did not finish) and named ``FAILED`` in the frame afterwards.
        """
        result = self.result
        state = self.state()
        if result is None:
            return Request(
                self.request_id,
                self.scheduled_time_us,
                self.prompt_token_count,
                self.max_output_tokens,
                state=RequestState.CANCELLED,
                finish_time_us=self.cancel_time_us,
            )
        tokens = result.token_times_us
        finished = state == RequestState.FINISHED.name
        finish = tokens[-1] if finished and tokens else result.end_us
        return Request(
            self.request_id,
            result.sent_us,
            self.prompt_token_count,
            self.max_output_tokens,
            state=RequestState.FINISHED if finished else RequestState.CANCELLED,
            generated_token_count=(
                self.max_output_tokens if finished else result.generated_token_count
            ),
            first_token_time_us=tokens[0] if tokens else None,
            finish_time_us=finish,
        )


def measured_frames(records: Iterable[RequestRecord]) -> dict[str, pd.DataFrame]:
    """The ``requests`` and ``tokens`` tables of *records* (request id order)."""
    rows = sorted(records, key=lambda record: record.request_id)
    requests = requests_frame([record.to_request() for record in rows])
    requests["state"] = pd.array([record.state() for record in rows], dtype="str")
    results = [record.result for record in rows]
    appended: dict[str, Sequence[Any]] = {
        "scheduled_time_us": [record.scheduled_time_us for record in rows],
        "send_lag_us": [
            None if record.result is None else record.result.sent_us - record.scheduled_time_us
            for record in rows
        ],
        "cancel_time_us": [record.cancel_time_us for record in rows],
        "chunk_token_count": [0 if r is None else len(r.token_times_us) for r in results],
        "usage_prompt_tokens": [None if r is None else r.usage_prompt_tokens for r in results],
        "usage_completion_tokens": [
            None if r is None else r.usage_completion_tokens for r in results
        ],
        "http_status": [None if r is None else r.status for r in results],
        "response_id": [None if r is None else r.response_id for r in results],
        "error": [record.error() for record in rows],
    }
    for column, dtype in MEASURED_REQUEST_DTYPES.items():
        requests[column] = pd.Series(appended[column], dtype=dtype, index=requests.index)
    token_rows = [
        (record.request_id, index, time_us)
        for record in rows
        if record.result is not None
        for index, time_us in enumerate(record.result.token_times_us, start=1)
    ]
    tokens = pd.DataFrame(
        {
            "request_id": pd.Series([row[0] for row in token_rows], dtype="int64"),
            "token_index": pd.Series([row[1] for row in token_rows], dtype="int64"),
            "time_us": pd.Series([row[2] for row in token_rows], dtype="Int64"),
        }
    )
    return {"requests": requests, "tokens": tokens}


@dataclass(frozen=True)
class MeasuredRun:
    """A replay's measurements: its frames and what the manifest says about them.

    ``requests`` and ``tokens`` are :func:`measured_frames`' tables; ``measured`` is
    the manifest's ``measured`` entry (url, model, start time, request options);
    ``end_us`` the last time anything was measured.
    """

    scenario: str
    seed: int
    requests: pd.DataFrame
    tokens: pd.DataFrame
    measured: Mapping[str, Any]
    end_us: int

    @property
    def summary(self) -> pd.DataFrame:
        """:func:`simsim.summarize` of the requests (without occupancy: no admissions)."""
        return summarize(self.requests)

    def write(self, folder: str | Path, *, format: Format = "csv") -> list[Path]:
        """Write the measured folder (``requests``, ``tokens``, ``summary``, ``run.json``).

        *folder* is created if missing; tables of an earlier run in it are replaced.
        """
        Path(folder).mkdir(parents=True, exist_ok=True)
        return write_run_folder(
            folder,
            {
                "requests": self.requests,
                "tokens": self.tokens,
                "summary": self.summary.reset_index(),
            },
            format=format,
            scenario=self.scenario,
            seed=self.seed,
            end_us=self.end_us,
            extra={MEASURED_KEY: dict(self.measured)},
        )
