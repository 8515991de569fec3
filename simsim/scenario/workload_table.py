"""The ``[workload]`` table: generated requests, their arrival processes and distributions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from simsim.clock import MAX_TIME_US
from simsim.engines import KvCacheConfig
from simsim.scenario.checker import (
    ScenarioError,
    TomlChecker,
    from_trace_error,
    limited,
    make,
)
from simsim.scenario.model import Workload
from simsim.traces import TraceError
from simsim.workloads import (
    ArrivalProcess,
    ClassMix,
    ClosedLoopWorkload,
    Empirical,
    Exponential,
    Fixed,
    FixedRateArrivals,
    GammaArrivals,
    LengthDistribution,
    LogNormal,
    OpenLoopWorkload,
    PoissonArrivals,
    RequestClass,
    SharedPrefixes,
    Stage,
    StagedArrivals,
    Uniform,
    check_request_count,
)

__all__ = ["METADATA_KEYS", "SharedCache", "parse_metadata", "parse_workload"]


_NEEDS_PREFIX_CACHE = (
    'needs engine = "batching" with [kv_cache] and [prefix_cache]: {what} (or '
    "[prefix_cache] enabled = false for the same requests naming no blocks, a baseline "
    "to compare the cache against)"
)


@dataclass(frozen=True, slots=True)
class SharedCache:
    """The KV cache whose blocks a workload's requests name (``shared_prefixes``,
    ``conversation``), and whether they name them.

    ``block_hashes`` is ``False`` under ``[prefix_cache] enabled = false``: the requests
    are made exactly as with the cache on (the same sizes from the same seed) but name no
    blocks, since a server without a prefix cache refuses hashes it would not use.
    """

    kv_cache: KvCacheConfig
    block_hashes: bool


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
    "shared_prefixes",
)
_SHARED_PREFIX_DATA_KEYS = (
    "kind",
    "data",
    "count",
    "arrivals",
    "rate_per_s",
    "num_unique_system_prompts",
    "num_users_per_system_prompt",
    "system_prompt_len",
    "question_len",
    "output_len",
    "ignore_eos",
    "enable_multi_turn_chat",
    "patience_us",
    "first_request_id",
    "start_time_us",
)
"""``data = "shared_prefix"``: inference-perf's shared-prefix data, its keys named as
inference-perf's configuration (and ``train.csv``) name them."""
_CLASS_MIX_KEYS = ("kind", "classes", "total", "first_request_id", "start_time_us")
METADATA_KEYS = ("tenant", "priority", "tags")
"""Request metadata keys a ``[[workload.classes]]`` table shares with ``[[requests]]``."""
_CLASS_KEYS = (
    "name",
    "count",
    "share",
    "arrivals",
    "rate_per_s",
    "prompt_tokens",
    "output_tokens",
    "patience_us",
    *METADATA_KEYS,
    "relative_deadline_us",
    "ttft_slo_us",
    "tpot_slo_us",
)
_SHARED_PREFIX_KEYS = ("lengths", "weights")
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
    "conversation",
)
_ARRIVAL_KEYS = {
    "poisson": ("process", "rate_per_s"),
    "gamma": ("process", "rate_per_s", "cv"),
    "fixed": ("process", "rate_per_s"),
    "staged": ("process", "stages"),
}
_STAGE_KEYS = ("rate_per_s", "duration_s", "duration_us")
_DISTRIBUTION_KEYS = {
    "fixed": ("distribution", "value"),
    "uniform": ("distribution", "low", "high"),
    "lognormal": ("distribution", "mean", "cv", "low", "high"),
    "exponential": ("distribution", "mean", "low", "high"),
    "empirical": ("distribution", "values", "weights", "path", "column", "weight_column"),
}


