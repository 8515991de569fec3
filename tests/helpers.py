"""Helpers shared by test files (import them with ``from helpers import ...``).

pytest puts this folder on ``sys.path`` while it imports the test files (the folder has
no ``__init__.py``), so a test file imports this module by its bare name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx

import simsim

if TYPE_CHECKING:
    import pandas as pd

    from simsim.engines.base import EngineBase
    from simsim.fidelity.calibrate import Probe
    from simsim.live import LiveServer, ServeOptions

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: ``benchmarks/``, ``examples/`` and ``docs/`` are below it."""

EXHAUSTIVE = os.environ.get("SIMSIM_EXHAUSTIVE", "0") not in ("", "0")
"""True when ``SIMSIM_EXHAUSTIVE=1``: the long runs, not the suite's quick sizes.

The suite's default sizes are chosen to reach every rule's code paths in a few seconds;
an exhaustive run (``SIMSIM_EXHAUSTIVE=1 python -m pytest``) draws ten times as many
property-test examples and runs the M/G/1 validation at the budget documented in
``docs/validation.md``. Use it after changing an engine, before a release.
"""

EXHAUSTIVE_FACTOR = 10
"""How many times more property-test examples an exhaustive run draws."""


def examples(quick: int) -> int:
    """A property test's ``max_examples``: *quick* normally, ten times more if exhaustive."""
    return quick * EXHAUSTIVE_FACTOR if EXHAUSTIVE else quick


def property_settings(quick: int) -> Any:
    """Settings for a property test of *quick* examples (:func:`examples`): no deadline,
    derandomized, no example database, and no health check about slow or big data."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples(quick),
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """Import the script at *path* (not on ``sys.path``) as a fresh module and return it.

    The module is registered in ``sys.modules`` under *name* (by default the file's stem
    prefixed with ``script_``) before it runs, because ``dataclasses`` looks a class's
    module up there while decorating it. Each call runs the script's top level again.
    """
    module_name = name if name is not None else f"script_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file that can be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def request_row(request: simsim.Request) -> tuple[Any, ...]:
    """Every field of *request* that ``requests_frame`` reads, as one comparable tuple.

    The frame's other columns (latencies) are computed from these, so two engines whose
    rows are equal have equal request tables; comparing rows is much cheaper than
    building and comparing two DataFrames, which matters in a loop over timestamps.
    """
    return (
        request.request_id,
        request.state,
        request.arrival_time_us,
        request.prompt_token_count,
        request.max_output_tokens,
        request.generated_token_count,
        request.admit_time_us,
        request.prefill_end_time_us,
        request.first_token_time_us,
        request.finish_time_us,
    )


def request_table(engine: simsim.SimulationEngine | simsim.BatchingEngine) -> list[tuple[Any, ...]]:
    """:func:`request_row` of every request of *engine*, in request id order."""
    requests = engine.requests  # read once: the fast engine catches up on every read
    return [request_row(requests[rid]) for rid in sorted(requests)]


# --------------------------------------------------------------------- the live server


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll *condition* until it holds; fail naming *what* after *timeout_s* wall seconds.

    A wait, not a timed assertion: the bound only stops a broken server from hanging
    the suite, and is far above what any correct run needs.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")
        time.sleep(0.002)


def sse_payloads(lines: Iterable[str]) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order, checking its framing.

    Every event must be one ``data: ...`` line followed by a blank line (the framing
    ``simsim serve`` writes); anything else fails the test.
    """
    payloads: list[str] = []
    expect_blank = False
    for line in lines:
        if expect_blank:
            assert line == "", f"an SSE event must end with a blank line, got {line!r}"
            expect_blank = False
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payloads.append(line.removeprefix("data: "))
        expect_blank = True
    return payloads


def engine_request_id(response_id: str) -> int:
    """The engine's request id inside a served response id (``cmpl-7`` -> 7)."""
    prefix, _, number = response_id.rpartition("-")
    assert prefix in ("cmpl", "chatcmpl") and number.isdigit(), response_id
    return int(number)


