"""How fast simsim runs: one seeded workload through four solvers, in one process.

The workload is an M/G/1 queue at utilization 0.9: Poisson arrivals, prompt lengths
uniform on 16..1024 tokens, output lengths uniform on 0..128 tokens, and a fixed linear
cost model (prefill ``2000 + 50 * prompt`` us, decode step ``8000`` us). Every time in
the workload is *simulated*; what this script measures is the wall time and memory the
solvers need to work those simulated times out, on the machine it runs on.

The solvers, each timed from building its model to the end of its run:

- ``closed_form``: the FCFS single-server recursion, ``start = max(arrival, previous
  finish)``; a plain loop, the limit no simulator can beat.
- ``raw_simpy``: a minimal hand-written SimPy model of the same queue (one process per
  request, a ``simpy.Resource``, one timeout per prefill and per decode step); the anchor
  for any design built on SimPy.
- ``simsim``: :class:`simsim.SimulationEngine`, with its full per-token event log.
- ``simsim_fast``: :class:`simsim.FastSimulationEngine`, one event per request's work.

Not run by default (``--solvers``): ``raw_simpy_fed``, ``simsim_fed`` and
``simsim_fast_fed`` feed the arrivals from one source process instead of putting them
all into the heap up front, and are compared with ``raw_simpy_fed``.

Every solver's admit, first-token and finish times must equal ``closed_form``'s exactly;
the script exits with status 1 otherwise. Each solver first runs ``--warmup`` times on a
tiny workload, untimed (see :func:`warm_up`). Wall time is the best of ``--repeat`` runs;
peak memory comes from one more run under ``tracemalloc``, which is not timed because
tracing slows the code down. Ratios are taken against ``raw_simpy`` at the same size, in
the same process, on the same machine: they say nothing about another machine.

Run it by hand (``tests/test_benchmarks_smoke.py`` runs ``--quick``)::

    python benchmarks/solvers.py                   # 1e3 .. 1e5, and 1e6 for the fast path
    python benchmarks/solvers.py --quick           # seconds: small sizes, one repetition
    python benchmarks/solvers.py --plot docs/performance_scaling.png \\
        --markdown docs/performance.md             # refresh the doc's generated tables

See ``docs/performance.md`` for the results and how to read them.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd
import simpy

import simsim

ROOT = Path(__file__).resolve().parent.parent
BEGIN_MARKER = "<!-- BEGIN GENERATED: python benchmarks/solvers.py -->"
END_MARKER = "<!-- END GENERATED -->"

#: The cost model (microseconds). On the single slot: prefill_us(p, 1) = 2000 + 50 p and
#: decode_step_us(1) = 8000.
BACKEND_CONFIG = simsim.SimulatedBackendConfig(
    prefill_base_us=2000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=0,
    decode_base_us=8000,
    decode_per_active_sequence_us=0,
)
#: The same costs as plain integers, for the hand-written solvers (one active sequence).
PREFILL_FIXED_US = BACKEND_CONFIG.prefill_base_us + BACKEND_CONFIG.prefill_per_active_sequence_us
PREFILL_PER_TOKEN_US = BACKEND_CONFIG.prefill_per_token_us
DECODE_STEP_US = BACKEND_CONFIG.decode_base_us + BACKEND_CONFIG.decode_per_active_sequence_us

UTILIZATION = 0.9
PROMPT_TOKENS = (16, 1024)  # inclusive
OUTPUT_TOKENS = (0, 128)  # inclusive
SEED = 20_250_101

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)
#: Largest run for the solvers with one event per token (raw_simpy, simsim).
DEFAULT_PER_TOKEN_MAX = 100_000
DEFAULT_REPEAT = 3
#: Untimed runs of each solver before measuring (see warm_up), on this many requests.
DEFAULT_WARMUP = 10
WARMUP_REQUESTS = 20
QUICK_SIZES = (100, 500, 1_000)
QUICK_PER_TOKEN_MAX = 500
QUICK_WARMUP = 2
#: "requests_frame() on 1e6 requests builds in seconds", read as: in under ten.
FRAME_LIMIT_S = 10.0
#: The solver every default solver's wall time is divided by, at the same size.
ANCHOR = "raw_simpy"
#: The anchor of the optional *_fed solvers, whose arrivals come from a source process.
FED_ANCHOR = "raw_simpy_fed"

#: What "events" means for each solver, printed with the tables.
EVENT_NOTES = {
    "closed_form": "none (a loop over requests)",
    "raw_simpy": (
        "heap pops: every SimPy event scheduled and processed (process starts, timeouts, "
        "resource grants and releases, process ends), read from the environment's sequence "
        "counter after the heap has drained"
    ),
    "simsim": (
        "engine.processed_event_count: the engine's own lifecycle events (arrival, prefill, "
        "each decode step, completion); admission boundaries are heap pops but not counted"
    ),
    "simsim_fast": (
        "engine.processed_event_count: arrival and one event per request's work "
        "(admission boundaries not counted)"
    ),
    "raw_simpy_fed": "heap pops, as raw_simpy (the source's timeouts included)",
    "simsim_fed": "engine.processed_event_count, as simsim",
    "simsim_fast_fed": "engine.processed_event_count, as simsim_fast",
}


# ---------------------------------------------------------------------- the workload


@dataclass(frozen=True, slots=True)
class Workload:
    """*n* requests in id order, as plain Python lists of ``int``."""

    arrival_us: list[int]
    prompt_tokens: list[int]
    output_tokens: list[int]

    def __len__(self) -> int:
        return len(self.arrival_us)


def mean_service_us() -> float:
    """The exact mean service time: mean prefill plus mean output times one step."""
    mean_prompt = (PROMPT_TOKENS[0] + PROMPT_TOKENS[1]) / 2
    mean_output = (OUTPUT_TOKENS[0] + OUTPUT_TOKENS[1]) / 2
    return PREFILL_FIXED_US + PREFILL_PER_TOKEN_US * mean_prompt + DECODE_STEP_US * mean_output


def make_workload(n: int, seed: int = SEED) -> Workload:
    """*n* requests with Poisson arrivals at ``UTILIZATION`` (times rounded to whole us)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, n)
    outputs = rng.integers(OUTPUT_TOKENS[0], OUTPUT_TOKENS[1] + 1, n)
    gaps_us = rng.exponential(mean_service_us() / UTILIZATION, n)
    arrivals = np.rint(np.cumsum(gaps_us)).astype(np.int64)
    return Workload(arrivals.tolist(), prompts.tolist(), outputs.tolist())