def parse_workload(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    shared_cache: SharedCache | None = None,
) -> Workload:
    """The workload of a ``[workload]`` table (open or closed loop).

    *shared_cache* is the scenario's KV cache when it has a ``[prefix_cache]`` table
    (``None`` otherwise): ``shared_prefixes`` and ``conversation`` name its blocks (or,
    with the cache disabled, are made the same naming none), and are refused without
    one; a shared-prefix request that needs more blocks than it holds is refused before
    any block hash is made.
    """
    kind = check.choice(table, "kind", "workload", ("open_loop", "closed_loop"), "open_loop")
    where = "workload"
    try:
        if "classes" in table:
            return _parse_class_mix(check, table, base_dir)
        if "data" in table:
            return _parse_shared_prefix_data(check, table, base_dir, shared_cache)
        if kind == "closed_loop":
            check.keys(table, _CLOSED_LOOP_KEYS, where)
            users = _request_count(check, table, "users")
            per_user = check.optional_integer(table, "requests_per_user", where, minimum=1)
            first = check.integer(table, "first_request_id", where, default=0)
            closed = ClosedLoopWorkload(
                users=users,
                think_time_us=_parse_distribution(check, table, "think_time_us", base_dir),
                prompt_tokens=_parse_distribution(check, table, "prompt_tokens", base_dir),
                output_tokens=_parse_distribution(check, table, "output_tokens", base_dir),
                requests_per_user=per_user,
                horizon_us=_horizon(check, table),
                first_request_id=first,
                patience=_parse_optional_distribution(check, table, "patience_us", base_dir),
                conversation_block_size_tokens=_conversation_blocks(check, table, shared_cache),
                block_hashes=shared_cache is None or shared_cache.block_hashes,
            )
            if per_user is not None:
                _check_ids(check, first, users * per_user)
            return closed
        check.keys(table, _OPEN_LOOP_KEYS, where)
        return _open_loop(
            check,
            table,
            base_dir,
            ("prompt_tokens", "output_tokens"),
            lambda: _parse_shared_prefixes(check, table, shared_cache),
        )
    except ScenarioError:
        raise
    except TraceError as error:
        raise from_trace_error(error) from None
    except (TypeError, ValueError, OverflowError) as error:
        raise check.fail(where, str(error)) from None


def _open_loop_count(check: TomlChecker, table: Mapping[str, Any], arrivals: ArrivalProcess) -> int:
    """``count``: required, except with staged arrivals, whose stages make their own
    count (a smaller ``count`` keeps the first requests)."""
    if not isinstance(arrivals, StagedArrivals):
        return _request_count(check, table, "count")
    stages_count = arrivals.count
    if "count" not in table:
        if stages_count == 0:
            raise check.fail(
                "workload.arrivals.stages",
                "make no request (rate x duration is below 1 in every stage)",
            )
        return limited(
            check,
            "workload.arrivals.stages",
            "the stages' count",
            lambda v: check_request_count(v, "the stages' count"),
            stages_count,
        )
    count = _request_count(check, table, "count")
    if count > stages_count:
        raise check.fail(
            "workload.count",
            f"must be at most {stages_count}, the requests the stages make (rate x duration "
            f"per stage), got {count} (leave count out to make them all)",
        )
    return count


def _parse_shared_prefix_data(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    shared_cache: SharedCache | None,
) -> OpenLoopWorkload:
    """``data = "shared_prefix"``: inference-perf's shared-prefix data (see
    :class:`~simsim.workloads.SharedPrefixes` with ``users_per_prefix``)."""
    where = "workload"
    check.choice(table, "data", where, ("shared_prefix",), "shared_prefix")
    check.keys(table, _SHARED_PREFIX_DATA_KEYS, where)
    if table.get("kind", "open_loop") != "open_loop":
        raise check.fail(
            "workload.kind",
            f'data = "shared_prefix" is open-loop traffic; got kind = {table["kind"]!r} '
            "(leave kind out)",
        )
    if shared_cache is None:
        raise check.fail(
            "workload.data",
            _NEEDS_PREFIX_CACHE.format(what="requests share their system prompts' blocks"),
        )
    if not check.boolean(table, "ignore_eos", where, default=True):
        raise check.fail(
            "workload.ignore_eos",
            "must be true: simsim generates exactly output_len tokens per request, as a "
            "server does when it ignores the end-of-sequence token (for shorter answers, "
            "give output_len a distribution)",
        )
    # Multi-turn chat changes the chat template, not the context: nothing to model.
    check.boolean(table, "enable_multi_turn_chat", where, default=False)
    prompts = check.integer(table, "num_unique_system_prompts", where, minimum=1)
    users = check.integer(table, "num_users_per_system_prompt", where, minimum=1)
    length = check.integer(table, "system_prompt_len", where)
    if prompts * users > MAX_TIME_US:
        raise check.fail(
            "workload.num_users_per_system_prompt",
            f"{prompts} x {users} users pass the 64-bit limit 2**63 - 1",
        )
    cache = shared_cache.kv_cache
    shared = make(
        check,
        where,
        SharedPrefixes,
        [length] * prompts,
        cache.block_size_tokens,
        total_blocks=cache.total_blocks,
        block_hashes=shared_cache.block_hashes,
        users_per_prefix=users,
    )
    return _open_loop(check, table, base_dir, ("question_len", "output_len"), lambda: shared)


