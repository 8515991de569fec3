"""Scenario files: a whole simulation described in TOML, checked before it runs.

A scenario names a cost model, a scheduler, the requests (listed inline, read from a
CSV trace, or generated from a seed) and cancellations at given times. Loading checks
every key and value and raises :class:`ScenarioError` naming the file, the key and the
rule at fault; nothing runs until the whole file is valid. See ``docs/scenarios.md``.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from simsim.backend import SimulatedBackend, SimulatedBackendConfig
from simsim.clock import MAX_TIME_US, Environment
from simsim.engines import BatchingEngine, FastSimulationEngine, KvCacheConfig, SimulationEngine
from simsim.engines.base import EngineBase
from simsim.engines.batching import POLICIES
from simsim.request import Request
from simsim.scheduler import FcfsScheduler
from simsim.traces import TraceError, read_azure_trace, read_plain_trace
from simsim.workloads import (
    ArrivalProcess,
    ClosedLoopWorkload,
    Empirical,
    Exponential,
    Fixed,
    FixedRateArrivals,
    GammaArrivals,
    GeneratedWorkload,
    LengthDistribution,
    LogNormal,
    OpenLoopWorkload,
    PoissonArrivals,
    Uniform,
    check_seed,
)

__all__ = [
    "BatchingSpec",
    "Cancellation",
    "RequestSpec",
    "Scenario",
    "ScenarioError",
    "TomlChecker",
    "Workload",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "read_toml",
    "read_trace_csv",
    "run_scenario",
]

ENGINES = ("single_slot", "single_slot_fast", "batching")
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

    @classmethod
    def of(cls, request: Request) -> RequestSpec:
        """The spec of an existing request (its size and arrival)."""
        return cls(
            request.request_id,
            request.arrival_time_us,
            request.prompt_token_count,
            request.max_output_tokens,
        )

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


Workload = OpenLoopWorkload | ClosedLoopWorkload


@dataclass(frozen=True, slots=True)
class BatchingSpec:
    """The ``[batching]`` and ``[kv_cache]`` tables: how the batching server is set up."""

    max_active_requests: int
    max_batch_tokens: int | None = None
    policy: str = "prefill_first"
    kv_cache: KvCacheConfig | None = None

    def build(
        self, backend: SimulatedBackend, scheduler: FcfsScheduler, env: Environment
    ) -> BatchingEngine:
        """A :class:`BatchingEngine` with these settings."""
        return BatchingEngine(
            backend,
            scheduler,
            max_active_requests=self.max_active_requests,
            max_batch_tokens=self.max_batch_tokens,
            policy=self.policy,
            kv_cache=self.kv_cache,
            env=env,
        )


@dataclass(frozen=True)
class Scenario:
    """A complete, validated simulation: what to build and what to feed it."""

    name: str = "scenario"
    engine: str = "single_slot"
    batching: BatchingSpec | None = None
    scheduler: str = "fcfs"
    backend: SimulatedBackendConfig = field(default_factory=SimulatedBackendConfig)
    requests: tuple[RequestSpec, ...] = ()
    workload: Workload | None = None
    cancellations: tuple[Cancellation, ...] = ()
    seed: int = 0
    source: str = "<scenario>"

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario with another seed for its generated workload."""
        return replace(self, seed=check_seed(seed))

    def generated(self) -> GeneratedWorkload | None:
        """What an open-loop ``workload`` makes from the seed (``None`` otherwise)."""
        if not isinstance(self.workload, OpenLoopWorkload):
            return None
        try:
            return self.workload.generate(self.seed)
        except (ValueError, OverflowError) as error:
            raise ScenarioError(self.source, "workload", str(error)) from None

    def all_requests(self) -> list[RequestSpec]:
        """Listed, traced and generated requests, in id order; ids must be unique.

        A closed-loop workload's requests are made while the simulation runs and are
        not included.
        """
        specs = list(self.requests)
        generated = self.generated()
        if generated is not None:
            specs.extend(RequestSpec.of(request) for request in generated.requests)
        seen: set[int] = set()
        for spec in specs:
            if spec.request_id in seen:
                raise ScenarioError(
                    self.source,
                    "requests",
                    f"request id {spec.request_id} appears twice (ids must be unique "
                    "across [[requests]], [trace] and [workload])",
                )
            seen.add(spec.request_id)
        specs.sort(key=lambda s: s.request_id)
        return specs