# ---------------------------------------------------------------------- solvers


@dataclass(frozen=True, slots=True)
class Timeline:
    """Per-request results in id order; ``None`` for the first token of an empty output."""

    admit_us: list[int | None]
    first_token_us: list[int | None]
    finish_us: list[int | None]


@dataclass(frozen=True, slots=True)
class Solved:
    """One solver run: its results, its measured region and its counters."""

    timeline: Timeline
    wall_s: float
    #: Peak memory allocated in the measured region, when run under tracemalloc.
    peak_bytes: int | None
    #: The solver's own event count (see EVENT_NOTES); None for the closed form.
    events: int | None
    #: Events pushed into (and, the heap being empty at the end, popped from) SimPy's heap.
    heap_pops: int | None
    #: The engine, for the simsim solvers (to read its log and build its frame).
    engine: simsim.SimulationEngine | None = None


class _Region:
    """The measured region of a solver: wall time, and peak memory under tracemalloc."""

    __slots__ = ("_baseline", "_start", "peak_bytes", "wall_s")

    def __enter__(self) -> _Region:
        self.peak_bytes: int | None = None
        self._baseline = 0
        if tracemalloc.is_tracing():
            tracemalloc.reset_peak()
            self._baseline = tracemalloc.get_traced_memory()[0]
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.wall_s = time.perf_counter() - self._start
        if tracemalloc.is_tracing():
            self.peak_bytes = tracemalloc.get_traced_memory()[1] - self._baseline


def solve_closed_form(workload: Workload) -> Solved:
    """Lindley's recursion for one FCFS server: ``start = max(arrival, previous finish)``."""
    with _Region() as region:
        fixed, per_token, step = PREFILL_FIXED_US, PREFILL_PER_TOKEN_US, DECODE_STEP_US
        admit: list[int | None] = []
        first_token: list[int | None] = []
        finish: list[int | None] = []
        free_at = 0
        for arrival, prompt, output in zip(
            workload.arrival_us, workload.prompt_tokens, workload.output_tokens, strict=True
        ):
            start = arrival if arrival > free_at else free_at
            prefill_end = start + fixed + per_token * prompt
            free_at = prefill_end + step * output
            admit.append(start)
            first_token.append(prefill_end + step if output else None)
            finish.append(free_at)
    return Solved(
        Timeline(admit, first_token, finish), region.wall_s, region.peak_bytes, None, None
    )


