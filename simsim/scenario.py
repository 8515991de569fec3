"""Scenario files: a whole simulation described in TOML, checked before it runs.

A scenario names a cost model, a scheduler, the requests (listed inline, read from a
CSV trace, or generated from a seed) and cancellations at given times. Loading checks
every key and value and raises :class:`ScenarioError` naming the file, the key and the
rule at fault; nothing runs until the whole file is valid. See ``docs/scenarios.md``.
"""

from __future__ import annotations

import csv
import difflib
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from simsim.backend import SimulatedBackend, SimulatedBackendConfig
from simsim.clock import MAX_TIME_US, Environment
from simsim.engines import SimulationEngine
from simsim.request import Request
from simsim.scheduler import FcfsScheduler

__all__ = [
    "Cancellation",
    "RequestSpec",
    "Scenario",
    "ScenarioError",
    "WorkloadSpec",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "read_trace_csv",
    "run_scenario",
]

ENGINES = ("single_slot",)
SCHEDULERS = ("fcfs",)


class ScenarioError(ValueError):
    """A scenario file (or trace) broke a rule; the message names the file and key."""

    def __init__(self, source: str, key: str, rule: str) -> None:
        self.source = source
        self.key = key
        self.rule = rule
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {rule}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a scenario, before it becomes a :class:`Request`."""

    request_id: int
    arrival_time_us: int
    prompt_token_count: int
    max_output_tokens: int

    def to_request(self) -> Request:
        """A fresh pristine :class:`Request` with these fields."""
        return Request(
            self.request_id, self.arrival_time_us, self.prompt_token_count, self.max_output_tokens
        )


@dataclass(frozen=True, slots=True)
class Cancellation:
    """Cancel *request_id* at *time_us* (skipped if it has finished by then)."""

    time_us: int
    request_id: int


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A generated open-loop workload: Poisson arrivals, uniform token counts."""

    count: int
    rate_per_s: float
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    first_request_id: int = 0
    start_time_us: int = 0

    def generate(self, seed: int) -> list[RequestSpec]:
        """The requests this workload makes from *seed* (the same on every machine)."""
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1e6 / self.rate_per_s, size=self.count)
        arrivals = self.start_time_us + np.cumsum(np.rint(gaps).astype(np.int64))
        prompts = rng.integers(
            self.prompt_tokens[0], self.prompt_tokens[1], self.count, endpoint=True
        )
        outputs = rng.integers(
            self.output_tokens[0], self.output_tokens[1], self.count, endpoint=True
        )
        return [
            RequestSpec(self.first_request_id + i, int(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))
        ]


@dataclass(frozen=True)
class Scenario:
    """A complete, validated simulation: what to build and what to feed it."""

    name: str = "scenario"
    engine: str = "single_slot"
    scheduler: str = "fcfs"
    backend: SimulatedBackendConfig = field(default_factory=SimulatedBackendConfig)
    requests: tuple[RequestSpec, ...] = ()
    workload: WorkloadSpec | None = None
    cancellations: tuple[Cancellation, ...] = ()
    seed: int = 0
    source: str = "<scenario>"

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario with another seed for its generated workload."""
        return replace(self, seed=seed)

    def all_requests(self) -> list[RequestSpec]:
        """Listed, traced and generated requests, in id order; ids must be unique."""
        specs = list(self.requests)
        if self.workload is not None:
            specs.extend(self.workload.generate(self.seed))
        seen: set[int] = set()
        for spec in specs:
            if spec.request_id in seen:
                raise ScenarioError(
                    self.source,
                    "requests",
                    f"request id {spec.request_id} appears twice (ids must be unique)",
                )
            seen.add(spec.request_id)
        specs.sort(key=lambda s: s.request_id)
        return specs


# ---------------------------------------------------------------------- loading

_TOP_KEYS = ("scenario", "backend", "scheduler", "requests", "trace", "workload", "cancellations")
_SCENARIO_KEYS = ("name", "engine", "seed")
_BACKEND_KEYS = tuple(SimulatedBackendConfig.__dataclass_fields__)
_SCHEDULER_KEYS = ("policy",)
_REQUEST_KEYS = ("request_id", "arrival_time_us", "prompt_token_count", "max_output_tokens")
_TRACE_KEYS = ("path",)
_WORKLOAD_KEYS = (
    "count",
    "rate_per_s",
    "prompt_tokens",
    "output_tokens",
    "first_request_id",
    "start_time_us",
)
_CANCELLATION_KEYS = ("time_us", "request_id")


def load_scenario(path: str | Path, *, seed: int | None = None) -> Scenario:
    """Read and validate a TOML scenario file; *seed* overrides the file's seed."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(source, "", f"cannot read the file ({error.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(source, "", f"not valid TOML: {error}") from None
    scenario = parse_scenario(data, source=source, base_dir=path.parent)
    return scenario if seed is None else scenario.with_seed(seed)