def serve_backend(decode_us: int, per_sequence_us: int = 0) -> simsim.SimulatedBackend:
    """A cost model for the live-server tests: a 1 ms prefill (+10 us a token), slow decode.

    *decode_us* is a lone request's decode step; *per_sequence_us* is added per active
    sequence. Tests serve it at speed 20 to 50, a few wall milliseconds a token, so a
    request the test means to cut off is far from its end when its client goes away.
    """
    return simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_base_us=1_000,
            prefill_per_token_us=10,
            prefill_per_active_sequence_us=0,
            decode_base_us=decode_us,
            decode_per_active_sequence_us=per_sequence_us,
        )
    )


@contextlib.contextmanager
def serving(
    engine: EngineBase, speed: float, options: ServeOptions | None = None
) -> Iterator[tuple[LiveServer, httpx.Client, contextlib.ExitStack[Any]]]:
    """*engine* served on a free port, an ``httpx`` client, and a stack for held streams.

    Yields ``(server, http, stack)``; on the way out the held streams close first, then
    the client, then the server (always, even when the test failed).
    """
    from simsim.live import LiveServer  # the serve extra: imported by the live tests only

    with (
        LiveServer(engine, speed=speed, options=options, port=0) as server,
        httpx.Client(timeout=30) as http,
        contextlib.ExitStack() as stack,
    ):
        yield server, http, stack


class HeldStream:
    """A streamed ``/v1/completions`` request held open, read chunk by chunk, maybe dropped.

    Opening it returns once the response headers came, which the server sends right
    after it submitted the request: the request is in the simulation from then on. The
    stream's line iterator is kept, because httpx closes the connection when a started
    iterator is dropped.
    """

    def __init__(
        self, stack: contextlib.ExitStack[Any], http: httpx.Client, base_url: str, **body: Any
    ) -> None:
        payload = {"model": "simsim", "stream": True, **body}
        self._response = stack.enter_context(
            http.stream("POST", f"{base_url}/completions", json=payload)
        )
        assert self._response.status_code == 200, self._response.read()
        self._lines = self._response.iter_lines()
        self.chunks: list[str] = []
        """The text of each token chunk read so far."""
        self.done = False
        """Whether the final ``data: [DONE]`` was read."""
        self.request_id: int | None = None
        """The engine's id of the request, known from the first chunk."""
        self.errors: list[dict[str, Any]] = []
        """The error objects of error events (a stream the server ended early has one)."""

    def read(self, count: int) -> None:
        """Read *count* more token chunks; fail if the stream ends first."""
        for _ in range(count):
            payload = self._payload()
            assert payload != "[DONE]", f"the stream ended after {len(self.chunks)} chunks"
            self._take(payload)

    def read_to_end(self) -> None:
        """Read every remaining chunk and the final ``[DONE]``."""
        while (payload := self._payload()) != "[DONE]":
            self._take(payload)
        self.done = True

    def close(self) -> None:
        """Go away without reading the rest (closes the connection)."""
        self._response.close()

    def _take(self, payload: str) -> None:
        chunk = json.loads(payload)
        if "error" in chunk:
            self.errors.append(chunk["error"])
            return
        self.request_id = engine_request_id(chunk["id"])
        self.chunks.append(chunk["choices"][0]["text"])

    def _payload(self) -> str:
        line = ""
        while not line:
            line = next(self._lines)
        assert line.startswith("data: "), line
        return line.removeprefix("data: ")


def simulated_probes(
    plan: Sequence[Probe], config: simsim.FittedBackendConfig, engine: str = "single_slot"
) -> pd.DataFrame:
    """The probes table a perfectly quiet simsim server would give (times exact, no HTTP)."""
    from simsim.fidelity.calibrate import probe_row, probes_frame

    rows = []
    for probe in plan:
        backend = simsim.FittedBackend(config)
        server: simsim.SimulationEngine | simsim.BatchingEngine
        if engine == "batching":
            server = simsim.BatchingEngine(backend, max_active_requests=max(4, probe.concurrency))
        else:
            server = simsim.SimulationEngine(backend)
        for member in range(probe.concurrency):
            server.submit(simsim.Request(member, 0, probe.prompt_tokens, probe.output_tokens))
        server.run()
        events = server.events_frame()
        for member in range(probe.concurrency):
            tokens = events[
                (events["request_id"] == member) & (events["event_type"] == "DECODE_STEP_COMPLETE")
            ]["timestamp_us"]
            times = [int(t) for t in tokens]
            rows.append(
                probe_row(
                    probe, member, sent_us=0, token_times_us=times, generated_tokens=len(times)
                )
            )
    return probes_frame(rows)