def solve_raw_simpy(workload: Workload) -> Solved:
    """A minimal SimPy model: a process per request, a Resource, a timeout per piece of work."""
    with _Region() as region:
        n = len(workload)
        fixed, per_token, step = PREFILL_FIXED_US, PREFILL_PER_TOKEN_US, DECODE_STEP_US
        # SimPy types env.now as int | float; check_agreement insists on int.
        admit: list[Any] = [None] * n
        first_token: list[Any] = [None] * n
        finish: list[Any] = [None] * n
        env = simpy.Environment()
        server = simpy.Resource(env, capacity=1)
        timeout = env.timeout

        def request(
            index: int, arrival: int, prompt: int, output: int
        ) -> simpy.events.ProcessGenerator:
            yield timeout(arrival)
            with server.request() as slot:
                yield slot
                admit[index] = env.now
                yield timeout(fixed + per_token * prompt)
                if output:
                    yield timeout(step)
                    first_token[index] = env.now
                    for _ in range(output - 1):
                        yield timeout(step)
                finish[index] = env.now

        process = env.process
        for index, (arrival, prompt, output) in enumerate(
            zip(workload.arrival_us, workload.prompt_tokens, workload.output_tokens, strict=True)
        ):
            process(request(index, arrival, prompt, output))
        env.run()
    heap_pops = next(env._eid)  # every event scheduled has been popped: the heap is empty
    timeline = Timeline(admit, first_token, finish)
    return Solved(timeline, region.wall_s, region.peak_bytes, heap_pops, heap_pops)


def solve_raw_simpy_fed(workload: Workload) -> Solved:
    """``raw_simpy`` with its arrivals fed by one source process, so the heap stays small.

    The textbook SimPy shape: the source sleeps until the next arrival and starts that
    request's process then. Same events per request, but the heap holds a handful of
    entries instead of every pending arrival.
    """
    with _Region() as region:
        n = len(workload)
        fixed, per_token, step = PREFILL_FIXED_US, PREFILL_PER_TOKEN_US, DECODE_STEP_US
        admit: list[Any] = [None] * n
        first_token: list[Any] = [None] * n
        finish: list[Any] = [None] * n
        env = simpy.Environment()
        server = simpy.Resource(env, capacity=1)
        timeout = env.timeout
        process = env.process

        def request(index: int, prompt: int, output: int) -> simpy.events.ProcessGenerator:
            with server.request() as slot:
                yield slot
                admit[index] = env.now
                yield timeout(fixed + per_token * prompt)
                if output:
                    yield timeout(step)
                    first_token[index] = env.now
                    for _ in range(output - 1):
                        yield timeout(step)
                finish[index] = env.now

        def source() -> simpy.events.ProcessGenerator:
            for index, (arrival, prompt, output) in enumerate(
                zip(
                    workload.arrival_us,
                    workload.prompt_tokens,
                    workload.output_tokens,
                    strict=True,
                )
            ):
                if arrival > env.now:
                    yield timeout(arrival - env.now)
                process(request(index, prompt, output))

        process(source())
        env.run()
    heap_pops = next(env._eid)
    timeline = Timeline(admit, first_token, finish)
    return Solved(timeline, region.wall_s, region.peak_bytes, heap_pops, heap_pops)


def _solve_engine(
    engine_class: type[simsim.SimulationEngine], workload: Workload, *, fed: bool = False
) -> Solved:
    with _Region() as region:
        engine = engine_class(simsim.SimulatedBackend(BACKEND_CONFIG))
        submit = engine.submit
        make = simsim.Request
        requests = enumerate(
            zip(workload.arrival_us, workload.prompt_tokens, workload.output_tokens, strict=True)
        )
        if fed:
            env = engine.env

            def source() -> simpy.events.ProcessGenerator:
                for request_id, (arrival, prompt, output) in requests:
                    if arrival > env.now:
                        yield env.timeout(arrival - env.now)
                    submit(make(request_id, arrival, prompt, output))

            env.process(source())
        else:
            for request_id, (arrival, prompt, output) in requests:
                submit(make(request_id, arrival, prompt, output))
        engine.run()
    if engine.has_pending_events:
        raise RuntimeError(f"{engine_class.__name__}.run() left events in the heap")
    by_id = engine.requests
    done = [by_id[i] for i in range(len(workload))]
    timeline = Timeline(
        [r.admit_time_us for r in done],
        [r.first_token_time_us for r in done],
        [r.finish_time_us for r in done],
    )
    heap_pops = next(engine.env._eid)
    return Solved(
        timeline,
        region.wall_s,
        region.peak_bytes,
        engine.processed_event_count,
        heap_pops,
        engine,
    )