def parse_scenario(
    data: Mapping[str, Any], *, source: str = "<scenario>", base_dir: Path | None = None
) -> Scenario:
    """Validate an already-parsed TOML document and build the :class:`Scenario`."""
    check = _Checker(source)
    check.keys(data, _TOP_KEYS, "")
    head = check.table(data, "scenario", "scenario")
    check.keys(head, _SCENARIO_KEYS, "scenario")
    name = check.string(head, "name", "scenario", default="scenario")
    engine = check.choice(head, "engine", "scenario", ENGINES, default="single_slot")
    seed = check.integer(head, "seed", "scenario", default=0)

    backend_table = check.table(data, "backend", "backend")
    check.keys(backend_table, _BACKEND_KEYS, "backend")
    backend = SimulatedBackendConfig(
        **{key: check.integer(backend_table, key, "backend", default=0) for key in _BACKEND_KEYS}
    )

    scheduler_table = check.table(data, "scheduler", "scheduler")
    check.keys(scheduler_table, _SCHEDULER_KEYS, "scheduler")
    scheduler = check.choice(scheduler_table, "policy", "scheduler", SCHEDULERS, default="fcfs")

    specs: list[RequestSpec] = []
    for index, row in enumerate(check.array_of_tables(data, "requests")):
        where = f"requests[{index}]"
        check.keys(row, _REQUEST_KEYS, where)
        specs.append(
            RequestSpec(
                check.integer(row, "request_id", where),
                check.time(row, "arrival_time_us", where),
                check.integer(row, "prompt_token_count", where),
                check.integer(row, "max_output_tokens", where),
            )
        )

    if "trace" in data:
        trace = check.table(data, "trace", "trace")
        check.keys(trace, _TRACE_KEYS, "trace")
        trace_path = Path(check.string(trace, "path", "trace"))
        if not trace_path.is_absolute() and base_dir is not None:
            trace_path = base_dir / trace_path
        specs.extend(read_trace_csv(trace_path))

    workload = None
    if "workload" in data:
        table = check.table(data, "workload", "workload")
        check.keys(table, _WORKLOAD_KEYS, "workload")
        rate = check.number(table, "rate_per_s", "workload")
        if rate <= 0:
            raise ScenarioError(source, "workload.rate_per_s", f"must be > 0, got {rate}")
        workload = WorkloadSpec(
            count=check.integer(table, "count", "workload"),
            rate_per_s=rate,
            prompt_tokens=check.int_range(table, "prompt_tokens", "workload"),
            output_tokens=check.int_range(table, "output_tokens", "workload"),
            first_request_id=check.integer(table, "first_request_id", "workload", default=0),
            start_time_us=check.time(table, "start_time_us", "workload", default=0),
        )

    cancellations: list[Cancellation] = []
    for index, row in enumerate(check.array_of_tables(data, "cancellations")):
        where = f"cancellations[{index}]"
        check.keys(row, _CANCELLATION_KEYS, where)
        cancellations.append(
            Cancellation(check.time(row, "time_us", where), check.integer(row, "request_id", where))
        )

    scenario = Scenario(
        name=name,
        engine=engine,
        scheduler=scheduler,
        backend=backend,
        requests=tuple(specs),
        workload=workload,
        cancellations=tuple(cancellations),
        seed=seed,
        source=source,
    )
    known = {spec.request_id for spec in scenario.all_requests()}
    for index, cancellation in enumerate(scenario.cancellations):
        if cancellation.request_id not in known:
            raise ScenarioError(
                source,
                f"cancellations[{index}].request_id",
                f"request {cancellation.request_id} is not in the scenario's requests",
            )
    return scenario


