"""From a TOML document to a :class:`Scenario`: the top-level tables and their rules.

Each table is checked with a :class:`TomlChecker`; ``[trace]`` and ``[workload]`` have
their own modules. Nothing is built or run until the whole document is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from simsim.admission import ADMISSION_KEYS, AdmissionControl, Limit
from simsim.backend import (
    BACKENDS,
    FittedBackendConfig,
    SimulatedBackend,
    SimulatedBackendConfig,
)
from simsim.checks import did_you_mean
from simsim.clock import Environment
from simsim.cluster import ROUTERS, SCORERS, KvTransferConfig, WeightedRouter
from simsim.engines import KvCacheConfig
from simsim.engines.batching import POLICIES
from simsim.gpu.gpus import GpuSpec
from simsim.registry import Registry
from simsim.scenario.checker import ScenarioError, TomlChecker, limited, make, read_toml
from simsim.scenario.engine_kinds import ENGINE_KINDS, cannot
from simsim.scenario.gpu_tables import (
    parse_gpus,
    parse_physics_backend,
    parse_vllm,
    vllm_batching,
)
from simsim.scenario.model import (
    SCHEDULER_OPTIONS,
    BackendConfig,
    BackendSpec,
    BatchingSpec,
    Cancellation,
    ClusterSpec,
    PhysicsBackendSpec,
    PoolSpec,
    RequestSpec,
    Scenario,
    check_replicas,
    scenario_options,
)
from simsim.scenario.trace_table import parse_trace
from simsim.scenario.workload_table import (
    METADATA_KEYS,
    SharedCache,
    parse_metadata,
    parse_workload,
)
from simsim.scheduler import FcfsScheduler
from simsim.schedulers import SCHEDULERS as SCHEDULER_FACTORIES
from simsim.traces import MOONCAKE_BLOCK_SIZE
from simsim.workloads import ClassMix, ClosedLoopWorkload

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
    "cluster",
    "admission",
    "vllm",
    "gpus",
)
_ADMISSION_KEYS = ("key", "limits")
_LIMIT_KEYS = ("max_queued", "rate_per_s", "burst")
_ROUTER_KEYS = ("replicas", "router", "seed", "weights")
_CLUSTER_KEYS = (*_ROUTER_KEYS, "refresh_interval_us", "prefill", "decode", "transfer")
_POOL_OVERRIDES = ("max_active_requests", "max_batch_tokens", "policy", "total_blocks")
_POOL_KEYS = (*_ROUTER_KEYS, *_POOL_OVERRIDES)
_TRANSFER_KEYS = ("kv_bytes_per_token", "bandwidth_bytes_per_s", "base_us")
_POOLS = ("prefill", "decode", "transfer")
_DEFAULT_ROUTERS = {
    "cluster": "round_robin",
    "prefill": "round_robin",
    "decode": "least_outstanding",
}
_PREFIX_CACHE_KEYS = ("enabled",)
_BATCHING_KEYS = ("max_active_requests", "max_batch_tokens", "policy", "first_token_at_prefill")
_KV_CACHE_KEYS = ("block_size_tokens", "total_blocks")
_SCENARIO_KEYS = ("name", "engine", "seed")
_BACKEND_KEYS = tuple(SimulatedBackendConfig.__dataclass_fields__)
_FITTED_BACKEND_KEYS = tuple(FittedBackendConfig.__dataclass_fields__)
BACKEND_KINDS = tuple(BACKENDS)
"""The built-in ``[backend] kind`` names: the linear model in whole microseconds (default)
or the fitted one (registered kinds are in :data:`simsim.backend.BACKENDS`)."""
_REQUEST_KEYS = (
    "request_id",
    "arrival_time_us",
    "prompt_token_count",
    "max_output_tokens",
    "block_hashes",
    "request_class",
    *METADATA_KEYS,
    "deadline_us",
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
        fitted = table.get("kind") == "fitted"
        refusal = cannot(engine, "prices_context") if fitted and isinstance(engine, str) else None
        if refusal is not None:
            raise check.fail("backend.kind", f'{path} uses engine = "{engine}": {refusal}')
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
    engine = check.choice(head, "engine", "scenario", tuple(ENGINE_KINDS), default="single_slot")
    seed = check.integer(head, "seed", "scenario", default=0)

    backend_table = check.table(data, "backend", "backend")
    gpus = parse_gpus(check, data)
    vllm = parse_vllm(check, data, base_dir, gpus) if engine == "vllm" else None
    if vllm is not None:
        backend: BackendConfig = PhysicsBackendSpec(
            vllm.model, vllm.gpu, vllm.tp, vllm.coefficients
        )
    else:
        if "vllm" in data:
            raise check.fail("vllm", 'only for engine = "vllm" (see [scenario] engine)')
        backend = _parse_backend(check, backend_table, base_dir, gpus)
        if gpus and not isinstance(backend, PhysicsBackendSpec):
            raise check.fail(
                "gpus",
                'a GPU is named only by engine = "vllm" ([vllm] gpu) or a [backend] of '
                'kind = "physics" (its gpu), and this scenario has neither',
            )

    scheduler, scheduler_options = _parse_scheduler(check, data)

    # The server before the requests: a request's block hashes need its prefix cache, and
    # shared prefixes name its blocks and are checked against its size before a single
    # block hash is made.
    batching = _parse_batching(check, data, engine)
    # A vLLM server is a batching server too: its KV cache and prefix cache are checked
    # alike (it always takes block hashes; it uses them with prefix caching enabled).
    served = batching if vllm is None else vllm_batching(vllm)
    prefix_cache = served is not None and served.prefix_cache
    # [prefix_cache] enabled = false: requests may name blocks, and are made the same
    # without their names (a baseline to compare the cache against).
    names_allowed = (batching is not None and "prefix_cache" in data) or vllm is not None
    cluster = _parse_cluster(check, data, engine, served) if "cluster" in data else None

    specs: list[RequestSpec] = []
    for index, row in enumerate(check.array_of_tables(data, "requests")):
        where = f"requests[{index}]"
        check.keys(row, _REQUEST_KEYS, where)
        request_class = None
        if "request_class" in row:
            request_class = check.string(row, "request_class", where)
            if not request_class:
                raise check.fail(f"{where}.request_class", "must be a non-empty string")
        sizes = (
            check.integer(row, "request_id", where),
            check.time(row, "arrival_time_us", where),
            check.integer(row, "prompt_token_count", where),
            check.integer(row, "max_output_tokens", where),
        )
        block_hashes = _block_hashes(check, row, where, names_allowed, prefix_cache)
        deadline_us = check.optional_time(row, "deadline_us", where)
        metadata = parse_metadata(check, row, where)
        try:
            spec = RequestSpec(
                *sizes,
                block_hashes=block_hashes,
                request_class=request_class,
                deadline_us=deadline_us,
                **metadata,
            )
        except ValueError as error:  # a repeated block hash: refused as submit refused it
            raise ScenarioError(check.source, f"request {sizes[0]}", str(error)) from None
        specs.append(spec)

    if "trace" in data:
        trace = check.table(data, "trace", "trace")
        specs.extend(parse_trace(check, trace, base_dir, prefix_cache))

    workload = None
    if "workload" in data:
        workload = parse_workload(
            check,
            check.table(data, "workload", "workload"),
            base_dir,
            _shared_cache(served, cluster, names_allowed),
        )

    if require_requests and not specs and workload is None:
        raise ScenarioError(
            source, "", "the scenario has no requests: add [[requests]], [trace] or [workload]"
        )

    admission = _parse_admission(check, data, cluster) if "admission" in data else None
    if admission is not None and (specs or workload is not None):
        # A serving scenario has no requests of its own: its clients' names are unknown
        # here (simsim serve notes which limits its requests can meet).
        _check_limit_names(check, admission, specs, workload)
    _check_trace_blocks(check, data, served)
    refusal = cannot(engine, "prices_context")
    if refusal is not None and isinstance(backend, FittedBackendConfig):
        raise check.fail("backend.kind", refusal)
    if refusal is not None and isinstance(backend, PhysicsBackendSpec):
        raise check.fail(
            "backend.kind",
            f'"physics" prices each step from its context, as "fitted" does: {refusal}',
        )
    refusal = cannot(engine, "closed_loop")
    if refusal is not None and isinstance(workload, ClosedLoopWorkload):
        # Its users submit and cancel while the simulation runs, in an order that
        # depends on which of two events at the same microsecond comes first, and an
        # engine without closed_loop has other events: the tables would differ.
        raise check.fail("workload.kind", refusal)

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
        cluster=cluster,
        scheduler=scheduler,
        scheduler_options=scheduler_options,
        admission=admission,
        backend=backend,
        requests=tuple(specs),
        workload=workload,
        cancellations=tuple(cancellations),
        seed=seed,
        source=source,
        vllm=vllm,
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
    if require_backend and not backend_table and vllm is None:
        # Every cost would be 0 and every latency 0 us: almost always a forgotten table.
        missing = "missing table" if "backend" not in data else "the table is empty"
        raise ScenarioError(
            source,
            "backend",
            f"{missing}: every cost would be 0 and every latency 0 us; give the cost model "
            f"({', '.join(_BACKEND_KEYS)}), writing 0 explicitly for a cost that is zero",
        )
    return scenario


def _parse_scheduler(
    check: TomlChecker, data: Mapping[str, Any]
) -> tuple[str, tuple[tuple[str, float], ...]]:
    """``[scheduler]``: the policy and its options, checked by building one scheduler."""
    table = check.table(data, "scheduler", "scheduler")
    policy = check.choice(table, "policy", "scheduler", tuple(SCHEDULER_FACTORIES), default="fcfs")
    allowed = SCHEDULER_OPTIONS[policy]
    for key in table:
        others = [name for name, keys in SCHEDULER_OPTIONS.items() if key in keys]
        if others and key not in allowed:
            takes = ", ".join(allowed) if allowed else "no options"
            raise check.fail(
                f"scheduler.{key}",
                f"policy {policy!r} takes {takes}; {key} is an option of {', '.join(others)}",
            )
    check.keys(table, ("policy", *allowed), "scheduler")
    options = _options(check, table, "scheduler", SCHEDULER_FACTORIES, policy, allowed)
    scheduler = make(check, "scheduler", SCHEDULER_FACTORIES[policy], **dict(options))
    if scheduler is None:  # an engine would quietly use its default FCFS instead
        raise check.fail(
            "scheduler.policy",
            f"the factory of {policy!r} returned None, not a scheduler (it must return an "
            "object with enqueue, remove, decide, commit, epoch and stats)",
        )
    return policy, options


def _options(
    check: TomlChecker,
    table: Mapping[str, Any],
    where: str,
    registry: Registry[Any],
    name: str,
    allowed: Sequence[str],
) -> tuple[tuple[str, Any], ...]:
    """The plug-in options of *table* (keys among *allowed*): an option whose default
    is an ``int`` must be an integer, one whose default is a ``float`` a number; any
    other is passed as the file gives it."""
    defaults = registry.defaults(name)
    options = []
    for key in allowed:
        if key not in table:
            continue
        default = defaults.get(key)
        value: Any = table[key]
        if type(default) is int:
            value = check.integer(table, key, where)
        elif type(default) is float:
            value = check.number(table, key, where)
        options.append((key, value))
    return tuple(options)


def _parse_admission(
    check: TomlChecker, data: Mapping[str, Any], cluster: ClusterSpec | None
) -> AdmissionControl:
    """``[admission]``: a queue limit and a token bucket per class (or tenant), in
    ``[admission.limits.<name>]`` tables (``"*"``: every other name)."""
    table = check.table(data, "admission", "admission")
    check.keys(table, _ADMISSION_KEYS, "admission")
    key = check.choice(table, "key", "admission", tuple(ADMISSION_KEYS), default="class")
    if "limits" not in table:
        raise check.fail(
            "admission.limits",
            "missing: give a limit per class (or tenant), e.g. [admission.limits.batch] "
            'max_queued = 10; the name "*" applies to every other name',
        )
    limits: dict[str, Limit] = {}
    for name, row in check.table(table, "limits", "admission.limits").items():
        where = f"admission.limits.{name}"
        if not isinstance(row, dict):
            raise check.fail(where, f"must be a table of {', '.join(_LIMIT_KEYS)}")
        check.keys(row, _LIMIT_KEYS, where)
        queued = row.get("max_queued")
        if type(queued) is int and queued < 1:
            raise check.fail(
                f"{where}.max_queued",
                f"must be >= 1 (how many requests of this name may wait), got {queued}",
            )
        limits[name] = make(
            check,
            where,
            Limit,
            max_queued=check.optional_integer(row, "max_queued", where),
            rate_per_s=check.optional_number(row, "rate_per_s", where),
            burst=check.integer(row, "burst", where, default=1, minimum=1),
        )
    return make(check, "admission", AdmissionControl, limits, key=key)


def _check_limit_names(
    check: TomlChecker,
    admission: AdmissionControl,
    specs: Sequence[RequestSpec],
    workload: object,
) -> None:
    """Refuse an ``[admission.limits.<name>]`` that no request of the scenario carries:
    it would limit nothing (a misspelt class, or a class name under ``key = "tenant"``)."""
    field = "request_class" if admission.key == "class" else "tenant"
    names = {getattr(spec, field) for spec in specs}
    if isinstance(workload, ClassMix):
        names.update(
            getattr(entry, "name" if field == "request_class" else field)
            for entry in workload.classes
        )
    names.discard(None)
    for name in admission.limits:
        if name == "*" or name in names:
            continue
        known = sorted(str(n) for n in names)
        hint = did_you_mean(name, known)
        raise check.fail(
            f"admission.limits.{name}",
            f"no request of this scenario has {field} {name!r}{hint}, so this limit would "
            f"apply to nothing; the scenario's {field} names are "
            f'{", ".join(known) if known else "none"} ("*" applies to every other name)',
        )


def load_backend(path: str | Path) -> BackendConfig:
    """The cost model in the ``[backend]`` table of the TOML file at *path*.

    Such as the file ``simsim calibrate`` writes; other tables in the file are not read.
    Errors (:class:`ScenarioError`) name *path*: a missing or empty table, a bad key or
    value.
    """
    check, table = _backend_table(path)
    return _parse_backend(check, table, Path(path).parent, {})


def _backend_table(path: str | Path) -> tuple[TomlChecker, Mapping[str, Any]]:
    check = TomlChecker(str(path))
    table = check.table(read_toml(path), "backend", "backend")
    if not table:
        raise check.fail("backend", "missing or empty table: the file gives no cost model")
    _parse_backend(check, table, Path(path).parent, {})
    return check, table


def _parse_backend(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    gpus: Mapping[str, GpuSpec],
) -> BackendConfig:
    """``[backend]``: integer coefficients by default, ``kind = "fitted"`` and floats,
    ``kind = "physics"`` and a model on GPUs (*gpus*: the scenario's own, by name; a
    model's path is read from *base_dir*), or a registered kind and the options its
    factory takes."""
    kind = check.choice(table, "kind", "backend", (*BACKENDS, "physics"), default="simulated")
    if kind == "physics":
        return parse_physics_backend(check, table, base_dir, gpus)
    if kind not in ("simulated", "fitted"):
        allowed = scenario_options(BACKENDS, kind)
        check.keys(table, ("kind", *allowed), "backend")
        spec = BackendSpec(kind, _options(check, table, "backend", BACKENDS, kind, allowed))
        make(check, "backend", BACKENDS[kind], **dict(spec.options))
        return spec
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


def _block_hashes(
    check: TomlChecker, row: Mapping[str, Any], where: str, allowed: bool, used: bool
) -> tuple[int | str, ...] | None:
    """A ``[[requests]]`` entry's ``block_hashes``: only a prefix cache uses them, so
    they are refused without a ``[prefix_cache]`` table (*allowed*) and checked but left
    out when it is disabled (not *used*)."""
    hashes = check.hashes(row, "block_hashes", where)
    if hashes is not None and not allowed:
        raise check.fail(
            f"{where}.block_hashes",
            'needs engine = "batching" with [kv_cache] and [prefix_cache]: only a prefix cache '
            "shares the blocks they name, and without one they would be ignored (with "
            "[prefix_cache] enabled = false they are left out on purpose)",
        )
    return hashes if used else None


def _shared_cache(
    batching: BatchingSpec | None, cluster: ClusterSpec | None, names_allowed: bool
) -> SharedCache | None:
    """The KV cache whose blocks a workload's requests may name: the scenario's, with a
    ``[prefix_cache]`` table (``None`` without one), at the size of the largest one any
    replica has, so a request that fits none of them is refused before its hashes are
    made; the requests name its blocks only if the prefix cache is enabled."""
    if batching is None or not names_allowed or batching.kv_cache is None:
        return None
    pools = () if cluster is None else cluster.pools()
    largest = max(
        spec.kv_cache.total_blocks
        for spec in (batching, *(pool.batching for pool in pools))
        if spec is not None and spec.kv_cache is not None
    )
    cache = KvCacheConfig(batching.kv_cache.block_size_tokens, largest)
    return SharedCache(cache, block_hashes=batching.prefix_cache)


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
            check.integer(kv_table, "block_size_tokens", "kv_cache", minimum=1),
            check.integer(kv_table, "total_blocks", "kv_cache", minimum=1),
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
        max_active_requests=check.integer(table, "max_active_requests", "batching", minimum=1),
        max_batch_tokens=check.optional_integer(table, "max_batch_tokens", "batching", minimum=1),
        policy=check.choice(table, "policy", "batching", tuple(POLICIES), default="prefill_first"),
        kv_cache=kv_cache,
        prefix_cache=prefix_cache,
        first_token_at_prefill=check.boolean(
            table, "first_token_at_prefill", "batching", default=False
        ),
    )
    _check_server(check, "batching", spec)
    return spec


def _parse_cluster(
    check: TomlChecker, data: Mapping[str, Any], engine: str, batching: BatchingSpec | None
) -> ClusterSpec:
    """``[cluster]``: copies of the scenario's server behind a router, or (with
    ``[cluster.prefill]``, ``[cluster.decode]`` and ``[cluster.transfer]``) a prefill pool
    and a decode pool of batching servers."""
    table = check.table(data, "cluster", "cluster")
    check.keys(table, _CLUSTER_KEYS, "cluster")
    refresh = check.time(table, "refresh_interval_us", "cluster", default=0)
    prefix_cache = batching is not None and batching.prefix_cache
    parts = [name for name in _POOLS if name in table]
    if not parts:
        pool = _parse_pool(check, table, "cluster", None, prefix_cache)
        return ClusterSpec(pool=pool, refresh_interval_us=refresh)
    missing = [name for name in _POOLS if name not in table]
    if missing:
        raise check.fail(
            f"cluster.{missing[0]}",
            f"missing table: disaggregation needs [cluster.prefill], [cluster.decode] and "
            f"[cluster.transfer] together (the file gives {', '.join(parts)})",
        )
    if engine != "batching" or batching is None:
        raise check.fail(
            f"cluster.{parts[0]}",
            'disaggregated prefill and decode need engine = "batching" (a request moves '
            f'from a batching prefill replica to a batching decode one); the engine is "{engine}"',
        )
    if batching.first_token_at_prefill:
        raise check.fail(
            "batching.first_token_at_prefill",
            "not supported with disaggregated prefill and decode (a prefill replica hands "
            "a request over before its first token); leave it out or set it false",
        )
    for key in _ROUTER_KEYS:
        if key in table:
            raise check.fail(
                f"cluster.{key}",
                "with [cluster.prefill] and [cluster.decode], give replicas, router and its "
                "options in each pool's table",
            )
    prefill, decode = (
        _parse_pool(
            check,
            _checked(check, check.table(table, name, f"cluster.{name}"), f"cluster.{name}"),
            f"cluster.{name}",
            batching,
            prefix_cache,
        )
        for name in ("prefill", "decode")
    )
    transfer_table = check.table(table, "transfer", "cluster.transfer")
    check.keys(transfer_table, _TRANSFER_KEYS, "cluster.transfer")
    transfer = make(
        check,
        "cluster.transfer",
        KvTransferConfig,
        kv_bytes_per_token=check.integer(
            transfer_table, "kv_bytes_per_token", "cluster.transfer", minimum=1
        ),
        bandwidth_bytes_per_s=check.integer(
            transfer_table, "bandwidth_bytes_per_s", "cluster.transfer", minimum=1
        ),
        base_us=check.time(transfer_table, "base_us", "cluster.transfer", default=0),
    )
    return ClusterSpec(
        prefill=prefill, decode=decode, transfer=transfer, refresh_interval_us=refresh
    )


def _checked(check: TomlChecker, table: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    check.keys(table, _POOL_KEYS, where)
    return table


def _parse_pool(
    check: TomlChecker,
    table: Mapping[str, Any],
    where: str,
    batching: BatchingSpec | None,
    prefix_cache: bool,
) -> PoolSpec:
    """A pool's replica count, router and router options (its keys already checked);
    with *batching* (a disaggregated pool), also its overrides of the batching server.
    *prefix_cache*: whether the replicas have one (``prefix_affinity`` needs it)."""
    replicas = limited(
        check,
        f"{where}.replicas",
        "replicas",
        check_replicas,
        check.integer(table, "replicas", where, minimum=1),
    )
    name = where.rpartition(".")[2]
    router = check.choice(table, "router", where, tuple(ROUTERS), default=_DEFAULT_ROUTERS[name])
    options = ROUTERS.options(router)
    if router == "prefix_affinity" and not prefix_cache:
        raise check.fail(
            f"{where}.router",
            "'prefix_affinity' sends a request where its prefix is cached, and the replicas "
            'have no prefix cache (engine = "batching" with [kv_cache] and [prefix_cache]): '
            "it would send every request to the least loaded; use 'least_outstanding' for "
            "that, or add [prefix_cache]",
        )
    seed = None
    if "seed" in table:
        if not ROUTERS.seeded(router):
            seeded = [other for other in ROUTERS if ROUTERS.seeded(other)]
            raise check.fail(
                f"{where}.seed",
                f"only for router {' or '.join(repr(r) for r in seeded)} "
                f"(the router is {router!r})",
            )
        seed = check.integer(table, "seed", where)
    weights = None
    if "weights" in table:
        if options is not None and "weights" not in options:
            weighted = [other for other in ROUTERS if "weights" in (ROUTERS.options(other) or ())]
            raise check.fail(
                f"{where}.weights",
                f"only for router {' or '.join(repr(r) for r in weighted)} "
                f"(the router is {router!r})",
            )
        weights_table = check.table(table, "weights", f"{where}.weights")
        check.keys(weights_table, tuple(SCORERS), f"{where}.weights")
        values = {
            scorer: check.number(weights_table, scorer, f"{where}.weights")
            for scorer in weights_table
        }
        make(check, f"{where}.weights", WeightedRouter, values)
        if not prefix_cache and not any(w for scorer, w in values.items() if scorer != "prefix"):
            raise check.fail(
                f"{where}.weights",
                "only 'prefix' is weighed, and the replicas have no prefix cache "
                '(engine = "batching" with [kv_cache] and [prefix_cache]): it would send every '
                "request to the least loaded; weigh 'queue' too, or add [prefix_cache]",
            )
        weights = tuple(values.items())
    pool = PoolSpec(replicas, router, seed, weights, _pool_batching(check, table, where, batching))
    # A user's router factory is tried at load, so its own errors name this table.
    make(check, f"{where}.router", ROUTERS[router], **pool.router_options(0))
    return pool


def _pool_batching(
    check: TomlChecker, table: Mapping[str, Any], where: str, batching: BatchingSpec | None
) -> BatchingSpec | None:
    """The pool's batching server: the scenario's with the pool's overrides, if any."""
    if batching is None or not any(key in table for key in _POOL_OVERRIDES):
        return None
    kv_cache = batching.kv_cache
    if "total_blocks" in table:
        if kv_cache is None:
            raise check.fail(
                f"{where}.total_blocks", "needs [kv_cache]: there are no blocks to count"
            )
        kv_cache = make(
            check,
            f"{where}.total_blocks",
            KvCacheConfig,
            kv_cache.block_size_tokens,
            check.integer(table, "total_blocks", where, minimum=1),
        )
    spec = replace(
        batching,
        max_active_requests=check.integer(
            table, "max_active_requests", where, default=batching.max_active_requests, minimum=1
        ),
        max_batch_tokens=(
            check.integer(table, "max_batch_tokens", where, minimum=1)
            if "max_batch_tokens" in table
            else batching.max_batch_tokens
        ),
        policy=check.choice(table, "policy", where, tuple(POLICIES), default=batching.policy),
        kv_cache=kv_cache,
    )
    _check_server(check, where, spec)
    return spec


def _check_server(check: TomlChecker, where: str, spec: BatchingSpec) -> None:
    """Let the engine's own checks speak (token cap vs slots, mixed needs a budget...)."""
    make(
        check,
        where,
        spec.build,
        SimulatedBackend(SimulatedBackendConfig()),
        FcfsScheduler(),
        Environment(),
    )