def _open_loop(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    size_keys: tuple[str, str],
    shared_prefixes: Callable[[], SharedPrefixes | None],
) -> OpenLoopWorkload:
    """An open-loop workload whose prompt and output sizes are the distributions at
    *size_keys*; *shared_prefixes* is read last (its errors come after the others')."""
    where = "workload"
    arrivals = _parse_arrivals(check, table)
    count = _open_loop_count(check, table, arrivals)
    first = check.integer(table, "first_request_id", where, default=0)
    _check_ids(check, first, count)
    prompt_key, output_key = size_keys
    return OpenLoopWorkload(
        arrivals=arrivals,
        prompt_tokens=_parse_distribution(check, table, prompt_key, base_dir),
        output_tokens=_parse_distribution(check, table, output_key, base_dir),
        count=count,
        patience=_parse_optional_distribution(check, table, "patience_us", base_dir),
        first_request_id=first,
        start_us=check.time(table, "start_time_us", where, default=0),
        shared_prefixes=shared_prefixes(),
    )


def parse_metadata(check: TomlChecker, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The request metadata of a table: ``tenant``, ``priority`` and ``tags`` given in it."""
    metadata: dict[str, Any] = {}
    if "tenant" in table:
        tenant = check.string(table, "tenant", where)
        if not tenant:
            raise check.fail(f"{where}.tenant", "must be a non-empty string")
        metadata["tenant"] = tenant
    if "priority" in table:
        metadata["priority"] = check.signed_integer(table, "priority", where, default=0)
    tags = check.tags(table, "tags", where)
    if tags is not None:
        metadata["tags"] = tags
    return metadata


def _parse_class_mix(
    check: TomlChecker, table: Mapping[str, Any], base_dir: Path | None
) -> ClassMix:
    """``[[workload.classes]]``: open-loop traffic in several classes, merged by arrival."""
    check.keys(table, _CLASS_MIX_KEYS, "workload")
    if table.get("kind", "open_loop") != "open_loop":
        raise check.fail(
            "workload.kind",
            f"[[workload.classes]] describe open-loop traffic; got kind = {table['kind']!r} "
            "(leave kind out)",
        )
    rows = list(check.array_of_tables(table, "classes", "workload.classes"))
    if not rows:
        raise check.fail("workload.classes", "needs at least one [[workload.classes]] table")
    total = _request_count(check, table, "total") if "total" in table else None
    classes: list[RequestClass] = []
    names: dict[str, int] = {}
    for index, row in enumerate(rows):
        where = f"workload.classes[{index}]"
        name = check.string(row, "name", where)
        if not name:
            raise check.fail(f"{where}.name", "must be a non-empty string")
        if name in names:
            raise check.fail(
                f"{where}.name",
                f"{name!r} is also the name of workload.classes[{names[name]}]; class names "
                "must be unique",
            )
        names[name] = index
        where = f"workload.classes[{index}] ({name})"
        check.keys(row, _CLASS_KEYS, where)
        count = None
        if "count" in row:
            if total is not None:
                raise check.fail(
                    f"{where}.count",
                    f"the workload has total = {total}: give every class a count and no "
                    "total, or a total and (optionally) shares",
                )
            count = _request_count(check, row, "count", where)
        elif total is None:
            raise check.fail(
                f"{where}.count",
                "missing: give every class a count, or give [workload] a total to split "
                "among the classes (by share, or by arrival rate)",
            )
        share = check.optional_number(row, "share", where)
        if share is not None and total is None:
            raise check.fail(f"{where}.share", "needs [workload] total (the count to share out)")
        arrivals = _parse_arrivals(check, row, where)
        if isinstance(arrivals, StagedArrivals):
            raise check.fail(
                f"{where}.arrivals",
                'process = "staged" makes a [workload] of its own (its requests are tagged '
                "by stage), not a class of a mix",
            )
        classes.append(
            make(
                check,
                where,
                RequestClass,
                name,
                arrivals,
                _parse_distribution(check, row, "prompt_tokens", base_dir, where),
                _parse_distribution(check, row, "output_tokens", base_dir, where),
                count=count,
                share=share,
                relative_deadline_us=check.optional_time(row, "relative_deadline_us", where),
                patience=_parse_optional_distribution(check, row, "patience_us", base_dir, where),
                ttft_slo_us=check.optional_number(row, "ttft_slo_us", where),
                tpot_slo_us=check.optional_number(row, "tpot_slo_us", where),
                **parse_metadata(check, row, where),
            )
        )
    first = check.integer(table, "first_request_id", "workload", default=0)
    mix = make(
        check,
        "workload",
        ClassMix,
        classes,
        total=total,
        first_request_id=first,
        start_us=check.time(table, "start_time_us", "workload", default=0),
    )
    _check_ids(check, first, mix.count)
    return mix


def _horizon(check: TomlChecker, table: Mapping[str, Any]) -> int | None:
    """A closed loop's ``horizon_us``: users start at 0, so 0 would make no request and
    is refused as ``count = 0`` is."""
    horizon = check.optional_time(table, "horizon_us", "workload")
    if horizon == 0:
        raise check.fail("workload.horizon_us", "must be >= 1, got 0")
    return horizon


def _conversation_blocks(
    check: TomlChecker, table: Mapping[str, Any], shared_cache: SharedCache | None
) -> int | None:
    """``conversation = true``: each user is a multi-turn conversation (needs a
    ``[prefix_cache]`` table)."""
    if not check.boolean(table, "conversation", "workload", default=False):
        return None
    if shared_cache is None:
        raise check.fail(
            "workload.conversation", _NEEDS_PREFIX_CACHE.format(what="turns share its blocks")
        )
    return shared_cache.kv_cache.block_size_tokens


def _parse_shared_prefixes(
    check: TomlChecker, table: Mapping[str, Any], shared_cache: SharedCache | None
) -> SharedPrefixes | None:
    if "shared_prefixes" not in table:
        return None
    where = "workload.shared_prefixes"
    prefixes = check.table(table, "shared_prefixes", where)
    check.keys(prefixes, _SHARED_PREFIX_KEYS, where)
    if shared_cache is None:
        raise check.fail(where, _NEEDS_PREFIX_CACHE.format(what="requests share its blocks"))
    lengths = prefixes.get("lengths")
    if not isinstance(lengths, list) or not lengths:
        raise check.fail(
            f"{where}.lengths", f"must be a non-empty array of integers, got {lengths!r}"
        )
    lengths = check.integers(lengths, f"{where}.lengths")
    weights = prefixes.get("weights")
    if weights is not None and (
        not isinstance(weights, list) or not all(type(v) in (int, float) for v in weights)
    ):
        raise check.fail(f"{where}.weights", f"must be an array of numbers, got {weights!r}")
    try:
        cache = shared_cache.kv_cache
        return SharedPrefixes(
            lengths,
            cache.block_size_tokens,
            weights,
            cache.total_blocks,
            block_hashes=shared_cache.block_hashes,
        )
    except (TypeError, ValueError) as error:
        raise check.fail(where, str(error)) from None


def _request_count(
    check: TomlChecker, table: Mapping[str, Any], key: str, where: str = "workload"
) -> int:
    """How many requests (or users) a workload makes: 1 to
    :data:`~simsim.workloads.MAX_GENERATED_REQUESTS`, checked before anything is drawn."""
    value = check.integer(table, key, where, minimum=1)
    return limited(check, f"{where}.{key}", key, lambda v: check_request_count(v, key), value)


def _check_ids(check: TomlChecker, first: int, count: int) -> None:
    if count and first + count - 1 > MAX_TIME_US:
        raise check.fail(
            "workload.first_request_id",
            f"{first} numbers {count} requests up to {first + count - 1}, past the 64-bit "
            "limit 2**63 - 1",
        )


def _parse_arrivals(
    check: TomlChecker, table: Mapping[str, Any], where: str = "workload"
) -> ArrivalProcess:
    if "rate_per_s" in table:
        if "arrivals" in table:
            raise check.fail(f"{where}.rate_per_s", "give either rate_per_s or arrivals, not both")
        return make(
            check, f"{where}.rate_per_s", PoissonArrivals, check.number(table, "rate_per_s", where)
        )
    at = f"{where}.arrivals"
    spec = check.table(table, "arrivals", at)
    if "arrivals" not in table:
        raise check.fail(at, "missing required key (or give rate_per_s)")
    process = check.choice(spec, "process", at, tuple(_ARRIVAL_KEYS), default="poisson")
    check.keys(spec, _ARRIVAL_KEYS[process], at)
    if process == "staged":
        return _parse_stages(check, spec, at)
    rate = check.number(spec, "rate_per_s", at)
    if process == "gamma":
        return make(check, at, GammaArrivals, rate, check.number(spec, "cv", at))
    if process == "fixed":
        return make(check, at, FixedRateArrivals, rate)
    return make(check, at, PoissonArrivals, rate)


def _parse_stages(check: TomlChecker, spec: Mapping[str, Any], at: str) -> StagedArrivals:
    """``{ process = "staged", stages = [{ rate_per_s = R, duration_s = D }, ...] }``."""
    where = f"{at}.stages"
    if "stages" not in spec:
        raise check.fail(where, "missing required key (an array of { rate_per_s, duration_s })")
    rows = spec["stages"]
    if not isinstance(rows, list) or not rows:
        raise check.fail(
            where,
            "must be a non-empty array of tables { rate_per_s = R, duration_s = D } "
            f"(or duration_us), got {rows!r}",
        )
    stages: list[Stage] = []
    for index, row in enumerate(rows):
        here = f"{where}[{index}]"
        if not isinstance(row, dict):
            raise check.fail(
                here, f"must be a table {{ rate_per_s = R, duration_s = D }}, got {row!r}"
            )
        check.keys(row, _STAGE_KEYS, here)
        rate = check.number(row, "rate_per_s", here)
        if ("duration_s" in row) == ("duration_us" in row):
            raise check.fail(here, "give exactly one of duration_s and duration_us")
        if "duration_us" in row:
            duration_us = check.time(row, "duration_us", here)
        else:
            seconds = check.number(row, "duration_s", here)
            # The decimal the file wrote, rounded once to the microsecond (ties to even).
            micros = (Decimal(repr(row["duration_s"])) * 1_000_000).quantize(
                Decimal(1), rounding=ROUND_HALF_EVEN
            )
            if not 0 < micros <= MAX_TIME_US:
                raise check.fail(
                    f"{here}.duration_s",
                    f"must be at least 1 microsecond and at most 2**63 - 1 us, got {seconds!r}",
                )
            duration_us = int(micros)
        stages.append(make(check, here, Stage, rate_per_s=rate, duration_us=duration_us))
    return make(check, where, StagedArrivals, stages)


def _parse_optional_distribution(
    check: TomlChecker,
    table: Mapping[str, Any],
    key: str,
    base_dir: Path | None,
    where: str = "workload",
) -> LengthDistribution | None:
    if key not in table:
        return None
    return _parse_distribution(check, table, key, base_dir, where)


def _parse_distribution(
    check: TomlChecker,
    table: Mapping[str, Any],
    key: str,
    base_dir: Path | None,
    where: str = "workload",
) -> LengthDistribution:
    at = f"{where}.{key}"
    if key not in table:
        raise check.fail(at, "missing required key")
    value = table[key]
    if isinstance(value, list):
        low, high = check.int_range(table, key, where)
        return make(check, at, Uniform, low, high)
    if type(value) in (int, float):  # a float is refused, with its integer spelling
        return make(check, at, Fixed, check.integer(table, key, where))
    spec = check.table(table, key, at)
    kind = check.choice(spec, "distribution", at, tuple(_DISTRIBUTION_KEYS), default="")
    check.keys(spec, _DISTRIBUTION_KEYS[kind], at)
    if kind == "fixed":
        return make(check, at, Fixed, check.integer(spec, "value", at))
    if kind == "uniform":
        return make(
            check, at, Uniform, check.integer(spec, "low", at), check.integer(spec, "high", at)
        )
    floor = check.integer(spec, "low", at, default=0)
    ceiling = check.optional_integer(spec, "high", at)
    if kind == "lognormal":
        mean, cv = check.number(spec, "mean", at), check.number(spec, "cv", at)
        return make(check, at, LogNormal, mean, cv, floor, ceiling)
    if kind == "exponential":
        return make(check, at, Exponential, check.number(spec, "mean", at), floor, ceiling)
    if "path" in spec:
        path = Path(check.string(spec, "path", at))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        weight_column = spec.get("weight_column")
        return make(
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
    values = check.integers(values, f"{at}.values")
    return make(check, at, Empirical, tuple(values), None if weights is None else tuple(weights))