# ---------------------------------------------------------------------- loading

_TOP_KEYS = (
    "scenario",
    "backend",
    "scheduler",
    "batching",
    "kv_cache",
    "requests",
    "trace",
    "workload",
    "cancellations",
)
_BATCHING_KEYS = ("max_active_requests", "max_batch_tokens", "policy")
_KV_CACHE_KEYS = ("block_size_tokens", "total_blocks")
_SCENARIO_KEYS = ("name", "engine", "seed")
_BACKEND_KEYS = tuple(SimulatedBackendConfig.__dataclass_fields__)
_SCHEDULER_KEYS = ("policy",)
_REQUEST_KEYS = ("request_id", "arrival_time_us", "prompt_token_count", "max_output_tokens")
_TRACE_KEYS = (
    "path",
    "format",
    "time_scale",
    "window_start_us",
    "window_duration_us",
    "window_start_s",
    "window_duration_s",
    "first_request_id",
)
_OPEN_LOOP_KEYS = (
    "kind",
    "count",
    "arrivals",
    "rate_per_s",
    "prompt_tokens",
    "output_tokens",
    "patience_us",
    "first_request_id",
    "start_time_us",
)
_CLOSED_LOOP_KEYS = (
    "kind",
    "users",
    "think_time_us",
    "prompt_tokens",
    "output_tokens",
    "patience_us",
    "requests_per_user",
    "horizon_us",
    "first_request_id",
)
_ARRIVAL_KEYS = {
    "poisson": ("process", "rate_per_s"),
    "gamma": ("process", "rate_per_s", "cv"),
    "fixed": ("process", "rate_per_s"),
}
_DISTRIBUTION_KEYS = {
    "fixed": ("distribution", "value"),
    "uniform": ("distribution", "low", "high"),
    "lognormal": ("distribution", "mean", "cv", "low", "high"),
    "exponential": ("distribution", "mean", "low", "high"),
    "empirical": ("distribution", "values", "weights", "path", "column", "weight_column"),
}
_CANCELLATION_KEYS = ("time_us", "request_id")