class _Checker:
    """Typed look-ups into parsed TOML that raise :class:`ScenarioError` on bad input."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, rule: str) -> ScenarioError:
        return ScenarioError(self.source, key, rule)

    def keys(self, table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.fail(
                    _join(where, key),
                    f"unknown key{hint}; allowed keys: {', '.join(allowed)}",
                )

    def table(self, data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table, got {_kind(value)}")
        return value

    def array_of_tables(self, data: Mapping[str, Any], key: str) -> Iterator[Mapping[str, Any]]:
        rows = data.get(key, [])
        if not isinstance(rows, list):
            raise self.fail(key, f"must be an array of tables ([[{key}]]), got {_kind(rows)}")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise self.fail(f"{key}[{index}]", f"must be a table, got {_kind(row)}")
            yield row

    def _get(self, table: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
        if key in table:
            return table[key]
        if default is _REQUIRED:
            raise self.fail(_join(where, key), "missing required key")
        return default

    def integer(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if type(value) is not int:
            raise self.fail(_join(where, key), f"must be an integer, got {_kind(value)} {value!r}")
        if value < 0:
            raise self.fail(_join(where, key), f"must be >= 0, got {value}")
        if value > MAX_TIME_US:
            raise self.fail(_join(where, key), f"must be at most 2**63 - 1, got {value}")
        return value

    def time(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if type(value) is not int:
            raise self.fail(
                _join(where, key),
                f"must be an integer number of microseconds, got {_kind(value)} {value!r}",
            )
        if value < 0:
            raise self.fail(_join(where, key), f"must be >= 0 microseconds, got {value}")
        if value > MAX_TIME_US:
            raise self.fail(_join(where, key), f"must be at most 2**63 - 1, got {value}")
        return value

    def number(self, table: Mapping[str, Any], key: str, where: str) -> float:
        value = self._get(table, key, where, _REQUIRED)
        if type(value) not in (int, float):
            raise self.fail(_join(where, key), f"must be a number, got {_kind(value)} {value!r}")
        return float(value)

    def string(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> str:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if not isinstance(value, str):
            raise self.fail(_join(where, key), f"must be a string, got {_kind(value)} {value!r}")
        return value

    def choice(
        self,
        table: Mapping[str, Any],
        key: str,
        where: str,
        choices: tuple[str, ...],
        default: str,
    ) -> str:
        value = self.string(table, key, where, default=default)
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise self.fail(
                _join(where, key), f"unknown value {value!r}{hint}; choose one of {choices}"
            )
        return value

    def int_range(self, table: Mapping[str, Any], key: str, where: str) -> tuple[int, int]:
        value = self._get(table, key, where, _REQUIRED)
        if not (isinstance(value, list) and len(value) == 2):
            raise self.fail(
                _join(where, key), f"must be a [min, max] pair of integers, got {value!r}"
            )
        low, high = (self.integer({key: v}, key, where) for v in value)
        if low > high:
            raise self.fail(_join(where, key), f"min {low} is greater than max {high}")
        return (low, high)


_REQUIRED: Any = object()


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------- traces

TRACE_COLUMNS = ("arrival_time_us", "prompt_token_count", "max_output_tokens")


def read_trace_csv(path: str | Path, *, first_request_id: int = 0) -> list[RequestSpec]:
    """Read a plain CSV trace: ``arrival_time_us, prompt_token_count, max_output_tokens``.

    An optional ``request_id`` column gives ids; otherwise rows are numbered from
    *first_request_id* in file order. Every value must be a non-negative integer; a bad
    row raises :class:`ScenarioError` naming the file, the line and the column.
    """
    path = Path(path)
    source = str(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise ScenarioError(source, "", f"cannot read the trace ({error.strerror})") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ScenarioError(source, "line 1", "the trace is empty (no header row)")
        header = [name.strip() for name in header]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ScenarioError(source, "line 1", f"missing columns {missing}; found {header}")
        unknown = [c for c in header if c not in (*TRACE_COLUMNS, "request_id")]
        if unknown:
            raise ScenarioError(source, "line 1", f"unknown columns {unknown}")
        index = {name: header.index(name) for name in header}
        specs: list[RequestSpec] = []
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ScenarioError(
                    source, f"line {line}", f"expected {len(header)} fields, got {len(row)}"
                )

            def field(name: str, row: list[str] = row, line: int = line) -> int:
                return _trace_int(row[index[name]], source, line, name)

            rid = field("request_id") if "request_id" in index else first_request_id + len(specs)
            specs.append(
                RequestSpec(
                    rid,
                    field("arrival_time_us"),
                    field("prompt_token_count"),
                    field("max_output_tokens"),
                )
            )
    return specs


def _trace_int(text: str, source: str, line: int, column: str) -> int:
    cell = text.strip()
    try:
        value = int(cell)
    except ValueError:
        raise ScenarioError(
            source, f"line {line}, column {column}", f"must be a non-negative integer, got {cell!r}"
        ) from None
    if value < 0 or value > MAX_TIME_US:
        raise ScenarioError(
            source,
            f"line {line}, column {column}",
            f"must be between 0 and 2**63 - 1, got {value}",
        )
    return value


# ---------------------------------------------------------------------- running


def default_scenario(seed: int = 0) -> Scenario:
    """The built-in scenario of ``simsim run``: 1500 Poisson requests at about 80% load."""
    return Scenario(
        name="default",
        backend=SimulatedBackendConfig(
            prefill_base_us=2_000,
            prefill_per_token_us=50,
            prefill_per_active_sequence_us=0,
            decode_base_us=8_000,
            decode_per_active_sequence_us=0,
        ),
        workload=WorkloadSpec(
            count=1_500, rate_per_s=1.5, prompt_tokens=(16, 1024), output_tokens=(0, 128)
        ),
        cancellations=tuple(Cancellation(60_000_000 * k, 100 * k) for k in range(1, 8)),
        seed=seed,
        source="<built-in default>",
    )


def run_scenario(
    scenario: Scenario,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationEngine:
    """Build the scenario's engine, feed it, run it to the end and return it.

    Cancellations at time T take effect after the arrivals at T and before every other
    event at T (they are scheduled after all submissions, before the run starts); a
    request that is already finished by then is left alone. *progress*, if given, is
    called now and then with (requests admitted so far, requests in the scenario).
    """
    specs = scenario.all_requests()
    env = Environment()
    engine = SimulationEngine(SimulatedBackend(scenario.backend), FcfsScheduler(), env=env)
    for spec in specs:
        engine.submit(spec.to_request())
    for cancellation in sorted(scenario.cancellations, key=lambda c: c.time_us):
        timer = env.timeout(cancellation.time_us)
        timer.callbacks.append(_canceller(engine, cancellation.request_id))
    total = len(specs)
    if progress is None:
        engine.run()
        return engine
    step = engine.run_next_timestamp
    count = 0
    while step() is not None:
        count += 1
        if count % 4096 == 0:
            progress(len(engine.admission_log), total)
    progress(total, total)
    return engine


def _canceller(engine: SimulationEngine, request_id: int) -> Callable[[Any], None]:
    def cancel(_event: Any) -> None:
        if not engine.requests[request_id].is_terminal:
            engine.cancel_request(request_id)

    return cancel
