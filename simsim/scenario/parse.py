"""From a TOML document to a :class:`Scenario`: the top-level tables and their rules.

Each table is checked with a :class:`TomlChecker`; ``[trace]`` and ``[workload]`` have
their own modules. Nothing is built or run until the whole document is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simsim.backend import (
    FittedBackendConfig,
    SimulatedBackend,
    SimulatedBackendConfig,
)
from simsim.clock import Environment
from simsim.engines import KvCacheConfig
from simsim.engines.batching import POLICIES
from simsim.scenario.checker import ScenarioError, TomlChecker, make, read_toml
from simsim.scenario.model import (
    ENGINE_BUILDERS,
    SCHEDULERS,
    BatchingSpec,
    Cancellation,
    RequestSpec,
    Scenario,
)
from simsim.scenario.trace_table import parse_trace
from simsim.scenario.workload_table import parse_workload
from simsim.scheduler import FcfsScheduler
from simsim.traces import MOONCAKE_BLOCK_SIZE
from simsim.workloads import ClosedLoopWorkload

__all__ = ["load_backend", "load_scenario", "parse_scenario"]

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
    "prefix_cache",
)
_PREFIX_CACHE_KEYS = ("enabled",)
_BATCHING_KEYS = ("max_active_requests", "max_batch_tokens", "policy")
_KV_CACHE_KEYS = ("block_size_tokens", "total_blocks")
_SCENARIO_KEYS = ("name", "engine", "seed")
_BACKEND_KEYS = tuple(SimulatedBackendConfig.__dataclass_fields__)
_FITTED_BACKEND_KEYS = tuple(FittedBackendConfig.__dataclass_fields__)
BACKEND_KINDS = ("simulated", "fitted")
"""``[backend] kind``: the linear model in whole microseconds (default) or the fitted one."""
_SCHEDULER_KEYS = ("policy",)
_REQUEST_KEYS = (
    "request_id",
    "arrival_time_us",
    "prompt_token_count",
    "max_output_tokens",
    "block_hashes",
)
_CANCELLATION_KEYS = ("time_us", "request_id")


def load_scenario(
    path: str | Path,
    *,
    seed: int | None = None,
    require_requests: bool = True,
    backend: str | Path | None = None,
    require_backend: bool = True,
) -> Scenario:
    """Read and validate a TOML scenario file; *seed* overrides the file's seed.

    The file must give its costs in a ``[backend]`` table (zeros written out are fine).
    *backend*, a second TOML file (such as the one ``simsim calibrate`` writes), replaces
    that table with its own ``[backend]`` table (its other tables are not read). Without
    *require_requests* (``simsim serve``, whose clients send the requests), a file with
    no ``[[requests]]``, ``[trace]`` or ``[workload]`` is accepted; without
    *require_backend* (``simsim replay``, which measures a real server), a file without
    ``[backend]`` is (its costs are then all zero).
    """
    path = Path(path)
    data = read_toml(path)
    if backend is not None:
        check, table = _backend_table(backend)
        head = data.get("scenario")
        engine = head.get("engine") if isinstance(head, dict) else None
        if engine == "single_slot_fast" and table.get("kind") == "fitted":
            raise check.fail(
                "backend.kind",
                f"a fitted backend prices each decode step from its context, and {path} uses "
                'engine = "single_slot_fast", which prices one decode step per request; use '
                '"single_slot"',
            )
        data = {**data, "backend": table}
    scenario = parse_scenario(
        data,
        source=str(path),
        base_dir=path.parent,
        require_backend=require_backend,
        require_requests=require_requests,
    )
    return scenario if seed is None else scenario.with_seed(seed)


def parse_scenario(
    data: Mapping[str, Any],
    *,
    source: str = "<scenario>",
    base_dir: Path | None = None,
    require_backend: bool = False,
    require_requests: bool = True,
) -> Scenario:
    """Validate an already-parsed TOML document and build the :class:`Scenario`.

    With *require_backend* (as for every scenario file, see :func:`load_scenario`), a
    document without a ``[backend]`` table, or with an empty one, is refused: its costs
    would all be zero. Without it, a missing table means
    :class:`~simsim.SimulatedBackendConfig`'s defaults (all zero), as in Python.
    """
    check = TomlChecker(source)
    check.keys(data, _TOP_KEYS, "")
    head = check.table(data, "scenario", "scenario")
    check.keys(head, _SCENARIO_KEYS, "scenario")
    name = check.string(head, "name", "scenario", default="scenario")
    engine = check.choice(head, "engine", "scenario", tuple(ENGINE_BUILDERS), default="single_slot")
    seed = check.integer(head, "seed", "scenario", default=0)

    backend_table = check.table(data, "backend", "backend")
    backend = _parse_backend(check, backend_table)

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
                block_hashes=check.hashes(row, "block_hashes", where),
            )
        )

    if "trace" in data:
        specs.extend(parse_trace(check, check.table(data, "trace", "trace"), base_dir))

    workload = None
    if "workload" in data:
        kv = data.get("kv_cache")
        block = kv.get("block_size_tokens") if isinstance(kv, dict) else None
        workload = parse_workload(
            check,
            check.table(data, "workload", "workload"),
            base_dir,
            block if type(block) is int and block > 0 else None,
        )

    if require_requests and not specs and workload is None:
        raise ScenarioError(
            source, "", "the scenario has no requests: add [[requests]], [trace] or [workload]"
        )

    batching = _parse_batching(check, data, engine)
    _check_trace_blocks(check, data, batching)
    if engine == "single_slot_fast" and isinstance(backend, FittedBackendConfig):
        raise check.fail(
            "backend.kind",
            "a fitted backend prices each decode step from its context; use engine = "
            '"single_slot" (the fast engine prices one decode step per request)',
        )
    if engine == "single_slot_fast" and isinstance(workload, ClosedLoopWorkload):
        # Its users submit and cancel while the simulation runs, in an order that
        # depends on which of two events at the same microsecond comes first, and the
        # fast engine's events are not the full engine's: the tables would differ.
        raise check.fail(
            "workload.kind",
            'closed_loop needs engine = "single_slot" (or "batching"): the fast engine gives '
            "the full engine's request table only when every submission and cancellation "
            "is set up before the run",
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
    if require_backend and not backend_table:
        # Every cost would be 0 and every latency 0 us: almost always a forgotten table.
        missing = "missing table" if "backend" not in data else "the table is empty"
        raise ScenarioError(
            source,
            "backend",
            f"{missing}: every cost would be 0 and every latency 0 us; give the cost model "
            f"({', '.join(_BACKEND_KEYS)}), writing 0 explicitly for a cost that is zero",
        )
    return scenario


def load_backend(path: str | Path) -> SimulatedBackendConfig | FittedBackendConfig:
    """The cost model in the ``[backend]`` table of the TOML file at *path*.

    Such as the file ``simsim calibrate`` writes; other tables in the file are not read.
    Errors (:class:`ScenarioError`) name *path*: a missing or empty table, a bad key or
    value.
    """
    check, table = _backend_table(path)
    return _parse_backend(check, table)


def _backend_table(path: str | Path) -> tuple[TomlChecker, Mapping[str, Any]]:
    check = TomlChecker(str(path))
    table = check.table(read_toml(path), "backend", "backend")
    if not table:
        raise check.fail("backend", "missing or empty table: the file gives no cost model")
    _parse_backend(check, table)
    return check, table


def _parse_backend(
    check: TomlChecker, table: Mapping[str, Any]
) -> SimulatedBackendConfig | FittedBackendConfig:
    """``[backend]``: integer coefficients by default, or ``kind = "fitted"`` and floats."""
    kind = check.choice(table, "kind", "backend", BACKEND_KINDS, default="simulated")
    if kind == "simulated":
        # The allowed keys are named as before kind existed: an unknown key's message
        # is the one users of the linear model have always seen.
        check.keys({k: v for k, v in table.items() if k != "kind"}, _BACKEND_KEYS, "backend")
        return SimulatedBackendConfig(
            **{key: check.integer(table, key, "backend", default=0) for key in _BACKEND_KEYS}
        )
    check.keys(table, (*_FITTED_BACKEND_KEYS, "kind"), "backend")
    values = {key: check.number(table, key, "backend", default=0.0) for key in _FITTED_BACKEND_KEYS}
    for key, value in values.items():
        if value < 0:
            raise check.fail(f"backend.{key}", f"must be >= 0 microseconds, got {value!r}")
    return FittedBackendConfig(**values)


def _check_trace_blocks(
    check: TomlChecker, data: Mapping[str, Any], batching: BatchingSpec | None
) -> None:
    """A Mooncake trace's hashes name blocks of its own size: the KV cache's must match."""
    trace = data.get("trace")
    if not isinstance(trace, dict) or trace.get("format") != "mooncake":
        return
    if batching is None or not batching.prefix_cache or batching.kv_cache is None:
        return
    size = trace.get("block_size_tokens", MOONCAKE_BLOCK_SIZE)
    if size != batching.kv_cache.block_size_tokens:
        raise check.fail(
            "trace.block_size_tokens",
            f"the trace's hash_ids name blocks of {size} tokens, but [kv_cache] "
            f"block_size_tokens is {batching.kv_cache.block_size_tokens}: set them equal "
            "(the public Mooncake traces use 512)",
        )


def _parse_batching(
    check: TomlChecker, data: Mapping[str, Any], engine: str
) -> BatchingSpec | None:
    if engine != "batching":
        for name in ("batching", "kv_cache", "prefix_cache"):
            if name in data:
                raise check.fail(name, 'only for engine = "batching" (see [scenario] engine)')
        return None
    table = check.table(data, "batching", "batching")
    check.keys(table, _BATCHING_KEYS, "batching")
    kv_cache = None
    if "kv_cache" in data:
        kv_table = check.table(data, "kv_cache", "kv_cache")
        check.keys(kv_table, _KV_CACHE_KEYS, "kv_cache")
        kv_cache = make(
            check,
            "kv_cache",
            KvCacheConfig,
            check.integer(kv_table, "block_size_tokens", "kv_cache"),
            check.integer(kv_table, "total_blocks", "kv_cache"),
        )
    prefix_cache = False
    if "prefix_cache" in data:
        prefix_table = check.table(data, "prefix_cache", "prefix_cache")
        check.keys(prefix_table, _PREFIX_CACHE_KEYS, "prefix_cache")
        prefix_cache = check.boolean(prefix_table, "enabled", "prefix_cache", default=True)
        if prefix_cache and kv_cache is None:
            raise check.fail(
                "prefix_cache", "needs [kv_cache]: the cache shares and keeps its KV blocks"
            )
    spec = BatchingSpec(
        max_active_requests=check.integer(table, "max_active_requests", "batching"),
        max_batch_tokens=check.optional_integer(table, "max_batch_tokens", "batching"),
        policy=check.choice(table, "policy", "batching", POLICIES, default="prefill_first"),
        kv_cache=kv_cache,
        prefix_cache=prefix_cache,
    )
    # Let the engine's own checks speak (token cap vs slots, mixed needs a budget...).
    make(
        check,
        "batching",
        spec.build,
        SimulatedBackend(SimulatedBackendConfig()),
        FcfsScheduler(),
        Environment(),
    )
    return spec