def load_scenario(path: str | Path, *, seed: int | None = None) -> Scenario:
    """Read and validate a TOML scenario file; *seed* overrides the file's seed."""
    path = Path(path)
    scenario = parse_scenario(read_toml(path), source=str(path), base_dir=path.parent)
    return scenario if seed is None else scenario.with_seed(seed)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing file or bad TOML is a :class:`ScenarioError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(source, "", f"cannot read the file ({error.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(source, "", f"not valid TOML: {error}") from None


def parse_scenario(
    data: Mapping[str, Any], *, source: str = "<scenario>", base_dir: Path | None = None
) -> Scenario:
    """Validate an already-parsed TOML document and build the :class:`Scenario`."""
    check = TomlChecker(source)
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
        specs.extend(_parse_trace(check, check.table(data, "trace", "trace"), base_dir))

    workload = None
    if "workload" in data:
        workload = _parse_workload(check, check.table(data, "workload", "workload"), base_dir)

    if not specs and workload is None:
        raise ScenarioError(
            source, "", "the scenario has no requests: add [[requests]], [trace] or [workload]"
        )

    batching = _parse_batching(check, data, engine)

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
        batching=batching,
        scheduler=scheduler,
        backend=backend,
        requests=tuple(specs),
        workload=workload,
        cancellations=tuple(cancellations),
        seed=seed,
        source=source,
    )
    known = {spec.request_id for spec in scenario.all_requests()}
    # Cancellations must name requests known before the run (not closed-loop ones).
    for index, cancellation in enumerate(scenario.cancellations):
        if cancellation.request_id not in known:
            raise ScenarioError(
                source,
                f"cancellations[{index}].request_id",
                f"request {cancellation.request_id} is not in the scenario's requests",
            )
    return scenario


def _parse_batching(
    check: TomlChecker, data: Mapping[str, Any], engine: str
) -> BatchingSpec | None:
    if engine != "batching":
        for name in ("batching", "kv_cache"):
            if name in data:
                raise check.fail(name, 'only for engine = "batching" (see [scenario] engine)')
        return None
    table = check.table(data, "batching", "batching")
    check.keys(table, _BATCHING_KEYS, "batching")
    kv_cache = None
    if "kv_cache" in data:
        kv_table = check.table(data, "kv_cache", "kv_cache")
        check.keys(kv_table, _KV_CACHE_KEYS, "kv_cache")
        kv_cache = _make(
            check,
            "kv_cache",
            KvCacheConfig,
            check.integer(kv_table, "block_size_tokens", "kv_cache"),
            check.integer(kv_table, "total_blocks", "kv_cache"),
        )
    spec = BatchingSpec(
        max_active_requests=check.integer(table, "max_active_requests", "batching"),
        max_batch_tokens=check.optional_integer(table, "max_batch_tokens", "batching"),
        policy=check.choice(table, "policy", "batching", POLICIES, default="prefill_first"),
        kv_cache=kv_cache,
    )
    # Let the engine's own checks speak (token cap vs slots, mixed needs a budget...).
    _make(
        check,
        "batching",
        spec.build,
        SimulatedBackend(SimulatedBackendConfig()),
        FcfsScheduler(),
        Environment(),
    )
    return spec


def _parse_trace(
    check: TomlChecker, table: Mapping[str, Any], base_dir: Path | None
) -> list[RequestSpec]:
    check.keys(table, _TRACE_KEYS, "trace")
    path = Path(check.string(table, "path", "trace"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    fmt = check.choice(table, "format", "trace", ("plain", "azure"), default="plain")
    time_scale = check.number(table, "time_scale", "trace", default=1.0)
    first = check.integer(table, "first_request_id", "trace", default=0)
    window_keys = {
        "plain": ("window_start_us", "window_duration_us"),
        "azure": ("window_start_s", "window_duration_s"),
    }[fmt]
    for key in _TRACE_KEYS:
        if key.startswith("window_") and key in table and key not in window_keys:
            raise check.fail(
                f"trace.{key}", f"not for format {fmt!r}; use {' and '.join(window_keys)}"
            )
    try:
        if fmt == "plain":
            requests = read_plain_trace(
                path,
                time_scale=time_scale,
                window_start_us=check.optional_time(table, "window_start_us", "trace"),
                window_duration_us=check.optional_time(table, "window_duration_us", "trace"),
                first_request_id=first,
            )
        else:
            requests = read_azure_trace(
                path,
                time_scale=time_scale,
                window_start_s=check.optional_number(table, "window_start_s", "trace"),
                window_duration_s=check.optional_number(table, "window_duration_s", "trace"),
                first_request_id=first,
            )
    except TraceError as error:
        raise _from_trace_error(error) from None
    except (TypeError, ValueError) as error:
        raise check.fail("trace", str(error)) from None
    return [RequestSpec.of(request) for request in requests]


def _from_trace_error(error: TraceError) -> ScenarioError:
    place = ", ".join(
        part
        for part in (
            None if error.line is None else f"line {error.line}",
            None if error.column is None else f"column {error.column}",
        )
        if part is not None
    )
    return ScenarioError(error.source, place, error.rule)


def _parse_workload(
    check: TomlChecker, table: Mapping[str, Any], base_dir: Path | None
) -> Workload:
    kind = check.choice(table, "kind", "workload", ("open_loop", "closed_loop"), "open_loop")
    where = "workload"
    try:
        if kind == "closed_loop":
            check.keys(table, _CLOSED_LOOP_KEYS, where)
            return ClosedLoopWorkload(
                users=check.integer(table, "users", where),
                think_time_us=_parse_distribution(check, table, "think_time_us", base_dir),
                prompt_tokens=_parse_distribution(check, table, "prompt_tokens", base_dir),
                output_tokens=_parse_distribution(check, table, "output_tokens", base_dir),
                requests_per_user=check.optional_integer(table, "requests_per_user", where),
                horizon_us=check.optional_time(table, "horizon_us", where),
                first_request_id=check.integer(table, "first_request_id", where, default=0),
                patience=_parse_optional_distribution(check, table, "patience_us", base_dir),
            )
        check.keys(table, _OPEN_LOOP_KEYS, where)
        return OpenLoopWorkload(
            arrivals=_parse_arrivals(check, table),
            prompt_tokens=_parse_distribution(check, table, "prompt_tokens", base_dir),
            output_tokens=_parse_distribution(check, table, "output_tokens", base_dir),
            count=check.integer(table, "count", where),
            patience=_parse_optional_distribution(check, table, "patience_us", base_dir),
            first_request_id=check.integer(table, "first_request_id", where, default=0),
            start_us=check.time(table, "start_time_us", where, default=0),
        )
    except ScenarioError:
        raise
    except TraceError as error:
        raise _from_trace_error(error) from None
    except (TypeError, ValueError, OverflowError) as error:
        raise check.fail(where, str(error)) from None


def _parse_arrivals(check: TomlChecker, table: Mapping[str, Any]) -> ArrivalProcess:
    where = "workload"
    if "rate_per_s" in table:
        if "arrivals" in table:
            raise check.fail("workload.rate_per_s", "give either rate_per_s or arrivals, not both")
        return _make(
            check, "workload.rate_per_s", PoissonArrivals, check.number(table, "rate_per_s", where)
        )
    spec = check.table(table, "arrivals", "workload.arrivals")
    if "arrivals" not in table:
        raise check.fail("workload.arrivals", "missing required key (or give rate_per_s)")
    at = "workload.arrivals"
    process = check.choice(spec, "process", at, tuple(_ARRIVAL_KEYS), default="poisson")
    check.keys(spec, _ARRIVAL_KEYS[process], at)
    rate = check.number(spec, "rate_per_s", at)
    if process == "gamma":
        return _make(check, at, GammaArrivals, rate, check.number(spec, "cv", at))
    if process == "fixed":
        return _make(check, at, FixedRateArrivals, rate)
    return _make(check, at, PoissonArrivals, rate)


def _parse_optional_distribution(
    check: TomlChecker, table: Mapping[str, Any], key: str, base_dir: Path | None
) -> LengthDistribution | None:
    if key not in table:
        return None
    return _parse_distribution(check, table, key, base_dir)


def _parse_distribution(
    check: TomlChecker, table: Mapping[str, Any], key: str, base_dir: Path | None
) -> LengthDistribution:
    at = f"workload.{key}"
    if key not in table:
        raise check.fail(at, "missing required key")
    value = table[key]
    if isinstance(value, list):
        low, high = check.int_range(table, key, "workload")
        return _make(check, at, Uniform, low, high)
    if type(value) is int:
        return _make(check, at, Fixed, check.integer(table, key, "workload"))
    spec = check.table(table, key, at)
    kind = check.choice(spec, "distribution", at, tuple(_DISTRIBUTION_KEYS), default="")
    check.keys(spec, _DISTRIBUTION_KEYS[kind], at)
    if kind == "fixed":
        return _make(check, at, Fixed, check.integer(spec, "value", at))
    if kind == "uniform":
        return _make(
            check, at, Uniform, check.integer(spec, "low", at), check.integer(spec, "high", at)
        )
    floor = check.integer(spec, "low", at, default=0)
    ceiling = check.optional_integer(spec, "high", at)
    if kind == "lognormal":
        mean, cv = check.number(spec, "mean", at), check.number(spec, "cv", at)
        return _make(check, at, LogNormal, mean, cv, floor, ceiling)
    if kind == "exponential":
        return _make(check, at, Exponential, check.number(spec, "mean", at), floor, ceiling)
    if "path" in spec:
        path = Path(check.string(spec, "path", at))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        weight_column = spec.get("weight_column")
        return _make(
            check,
            at,
            Empirical.from_csv,
            path,
            check.string(spec, "column", at),
            weight_column=None
            if weight_column is None
            else check.string(spec, "weight_column", at),
        )
    values = spec.get("values")
    weights = spec.get("weights")
    if not isinstance(values, list):
        raise check.fail(f"{at}.values", "an empirical distribution needs values = [...] or path")
    return _make(check, at, Empirical, tuple(values), None if weights is None else tuple(weights))


def _make(check: TomlChecker, at: str, factory: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Build a workload part, turning its argument errors into a :class:`ScenarioError`."""
    try:
        return factory(*args, **kwargs)
    except TraceError as error:
        raise _from_trace_error(error) from None
    except (TypeError, ValueError, OverflowError) as error:
        raise check.fail(at, str(error)) from None


_T = TypeVar("_T")


class TomlChecker:
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

    def number(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> float:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if type(value) not in (int, float):
            raise self.fail(_join(where, key), f"must be a number, got {_kind(value)} {value!r}")
        if not math.isfinite(value):
            raise self.fail(_join(where, key), f"must be a finite number, got {value!r}")
        return float(value)

    def optional_number(self, table: Mapping[str, Any], key: str, where: str) -> float | None:
        return None if key not in table else self.number(table, key, where)

    def optional_integer(self, table: Mapping[str, Any], key: str, where: str) -> int | None:
        return None if key not in table else self.integer(table, key, where)

    def optional_time(self, table: Mapping[str, Any], key: str, where: str) -> int | None:
        return None if key not in table else self.time(table, key, where)

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
        value = self.string(table, key, where, default=default or _REQUIRED)
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


def read_trace_csv(path: str | Path, *, first_request_id: int = 0) -> list[RequestSpec]:
    """Read a plain CSV trace (see :func:`simsim.traces.read_plain_trace`) as specs.

    Errors are :class:`ScenarioError` naming the file, the line and the column.
    """
    try:
        requests = read_plain_trace(path, first_request_id=first_request_id)
    except TraceError as error:
        raise _from_trace_error(error) from None
    return [RequestSpec.of(request) for request in requests]


# ---------------------------------------------------------------------- running


def default_scenario(seed: int = 0) -> Scenario:
    """The built-in scenario of ``simsim run``: 1500 Poisson requests at about 80% load.

    Prompts are uniform on 16..1024 tokens and outputs on 0..128; the mean service time
    is about 0.54 s, so 1.5 arrivals per second keep the single slot about 80% busy.
    Seven requests are cancelled along the way.
    """
    return Scenario(
        name="default",
        backend=SimulatedBackendConfig(
            prefill_base_us=2_000,
            prefill_per_token_us=50,
            prefill_per_active_sequence_us=0,
            decode_base_us=8_000,
            decode_per_active_sequence_us=0,
        ),
        workload=OpenLoopWorkload(
            arrivals=PoissonArrivals(1.5),
            prompt_tokens=Uniform(16, 1024),
            output_tokens=Uniform(0, 128),
            count=1_500,
        ),
        cancellations=tuple(Cancellation(60_000_000 * k, 100 * k) for k in range(1, 8)),
        seed=check_seed(seed),
        source="<built-in default>",
    )


def run_scenario(
    scenario: Scenario,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> EngineBase:
    """Build the scenario's engine, feed it, run it to the end and return it.

    Every listed, traced and generated request is submitted first, in id order; then
    the ``[[cancellations]]`` and the workload's patience deadlines are scheduled, and
    a closed-loop workload's users are started. So a cancellation at time T takes
    effect after the arrivals at T and before every other event at T; a request that is
    already finished by then is left alone. *progress*, if given, is called now and
    then with (requests admitted so far, requests known before the run).
    """
    specs = scenario.all_requests()
    env = Environment()
    backend = SimulatedBackend(scenario.backend)
    engine: EngineBase
    if scenario.engine == "batching":
        assert scenario.batching is not None
        engine = scenario.batching.build(backend, FcfsScheduler(), env)
    elif scenario.engine == "single_slot_fast":
        engine = FastSimulationEngine(backend, FcfsScheduler(), env=env)
    else:
        engine = SimulationEngine(backend, FcfsScheduler(), env=env)
    for spec in specs:
        engine.submit(spec.to_request())
    deadlines = [(c.time_us, c.request_id) for c in scenario.cancellations]
    generated = scenario.generated()
    if generated is not None:
        deadlines.extend(generated.cancellations)
    for time_us, request_id in sorted(deadlines):
        timer = env.timeout(time_us - env.now)
        timer.callbacks.append(_canceller(engine, request_id))
    if isinstance(scenario.workload, ClosedLoopWorkload):
        scenario.workload.start(env, engine, scenario.seed)
    total = max(len(specs), 1)
    if progress is None:
        engine.run()
        return engine
    step = engine.run_next_timestamp
    count = 0
    while step() is not None:
        count += 1
        if count % 4096 == 0:
            progress(min(len(engine.admission_log), total), total)
    progress(total, total)
    return engine


def _canceller(engine: EngineBase, request_id: int) -> Callable[[Any], None]:
    def cancel(_event: Any) -> None:
        if not engine.requests[request_id].is_terminal:
            engine.cancel_request(request_id)

    return cancel