def solve_simsim(workload: Workload) -> Solved:
    """``SimulationEngine`` with the full event log: create, submit and run every request."""
    return _solve_engine(simsim.SimulationEngine, workload)


def solve_simsim_fast(workload: Workload) -> Solved:
    """``FastSimulationEngine``: the same, one event per request's work."""
    return _solve_engine(simsim.FastSimulationEngine, workload)


def solve_simsim_fed(workload: Workload) -> Solved:
    """``simsim`` with each request submitted at its arrival by a source process."""
    return _solve_engine(simsim.SimulationEngine, workload, fed=True)


def solve_simsim_fast_fed(workload: Workload) -> Solved:
    """``simsim_fast`` with each request submitted at its arrival by a source process."""
    return _solve_engine(simsim.FastSimulationEngine, workload, fed=True)


@dataclass(frozen=True, slots=True)
class Solver:
    """A named solver, timed against its *anchor* at the same size.

    *per_token* solvers get one event per token and stop at ``--per-token-max``.
    """

    name: str
    solve: Callable[[Workload], Solved]
    per_token: bool
    anchor: str = ANCHOR


SOLVERS = (
    Solver("closed_form", solve_closed_form, per_token=False),
    Solver("raw_simpy", solve_raw_simpy, per_token=True),
    Solver("simsim", solve_simsim, per_token=True),
    Solver("simsim_fast", solve_simsim_fast, per_token=False),
    # Optional: every arrival fed by a source process instead of submitted up front.
    Solver("raw_simpy_fed", solve_raw_simpy_fed, per_token=True, anchor=FED_ANCHOR),
    Solver("simsim_fed", solve_simsim_fed, per_token=True, anchor=FED_ANCHOR),
    Solver("simsim_fast_fed", solve_simsim_fast_fed, per_token=False, anchor=FED_ANCHOR),
)
SOLVERS_BY_NAME = {solver.name: solver for solver in SOLVERS}
#: The solvers run by default: the four the issue asks for.
DEFAULT_SOLVERS = ("closed_form", "raw_simpy", "simsim", "simsim_fast")


# ---------------------------------------------------------------------- agreement


class DisagreementError(Exception):
    """A solver's times differ from the closed form's."""


def check_agreement(name: str, timeline: Timeline, reference: Timeline) -> None:
    """Raise :class:`DisagreementError` unless *timeline* equals *reference* int for int."""
    for column in ("admit_us", "first_token_us", "finish_us"):
        got: list[int | None] = getattr(timeline, column)
        want: list[int | None] = getattr(reference, column)
        if len(got) != len(want):
            raise DisagreementError(
                f"{name}: {len(got)} values of {column}, closed_form has {len(want)}"
            )
        kinds = set(map(type, got))
        if got == want and kinds <= {int, type(None)}:
            continue
        for index, (mine, theirs) in enumerate(zip(got, want, strict=True)):
            if mine != theirs or (mine is not None and type(mine) is not int):
                raise DisagreementError(
                    f"{name}: request {index} has {column} = {mine!r}, closed_form says {theirs!r}"
                )


# ---------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class LogStats:
    """An engine's event log and request table at one size."""

    logged_events: int
    used_bytes: int
    allocated_bytes: int
    frame_s: float

    @property
    def used_bytes_per_event(self) -> float:
        return self.used_bytes / self.logged_events

    @property
    def allocated_bytes_per_event(self) -> float:
        return self.allocated_bytes / self.logged_events


@dataclass(slots=True)
class Measurement:
    """One solver at one size: best wall time over the repetitions, and the rest."""

    solver: str
    requests: int
    wall_times_s: list[float] = field(default_factory=list)
    events: int | None = None
    heap_pops: int | None = None
    peak_bytes: int | None = None
    log: LogStats | None = None

    @property
    def wall_s(self) -> float:
        return min(self.wall_times_s)

    @property
    def us_per_request(self) -> float:
        return self.wall_s * 1e6 / self.requests

    @property
    def events_per_s(self) -> float | None:
        return None if self.events is None else self.events / self.wall_s


def log_stats(engine: simsim.SimulationEngine) -> LogStats:
    """Bytes of *engine*'s event log per event, and the time to build its request frame."""
    log = engine._event_log
    # The rows as written (a stretch's tokens are kept as inserts until a reader asks).
    columns = list(log.columns_open()) + list(log._inserts or ())
    allocated = sum(sys.getsizeof(column) for column in columns)
    start = time.perf_counter()
    frame = engine.requests_frame()
    frame_s = time.perf_counter() - start
    if len(frame) != len(engine.requests):
        raise RuntimeError("requests_frame() lost rows")
    return LogStats(len(log), log.nbytes, allocated, frame_s)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_size(
    solvers: Sequence[Solver], n: int, repeat: int, memory: bool, inspect_logs: set[str]
) -> dict[str, Measurement]:
    """Run *solvers* on one workload of *n* requests; repetitions interleave the solvers.

    Interleaving (A B C, A B C, ...) keeps a slow drift of the machine from favouring
    the solver measured first. The first repetition of each is checked against the
    closed form; engines named in *inspect_logs* also report their log and frame.
    """
    workload = make_workload(n)
    reference = solve_closed_form(workload).timeline
    results = {solver.name: Measurement(solver.name, n) for solver in solvers}
    for repetition in range(repeat):
        for solver in solvers:
            _progress(f"  {solver.name:<15} {n:>9,} requests, run {repetition + 1}/{repeat}")
            gc.collect()
            solved = solver.solve(workload)
            result = results[solver.name]
            result.wall_times_s.append(solved.wall_s)
            if repetition == 0:
                check_agreement(solver.name, solved.timeline, reference)
                result.events = solved.events
                result.heap_pops = solved.heap_pops
                if solved.engine is not None and solver.name in inspect_logs:
                    result.log = log_stats(solved.engine)
            del solved
    if memory:
        for solver in solvers:
            _progress(f"  {solver.name:<15} {n:>9,} requests, under tracemalloc")
            gc.collect()
            tracemalloc.start()
            try:
                solved = solver.solve(workload)
            finally:
                tracemalloc.stop()
            results[solver.name].peak_bytes = solved.peak_bytes
            del solved
    return results


# ---------------------------------------------------------------------- the machine


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "CPU": f"{cpu}, {os.cpu_count()} logical CPUs",
        "memory": memory,
        "OS": platform.platform(),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "SimPy / NumPy / pandas": f"{simpy.__version__} / {np.__version__} / {pd.__version__}",
        "simsim": f"{simsim.__version__} (git {commit})",
        "date": datetime.date.today().isoformat(),
    }


# ---------------------------------------------------------------------- reports


@dataclass(frozen=True, slots=True)
class Report:
    """Everything one invocation measured."""

    sizes: tuple[int, ...]
    repeat: int
    warmup: int
    memory: bool
    solvers: tuple[str, ...]
    results: dict[int, dict[str, Measurement]]
    machine: dict[str, str]

    @property
    def main_size(self) -> int:
        """The largest size every solver ran at: the main comparison."""
        return max(n for n in self.sizes if set(self.solvers) <= set(self.results[n]))

    def at(self, name: str) -> list[Measurement]:
        """*name*'s measurements, smallest size first."""
        return [self.results[n][name] for n in self.sizes if name in self.results[n]]

    def ratio(self, name: str, n: int) -> float | None:
        """*name*'s wall time over its anchor's at size *n*."""
        row = self.results[n]
        anchor = SOLVERS_BY_NAME[name].anchor
        if name not in row or anchor not in row:
            return None
        return row[name].wall_s / row[anchor].wall_s


def _number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _scaled(value: float | None) -> str:
    """A number with about three significant figures, for wide-ranging columns."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def comparison_rows(report: Report, n: int) -> list[list[str]]:
    """The main table at size *n*: one row per solver."""
    rows = []
    for name in report.solvers:
        m = report.results[n][name]
        peak = m.peak_bytes
        rows.append(
            [
                name,
                f"{m.wall_s:.3f}",
                _scaled(m.us_per_request),
                _number(m.events),
                _number(m.events_per_s),
                _number(m.heap_pops),
                _number(None if peak is None else peak / 2**20, 1),
                _number(None if peak is None else peak / n),
                _number(report.ratio(name, n), 3),
            ]
        )
    return rows


COMPARISON_HEADER = [
    "solver",
    "wall s",
    "us/request",
    "events",
    "events/s",
    "heap pops",
    "peak MiB",
    "peak B/request",
    "x anchor",
]


def scaling_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Wall time per request (us) by size, and each size's ratio to the anchor."""
    header = ["solver", *(f"{n:,}" for n in report.sizes)]
    rows = []
    for name in report.solvers:
        cells = [name]
        for n in report.sizes:
            m = report.results[n].get(name)
            ratio = report.ratio(name, n)
            if m is None:
                cells.append("-")
            elif ratio is None or name == SOLVERS_BY_NAME[name].anchor:
                cells.append(_scaled(m.us_per_request))
            else:
                cells.append(f"{_scaled(m.us_per_request)} ({ratio:.3f}x)")
        rows.append(cells)
    return header, rows


def memory_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Peak traced memory per request by size."""
    header = ["solver", *(f"{n:,}" for n in report.sizes)]
    rows = []
    for name in report.solvers:
        cells = [name]
        for n in report.sizes:
            m = report.results[n].get(name)
            peak = None if m is None or m.peak_bytes is None else m.peak_bytes / n
            cells.append(_number(peak))
        rows.append(cells)
    return header, rows


LOG_HEADER = [
    "solver",
    "requests",
    "events logged",
    "log B/event (used)",
    "log B/event (allocated)",
    "requests_frame() s",
]


def log_rows(report: Report) -> list[list[str]]:
    """The event log's cost and the request frame's build time, where inspected."""
    rows = []
    for n in report.sizes:
        for name in report.solvers:
            m = report.results[n].get(name)
            if m is None or m.log is None:
                continue
            rows.append(
                [
                    name,
                    f"{n:,}",
                    f"{m.log.logged_events:,}",
                    f"{m.log.used_bytes_per_event:.1f}",
                    f"{m.log.allocated_bytes_per_event:.1f}",
                    f"{m.log.frame_s:.2f}",
                ]
            )
    return rows


def _status(measured: float, limit: float) -> str:
    if measured <= limit:
        return "met"
    return f"missed by {100 * (measured / limit - 1):.1f}%"


def target_rows(report: Report) -> list[list[str]]:
    """The issue's targets, as far as this run measured them."""
    rows = []
    n = report.main_size
    names = set(report.solvers)
    if {"simsim", ANCHOR} <= names:
        ratio = report.ratio("simsim", n)
        assert ratio is not None
        met = _status(ratio, 1.5)
        rows.append(
            [f"1. simsim wall time <= 1.5x {ANCHOR} ({n:,} requests)", f"{ratio:.3f}x", met]
        )
    logs = [
        (name, size, m.log)
        for size in report.sizes
        for name, m in report.results[size].items()
        if m.log is not None
    ]
    for name, size, log in logs:
        per_event = log.allocated_bytes_per_event
        met = _status(per_event, 64)
        rows.append(
            [
                f"2. {name} event log <= 64 B/event ({size:,} requests)",
                f"{log.used_bytes_per_event:.1f} B used, {per_event:.1f} B allocated",
                met,
            ]
        )
        frame_met = _status(log.frame_s, FRAME_LIMIT_S) if size >= 1_000_000 else "-"
        rows.append(
            [f"2. {name} requests_frame() ({size:,} requests)", f"{log.frame_s:.2f} s", frame_met]
        )
    if {"simsim_fast", ANCHOR} <= names:
        ratio = report.ratio("simsim_fast", n)
        assert ratio is not None
        met = _status(ratio, 0.1)
        rows.append(
            [f"3. simsim_fast wall time <= 0.1x {ANCHOR} ({n:,} requests)", f"{ratio:.3f}x", met]
        )
    for m in report.at("simsim_fast"):
        if m.requests >= 1_000_000:
            met = _status(m.wall_s, 60)
            rows.append(
                [f"3. simsim_fast {m.requests:,} requests in < 60 s", f"{m.wall_s:.1f} s", met]
            )
    return rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    aligns = ["---", *("---:" for _ in header[1:])]
    lines = [header, aligns, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def _preamble(report: Report) -> list[str]:
    memory = "a separate run under tracemalloc" if report.memory else "not measured"
    return [
        f"Workload: M/G/1 at utilization {UTILIZATION}, seed {SEED}; prompts "
        f"{PROMPT_TOKENS[0]}..{PROMPT_TOKENS[1]} tokens, outputs {OUTPUT_TOKENS[0]}.."
        f"{OUTPUT_TOKENS[1]} tokens; prefill {PREFILL_FIXED_US} + {PREFILL_PER_TOKEN_US} "
        f"x prompt us, decode step {DECODE_STEP_US} us (simulated time).",
        f"Wall time: best of {report.repeat}, time.perf_counter, after {report.warmup} "
        f"untimed warm-up runs per solver. Peak memory: {memory}.",
        f"Ratios are measured in one process on this machine, against the anchor ({ANCHOR}; "
        f"{FED_ANCHOR} for the *_fed solvers) at the same size; they do not transfer to "
        "another machine.",
    ]


def _event_notes(report: Report) -> list[str]:
    return [f"{name}: {EVENT_NOTES[name]}" for name in report.solvers]


def render_text(report: Report) -> str:
    """The full report, for the terminal."""
    out = ["", "Machine:"]
    out += [f"  {key}: {value}" for key, value in report.machine.items()]
    out += ["", *_preamble(report), ""]
    n = report.main_size
    out += [f"Main comparison, {n:,} requests:", ""]
    out += [_text_table(COMPARISON_HEADER, comparison_rows(report, n)), ""]
    out += ["Events per solver:", *(f"  {note}" for note in _event_notes(report)), ""]
    header, rows = scaling_rows(report)
    out += ["Scaling: wall time per request (us), ratio to the anchor in brackets:", ""]
    out += [_text_table(header, rows), ""]
    if report.memory:
        header, rows = memory_rows(report)
        out += ["Peak traced memory per request (bytes):", "", _text_table(header, rows), ""]
    rows = log_rows(report)
    if rows:
        out += ["Event log and request frame:", "", _text_table(LOG_HEADER, rows), ""]
    rows = target_rows(report)
    if rows:
        out += ["Targets:", "", _text_table(["target", "measured", "status"], rows), ""]
    checked = ", ".join(report.solvers)
    out.append(f"All solvers agree with closed_form (admit, first token, finish): {checked}.")
    return "\n".join(out)


def render_markdown(report: Report) -> str:
    """The tables for ``docs/performance.md``."""
    out = ["### Machine", "", "| | |", "|---|---|"]
    out += [f"| {key} | {value} |" for key, value in report.machine.items()]
    out += ["", *(f"{line}  " for line in _preamble(report)), ""]
    n = report.main_size
    out += [f"### Main comparison, {n:,} requests", ""]
    out += [_markdown_table(COMPARISON_HEADER, comparison_rows(report, n)), ""]
    out += ["Events counted:", "", *(f"- {note}" for note in _event_notes(report)), ""]
    header, rows = scaling_rows(report)
    out += ["### Wall time per request (us), ratio to the anchor in brackets", ""]
    out += [_markdown_table(header, rows), ""]
    if report.memory:
        header, rows = memory_rows(report)
        out += ["### Peak traced memory per request (bytes)", ""]
        out += [_markdown_table(header, rows), ""]
    rows = log_rows(report)
    if rows:
        out += ["### Event log and request frame", "", _markdown_table(LOG_HEADER, rows), ""]
    rows = target_rows(report)
    if rows:
        out += ["### Targets", "", _markdown_table(["target", "measured", "status"], rows), ""]
    out.append(
        "Every solver's admit, first-token and finish times equal closed_form's at every size."
    )
    return "\n".join(out)


def write_markdown(report: Report, path: Path) -> None:
    """Write the tables to *path*; a file with the markers gets only that block replaced."""
    block = render_markdown(report)
    if path.exists():
        document = path.read_text(encoding="utf-8")
        begin = document.find(BEGIN_MARKER)
        end = document.find(END_MARKER, begin)
        if begin >= 0 and end >= 0:
            head = document[: begin + len(BEGIN_MARKER)]
            path.write_text(f"{head}\n{block}\n{document[end:]}", encoding="utf-8")
            return
    path.write_text(f"{BEGIN_MARKER}\n{block}\n{END_MARKER}\n", encoding="utf-8")


def plot_scaling(report: Report, path: Path) -> None:
    """Wall time per request against run size, log-log, one line per solver."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    markers = {"closed_form": "s", "raw_simpy": "o", "simsim": "^", "simsim_fast": "D"}
    fed = {"raw_simpy_fed": "raw_simpy", "simsim_fed": "simsim", "simsim_fast_fed": "simsim_fast"}
    for name in report.solvers:
        points = report.at(name)
        ax.plot(
            [m.requests for m in points],
            [m.us_per_request for m in points],
            marker=markers[fed.get(name, name)],
            linestyle="--" if name in fed else "-",
            label=name,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("requests in the run")
    ax.set_ylabel(f"wall time per request (us, best of {report.repeat})")
    ax.set_title(
        "Wall time per request on this machine\n"
        f"(simulated M/G/1 workload, utilization {UTILIZATION}; "
        f"{report.machine['CPU']})",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------------- main


def warm_up(solvers: Sequence[Solver], runs: int) -> None:
    """Run each solver *runs* times on a tiny workload, untimed.

    CPython 3.11 specializes a function's bytecode only once the function has been
    called 8 times; a loop inside a function entered once per run (SimPy's and simsim's
    run loops, the solvers' own loops) runs unspecialized, and slower, until then.
    Warming up measures every size with the same, specialized code.
    """
    workload = make_workload(WARMUP_REQUESTS)
    for solver in solvers:
        for _ in range(runs):
            solver.solve(workload)


def run(
    sizes: Sequence[int],
    repeat: int,
    per_token_max: int,
    solver_names: Sequence[str],
    memory: bool,
    warmup: int = DEFAULT_WARMUP,
) -> Report:
    """Measure every selected solver at every size it runs at, after *warmup* runs each."""
    solvers = [solver for solver in SOLVERS if solver.name in solver_names]
    load_at_start = _load_average()
    _progress(f"warming up: {warmup} runs of {WARMUP_REQUESTS} requests per solver")
    warm_up(solvers, warmup)
    ordered = tuple(sorted(set(sizes)))
    results: dict[int, dict[str, Measurement]] = {}
    for n in ordered:
        here = [s for s in solvers if not s.per_token or n <= per_token_max]
        # Each engine's log and frame are inspected at the largest size it runs at.
        inspect = {
            s.name
            for s in here
            if max(m for m in ordered if not s.per_token or m <= per_token_max) == n
        }
        _progress(f"{n:,} requests:")
        results[n] = measure_size(here, n, repeat, memory, inspect)
    described = machine()
    # Other processes share the CPUs: say how busy the machine was.
    described["load average (1 min) at start / end"] = f"{load_at_start} / {_load_average()}"
    return Report(
        ordered, repeat, warmup, memory, tuple(s.name for s in solvers), results, described
    )


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="run sizes (requests)"
    )
    parser.add_argument(
        "--per-token-max",
        type=int,
        default=DEFAULT_PER_TOKEN_MAX,
        help="largest size for raw_simpy and simsim, which have an event per token",
    )
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="best of N runs")
    parser.add_argument(
        "--solvers",
        nargs="+",
        choices=list(SOLVERS_BY_NAME),
        default=list(DEFAULT_SOLVERS),
        help=(
            "which solvers to run, each checked against closed_form (default: the four; "
            "the *_fed ones submit arrivals from a source process)"
        ),
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help="untimed runs per solver before measuring (0: measure cold code)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"sizes {', '.join(map(str, QUICK_SIZES))}, one repetition, "
            f"{QUICK_WARMUP} warm-up runs (the smoke test)"
        ),
    )
    parser.add_argument("--plot", type=Path, help="write the time-per-request plot (PNG)")
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    args = parser.parse_args(argv)
    sizes, repeat, per_token_max = args.sizes, args.repeat, args.per_token_max
    if args.quick:
        sizes, repeat, per_token_max = list(QUICK_SIZES), 1, QUICK_PER_TOKEN_MAX
        args.warmup = min(args.warmup, QUICK_WARMUP)
    if repeat < 1 or min(sizes) < 1 or args.warmup < 0:
        parser.error("--repeat and every size must be at least 1, --warmup at least 0")
    if not any(n <= per_token_max for n in sizes):
        parser.error("at least one size must be within --per-token-max")
    try:
        report = run(sizes, repeat, per_token_max, args.solvers, not args.no_memory, args.warmup)
    except DisagreementError as error:
        print(f"DISAGREEMENT: {error}", file=sys.stderr)
        return 1
    print(render_text(report))
    if args.markdown is not None:
        write_markdown(report, args.markdown)
    if args.plot is not None:
        plot_scaling(report, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
